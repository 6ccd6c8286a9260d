"""What every corpus's DATA_CARD.md renders alike: the count table, the dropped
reasons, the evaluation sources also seen in training. Each source's card
module (`data_card.py`, `messages_card.py`, `everyday_card.py`) keeps its own
prose around them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol


class CardCorpus(Protocol):
    name: str
    dropped: Counter[str]

    def source_overlap(self) -> dict[str, int]: ...


def text_table(rows: Sequence[Sequence[str]], left: int) -> str:
    """A fixed-width table, header first: the first `left` columns left-aligned,
    the rest right-aligned, a dashed rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < left else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def dropped_list(corpora: Sequence[CardCorpus], by_reason: bool = False) -> str:
    """One line per corpus: why pairs were dropped, most common first (by_reason:
    in the reasons' order, `none` when nothing was)."""
    if by_reason:
        return "\n".join(f"- `{c.name}`: " + (", ".join(
            f"{r}: {n}" for r, n in sorted(c.dropped.items())) or "none") for c in corpora)
    return "\n".join(f"- `{c.name}`: " + ", ".join(f"{r}: {n}" for r, n in c.dropped.most_common())
                     for c in corpora)


def overlap_list(corpora: Sequence[CardCorpus]) -> str:
    """Per corpus, the test/valid pairs whose source is also a training source."""
    return "\n".join(f"  - `{c.name}`: " + ", ".join(f"{s} {n}" for s, n in
                                                    c.source_overlap().items())
                     for c in corpora)
