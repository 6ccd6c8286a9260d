"""Load a Hugging Face BART directory (BartForConditionalGeneration, e.g.
facebook/bart-large-cnn) into `Seq2SeqTransformer`.

Reads `config.json` as plain JSON and the weights with `safetensors` or
`torch.load(weights_only=True)`; `transformers` is imported only to build a
tokenizer.json from vocab.json + merges.txt for a folder that has none (at
export, never in the server). Every problem found is collected before failing
and raised as one `ConversionError` / `SourceError`.

Exactness notes (checked against transformers 5.24 `modeling_bart.py`):
- BART is post-norm with no final stack LayerNorm, LayerNorm eps 1e-5; its
  layers carry Marian's tensor names (the shared table in hf.py).
- Positions are learned, one table per stack, looked up at position + 2 (the
  offset of `BartLearnedPositionalEmbedding`): the offset is folded at
  conversion, our table being the stored one from row 2 on.
- `layernorm_embedding`: a LayerNorm after token embedding (scaled by
  sqrt(d_model) iff `scale_embedding`) + position, in the encoder and decoder.
- Logits get `final_logits_bias` (dropped when all zeros).
- Ties as Marian's in transformers 5, BART always sharing one matrix between
  encoder and decoder: `tie_word_embeddings=false` unties everything; we share
  and tie in our model exactly where the stored tensors are equal.
- The decoder starts from </s> (decoder_start_token_id 2); bos <s> 0, pad 1,
  eos 2, unk <unk> (the tokenizer's, 3 by convention).
- Generation: as generate() under the folder's generation_config.json
  (generation.py), bart-large-cnn's forced <s> first (forced_bos_token_id) and
  </s> at the limit (forced_eos_token_id) included.

The families of BART's layout (Pegasus: pegasus.py) reuse this module through a
`Layout`: what the family fixes (defaults, old keys, structure, tokenizer files) and
two hooks (the stacks' tensors outside their layers; the unk id's fallback).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
    TOKENIZER_JSON,
    ConversionError,
    Weights,
    build_model,
    check_architectures,
    check_state,
    check_tokenizer_ids,
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
from seq2serve.model.families.hf import (
    tokenizer_json as hf_tokenizer_json,
)
from seq2serve.model.families.source import Source, SourceError, folder_name
from seq2serve.model.families.tasks import TaskRequest
from seq2serve.model.transformer import Seq2SeqTransformer

# transformers' BartConfig defaults: a config.json that omits a field means these.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50265,
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
    "scale_embedding": False,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
    "tie_word_embeddings": True,
}

# Keys of older (transformers 2/3) BART configs. transformers 5's BART ignores
# them and always computes post-norm with learned positions and no final stack
# LayerNorm (mBART's layout has them): another value means another model.
BART_FLAG_VALUES = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "static_position_embeddings": False,
    "add_bias_logits": False,
    "normalize_embedding": True,
}

SUPPORTED_ARCHITECTURES = ("BartForConditionalGeneration", "BartModel")
POSITION_OFFSET = 2  # BartLearnedPositionalEmbedding looks position p up at row p + 2


# -- the layout's families -----------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What a family of BART's layout fixes (BART's: `BART`, below; Marian's,
    Pegasus's, mBART's, M2M100's in their modules): config.json's defaults, the old
    keys it refuses (key -> the value its structure has), the ModelConfig fields its
    architecture fixes, its tokenizer files (transformers' `tokenizer_class` builds
    tokenizer.json from them at export where absent), and two hooks: `stack_tensors`
    (each stack's tensors outside its layers by our name, and the HF names to cite)
    and `fallback_unk` (the unk id where neither config.json nor tokenizer.json
    says)."""

    name: str  # in messages
    model_type: str
    architectures: tuple[str, ...]
    hf_defaults: Mapping[str, Any]
    flag_values: Mapping[str, Any]
    structure: Mapping[str, Any]
    stack_tensors: Callable[[ModelConfig, Weights, str, list[str]],
                            tuple[dict[str, Tensor | None], dict[str, str]]]
    fallback_unk: Callable[[Path | None], tuple[int, str]]
    tokenizer_files: tuple[str, ...]
    tokenizer_class: str
    # Marian's: the config key that says whether encoder and decoder share one
    # embedding (None: they always do, as BART's), and the one of a decoder
    # vocabulary of its own (None: the encoder's).
    share_key: str | None = None
    decoder_vocab_key: str | None = None


# -- config ----------------------------------------------------------------------


def tokenizer_json_unk(file: Path) -> int | None:
    """The unk id a tokenizer.json says: "<unk>" of a BPE vocabulary (a mapping),
    a Unigram model's unk_id (its vocabulary is a list)."""
    try:
        model = json.loads(file.read_text(encoding="utf-8")).get("model", {})
        vocab = model.get("vocab")
        unk = vocab.get("<unk>") if isinstance(vocab, dict) else model.get("unk_id")
    except (OSError, ValueError, AttributeError):
        return None
    return unk if is_int(unk) else None


def vocab_json_unk(path: Path | None) -> tuple[int, str]:
    """The unk id of the folder's vocab.json (BART's, M2M100's), else BART's
    convention."""
    if path is not None and (path / "vocab.json").is_file():
        try:
            unk = json.loads((path / "vocab.json").read_text(encoding="utf-8")).get("<unk>")
            if is_int(unk):
                return unk, "vocab.json"
        except (OSError, ValueError, AttributeError):
            pass
    return 3, "BART convention (<s>=0, <pad>=1, </s>=2, <unk>=3)"


def _unk_id(path: Path | None, hf: Mapping[str, Any], layout: Layout,
            tokenizer_json: Path | None = None) -> tuple[int, str]:
    """The family's configs carry no unk id; the tokenizer's vocabulary does
    (`tokenizer_json`, else the folder's)."""
    if is_int(hf.get("unk_token_id")):
        return hf["unk_token_id"], "config.json"
    if tokenizer_json is None and path is not None and (path / TOKENIZER_JSON).is_file():
        tokenizer_json = path / TOKENIZER_JSON
    if tokenizer_json is not None and (unk := tokenizer_json_unk(tokenizer_json)) is not None:
        return unk, TOKENIZER_JSON
    return layout.fallback_unk(path)


def _vocabularies(hf: Mapping[str, Any], ints: Mapping[str, int], layout: Layout,
                  problems: list[str]) -> tuple[bool, int]:
    """(whether encoder and decoder share one embedding, the decoder's vocabulary
    size) under `layout`'s keys; the pad id within the source vocabulary, whose
    embedding has it as padding_idx too (ModelConfig checks the target's)."""
    share = bool(hf[layout.share_key]) if layout.share_key is not None else True
    decoder_vocab = ints["vocab_size"]
    key = layout.decoder_vocab_key
    if key is not None and hf.get(key) is not None:
        if is_int(hf[key]):
            decoder_vocab = hf[key]
        else:
            problems.append(f"{key} must be an integer, got {hf[key]!r}")
    if share and decoder_vocab != ints["vocab_size"]:
        problems.append(f"{layout.share_key} needs {key} == vocab_size, got {decoder_vocab} "
                        f"and {ints['vocab_size']}")
    if ints["pad_token_id"] >= ints["vocab_size"]:
        problems.append(f"pad_token_id ({ints['pad_token_id']}) must be < vocab_size "
                        f"({ints['vocab_size']})")
    return share, decoder_vocab


def bart_config(hf_config: Mapping[str, Any], problems: list[str] | None = None,
                path: Path | None = None, layout: Layout | None = None,
                tokenizer_json: Path | None = None) -> ModelConfig:
    """Our `ModelConfig` for a BART config.json (or one of `layout`'s family).
    Without `problems`, raises a `ConversionError` listing every problem; with it,
    appends to it and returns a best-effort config."""
    layout = layout or BART
    own = problems is None
    found: list[str] = [] if own else problems
    hf = {**layout.hf_defaults, **{k: v for k, v in hf_config.items() if v is not None}}

    if hf_config.get("model_type") != layout.model_type:
        found.append(f"model_type must be {layout.model_type!r}, "
                     f"got {hf_config.get('model_type')!r}")
    check_architectures(hf_config, layout.architectures, found)
    for flag, value in layout.flag_values.items():
        if flag in hf_config and hf_config[flag] is not None and hf_config[flag] != value:
            found.append(f"{flag}={hf_config[flag]!r} is not supported ({layout.name} has "
                         f"{flag}={value!r})")

    ints = config_ints(hf, ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
                            "encoder_attention_heads", "decoder_attention_heads",
                            "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
                            "pad_token_id", "decoder_start_token_id"), found)
    # A family without BOS (Marian, Pegasus) has the decoder start in its place.
    bos = hf.get("bos_token_id")
    if bos is None:
        bos = ints["decoder_start_token_id"]
    elif not is_int(bos):
        found.append(f"bos_token_id must be an integer, got {bos!r}")
        bos = ints["decoder_start_token_id"]
    eos = one_eos(hf, layout.hf_defaults["eos_token_id"], found)
    activation = ACTIVATION_MAP.get(hf["activation_function"])
    if activation is None:
        found.append(f"activation_function must be one of {sorted(ACTIVATION_MAP)}, "
                     f"got {hf['activation_function']!r}")
        activation = "gelu"
    share, decoder_vocab = _vocabularies(hf, ints, layout, found)
    unk, unk_source = _unk_id(path, hf_config, layout, tokenizer_json)
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
        layer_norm_eps=1e-5,  # transformers' nn.LayerNorm default, not configurable
        scale_embedding=bool(hf["scale_embedding"]),
        # transformers 5 unties everything when tie_word_embeddings is false;
        # convert_bart() shares/ties where the stored tensors are equal
        share_embeddings=share and bool(hf["tie_word_embeddings"]),
        tie_output=bool(hf["tie_word_embeddings"]),
        final_logits_bias=True,
        **layout.structure,
        pad_id=ints["pad_token_id"],
        eos_id=eos,
        bos_id=bos,
        unk_id=unk,
        decoder_start_id=ints["decoder_start_token_id"],
        extra={
            "source": f"huggingface-{layout.model_type}",
            "transformers_version": hf_config.get("transformers_version"),
            "unk_id_from": unk_source,
        },
    )
    found.extend(cfg.problems())
    if own and found:
        raise ConversionError("config", found)
    return cfg


# -- weights ---------------------------------------------------------------------


def learned_positions(cfg: ModelConfig, weights: Weights, prefix: str,
                       problems: list[str]) -> tuple[dict[str, Tensor | None], dict[str, str]]:
    """BART's stack tensors: each stack's position table with the offset folded,
    (max_positions, d_model) from the stored (max_positions + 2, d_model); and the
    embedding LayerNorms. With the HF names of each."""
    state: dict[str, Tensor | None] = {}
    names: dict[str, str] = {}
    want = (cfg.max_positions + POSITION_OFFSET, cfg.d_model)
    for side, ours in (("encoder", "src"), ("decoder", "tgt")):
        name = f"{prefix}{side}.embed_positions.weight"
        names[f"{ours}_positions"] = name
        table = weights.take(name)
        if table is None:
            problems.append(f"missing tensor {name}")
        elif tuple(table.shape) != want:
            problems.append(f"{name} has shape {tuple(table.shape)}, expected {want} "
                            f"(max_position_embeddings + {POSITION_OFFSET} rows)")
        else:
            state[f"{ours}_positions"] = table[POSITION_OFFSET:]
        for t in ("weight", "bias"):
            names[f"{ours}_embed_norm.{t}"] = f"{prefix}{side}.layernorm_embedding.{t}"
            state[f"{ours}_embed_norm.{t}"] = weights.take(names[f"{ours}_embed_norm.{t}"])
    return state, names


def final_norms(weights: Weights, prefix: str) -> tuple[dict[str, Tensor | None],
                                                      dict[str, str]]:
    """The final LayerNorm after each stack of a pre-norm family (Pegasus, mBART,
    M2M100): `model.encoder.layer_norm` / `model.decoder.layer_norm`, our
    `encoder_norm` / `decoder_norm`; with the HF names of each."""
    state: dict[str, Tensor | None] = {}
    names: dict[str, str] = {}
    for side, ours in (("encoder", "encoder_norm"), ("decoder", "decoder_norm")):
        for t in ("weight", "bias"):
            names[f"{ours}.{t}"] = f"{prefix}{side}.layer_norm.{t}"
            state[f"{ours}.{t}"] = weights.take(names[f"{ours}.{t}"])
    return state, names


BART = Layout(
    name="BART", model_type="bart", architectures=SUPPORTED_ARCHITECTURES,
    hf_defaults=HF_DEFAULTS, flag_values=BART_FLAG_VALUES,
    structure={"pre_norm": False, "positions": "learned", "layernorm_embedding": True},
    stack_tensors=learned_positions, fallback_unk=vocab_json_unk,
    tokenizer_files=("vocab.json", "merges.txt"), tokenizer_class="BartTokenizer")


def convert_bart(path: str | Path, layout: Layout | None = None,
                 tokenizer_json: Path | None = None) -> tuple[ModelConfig, dict[str, Tensor]]:
    """(ModelConfig, state dict for `Seq2SeqTransformer`) from a BART directory
    (or one of `layout`'s family), or one `ConversionError` listing every problem
    found."""
    layout = layout or BART
    path = Path(path)
    hf, stored, problems = read_folder(path)
    cfg = bart_config(hf, problems, path, layout, tokenizer_json)
    if stored is None or problems:
        raise ConversionError(path, problems)

    prefix = hf_prefix(stored)
    weights = Weights(stored)
    tie = hf.get("tie_word_embeddings")
    share = layout.share_key is None or bool(hf.get(layout.share_key, True))
    embeddings = tied_embeddings(weights, prefix, share=share,
                                 tie=True if tie is None else bool(tie), problems=problems)
    enc, dec, out = embeddings.source, embeddings.target, embeddings.output
    # Share/tie in our model exactly where the matrices are equal: same outputs, less
    # memory (only where the vocabularies agree: wrong shapes are reported below).
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
    stack, stack_names = layout.stack_tensors(cfg, weights, prefix, problems)
    sd.update(stack)
    hf_names.update(stack_names)
    for ours, theirs in layer_names(cfg, prefix).items():
        sd[ours] = weights.take(theirs)
        hf_names[ours] = theirs
    state = check_state(cfg, sd, hf_names, weights, problems)
    if problems:
        raise ConversionError(path, dict.fromkeys(problems))
    cfg.extra["path"] = str(path)
    return cfg, state


def load_bart(path: str | Path, dtype: torch.dtype = torch.float32,
              layout: Layout | None = None,
              tokenizer_json: Path | None = None) -> Seq2SeqTransformer:
    """A `Seq2SeqTransformer` in eval mode with the BART checkpoint's weights (or
    those of `layout`'s family)."""
    cfg, state = convert_bart(path, layout, tokenizer_json)
    return build_model(cfg, state, dtype)


# -- the exporter's source ----------------------------------------------------------


def load_source(path: Path, task: TaskRequest | None = None,
                layout: Layout | None = None) -> Source:
    """A BART folder (or one of `layout`'s family) as the exporter takes it: the
    model, its tokenizer.json, its task (`task`, as `export --task` asks, else the
    one task_specific_params names; tasks.py) and generation defaults (the
    folder's generation_config, the task's entry applied over it as the pipeline
    applied it)."""
    layout = layout or BART
    problems: list[str] = []
    hf: dict[str, Any] = {}
    try:
        loaded = json.loads((path / "config.json").read_text(encoding="utf-8"))
        hf = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass  # load_bart reports it
    resolved = tasks.resolve(hf, task, (tasks.SUMMARIZE, tasks.TRANSLATE), layout.name,
                             problems)
    tokenizer_json = hf_tokenizer_json(path, problems, layout.tokenizer_files,
                                       layout.tokenizer_class, layout.name)
    model = None
    try:
        model = load_bart(path, layout=layout, tokenizer_json=tokenizer_json)
    except ConversionError as e:
        problems.extend(e.problems)
    if tokenizer_json is not None and model is not None:
        check_tokenizer_ids(tokenizer_json, model.cfg.tgt_vocab_size, layout.name, problems)
    if problems or model is None or tokenizer_json is None or resolved is None:
        raise SourceError(path, problems)
    settings = resolved.generation_settings(generate_settings(path, problems))
    if problems:
        raise SourceError(path, problems)
    return Source(
        kind=layout.model_type,
        model=model,
        name=folder_name(path),
        task=resolved.kind,
        source_language=resolved.source_language,
        target_language=resolved.target_language,
        tokenizer_json=tokenizer_json,
        generation=generation_from_hf(settings, model.cfg.max_positions),
        suppress=suppressed_by_hf(settings),
        origin={"format": f"huggingface-{layout.model_type}", **resolved.origin()},
        input_prefix=resolved.prefix,
    )
