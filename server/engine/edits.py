"""A step's log-prob processing as edits the device applies (pick.py's graph).

decoding.py's processors change a few entries of each row in place; where the
log-probs stay on the device, the host sends those changes as short lists
instead, and the pick graph applies them in an order that gives the same
values as `process_log_probs`: the repetition penalty (entries scaled), the
forced rows (every entry -inf but the forced token's 0), EOS's exponential
decay (entries raised), the bans (entries -inf), then, where the package asks,
the row's log-softmax again. The bans that generate() applies before the
forced tokens are dropped from the forced rows (the force overwrote them);
the rest are the same whenever they apply.

Every list is in rows of the step (N = B * beams); `placed` moves them to the
decoder call's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from seq2serve.server.engine.decoding import (
    NEG_INF,
    NO_TOKEN,
    Processing,
    ban_bad_words,
    block_repeated_ngrams,
    block_source_ngrams,
)

_NO_PAIRS = np.zeros((0, 2), dtype=np.int64)


@dataclass(frozen=True)
class StepEdits:
    """pen_at (P, 2) (row, column) with factors pen (P,) float32; forced (N,) the
    forced column per row (NO_TOKEN: none); decay_at (E, 2) with growth (E,)
    float32; ban_at (M, 2); renormalize: the row's log-softmax after them."""

    pen_at: np.ndarray
    pen: np.ndarray
    forced: np.ndarray
    decay_at: np.ndarray
    growth: np.ndarray
    ban_at: np.ndarray
    renormalize: bool

    @classmethod
    def none(cls, rows: int, renormalize: bool = False) -> StepEdits:
        """No processing: the decoder's log-probs as they are."""
        pairs = np.zeros((0, 2), dtype=np.int64)
        empty = np.zeros(0, dtype=np.float32)
        return cls(pairs, empty, np.full(rows, NO_TOKEN, dtype=np.int64), pairs, empty, pairs,
                   renormalize)

    def placed(self, at: slice | np.ndarray, rows: int) -> StepEdits:
        """The same edits for a decoder call of `rows` rows whose rows `at` are
        this step's (idle rows get none)."""
        where: np.ndarray = np.arange(rows, dtype=np.int64)[at]
        forced = np.full(rows, NO_TOKEN, dtype=np.int64)
        forced[where] = self.forced

        def moved(pairs: np.ndarray) -> np.ndarray:
            out: np.ndarray = pairs.copy()
            out[:, 0] = where[pairs[:, 0]]
            return out

        return StepEdits(moved(self.pen_at), self.pen, forced, moved(self.decay_at),
                         self.growth, moved(self.ban_at), self.renormalize)


def step_edits(p: Processing, history: np.ndarray, generated: np.ndarray, beams: int,
               width: int) -> StepEdits:
    """The edits of `process_log_probs` for per-source parameters p (B,), sources
    that generated `generated` (B,) tokens, `beams` rows each (history (N, W)),
    over rows of `width` columns."""
    sources = generated.shape[0]
    rows = sources * beams
    row_gen = np.repeat(generated, beams)
    bans: list[np.ndarray] = []
    pen_at, pen = _NO_PAIRS, np.zeros(0, dtype=np.float32)
    if p.reads_history:
        per_row = p.rows(np.repeat(np.arange(sources), beams))
        pen_at, pen = _penalties(history, per_row.repetition_penalty)
        recorder = _BanRecorder(rows, width)
        lengths = row_gen + 1
        block_repeated_ngrams(recorder, history, per_row.no_repeat_ngram_size,  # type: ignore[arg-type]
                              lengths)
        if p.encoder_ngram > 0:
            block_source_ngrams(recorder, history, lengths, p.encoder_ngram,  # type: ignore[arg-type]
                                per_row.source_ngrams)
        if p.longer_bad_words:
            ban_bad_words(recorder, history, np.zeros(0, dtype=np.int64),  # type: ignore[arg-type]
                          p.longer_bad_words, lengths)
        bans += recorder.pairs
    all_rows = np.arange(rows, dtype=np.int64)
    bans.append(_outer(all_rows, p.single_bad_words))
    if p.longest_min_length > 0:
        early = np.repeat(generated < p.min_length, beams)
        bans.append(_outer(np.flatnonzero(early), np.array([p.eos_id], dtype=np.int64)))
    forced = np.full(rows, NO_TOKEN, dtype=np.int64)
    if p.forced_bos is not None:
        first = np.repeat((generated == 0) & (p.forced_bos != NO_TOKEN), beams)
        forced[first] = np.repeat(p.forced_bos, beams)[first]
    if p.forced_eos != NO_TOKEN:
        assert p.max_new is not None, "a forced EOS needs each row's limit"
        forced[np.repeat(generated == p.max_new - 1, beams)] = p.forced_eos
    before = bans[0] if len(bans) == 1 else np.concatenate(bans) if bans else _NO_PAIRS
    if np.any(forced != NO_TOKEN):
        before = before[forced[before[:, 0]] == NO_TOKEN]  # the force overwrote them
    decay_at, growth = _NO_PAIRS, np.zeros(0, dtype=np.float32)
    if p.decay_start != NO_TOKEN:
        late = np.flatnonzero(row_gen > p.decay_start)
        decay_at = _outer(late, np.array([p.eos_id], dtype=np.int64))
        growth = (np.power(p.decay_factor, (row_gen[late] - p.decay_start).astype(np.float64))
                  - 1.0).astype(np.float32)
    after = [_outer(all_rows, p.suppress_ids)] if p.suppress_ids.size else []
    if p.begin_suppress:
        first_new = np.zeros(sources, dtype=np.int64) if p.forced_bos is None \
            else (p.forced_bos != NO_TOKEN).astype(np.int64)
        at = np.flatnonzero(np.repeat(generated == first_new, beams))
        after.append(_outer(at, p.begin_suppress_ids))
    return StepEdits(pen_at, pen, forced, decay_at, growth, _union([before, *after]),
                     p.renormalize)


def _union(parts: list[np.ndarray]) -> np.ndarray:
    """np.unique(np.concatenate(parts), axis=0): the distinct pairs, in (row, column)
    order. The usual step has one list, already in that order (a package's one-token
    bad words on every row): that list is the result as it is, with no copy and no
    sort (np.unique's axis=0 sorts a structured view of a copy)."""
    present = [part for part in parts if len(part)]
    if not present:
        return _NO_PAIRS
    if len(present) == 1 and _increasing(present[0]):
        return present[0]
    return np.unique(np.concatenate(present), axis=0)


def _increasing(pairs: np.ndarray) -> bool:
    """Whether (row, column) pairs are strictly increasing, so distinct and sorted."""
    rows = np.diff(pairs[:, 0])
    return bool(np.all((rows > 0) | ((rows == 0) & (np.diff(pairs[:, 1]) > 0))))


def _outer(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Every (row, column) pair of the two lists, (R * C, 2)."""
    r, c = np.broadcast_arrays(rows[:, None], np.asarray(cols, dtype=np.int64)[None, :])
    return np.stack([r.reshape(-1), c.reshape(-1)], axis=1).astype(np.int64)


def _penalties(history: np.ndarray, penalty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """apply_repetition_penalty's entries: each distinct token of a penalised row's
    history, with the row's factor."""
    pairs, factors = [], []
    for r in np.flatnonzero(penalty != 1.0):
        tokens = np.unique(history[r])
        pairs.append(_outer(np.array([r], dtype=np.int64), tokens))
        factors.append(np.full(tokens.size, penalty[r], dtype=np.float32))
    if not pairs:
        return _NO_PAIRS, np.zeros(0, dtype=np.float32)
    return np.concatenate(pairs), np.concatenate(factors)


class _BanRecorder:
    """Stands in for the (N, V) log-probs of decoding.py's history-reading bans,
    which only ever write -inf into it: records the (row, column) pairs written."""

    def __init__(self, rows: int, width: int):
        self.shape = (rows, width)
        self.pairs: list[np.ndarray] = []

    def __setitem__(self, key: tuple[Any, Any], value: Any) -> None:
        assert np.all(np.asarray(value) == NEG_INF), "a ban writes -inf only"
        first, second = key
        rows, outer_rows = self._index(first, self.shape[0])
        cols, outer_cols = self._index(second, self.shape[1])
        if outer_rows or outer_cols:  # a slice with an array: numpy's outer product
            self.pairs.append(_outer(rows.reshape(-1), cols.reshape(-1)))
            return
        r, c = np.broadcast_arrays(rows, cols)
        self.pairs.append(np.stack([r.reshape(-1), c.reshape(-1)], axis=1).astype(np.int64))

    @staticmethod
    def _index(index: Any, size: int) -> tuple[np.ndarray, bool]:
        if isinstance(index, slice):
            return np.arange(size, dtype=np.int64)[index], True
        array = np.asarray(index)
        if array.dtype == bool:
            return np.flatnonzero(array).astype(np.int64), False
        return array.astype(np.int64), False
