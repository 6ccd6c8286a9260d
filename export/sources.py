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

from seq2serve.export.hub import hub_folder, is_hub_id
from seq2serve.model.families.registry import FAMILIES, families_help, read_model_type
from seq2serve.model.families.source import Source, SourceError, default_generation
from seq2serve.model.families.tasks import TaskRequest
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


def load_source(path: str | Path, task: TaskRequest | None = None,
                revision: str | None = None) -> Source:
    """The source in the folder `path`, or in the hub's snapshot of the repository
    `path` names where no such folder exists (hub.py), at `revision` (export
    --revision: a branch, tag or commit; None: main); `task` (export --task)
    overrides the task the folder says."""
    root = Path(path)
    if not root.is_dir():
        if not is_hub_id(str(path)):
            raise SourceError(root, [f"{root}: not a directory (nor a Hugging Face hub id "
                                     "such as facebook/bart-large-cnn)"])
        folder = hub_folder(str(path), revision)
        source = load_source(folder, task)
        # The commit read, and the revision asked for where one was (a branch or tag
        # names a commit only until it moves).
        hub = {"repo_id": str(path), "commit": folder.name,
               **({"revision": revision} if revision is not None else {})}
        return dataclasses.replace(source, origin={**source.origin, "hub": hub})
    if revision is not None:
        raise SourceError(root, [f"--revision {revision}: {root} is a local folder; a "
                                 "revision picks a branch, tag or commit of a Hugging Face "
                                 "hub id (ORG/NAME), and a folder has only the files it "
                                 "holds"])
    if is_checkpoint(root):
        return _with_task(load_seq2serve(root), task)
    kind, why = read_model_type(root)
    if kind is None:
        raise SourceError(root, [f"{why}; expected a seq2serve checkpoint or a Hugging Face "
                                 f"folder ({families_help()})"])
    family = FAMILIES.get(kind)
    if family is None:
        known = ", ".join(repr(k) for k in sorted(FAMILIES))
        raise SourceError(root, [f"config.json: model_type {kind!r} is an architecture "
                                 f"export does not take (it takes {known})"])
    return family.load(root, task)


def _with_task(source: Source, task: TaskRequest | None) -> Source:
    """Our own checkpoint under the task `export --task` asks (its languages too)."""
    if task is None:
        return source
    pair = task.pair or (source.source_language, source.target_language)
    return dataclasses.replace(source, task=task.kind, source_language=pair[0],
                               target_language=pair[1])
