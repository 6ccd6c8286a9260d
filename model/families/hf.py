"""What every Hugging Face family shares: reading config.json and the weights
(safetensors or a torch file, single or sharded) as plain data, with every problem
collected before failing (CTranslate2-converter style) and raised as one
`ConversionError`; transformers' activation names. `transformers` is never
imported here (a test-only dependency) and nothing is fetched from a hub.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
TORCH_FILE = "pytorch_model.bin"

# transformers' ACT2FN name -> ours. gelu_python is exact (erf) GELU; the tanh
# variants are the same formula as torch's approximate="tanh".
ACTIVATION_MAP = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "swish": "swish",
    "silu": "swish",
}


class ConversionError(ValueError):
    """Everything wrong with one checkpoint, listed together."""

    def __init__(self, source: str | Path, problems: Iterable[str]):
        self.source = str(source)
        self.problems = list(problems)
        super().__init__(
            f"cannot convert checkpoint {self.source}:\n  - " + "\n  - ".join(self.problems)
        )


# -- files ---------------------------------------------------------------------


def read_config(path: Path, problems: list[str]) -> dict[str, Any] | None:
    file = path / CONFIG_FILE
    if not file.is_file():
        problems.append(f"{CONFIG_FILE} not found in {path}")
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{CONFIG_FILE} is not readable JSON: {exc}")
        return None
    if not isinstance(data, dict):
        problems.append(f"{CONFIG_FILE} must hold a JSON object, got {type(data).__name__}")
        return None
    return data


def _load_one(file: Path, problems: list[str]) -> dict[str, Tensor] | None:
    try:
        if file.name.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(str(file), device="cpu")
        data = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # any reader failure is a problem to report, not a crash
        problems.append(f"{file.name} cannot be read: {type(exc).__name__}: {exc}")
        return None
    if not isinstance(data, Mapping) or not all(isinstance(v, Tensor) for v in data.values()):
        problems.append(f"{file.name} does not hold a flat name -> tensor mapping")
        return None
    return dict(data)


def read_weights(path: Path, problems: list[str]) -> dict[str, Tensor] | None:
    """Prefer safetensors; accept single-file or sharded (`*.index.json`) checkpoints."""
    for single in (SAFETENSORS_FILE, TORCH_FILE):
        index = path / f"{single}.index.json"
        if (path / single).is_file():
            return _load_one(path / single, problems)
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                                    .values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                problems.append(f"{index.name} is not a valid shard index: {exc}")
                return None
            weights: dict[str, Tensor] = {}
            ok = True
            for shard in shards:
                part = _load_one(path / shard, problems)
                ok = ok and part is not None
                weights.update(part or {})
            return weights if ok else None
    problems.append(f"no weights in {path}: expected {SAFETENSORS_FILE} or {TORCH_FILE}")
    return None


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
