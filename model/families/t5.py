"""Load a Hugging Face T5 directory (T5ForConditionalGeneration: T5, T5 v1.1,
Flan-T5; MT5ForConditionalGeneration: mT5) into `Seq2SeqTransformer`.

Reads `config.json` as plain JSON and the weights with `safetensors` or
`torch.load(weights_only=True)`; `transformers` is imported only to build a
tokenizer.json from spiece.model for a folder that has none (at export, never in
the server). Every problem found is collected before failing and raised as one
`ConversionError` / `SourceError`.

Exactness notes (checked against transformers 5.24 `modeling_t5.py` / `modeling_mt5.py`):
- Pre-norm with T5's RMSNorm (no mean, no bias, variance in fp32) and a final norm
  per stack; no bias in any projection; no absolute positions and no embedding
  scale; attention scores are not scaled (scale 1.0).
- Heads are d_kv wide: num_heads * d_kv may differ from d_model (`head_dim`).
- Relative position bias: the first layer of each stack holds a
  (relative_attention_num_buckets, num_heads) table; every self-attention layer of
  the stack adds its bias (bidirectional buckets in the encoder, causal in the
  decoder); cross-attention has none. A cached decoder step computes each row's
  bias from its own position, so rows at different steps share one batch.
- Feed-forward: `feed_forward_proj` "relu" (T5), or "gated-gelu" (T5 v1.1,
  Flan-T5, mT5: gelu_new(wi_0 x) * wi_1 x) and other "gated-ACT".
- Output: T5 multiplies the decoder output by d_model**-0.5 when
  `scale_decoder_outputs` (config.json's key where present, else
  `tie_word_embeddings` is not false); mT5 never does. The factor is folded into
  the decoder's final norm weight. The output projection is `lm_head.weight` where
  stored (Flan-T5, mT5), else `shared.weight`.
- The decoder starts from pad (0); eos 1; the model's vocabulary (32128) is
  larger than the tokenizer's: every logits row is kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2serve.model.config import ModelConfig
from seq2serve.model.families import tasks
from seq2serve.model.families.generation import (
    generate_settings,
    generation_from_hf,
    suppressed_by_hf,
)
from seq2serve.model.families.hf import (
    ACTIVATION_MAP,
    ConversionError,
    Weights,
    build_model,
    check_architectures,
    check_state,
    check_tokenizer_ids,
    config_ints,
    is_int,
    one_eos,
    read_folder,
    same,
)
from seq2serve.model.families.hf import (
    tokenizer_json as hf_tokenizer_json,
)
from seq2serve.model.families.source import Source, SourceError, folder_name
from seq2serve.model.families.tasks import TaskRequest
from seq2serve.model.transformer import Seq2SeqTransformer

MODEL_TYPES = ("t5", "mt5")
SUPPORTED_ARCHITECTURES = ("T5ForConditionalGeneration", "MT5ForConditionalGeneration",
                           "T5Model", "MT5Model")

# transformers' T5Config / MT5Config defaults: a config.json that omits a field means these.
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "t5": {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6,
           "num_heads": 8, "feed_forward_proj": "relu"},
    "mt5": {"vocab_size": 250112, "d_model": 512, "d_kv": 64, "d_ff": 1024, "num_layers": 8,
            "num_heads": 6, "feed_forward_proj": "gated-gelu"},
}
COMMON_DEFAULTS: dict[str, Any] = {
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.1,
    "layer_norm_epsilon": 1e-6,
    "pad_token_id": 0,
    "eos_token_id": 1,
}


def scales_decoder_output(hf_config: Mapping[str, Any]) -> bool:
    """Whether transformers 5 multiplies the decoder output by d_model**-0.5."""
    if hf_config.get("model_type") != "t5":
        return False  # mT5 never
    if "scale_decoder_outputs" in hf_config:
        return bool(hf_config["scale_decoder_outputs"])
    return hf_config.get("tie_word_embeddings", None) is not False


def t5_config(hf_config: Mapping[str, Any], problems: list[str] | None = None) -> ModelConfig:
    """Our `ModelConfig` for a T5 / mT5 config.json. Without `problems`, raises a
    `ConversionError` listing every problem; with it, appends to it and returns a
    best-effort config."""
    own = problems is None
    found: list[str] = [] if own else problems
    kind = hf_config.get("model_type")
    if kind not in MODEL_TYPES:
        found.append(f"model_type must be one of {MODEL_TYPES}, got {kind!r}")
        kind = "t5"
    hf = {**COMMON_DEFAULTS, **HF_DEFAULTS[str(kind)],
          **{k: v for k, v in hf_config.items() if v is not None}}
    check_architectures(hf_config, SUPPORTED_ARCHITECTURES, found)
    ints = config_ints(hf, ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                            "relative_attention_num_buckets", "relative_attention_max_distance",
                            "pad_token_id"), found)
    decoder_layers = hf.get("num_decoder_layers", ints["num_layers"])
    if not is_int(decoder_layers):
        found.append(f"num_decoder_layers must be an integer, got {decoder_layers!r}")
        decoder_layers = ints["num_layers"]
    eos = one_eos(hf, 1, found)
    start = hf.get("decoder_start_token_id", ints["pad_token_id"])
    if not is_int(start):
        found.append(f"decoder_start_token_id must be an integer, got {start!r}")
        start = ints["pad_token_id"]
    proj = str(hf["feed_forward_proj"])
    parts = proj.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    act_name = "gelu_new" if proj == "gated-gelu" else parts[-1]
    activation = ACTIVATION_MAP.get(act_name)
    if activation is None or len(parts) > 2 or (len(parts) == 2 and not gated):
        found.append(f"feed_forward_proj must be ACT or gated-ACT with ACT one of "
                     f"{sorted(ACTIVATION_MAP)}, got {proj!r}")
        activation = "relu"
    unk = hf.get("unk_token_id", 2)
    cfg = ModelConfig(
        src_vocab_size=ints["vocab_size"],
        tgt_vocab_size=ints["vocab_size"],
        d_model=ints["d_model"],
        encoder_layers=ints["num_layers"],
        decoder_layers=decoder_layers,
        encoder_heads=ints["num_heads"],
        decoder_heads=ints["num_heads"],
        encoder_ffn_dim=ints["d_ff"],
        decoder_ffn_dim=ints["d_ff"],
        max_positions=int(hf.get("n_positions", 512)) if is_int(hf.get("n_positions", 512))
        else 512,
        dropout=float(hf["dropout_rate"]),
        attention_dropout=0.0,
        activation_dropout=float(hf["dropout_rate"]),
        activation=activation,
        pre_norm=True,
        layer_norm_eps=float(hf["layer_norm_epsilon"]),
        scale_embedding=False,
        share_embeddings=True,
        tie_output=True,
        final_logits_bias=False,
        positions="relative",
        norm="rms",
        linear_bias=False,
        ffn_gated=gated,
        head_dim=ints["d_kv"],
        attention_scale=1.0,
        relative_buckets=ints["relative_attention_num_buckets"],
        relative_max_distance=ints["relative_attention_max_distance"],
        pad_id=ints["pad_token_id"],
        eos_id=eos,
        bos_id=ints["pad_token_id"],  # T5 has no <s>
        unk_id=unk if is_int(unk) else 2,
        decoder_start_id=start,
        extra={
            "source": f"huggingface-{kind}",
            "transformers_version": hf_config.get("transformers_version"),
            "decoder_output_scaled": scales_decoder_output(hf_config),
        },
    )
    found.extend(cfg.problems())
    if own and found:
        raise ConversionError("config", found)
    return cfg


# -- weights ---------------------------------------------------------------------


def _names(cfg: ModelConfig, gated: bool) -> dict[str, str]:
    """our name -> HF name for every per-layer and per-stack tensor (not the embeddings)."""
    names: dict[str, str] = {
        "encoder_norm.weight": "encoder.final_layer_norm.weight",
        "decoder_norm.weight": "decoder.final_layer_norm.weight",
    }
    for side, ours in (("encoder", "src"), ("decoder", "tgt")):
        names[f"{ours}_relative.weight"] = (
            f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
    attn = (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o"))
    ffn = ((("ffn.fc1", "wi_0"), ("ffn.fc_gate", "wi_1")) if gated else (("ffn.fc1", "wi"),))
    ffn += (("ffn.fc2", "wo"),)

    def block(ours: str, theirs: str, sublayers: list[tuple[str, str, str]], ff: int) -> None:
        for i, (norm, module, hf_module) in enumerate(sublayers):
            names[f"{ours}{norm}.norm.weight"] = f"{theirs}{i}.layer_norm.weight"
            for a, b in attn:
                names[f"{ours}{module}.{a}.weight"] = f"{theirs}{i}.{hf_module}.{b}.weight"
        for a, b in ffn:
            names[f"{ours}{a}.weight"] = f"{theirs}{ff}.DenseReluDense.{b}.weight"
        names[f"{ours}ffn_block.norm.weight"] = f"{theirs}{ff}.layer_norm.weight"

    for i in range(cfg.encoder_layers):
        block(f"encoder_layers.{i}.", f"encoder.block.{i}.layer.",
              [("attn_block", "self_attn", "SelfAttention")], 1)
    for i in range(cfg.decoder_layers):
        block(f"decoder_layers.{i}.", f"decoder.block.{i}.layer.",
              [("self_block", "self_attn", "SelfAttention"),
               ("cross_block", "cross_attn", "EncDecAttention")], 2)
    return names


SHARED = "shared.weight"
ENCODER_EMBEDDING = "encoder.embed_tokens.weight"
DECODER_EMBEDDING = "decoder.embed_tokens.weight"
OUTPUT = "lm_head.weight"


def tied_as_transformers(weights: Weights) -> tuple[dict[str, Tensor | None], dict[str, str]]:
    """The matrices T5's encoder, decoder and output read, as transformers 5 loads
    them (`PreTrainedModel.tie_weights` during from_pretrained, T5Config and MT5Config
    forcing tie_word_embeddings): each of encoder.embed_tokens, decoder.embed_tokens
    and lm_head is tied to `shared` unless the checkpoint stores both with different
    values (then each keeps its own: a T5 trained untied, transformers' "will NOT tie
    them"); a tie whose source is missing reads the target instead (swapped), or
    another stored target of the same source. Returns (HF name -> tensor, our name ->
    the HF names to cite)."""
    names = (SHARED, ENCODER_EMBEDDING, DECODER_EMBEDDING, OUTPUT)
    value = {name: weights.take(name) for name in names}
    missing = {name for name in names if value[name] is None}
    pairs = [(ENCODER_EMBEDDING, SHARED), (DECODER_EMBEDDING, SHARED), (OUTPUT, SHARED)]
    cited = {name: name for name in names}
    for i, (target, source) in enumerate(pairs):
        if source not in missing and target not in missing:
            if not same(value[source], value[target]):
                continue  # held apart: transformers does not tie them
        elif target not in missing:
            target, source = source, target
        elif source in missing:
            source = next((t for t, s in pairs[i + 1:] if s == source and t not in missing),
                          source)
            if source in missing:
                continue  # nothing to read: reported as a missing tensor
        value[target] = value[source]
        cited[target] = f"{target} (tied to {source})"
        missing.discard(target)
    return value, {"src_embed.weight": cited[ENCODER_EMBEDDING],
                   "tgt_embed.weight": cited[DECODER_EMBEDDING], "output.weight": cited[OUTPUT]}


def convert_t5(path: str | Path) -> tuple[ModelConfig, dict[str, Tensor]]:
    """(ModelConfig, state dict for `Seq2SeqTransformer`) from a T5 / mT5 directory,
    or one `ConversionError` listing every problem found."""
    path = Path(path)
    hf, stored, problems = read_folder(path)
    cfg = t5_config(hf, problems)
    if stored is None or problems:
        raise ConversionError(path, problems)
    # A bare T5Model's tensors carry no prefix; ...ForConditionalGeneration's neither.
    weights = Weights(stored)
    tied, hf_names = tied_as_transformers(weights)
    # Hugging Face stores (and ignores) a relative bias for the first cross-attention.
    weights.take("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")
    sd: dict[str, Tensor | None] = {
        ours: tied[theirs] for ours, theirs in (("src_embed.weight", ENCODER_EMBEDDING),
                                                ("tgt_embed.weight", DECODER_EMBEDDING),
                                                ("output.weight", OUTPUT))}
    # Share and tie in our model exactly where the matrices are equal (one copy each).
    cfg.share_embeddings = same(sd["src_embed.weight"], sd["tgt_embed.weight"])
    cfg.tie_output = same(sd["output.weight"], sd["tgt_embed.weight"])
    names = _names(cfg, cfg.ffn_gated)
    for ours, theirs in names.items():
        sd[ours] = weights.take(theirs)
        hf_names[ours] = theirs
    if cfg.extra.get("decoder_output_scaled") and sd["decoder_norm.weight"] is not None:
        sd["decoder_norm.weight"] = sd["decoder_norm.weight"] * cfg.d_model ** -0.5
    state = check_state(cfg, sd, hf_names, weights, problems)
    if problems:
        raise ConversionError(path, dict.fromkeys(problems))
    cfg.extra["path"] = str(path)
    return cfg, state


def load_t5(path: str | Path, dtype: torch.dtype = torch.float32) -> Seq2SeqTransformer:
    """A `Seq2SeqTransformer` in eval mode with the T5 / mT5 checkpoint's weights."""
    cfg, state = convert_t5(path)
    return build_model(cfg, state, dtype)


# -- the exporter's source ----------------------------------------------------------


def load_source(path: Path, task: TaskRequest | None = None) -> Source:
    """A T5 / mT5 folder as the exporter takes it: the model, its tokenizer.json,
    its task (`task`, as `export --task` asks, else the one task_specific_params
    names: summarization or translation_X_to_Y; tasks.py) and generation defaults
    (the folder's generation_config, the task's entry applied over it as the
    pipeline applied it). The entry's input prefix ("summarize: ") becomes the
    manifest's input_prefix, which the server adds before every text."""
    problems: list[str] = []
    hf: dict[str, Any] = {}
    try:
        loaded = json.loads((path / "config.json").read_text(encoding="utf-8"))
        hf = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass  # load_t5 reports it
    resolved = tasks.resolve(hf, task, (tasks.SUMMARIZE, tasks.TRANSLATE),
                             "mT5" if hf.get("model_type") == "mt5" else "T5", problems)
    tokenizer_json = hf_tokenizer_json(path, problems, ("spiece.model",), "T5TokenizerFast",
                                       "T5")
    model = None
    try:
        model = load_t5(path)
    except ConversionError as e:
        problems.extend(e.problems)
    if tokenizer_json is not None and model is not None:
        check_tokenizer_ids(tokenizer_json, model.cfg.tgt_vocab_size, "T5", problems)
    if problems or model is None or tokenizer_json is None or resolved is None:
        raise SourceError(path, problems)
    settings = resolved.generation_settings(generate_settings(path, problems))
    if problems:
        raise SourceError(path, problems)
    return Source(
        kind=str(hf.get("model_type")),
        model=model,
        name=folder_name(path),
        task=resolved.kind,
        source_language=resolved.source_language,
        target_language=resolved.target_language,
        tokenizer_json=tokenizer_json,
        generation=generation_from_hf(settings, model.cfg.max_positions),
        suppress=suppressed_by_hf(settings),
        origin={"format": f"huggingface-{hf.get('model_type')}", **resolved.origin()},
        input_prefix=resolved.prefix,
    )
