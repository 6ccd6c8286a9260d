"""The model package: what `export` writes and what `serve` loads.

One directory per model: `manifest.json`, `encoder.onnx`, `decoder.onnx`,
`reorder.onnx`, `move.onnx`, `select.onnx` and the tokenizer files. The
manifest records the sha256 of every other file; `load_package` refuses a
package whose files do not match, naming the file. This module needs neither torch nor onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# 2: one graph input/output per decoder layer for the caches and cross K/V
# (format 1 stacked them as (L, ...) tensors, which cost a copy of the whole
# cache per step).
# 3: the decoder writes each row's new key/value at the row's own position and
# masks the cache slots after it, so rows at different steps share one call
# (iteration-level batching).
# 4: the decoder no longer gathers the cache by beam_origin: row r continues
# cache row r, and a separate reorder graph moves rows only when beams moved or
# rows joined; format 3 copied the whole cache twice per step.
# 5: the new slot is written with a ScatterND (ScatterElements in format 4),
# which ONNX Runtime runs in place without copying the cache when its output
# is bound to its input's buffer.
# 6: a move graph rewrites only the cache rows that moved (beam search), in
# place (a Gather of those rows, then a ScatterND into the cache), where the
# reorder graph copied every row; and a select graph (TopK) picks each row's
# best log-probs for beam search. The server reads format 6 only: re-export
# older packages (`seq2serve export` reads every checkpoint format it read before).
FORMAT_VERSION = 6
MANIFEST = "manifest.json"
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
REORDER_FILE = "reorder.onnx"
MOVE_FILE = "move.onnx"
SELECT_FILE = "select.onnx"
GRAPH_FILES = (ENCODER_FILE, DECODER_FILE, REORDER_FILE, MOVE_FILE, SELECT_FILE)

Spec = list[tuple[str, str, list[str]]]

# Graph signatures: (name, dtype, symbolic shape). B sources, N = B*K hypotheses,
# S source length, T cache slots (> every row's position), H heads, Dh head size, V vocab; a name
# `self_k.{i}` is decoder layer i's tensor.
ENCODER_INPUTS: Spec = [("src_ids", "int64", ["B", "S"]), ("src_mask", "int64", ["B", "S"])]


def per_layer(name: str, dtype: str, shape: list[str], layers: int) -> Spec:
    return [(f"{name}.{i}", dtype, shape) for i in range(layers)]


def encoder_outputs(layers: int) -> Spec:
    return [("memory", "float", ["B", "S", "D"]),
            *per_layer("cross_k", "float", ["B", "H", "S", "Dh"], layers),
            *per_layer("cross_v", "float", ["B", "H", "S", "Dh"], layers)]


def decoder_inputs(layers: int) -> Spec:
    """In the order of Seq2SeqTransformer.decode_step's arguments, lists flattened."""
    return [("tokens", "int64", ["N"]),
            ("positions", "int64", ["N"]),
            *per_layer("self_k", "float", ["N", "H", "T", "Dh"], layers),
            *per_layer("self_v", "float", ["N", "H", "T", "Dh"], layers),
            *per_layer("cross_k", "float", ["B", "H", "S", "Dh"], layers),
            *per_layer("cross_v", "float", ["B", "H", "S", "Dh"], layers),
            ("src_mask", "int64", ["B", "S"])]


def decoder_outputs(layers: int) -> Spec:
    return [("log_probs", "float32", ["N", "V"]),
            *per_layer("new_self_k", "float", ["N", "H", "T", "Dh"], layers),
            *per_layer("new_self_v", "float", ["N", "H", "T", "Dh"], layers),
            ("alignment", "int64", ["N"])]


def reorder_inputs(layers: int) -> Spec:
    """In the order of Seq2SeqTransformer.reorder_cache's arguments; M rows before."""
    return [*per_layer("self_k", "float", ["M", "H", "T", "Dh"], layers),
            *per_layer("self_v", "float", ["M", "H", "T", "Dh"], layers),
            ("beam_origin", "int64", ["N"])]


def reorder_outputs(layers: int) -> Spec:
    return [*per_layer("reordered_self_k", "float", ["N", "H", "T", "Dh"], layers),
            *per_layer("reordered_self_v", "float", ["N", "H", "T", "Dh"], layers)]


def move_inputs(layers: int) -> Spec:
    """The cache (N rows), the rows to rewrite (M, 1) and the row each copies (M,)."""
    return [*per_layer("self_k", "float", ["N", "H", "T", "Dh"], layers),
            *per_layer("self_v", "float", ["N", "H", "T", "Dh"], layers),
            ("moved_rows", "int64", ["M", 1]),
            ("moved_from", "int64", ["M"])]


def move_outputs(layers: int) -> Spec:
    return [*per_layer("moved_self_k", "float", ["N", "H", "T", "Dh"], layers),
            *per_layer("moved_self_v", "float", ["N", "H", "T", "Dh"], layers)]


SELECT_INPUTS: Spec = [("log_probs", "float32", ["N", "V"]), ("k", "int64", [1])]
SELECT_OUTPUTS: Spec = [("top_log_probs", "float32", ["N", "K"]),
                        ("top_ids", "int64", ["N", "K"])]


class PackageError(ValueError):
    """A package failed verification; `problems` lists every finding."""

    def __init__(self, path: Path, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__(f"model package {path} is invalid:\n  " + "\n  ".join(problems))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def signature(spec: Spec) -> list[dict[str, Any]]:
    return [{"name": n, "dtype": t, "shape": s} for n, t, s in spec]


@dataclass
class Manifest:
    name: str
    task: str  # "translate" | "summarize"
    source_language: str
    target_language: str
    config: dict[str, Any]  # ModelConfig.to_dict()
    special_tokens: dict[str, int]
    tokenizer: dict[str, Any]  # type, source_model, target_model, vocab (file names)
    generation: dict[str, Any]
    precision: str
    max_source_length: int
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    graphs: dict[str, Any] = field(default_factory=dict)
    exporter: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        return cls(**data)


REQUIRED_KEYS = ("name", "task", "source_language", "target_language", "config",
                 "special_tokens", "tokenizer", "generation", "precision", "max_source_length",
                 "files", "graphs", "format_version")


@dataclass
class ModelPackage:
    path: Path
    manifest: Manifest

    @property
    def encoder_path(self) -> Path:
        return self.path / ENCODER_FILE

    @property
    def decoder_path(self) -> Path:
        return self.path / DECODER_FILE

    @property
    def reorder_path(self) -> Path:
        return self.path / REORDER_FILE

    @property
    def move_path(self) -> Path:
        return self.path / MOVE_FILE

    @property
    def select_path(self) -> Path:
        return self.path / SELECT_FILE

    def file(self, name: str) -> Path:
        return self.path / name


def load_package(path: str | Path, verify_hashes: bool = True) -> ModelPackage:
    """Read and verify a package. Raises PackageError listing every problem."""
    root = Path(path)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise PackageError(root, [f"{MANIFEST}: missing"])
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(root, [f"{MANIFEST}: not valid JSON ({e})"]) from None
    if not isinstance(data, dict):
        raise PackageError(root, [f"{MANIFEST}: expected a JSON object"])
    problems = [f"{MANIFEST}: missing key {k!r}" for k in REQUIRED_KEYS if k not in data]
    if problems:
        raise PackageError(root, problems)
    if data["format_version"] != FORMAT_VERSION:
        raise PackageError(root, [f"{MANIFEST}: format_version {data['format_version']} is not "
                                  f"supported (this seq2serve reads {FORMAT_VERSION}); re-export "
                                  "it with `seq2serve export`"])
    unknown = sorted(set(data) - set(Manifest.__dataclass_fields__))
    if unknown:
        problems.append(f"{MANIFEST}: unknown keys {unknown}")
    files: dict[str, str] = data["files"]
    tokenizer_files = []
    for key in ("source_model", "target_model", "vocab"):
        if isinstance(data["tokenizer"].get(key), str):
            tokenizer_files.append(data["tokenizer"][key])
        else:
            problems.append(f"{MANIFEST}: tokenizer.{key} must name a file")
    for required in (*GRAPH_FILES, *tokenizer_files):
        if required not in files:
            problems.append(f"{MANIFEST}: 'files' does not list {required}")
    for name, expected in sorted(files.items()):
        file_path = root / name
        if "/" in name or name.startswith("."):
            problems.append(f"{name}: file names in a package must be plain names")
        elif not file_path.is_file():
            problems.append(f"{name}: missing")
        elif verify_hashes and sha256_file(file_path) != expected:
            problems.append(f"{name}: sha256 mismatch (file is corrupt, truncated or modified)")
    if problems:
        raise PackageError(root, problems)
    return ModelPackage(root, Manifest.from_dict(data))
