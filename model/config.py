"""The one model configuration, saved inside every checkpoint and manifest."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

ACTIVATIONS = ("relu", "gelu", "gelu_new", "swish")
POSITION_LAYOUTS = ("interleaved", "split")
POSITIONS = ("sinusoid", "learned", "relative")
NORMS = ("layer", "rms")
# Field metadata: a manifest leaves the field out while it holds its default, so
# that packages written before it existed read back and write back unchanged.
OMITTED_AT_DEFAULT = {"omitted_at_default": True}


@dataclass
class ModelConfig:
    """Architecture of the encoder-decoder transformer.

    The defaults are the paper's base model with the paper's choices
    (post-norm, ReLU, interleaved sinusoids). The switches cover the Marian
    (OPUS-MT) variant exactly: `position_layout="split"` puts sines in the first
    half of the vector and cosines in the second, `activation="swish"`, a final
    logits bias, and the decoder starting from the pad token. BART's:
    `positions="learned"` (one learned table per stack, position p at row p: the
    Hugging Face offset of 2 is folded away at conversion) and
    `layernorm_embedding` (a LayerNorm after token embedding + position, in the
    encoder and in the decoder). T5's (T5, Flan-T5, mT5): `positions="relative"`
    (no absolute positions: a learned bias per relative-position bucket and head,
    `relative_buckets` buckets up to `relative_max_distance`, one table per stack
    from its first layer, added to every self-attention layer's scores),
    `norm="rms"` (T5's RMSNorm: no mean, no bias, variance in fp32),
    `linear_bias=False` (no bias in attention and feed-forward projections),
    `ffn_gated` (act(fc1 x) * fc_gate x), `head_dim` (T5's d_kv: heads * head_dim
    may differ from d_model; 0 means d_model // heads) and `attention_scale`
    (0.0 means 1/sqrt(head_dim); T5 uses 1.0). The defaults of all these are the
    behaviour of checkpoints and manifests written before they existed.
    """

    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_heads: int = 8
    decoder_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    max_positions: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    pre_norm: bool = False
    layer_norm_eps: float = 1e-5
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    share_embeddings: bool = True  # one matrix for source and target tokens
    tie_output: bool = True  # output projection = target embedding matrix
    final_logits_bias: bool = False
    position_layout: str = "interleaved"  # of sinusoids
    positions: str = field(default="sinusoid", metadata=OMITTED_AT_DEFAULT)  # one of POSITIONS
    layernorm_embedding: bool = field(default=False, metadata=OMITTED_AT_DEFAULT)
    norm: str = field(default="layer", metadata=OMITTED_AT_DEFAULT)  # one of NORMS
    linear_bias: bool = field(default=True, metadata=OMITTED_AT_DEFAULT)
    ffn_gated: bool = field(default=False, metadata=OMITTED_AT_DEFAULT)
    head_dim: int = field(default=0, metadata=OMITTED_AT_DEFAULT)  # 0: d_model // heads
    attention_scale: float = field(default=0.0, metadata=OMITTED_AT_DEFAULT)  # 0: 1/sqrt(Dh)
    relative_buckets: int = field(default=32, metadata=OMITTED_AT_DEFAULT)
    relative_max_distance: int = field(default=128, metadata=OMITTED_AT_DEFAULT)
    pad_id: int = 0
    eos_id: int = 2
    bos_id: int = 1
    unk_id: int = 3
    decoder_start_id: int = 1
    extra: dict[str, Any] = field(default_factory=dict)  # provenance, never read by the model

    def problems(self) -> list[str]:
        """Every configuration problem at once (CTranslate2-converter style)."""
        out: list[str] = []
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "encoder_layers",
                     "decoder_layers", "encoder_heads", "decoder_heads", "encoder_ffn_dim",
                     "decoder_ffn_dim", "max_positions"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("encoder_heads", "decoder_heads"):
            heads = getattr(self, name)
            if heads >= 1 and not self.head_dim and self.d_model % heads:
                out.append(f"d_model ({self.d_model}) must be divisible by {name} ({heads})")
        if self.activation not in ACTIVATIONS:
            out.append(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.position_layout not in POSITION_LAYOUTS:
            out.append(
                f"position_layout must be one of {POSITION_LAYOUTS}, got {self.position_layout!r}"
            )
        if self.positions not in POSITIONS:
            out.append(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.norm not in NORMS:
            out.append(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.head_dim < 0:
            out.append(f"head_dim must be >= 0 (0: d_model // heads), got {self.head_dim}")
        if self.attention_scale < 0:
            out.append(f"attention_scale must be >= 0 (0: 1/sqrt(head_dim)), "
                       f"got {self.attention_scale}")
        if self.positions == "relative":
            if self.relative_buckets < 2:
                out.append(f"relative_buckets must be >= 2, got {self.relative_buckets}")
            if self.relative_max_distance < 2:
                out.append(f"relative_max_distance must be >= 2, "
                           f"got {self.relative_max_distance}")
        if self.positions == "sinusoid" and self.d_model % 2:
            out.append(f"d_model must be even for sinusoidal positions, got {self.d_model}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                out.append(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            out.append(
                "share_embeddings needs src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}"
            )
        for name in ("pad_id", "eos_id", "bos_id", "unk_id", "decoder_start_id"):
            value = getattr(self, name)
            if not 0 <= value < self.tgt_vocab_size:
                out.append(f"{name} must be in [0, {self.tgt_vocab_size}), got {value}")
        # The source embedding is built with padding_idx=pad_id as well.
        if not 0 <= self.pad_id < self.src_vocab_size:
            out.append(f"pad_id must be in [0, {self.src_vocab_size}) (src_vocab_size), "
                       f"got {self.pad_id}")
        return out

    def heads_dim(self, heads: int) -> int:
        """The size of one attention head: head_dim, or d_model // heads."""
        return self.head_dim or self.d_model // heads

    @property
    def decoder_head_dim(self) -> int:
        return self.heads_dim(self.decoder_heads)

    def validate(self) -> ModelConfig:
        problems = self.problems()
        if problems:
            raise ValueError("invalid ModelConfig:\n  " + "\n  ".join(problems))
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {', '.join(unknown)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        return cls.from_dict(json.loads(text))
