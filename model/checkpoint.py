"""Checkpoint directories: what training writes, resumes from, and export reads.

A checkpoint is one directory:

    config.json          format version, ModelConfig, task, languages, file names,
                         step, training arguments, latest validation scores
    model.safetensors    weights (tied embeddings stored once)
    tokenizer.model      the SentencePiece model, so the directory is self-contained
    trainer_state.pt     optimizer, step, RNG states, data position, best score
                         (resume checkpoints only; `best/` ships without it)

A run directory holds `checkpoints/step-000001234/` (the newest `keep`), `best/`,
`tokenizer.model`, the token cache and `log.jsonl`. Every directory is written
under a temporary name and renamed into place, so a crash or SIGKILL mid-save
leaves the previous checkpoint intact and never a half-written one.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_model

from seq2serve.model.config import ModelConfig
from seq2serve.model.tokenizer import Tokenizer
from seq2serve.model.transformer import Seq2SeqTransformer

FORMAT = "seq2serve-checkpoint"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.model"
STATE_FILE = "trainer_state.pt"
CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
SAVE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
}
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"  # zero-padded so a plain listing sorts by step


def _replace_dir(tmp: Path, target: Path) -> None:
    """Move the finished `tmp` onto `target`, replacing any previous directory.

    Directories cannot be renamed over non-empty ones, so the old one is moved
    aside first; between the two renames a reader sees no `target` at all, never
    a mixture of two versions.
    """
    old = None
    if target.exists():
        old = target.with_name(f".old-{target.name}-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(
    directory: str | os.PathLike[str],
    model: Seq2SeqTransformer,
    tokenizer_file: str | os.PathLike[str],
    meta: dict[str, Any] | None = None,
    trainer_state: dict[str, Any] | None = None,
    save_dtype: str = "float32",
) -> Path:
    """Write a checkpoint directory atomically and return its path.

    `meta` adds top-level keys to config.json (task, src_lang, tgt_lang, step,
    train_args, valid, ...). `save_dtype` other than float32 is for shipping:
    a resumable checkpoint should keep float32 weights.
    """
    if save_dtype not in SAVE_DTYPES:
        raise ValueError(f"save_dtype must be one of {tuple(SAVE_DTYPES)}, got {save_dtype!r}")
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        dtype = SAVE_DTYPES[save_dtype]
        # A cast copy, not an in-place cast: training goes on with fp32 weights.
        to_save = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
        save_model(to_save, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        shutil.copyfile(tokenizer_file, tmp / TOKENIZER_FILE)
        config: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model": model.cfg.to_dict(),
            "weights": {"file": WEIGHTS_FILE, "dtype": save_dtype},
            "tokenizer": {"file": TOKENIZER_FILE, "type": "sentencepiece",
                          "append_eos": True, "add_bos": False},
        }
        for key, value in (meta or {}).items():
            if key in config:
                raise ValueError(f"meta key {key!r} would overwrite a reserved config.json key")
            config[key] = value
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if trainer_state is not None:
            torch.save(trainer_state, tmp / STATE_FILE)
        _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """config.json of a checkpoint, checked for format and version."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"not a checkpoint directory (no {CONFIG_FILE}): {directory}")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format is {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {meta['format_version']} is newer than "
                         f"this code reads ({FORMAT_VERSION})")
    return meta


def load_model_weights(directory: str | os.PathLike[str], model: Seq2SeqTransformer,
                       device: str | torch.device = "cpu") -> None:
    """Load a checkpoint's weights into an existing model (cast to its dtype)."""
    missing, unexpected = load_model(model, str(Path(directory) / WEIGHTS_FILE),
                                     strict=True, device=str(device))
    if missing or unexpected:  # strict=True raises first; kept for clarity
        raise ValueError(f"weights mismatch: missing {missing}, unexpected {unexpected}")


def load_weights_growing(directory: str | os.PathLike[str], model: Seq2SeqTransformer,
                         unk_id: int, init_rows: Mapping[int, Sequence[int]] | None = None
                         ) -> int:
    """Load a checkpoint into a model whose vocabulary extends the checkpoint's (same
    ids, new ones appended). Each vocabulary-sized tensor gets the old rows and, for
    every new row, the mean of the old rows `init_rows` names for it (a new word
    piece: the pieces the old vocabulary spelled it with), else a copy of the <unk>
    row (a new character: the model first treats it as the <unk> it used to see
    there). Fine-tuning tells them apart. A model with more decoder layers than the
    checkpoint gets them on top, each starting as the identity (below). Returns the
    number of vocabulary rows added."""
    saved = load_file(str(Path(directory) / WEIGHTS_FILE))
    own = model.state_dict()
    added = 0
    for name, tensor in saved.items():
        target = own[name]
        if tensor.shape != target.shape:
            grows_rows = (tensor.dim() == target.dim() and tensor.shape[1:] == target.shape[1:]
                          and tensor.shape[0] < target.shape[0])
            if not grows_rows:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} does not "
                                 f"fit the model's {tuple(target.shape)}")
            old_rows = tensor.shape[0]
            rows = [tensor[list((init_rows or {}).get(i) or [unk_id])].float().mean(0)
                    for i in range(old_rows, target.shape[0])]
            tensor = torch.cat([tensor, torch.stack(rows).to(tensor.dtype)])
            added = max(added, target.shape[0] - old_rows)
        saved[name] = tensor.to(target.dtype)
    old_layers = 1 + max((int(n.split(".")[1]) for n in saved
                          if n.startswith("decoder_layers.")), default=-1)
    grown = range(old_layers, len(model.decoder_layers))
    if grown and not model.cfg.pre_norm:
        raise ValueError("a decoder grows by identity layers only in a pre-norm model")
    new_layer = tuple(f"decoder_layers.{i}." for i in grown)
    missing = {n for n in set(own) - set(saved) if not n.startswith(new_layer)}
    # Tied weights are saved once; the model's other name for them is filled by the tie.
    model.load_state_dict(saved, strict=False)
    untied = [n for n in missing if own[n].data_ptr() not in
              {own[m].data_ptr() for m in saved if m in own}]
    if untied:
        raise ValueError(f"weights missing from {directory}: {sorted(untied)}")
    with torch.no_grad():
        # A pre-norm layer whose three output projections are zero adds nothing to
        # the residual stream: the grown model starts as the checkpoint's function,
        # and the new layers' own weights get gradients once the projections move.
        for i in grown:
            layer = model.decoder_layers[i]
            for proj in (layer.self_attn.out_proj, layer.cross_attn.out_proj, layer.ffn.fc2):
                proj.weight.zero_()
                proj.bias.zero_()
    return added


def load_checkpoint(
    directory: str | os.PathLike[str], device: str | torch.device = "cpu",
) -> tuple[Seq2SeqTransformer, dict[str, Any], Tokenizer]:
    """(model in eval mode, config.json contents, tokenizer) for inference."""
    directory = Path(directory)
    meta = read_meta(directory)
    cfg = ModelConfig.from_dict(meta["model"])
    model = Seq2SeqTransformer(cfg).to(device)
    load_model_weights(directory, model, device)
    model.eval()
    tokenizer = Tokenizer(directory / meta["tokenizer"]["file"])
    if tokenizer.vocab_size != cfg.tgt_vocab_size:
        raise ValueError(f"{directory}: tokenizer has {tokenizer.vocab_size} pieces but the "
                         f"model's vocabulary is {cfg.tgt_vocab_size}")
    return model, meta, tokenizer


def load_trainer_state(directory: str | os.PathLike[str]) -> dict[str, Any]:
    # weights_only=False: the state holds numpy/python RNG tuples, and the file
    # is one this trainer wrote into its own run directory.
    return torch.load(Path(directory) / STATE_FILE, map_location="cpu", weights_only=False)


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, path) of every complete resume checkpoint in a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / CONFIG_FILE).is_file() and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def prune_checkpoints(run_dir: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest `keep` resume checkpoints; returns the deleted."""
    found = list_checkpoints(run_dir)
    doomed = [path for _, path in found[:-keep]] if keep > 0 else []
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed
