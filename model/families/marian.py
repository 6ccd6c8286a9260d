"""Load a Hugging Face MarianMTModel directory (OPUS-MT) into `Seq2SeqTransformer`.

Reads `config.json` as plain JSON and the weights with `safetensors` or
`torch.load(weights_only=True)`: `transformers` is never imported here (it is a
test-only dependency) and nothing is fetched from the hub.

Every problem found (files, config values, tensor names and shapes) is collected
before failing, CTranslate2-converter style, and raised as one `ConversionError`.

Exactness notes (checked against transformers 5.23 `modeling_marian.py`):
- Marian is post-norm with no final stack LayerNorm, LayerNorm eps 1e-5.
- Positions are sinusoids with sines in the first half of the vector, starting
  at position 0 for both encoder and decoder; the stored `embed_positions`
  tables are recomputed by our model, so they are only checked here.
- Token embeddings are scaled by sqrt(d_model) iff `scale_embedding`.
- Logits get `final_logits_bias` (a (1, V) buffer, zeros when absent); an
  all-zero one (OPUS-MT's) is dropped rather than added every step.
- Ties: in transformers 5 `tie_word_embeddings=false` unties *everything*,
  including the encoder/decoder embeddings that `share_encoder_decoder_embeddings`
  would otherwise tie. We therefore take each matrix from the tensor that module
  actually reads, and share/tie in our model only where the tensors are equal.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2serve.model.config import ModelConfig
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
    check_sinusoid_positions,
    check_state,
    config_ints,
    hf_prefix,
    is_int,
    layer_names,
    logits_bias,
    one_eos,
    read_folder,
    same,
    tied_embeddings,
)
from seq2serve.model.families.source import Source, SourceError
from seq2serve.model.transformer import Seq2SeqTransformer

# transformers' MarianConfig defaults: a config.json that omits a field means these.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101,
    "decoder_vocab_size": None,
    "max_position_embeddings": 1024,
    "encoder_layers": 12,
    "encoder_ffn_dim": 4096,
    "encoder_attention_heads": 16,
    "decoder_layers": 12,
    "decoder_ffn_dim": 4096,
    "decoder_attention_heads": 16,
    "activation_function": "gelu",
    "d_model": 1024,
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "decoder_start_token_id": 58100,
    "scale_embedding": False,
    "pad_token_id": 58100,
    "eos_token_id": 0,
    "bos_token_id": None,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
}

# BART-era flags that old Marian conversions wrote. transformers' Marian ignores
# them and always computes post-norm without extra LayerNorms, so a value other
# than the Marian one means the checkpoint is not what its config claims.
MARIAN_FLAG_VALUES = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": False,
    "layernorm_embedding": False,
    "add_bias_logits": False,
    "static_position_embeddings": True,
    "is_decoder": False,
}

SUPPORTED_ARCHITECTURES = ("MarianMTModel", "MarianModel")


# -- config ----------------------------------------------------------------------


def _unk_id(path: Path | None, hf: Mapping[str, Any]) -> tuple[int, str]:
    """Marian configs carry no unk id; the tokenizer's vocab.json does."""
    if is_int(hf.get("unk_token_id")):
        return hf["unk_token_id"], "config.json"
    if path is not None and (path / "vocab.json").is_file():
        try:
            vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
            if is_int(vocab.get("<unk>")):
                return vocab["<unk>"], "vocab.json"
        except (OSError, ValueError, AttributeError):
            pass
    return 1, "OPUS-MT convention (</s>=0, <unk>=1)"


def marian_config(hf_config: Mapping[str, Any], problems: list[str] | None = None,
                  path: Path | None = None) -> ModelConfig:
    """Our `ModelConfig` for a Marian config.json. Without `problems`, raises a
    `ConversionError` listing every problem; with it, appends to it and returns a
    best-effort config (so weight problems can be reported in the same error)."""
    own = problems is None
    found: list[str] = [] if own else problems
    hf = {**HF_DEFAULTS, **hf_config}

    if hf_config.get("model_type") != "marian":
        found.append(f"model_type must be 'marian', got {hf_config.get('model_type')!r}")
    check_architectures(hf_config, SUPPORTED_ARCHITECTURES, found)
    for flag, marian_value in MARIAN_FLAG_VALUES.items():
        if flag in hf_config and hf_config[flag] is not None and hf_config[flag] != marian_value:
            found.append(f"{flag}={hf_config[flag]!r} is not supported (Marian has "
                         f"{flag}={marian_value!r})")

    ints = config_ints(hf, ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
                            "encoder_attention_heads", "decoder_attention_heads",
                            "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
                            "pad_token_id", "decoder_start_token_id"), found)
    decoder_vocab = hf["decoder_vocab_size"] if hf["decoder_vocab_size"] is not None \
        else ints["vocab_size"]
    if not is_int(decoder_vocab):
        found.append(f"decoder_vocab_size must be an integer, got {decoder_vocab!r}")
        decoder_vocab = ints["vocab_size"]
    if hf["share_encoder_decoder_embeddings"] and decoder_vocab != ints["vocab_size"]:
        found.append("share_encoder_decoder_embeddings needs decoder_vocab_size == vocab_size, "
                     f"got {decoder_vocab} and {ints['vocab_size']}")

    # ModelConfig checks ids against the target vocabulary only, but the source
    # embedding is built with padding_idx=pad_id too.
    if ints["pad_token_id"] >= ints["vocab_size"]:
        found.append(f"pad_token_id ({ints['pad_token_id']}) must be < vocab_size "
                     f"({ints['vocab_size']})")

    eos = one_eos(hf, 0, found)

    activation = ACTIVATION_MAP.get(hf["activation_function"])
    if activation is None:
        found.append(f"activation_function must be one of {sorted(ACTIVATION_MAP)}, "
                     f"got {hf['activation_function']!r}")
        activation = "relu"

    # Marian has no BOS token; the decoder starts from pad. Keep the id in range.
    bos = hf["bos_token_id"] if is_int(hf["bos_token_id"]) else ints["decoder_start_token_id"]
    unk, unk_source = _unk_id(path, hf_config)
    cfg = ModelConfig(
        src_vocab_size=ints["vocab_size"],
        tgt_vocab_size=decoder_vocab,
        d_model=ints["d_model"],
        encoder_layers=ints["encoder_layers"],
        decoder_layers=ints["decoder_layers"],
        encoder_heads=ints["encoder_attention_heads"],
        decoder_heads=ints["decoder_attention_heads"],
        encoder_ffn_dim=ints["encoder_ffn_dim"],
        decoder_ffn_dim=ints["decoder_ffn_dim"],
        max_positions=ints["max_position_embeddings"],
        dropout=float(hf["dropout"]),
        attention_dropout=float(hf["attention_dropout"]),
        activation_dropout=float(hf["activation_dropout"]),
        activation=activation,
        pre_norm=False,
        layer_norm_eps=1e-5,  # transformers' nn.LayerNorm default, not configurable
        scale_embedding=bool(hf["scale_embedding"]),
        # transformers 5 unties everything when tie_word_embeddings is false;
        # convert_marian() re-ties where the stored tensors turn out equal.
        share_embeddings=bool(hf["share_encoder_decoder_embeddings"]
                              and hf["tie_word_embeddings"]),
        tie_output=bool(hf["tie_word_embeddings"]),
        final_logits_bias=True,
        position_layout="split",
        pad_id=ints["pad_token_id"],
        eos_id=eos,
        bos_id=bos,
        unk_id=unk,
        decoder_start_id=ints["decoder_start_token_id"],
        extra={
            "source": "huggingface-marian",
            "transformers_version": hf_config.get("transformers_version"),
            "unk_id_from": unk_source,
            "bos_id_from": "config.json" if is_int(hf["bos_token_id"])
            else "decoder_start_token_id (Marian has no BOS)",
        },
    )
    found.extend(cfg.problems())
    if own and found:
        raise ConversionError("config", found)
    return cfg


# -- weights ---------------------------------------------------------------------


def convert_marian(path: str | Path) -> tuple[ModelConfig, dict[str, Tensor]]:
    """(ModelConfig, state dict for `Seq2SeqTransformer`) from a Marian directory,
    or one `ConversionError` listing every problem found."""
    path = Path(path)
    hf, stored, problems = read_folder(path)
    cfg = marian_config(hf, problems, path)
    if stored is None or problems:
        # Config problems make expected tensor shapes meaningless; report what we have.
        raise ConversionError(path, problems)

    prefix = hf_prefix(stored)
    weights = Weights(stored)
    embeddings = tied_embeddings(
        weights, prefix, share=bool(hf.get("share_encoder_decoder_embeddings", True)),
        tie=bool(hf.get("tie_word_embeddings", True)), problems=problems)
    enc, dec, out = embeddings.source, embeddings.target, embeddings.output
    # Share/tie in our model exactly where the matrices are equal: same outputs, less memory.
    # (Only where the config's vocabularies agree: wrong shapes are reported below.)
    cfg = dataclasses.replace(
        cfg, share_embeddings=same(enc, dec) and cfg.src_vocab_size == cfg.tgt_vocab_size,
        tie_output=same(out, dec))
    sd: dict[str, Tensor | None] = {"src_embed.weight": enc, "tgt_embed.weight": dec,
                                    "output.weight": out}
    bias = logits_bias(weights)
    if bias is None:
        cfg = dataclasses.replace(cfg, final_logits_bias=False)
    else:
        sd["final_logits_bias"] = bias
    hf_names = dict(embeddings.names)
    for ours, theirs in layer_names(cfg, prefix).items():
        sd[ours] = weights.take(theirs)
        hf_names[ours] = theirs
    check_sinusoid_positions(cfg, weights, prefix, "Marian", problems)
    state = check_state(cfg, sd, hf_names, weights, problems)
    if problems:
        # A tied matrix is checked once per use; say each thing once.
        raise ConversionError(path, dict.fromkeys(problems))
    cfg.extra["path"] = str(path)
    return cfg, state


def load_marian(path: str | Path, dtype: torch.dtype = torch.float32) -> Seq2SeqTransformer:
    """A `Seq2SeqTransformer` in eval mode with the Marian checkpoint's weights."""
    cfg, state = convert_marian(path)
    return build_model(cfg, state, dtype)


# -- the exporter's source ----------------------------------------------------------


def _marian_languages(path: Path) -> tuple[str, str]:
    """From tokenizer_config.json, else from an opus-mt-SRC-TGT directory name."""
    cfg_file = path / "tokenizer_config.json"
    if cfg_file.is_file():
        data = json.loads(cfg_file.read_text(encoding="utf-8"))
        if data.get("source_lang") and data.get("target_lang"):
            return str(data["source_lang"]), str(data["target_lang"])
    parts = path.resolve().name.split("-")
    if len(parts) >= 4 and parts[0] == "opus" and parts[1] == "mt":
        return parts[2], parts[3]
    return "und", "und"


def load_source(path: Path, task: str | None = None) -> Source:
    """A Marian (OPUS-MT) folder as the exporter takes it: the model, its two
    SentencePiece models and vocab.json, its languages and generation defaults."""
    problems: list[str] = []
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (path / name).is_file():
            problems.append(f"{name}: missing (a Marian directory needs the tokenizer files)")
    tokenizer_cfg = path / "tokenizer_config.json"
    if tokenizer_cfg.is_file():
        if json.loads(tokenizer_cfg.read_text(encoding="utf-8")).get("separate_vocabs"):
            problems.append("tokenizer_config.json: separate_vocabs is not supported")
    model = None
    try:
        model = load_marian(path)
    except ConversionError as e:
        problems.extend(e.problems)
    vocab: dict[str, int] = {}
    if (path / "vocab.json").is_file():
        try:
            vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            problems.append(f"vocab.json: not valid JSON ({e})")
    if model is not None and vocab and max(vocab.values()) >= model.cfg.tgt_vocab_size:
        problems.append(f"vocab.json: ids reach {max(vocab.values())} but the model's "
                        f"vocabulary has {model.cfg.tgt_vocab_size} entries")
    # Its keys that the package does not apply (a decoder_start_token_id of its own
    # among them) are export's to refuse (generation_keys.py).
    settings = generate_settings(path, problems)
    if problems or model is None:
        raise SourceError(path, problems)
    src, tgt = _marian_languages(path)
    return Source(
        kind="marian",
        model=model,
        name=path.resolve().name,
        task=task or "translate",
        source_language=src,
        target_language=tgt,
        source_spm=path / "source.spm",
        target_spm=path / "target.spm",
        vocab=vocab,
        generation=generation_from_hf(settings, model.cfg.max_positions),
        suppress=suppressed_by_hf(settings),
        origin={"format": "huggingface-marian"},
    )
