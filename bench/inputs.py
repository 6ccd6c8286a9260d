"""What every group of benchmarks reads: the lines of a text file or a corpus split,
their token ids as the engine is given them, and comma-separated levels given on
the command line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

Number = TypeVar("Number", int, float)


class Tokenizer(Protocol):
    eos_id: int

    def encode(self, text: str) -> list[int]: ...


def read_sentences(data: Path, limit: int | None = None,
                   only_sentences: bool = False) -> list[str]:
    """The first `limit` (None: all) non-empty lines of DATA/test.src (or of DATA, a
    file), stripped; only_sentences: only those DATA/test.kind marks `sentence`
    (DDTP's test split also holds whole descriptions)."""
    path = data / "test.src" if data.is_dir() else data
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    if only_sentences:
        kinds = (data / "test.kind").read_text(encoding="utf-8").splitlines()
        lines = [line for line, kind in zip(lines, kinds, strict=True)
                 if kind.strip() == "sentence"]
    return [line for line in lines if line][:limit]


def source_ids(tokenizer: Tokenizer, texts: Sequence[str], limit: int) -> list[list[int]]:
    """Each text's token ids (EOS appended by the tokenizer), cut to the package's
    `max_source_length` with EOS kept last."""
    ids = [tokenizer.encode(t) for t in texts]
    return [i if len(i) <= limit else i[: limit - 1] + [tokenizer.eos_id] for i in ids]


def numbers(kind: Callable[[str], Number]) -> Callable[[str], list[Number]]:
    """An argparse type: "8,32,64" -> [8, 32, 64] (empty items skipped, "" -> [])."""

    def parse(text: str) -> list[Number]:
        return [kind(v) for v in text.split(",") if v.strip()]

    return parse
