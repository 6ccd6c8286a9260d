"""A Hugging Face hub id (`facebook/bart-large-cnn`) as the folder export reads: the
snapshot `huggingface_hub.snapshot_download` keeps in its cache
(HF_HUB_CACHE, else HF_HOME/hub: models--ORG--NAME/snapshots/COMMIT), downloaded there
where the hub can be reached, else the cached one (HF_HUB_OFFLINE=1 asks for that
alone), else a SourceError that says both.

Only what export reads is downloaded: config and tokenizer files and one copy of the
weights (safetensors where the repository has them, else the torch files), never its
TensorFlow, Flax, ONNX or Rust copies.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from seq2serve.model.families.source import SourceError

# Config, generation and tokenizer files (tokenizer.json, vocab.json, merges.txt,
# spiece.model, sentencepiece.bpe.model, source.spm, target.spm), at the top level.
FILES = ["*.json", "*.txt", "*.model", "*.spm"]
WEIGHTS = {
    "safetensors": ["model.safetensors", "model.safetensors.index.json",
                    "model-*-of-*.safetensors"],
    "torch": ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"],
}


def allow_patterns(files: list[str]) -> list[str]:
    """The files of a repository listing `files` that export reads, as
    snapshot_download's allow_patterns: one copy of the weights."""
    top = [f for f in files if "/" not in f]
    safetensors = any(fnmatch.fnmatch(f, p) for f in top for p in WEIGHTS["safetensors"])
    return FILES + WEIGHTS["safetensors" if safetensors else "torch"]


def is_hub_id(text: str) -> bool:
    """Whether `text` has the shape of a hub repository id (ORG/NAME or NAME)."""
    try:
        # Public in huggingface_hub.utils, re-exported there without `__all__`.
        from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]
    except ImportError:
        return False
    try:
        validate_repo_id(text)
    except ValueError:  # HFValidationError
        return False
    return True


def hub_folder(repo_id: str, revision: str | None = None) -> Path:
    """The snapshot of `repo_id` in the hub's cache, downloaded where it must be and
    can be; SourceError saying why not."""
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (
            DryRunError,
            IncompleteSnapshotError,
            LocalEntryNotFoundError,
        )
    except ImportError:
        raise SourceError(Path(repo_id), [
            f"{repo_id}: not a directory; taking it as a Hugging Face hub id needs "
            "huggingface_hub (pip install 'seq2serve[train]')"]) from None
    reached = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub was not reached"
    try:
        listing = snapshot_download(repo_id, revision=revision, dry_run=True)
        patterns = allow_patterns([f.filename for f in listing])
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except DryRunError as e:  # the hub cannot be reached (or said no): try the cache
        if e.__cause__ is not None and not constants.HF_HUB_OFFLINE:
            reached = f"the hub answered {type(e.__cause__).__name__}: {e.__cause__}"
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True,
                                      allow_patterns=_cached_patterns(repo_id, revision)))
    except (LocalEntryNotFoundError, IncompleteSnapshotError) as e:
        cache = constants.HF_HUB_CACHE
        raise SourceError(Path(repo_id), [
            f"{repo_id}: not a directory, and as a Hugging Face hub id: {reached}, and the "
            f"hub cache ({cache}; HF_HUB_CACHE or HF_HOME) does not hold it "
            f"({type(e).__name__}). Download it where the hub can be reached, or give "
            "the folder"]) from None


def _cached_patterns(repo_id: str, revision: str | None) -> list[str] | None:
    """allow_patterns for the cached snapshot, from the listing the cache kept of the
    repository (None where it kept none: nothing to check the snapshot against)."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        files = get_cached_repo_tree(repo_id, revision=revision)
    except CachedRepoTreeNotFoundError:
        return None
    return allow_patterns([f.path for f in files])
