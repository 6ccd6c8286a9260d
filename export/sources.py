"""One loader per source format behind one interface (CTranslate2-converter style).

A loader turns a directory on disk into a `Source` (model/families/source.py): the
PyTorch model, the tokenizer files the package will carry, and the manifest fields
it knows. Every problem a loader finds is collected and raised together. Our own
checkpoints load here; a Hugging Face folder through its family's module, by
config.json's model_type (model/families/registry.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from seq2serve.model.families.registry import FAMILIES, model_type
from seq2serve.model.families.source import Source, SourceError, default_generation
from seq2serve.model.package.tokenizer import PackageTokenizer

# Sentences for the export-time check of ONNX Runtime against PyTorch.
SAMPLE_TEXTS = [
    "Open the file and save your changes.",
    "This package contains the documentation.",
    "A library for reading and writing compressed archives",
    "The server could not be started because the port is already in use.",
]


def load_seq2serve(path: Path) -> Source:
    from seq2serve.model.checkpoint import load_checkpoint

    try:
        model, meta, tokenizer = load_checkpoint(path)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        # safetensors and torch report truncated or mismatched weights this way.
        raise SourceError(path, [f"{type(e).__name__}: {e}"]) from None
    task = meta.get("task", "translate")
    return Source(
        kind="seq2serve",
        model=model,
        name=meta.get("name") or path.resolve().name,
        task=task,
        source_language=meta.get("src_lang", "en"),
        target_language=meta.get("tgt_lang", "en"),
        source_spm=tokenizer.path,
        target_spm=tokenizer.path,
        vocab=PackageTokenizer.vocab_from_sentencepiece(tokenizer.path),
        generation=default_generation(model.cfg.max_positions),
        origin={"format": "seq2serve-checkpoint", "step": meta.get("step"),
                "valid": meta.get("valid")},
        trained_source_length=meta.get("train_args", {}).get("max_src_len"),
    )


def is_checkpoint(path: Path) -> bool:
    """Whether `path` holds a seq2serve checkpoint (config.json says its format)."""
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and data.get("format") == "seq2serve-checkpoint"


def load_source(path: str | Path, task: str | None = None) -> Source:
    """The source in the folder `path`; `task` (export --task) overrides the task
    the folder says."""
    root = Path(path)
    if not root.is_dir():
        raise SourceError(root, [f"{root}: not a directory"])
    if is_checkpoint(root):
        source = load_seq2serve(root)
        return dataclasses.replace(source, task=task) if task else source
    kind = model_type(root)
    if kind not in FAMILIES:
        found = f"model_type {kind!r}" if kind else "no model_type"
        raise SourceError(root, [
            f"config.json: missing, unreadable, or of an unknown architecture ({found}; "
            f"expected a seq2serve checkpoint or a Hugging Face folder with model_type one "
            f"of {', '.join(repr(k) for k in sorted(FAMILIES))})"])
    return FAMILIES[kind](root, task)
