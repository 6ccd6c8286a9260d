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
from seq2serve.model.families.source import Source, SourceError
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
    group = ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
    present = [name for name in group if name in weights]
    for name in present[1:]:
        weights.used.add(name)
        if not same(weights.tensors[name], weights.tensors[present[0]]):
            problems.append(f"{name} differs from {present[0]} (T5 shares one embedding)")
    shared = weights.take(*present) if present else None
    output = weights.take("lm_head.weight")
    if output is None:
        output = shared
    # Hugging Face stores (and ignores) a relative bias for the first cross-attention.
    weights.take("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")
    sd: dict[str, Tensor | None] = {"src_embed.weight": shared, "tgt_embed.weight": shared,
                                    "output.weight": output}
    hf_names = {"src_embed.weight": " = ".join(present or group),
                "tgt_embed.weight": " = ".join(present or group),
                "output.weight": "lm_head.weight" if "lm_head.weight" in weights else
                " = ".join(present or group)}
    cfg.tie_output = same(output, shared)
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


def _task(hf: Mapping[str, Any]) -> tuple[str | None, str | None, str | None, dict[str, Any]]:
    """(task, source language, target language, that task's parameters) from
    task_specific_params: summarization, or translation_X_to_Y (the first in
    sorted order when there are several; `export --task` picks the kind)."""
    params = hf.get("task_specific_params")
    if not isinstance(params, dict):
        return None, None, None, {}
    for key in sorted(params):
        value = params[key] if isinstance(params[key], dict) else {}
        if key.startswith("summarization"):
            return "summarize", "en", "en", value
    for key in sorted(params):
        value = params[key] if isinstance(params[key], dict) else {}
        parts = key.split("_")
        if len(parts) == 4 and parts[0] == "translation" and parts[2] == "to":
            return "translate", parts[1], parts[3], value
    return None, None, None, {}


def _task_for(hf: Mapping[str, Any], task: str) -> tuple[str, str, dict[str, Any]]:
    """The languages and parameters of the folder's entry for `task`, where it has one."""
    params = hf.get("task_specific_params")
    if isinstance(params, dict):
        for key in sorted(params):
            value = params[key] if isinstance(params[key], dict) else {}
            if task == "summarize" and key.startswith("summarization"):
                return "en", "en", value
            parts = key.split("_")
            if (task == "translate" and len(parts) == 4 and parts[0] == "translation"
                    and parts[2] == "to"):
                return parts[1], parts[3], value
    return "en", "en", {}


def load_source(path: Path, task: str | None = None) -> Source:
    """A T5 / mT5 folder as the exporter takes it: the model, its tokenizer.json,
    its task (`task`, as `export --task` asks, else the folder's
    task_specific_params: summarization or translation_X_to_Y) and generation
    defaults. The task's input prefix ("summarize: ") becomes the manifest's
    input_prefix, which the server adds before every text."""
    problems: list[str] = []
    hf: dict[str, Any] = {}
    try:
        loaded = json.loads((path / "config.json").read_text(encoding="utf-8"))
        hf = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass  # load_t5 reports it
    said, src_lang, tgt_lang, task_params = _task(hf)
    if task is not None and task != said:
        src_lang, tgt_lang, task_params = _task_for(hf, task)
    task = task or said
    if task is None:
        problems.append("config.json: task_specific_params names no summarization or "
                        "translation task and a T5 folder must say its task: export it "
                        "with --task (summarize or translate)")
    tokenizer_json = hf_tokenizer_json(path, problems, ("spiece.model",), "T5TokenizerFast",
                                       "T5")
    model = None
    try:
        model = load_t5(path)
    except ConversionError as e:
        problems.extend(e.problems)
    if tokenizer_json is not None and model is not None:
        check_tokenizer_ids(tokenizer_json, model.cfg.tgt_vocab_size, "T5", problems)
    if problems or model is None or tokenizer_json is None or task is None:
        raise SourceError(path, problems)
    settings = generate_settings(path, problems)
    if problems:
        raise SourceError(path, problems)
    prefix = task_params.get("prefix")
    return Source(
        kind=str(hf.get("model_type")),
        model=model,
        name=path.resolve().name,
        task=task,
        source_language=src_lang or "en",
        target_language=tgt_lang or "en",
        tokenizer_json=tokenizer_json,
        generation=generation_from_hf(settings, model.cfg.max_positions),
        suppress=suppressed_by_hf(settings),
        origin={"format": f"huggingface-{hf.get('model_type')}"},
        input_prefix=prefix if isinstance(prefix, str) else "",
    )
