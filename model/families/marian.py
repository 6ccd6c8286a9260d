"""Load a Hugging Face MarianMTModel directory (OPUS-MT) into `Seq2SeqTransformer`,
as a family of BART's layout (its layers carry BART's names): bart.py reads the
config, maps the weights (`bart.convert_bart`, `bart.load_bart` with
`layout=MARIAN`); this module says what Marian fixes (`MARIAN`, a `bart.Layout`:
a decoder vocabulary of its own, `share_encoder_decoder_embeddings`) and builds the
exporter's source (two SentencePiece models and vocab.json, its languages).

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

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from seq2serve.model.config import ModelConfig
from seq2serve.model.families import bart, tasks
from seq2serve.model.families.generation import (
    generate_settings,
    generation_from_hf,
    suppressed_by_hf,
)
from seq2serve.model.families.hf import (
    ConversionError,
    Weights,
    check_sinusoid_positions,
    is_int,
)
from seq2serve.model.families.source import Source, SourceError, folder_name
from seq2serve.model.families.tasks import TaskRequest

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
UNDETERMINED = "und"  # BCP 47's: a folder that says no language


# -- the layout -------------------------------------------------------------------


def _fallback_unk(path: Path | None) -> tuple[int, str]:
    """Marian configs carry no unk id; the tokenizer's vocab.json does."""
    if path is not None and (path / "vocab.json").is_file():
        try:
            vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
            if is_int(vocab.get("<unk>")):
                return vocab["<unk>"], "vocab.json"
        except (OSError, ValueError, AttributeError):
            pass
    return 1, "OPUS-MT convention (</s>=0, <unk>=1)"


def _stack_tensors(cfg: ModelConfig, weights: Weights, prefix: str,
                   problems: list[str]) -> tuple[dict[str, Tensor | None], dict[str, str]]:
    """Marian's stacks hold no tensor outside their layers: the stored position
    tables are checked to be the sinusoids our model recomputes."""
    check_sinusoid_positions(cfg, weights, prefix, "Marian", problems)
    return {}, {}


MARIAN = bart.Layout(
    name="Marian", model_type="marian", architectures=SUPPORTED_ARCHITECTURES,
    hf_defaults=HF_DEFAULTS, flag_values=MARIAN_FLAG_VALUES,
    structure={"pre_norm": False, "positions": "sinusoid", "position_layout": "split",
               "layernorm_embedding": False},
    stack_tensors=_stack_tensors, fallback_unk=_fallback_unk,
    tokenizer_files=("source.spm", "target.spm", "vocab.json"),
    tokenizer_class="MarianTokenizer",
    share_key="share_encoder_decoder_embeddings", decoder_vocab_key="decoder_vocab_size")


# -- the exporter's source ----------------------------------------------------------


def _marian_languages(path: Path) -> tuple[str, str]:
    """From tokenizer_config.json, else from an opus-mt-SRC-TGT name (the folder's,
    or the hub repository's: source.folder_name)."""
    cfg_file = path / "tokenizer_config.json"
    if cfg_file.is_file():
        data = json.loads(cfg_file.read_text(encoding="utf-8"))
        if data.get("source_lang") and data.get("target_lang"):
            return str(data["source_lang"]), str(data["target_lang"])
    parts = folder_name(path).split("-")
    if len(parts) >= 4 and parts[0] == "opus" and parts[1] == "mt":
        return parts[2], parts[3]
    return UNDETERMINED, UNDETERMINED


def _languages(path: Path, task: TaskRequest | None, problems: list[str]) -> tuple[str, str]:
    """The folder's languages, or `--task translate:SRC-TGT`'s where the folder says
    none; a task that contradicts the folder is a problem."""
    said = _marian_languages(path)
    if task is None:
        return said
    if task.kind != tasks.TRANSLATE:
        problems.append(f"--task {task}: a Marian model translates (--task translate)")
    asked = task.pair
    if asked is None:
        return said
    if said != (UNDETERMINED, UNDETERMINED) and asked != said:
        problems.append(f"--task {task}: the folder says it translates {said[0]} to "
                        f"{said[1]} (tokenizer_config.json or its name)")
    return asked


def load_source(path: Path, task: TaskRequest | None = None) -> Source:
    """A Marian (OPUS-MT) folder as the exporter takes it: the model, its two
    SentencePiece models and vocab.json, its languages (the folder's; `--task
    translate:SRC-TGT` for a folder that says none) and generation defaults."""
    problems: list[str] = []
    src, tgt = _languages(path, task, problems)
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (path / name).is_file():
            problems.append(f"{name}: missing (a Marian directory needs the tokenizer files)")
    tokenizer_cfg = path / "tokenizer_config.json"
    if tokenizer_cfg.is_file():
        if json.loads(tokenizer_cfg.read_text(encoding="utf-8")).get("separate_vocabs"):
            problems.append("tokenizer_config.json: separate_vocabs is not supported")
    model = None
    try:
        model = bart.load_bart(path, layout=MARIAN)
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
    settings = generate_settings(path, problems)
    start = settings.get("decoder_start_token_id")
    if model is not None and is_int(start) and start != model.cfg.decoder_start_id:
        problems.append(f"generation_config.json: decoder_start_token_id {start} differs from "
                        f"config.json's {model.cfg.decoder_start_id} (not supported)")
    if problems or model is None:
        raise SourceError(path, problems)
    return Source(
        kind="marian",
        model=model,
        name=folder_name(path),
        task=tasks.TRANSLATE,
        source_language=src,
        target_language=tgt,
        source_spm=path / "source.spm",
        target_spm=path / "target.spm",
        vocab=vocab,
        generation=generation_from_hf(settings, model.cfg.max_positions),
        suppress=suppressed_by_hf(settings),
        origin={"format": "huggingface-marian"},
    )
