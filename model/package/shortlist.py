"""The vocabulary shortlist: per source sentence, the target pieces worth scoring.

Marian's lexical shortlist (`--shortlist lex.s2t first best prune`, as Firefox's
Bergamot translator runs it on CPUs) and CTranslate2's vocabulary map cut the
output projection, the softmax and the top-k from the whole target vocabulary
(10,000 pieces in the shipped models) to a few hundred candidates: for each source
sentence the `first` most frequent target pieces, the `best` likeliest
translations of each of its pieces (those scoring at least `threshold`) and the
special ones. The set is the sentence's own, fixed for its whole decoding: it
never depends on its batch-mates (CTranslate2 takes the union over a batch, which
would make a text's output depend on its neighbours).

The lexical table is learned from the training pairs. Marian builds lex.s2t,
p(t | s), from fast_align alignments (extract_lex); this table is p(t | s) from
sentence-level co-occurrence of SentencePiece ids,

    p(t | s) = c(s, t) / c(s)

(c(s): the training sentences whose source holds piece s; c(s, t): those whose
target also holds t), counted with numpy in one pass over the pairs (40 s for
the 600,000 pairs of the shipped en-de). No aligner is installed with the
project (eflomal and fast_align would be a compiled dependency for one export
step), and co-occurrence ranks a piece's translations above unrelated pieces,
which is all a shortlist needs; the quality gate (`seq2serve shortlist-gate`, bench/quality)
measures the result against full-vocabulary decoding. The Dice coefficient
2 c(s, t) / (c(s) + c(t)) (`measure="dice"`) was measured too: at equal
coverage of the model's probability mass it needs 40% more candidates.

`shortlist.npz` in the package (format 8) holds the table (each source id's
targets, best first, with their scores), the target ids by frequency, the special
ids, and the output projection as the decoder holds it (`weight` (D, V) in the
decoder's dtype: int8 for int8 packages; `bias` (V,) float32), from which the
runner gathers a sentence's columns once, when it is admitted. The settings
(`first`, `best`, `threshold`) are the manifest's, applied when the runner loads
the table, so one table serves any setting. numpy and sentencepiece only: the
server imports this module.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SHORTLIST_FILE = "shortlist.npz"
# Each source piece keeps this many targets in the table; `best` picks among them.
TABLE_TARGETS = 200
# How a source piece's targets are ranked (learn_table).
MEASURES = ("conditional", "dice")
# Pairs seen in fewer training sentences than this are noise, not translations.
MIN_PAIR_COUNT = 2
# The candidate axis of a batch is a whole number of these. The log-softmax over
# it reduces in vector blocks (up to 16 lanes, 4 accumulators on AVX-512), and a
# row's padded slots (-inf, exp = 0) only add exact zeros per accumulator when
# every width is a whole number of blocks, so a sentence's log-probs are the same
# bits alone or beside one with more candidates (runner.SOURCE_WIDTH_MULTIPLE's
# reasoning, with the wider unrolled block).
WIDTH_MULTIPLE = 64
# Candidate slots past a sentence's own candidates hold this id (never a token).
PAD_CANDIDATE = -1


@dataclass(frozen=True)
class ShortlistSettings:
    """How many candidates a sentence gets (Marian's `first best prune`)."""

    # Marian's users run 100 and 100 on fast_align tables; on this co-occurrence table
    # 100/100 lost up to 1.7 BLEU on the shipped models' test splits, 300/200 kept
    # BLEU and chrF within about 0.3 (issue 35's gate runs, CHANGELOG).
    first: int = 300  # the most frequent target pieces
    best: int = 200  # per source piece, its best-scoring targets ...
    threshold: float = 0.0  # ... that score at least this (p(t | s), in [0, 1])

    def problems(self) -> list[str]:
        out = []
        if not 0 <= self.first:
            out.append(f"shortlist first must be >= 0, got {self.first}")
        if not 0 <= self.best <= TABLE_TARGETS:
            out.append(f"shortlist best must be in [0, {TABLE_TARGETS}], got {self.best}")
        if not 0.0 <= self.threshold <= 1.0:
            out.append(f"shortlist threshold must be in [0, 1], got {self.threshold}")
        return out


@dataclass(frozen=True)
class LexicalTable:
    """targets[indptr[s]:indptr[s + 1]]: source id s's targets, best first, with
    their scores; frequent: target ids, most frequent first; special: ids that are
    always candidates (padding, EOS, unknown, the start token)."""

    indptr: np.ndarray  # (S + 1,) int64
    targets: np.ndarray  # (E,) int32
    scores: np.ndarray  # (E,) float32
    frequent: np.ndarray  # (F,) int32
    special: np.ndarray  # (k,) int64

    @property
    def source_vocab(self) -> int:
        return int(self.indptr.shape[0] - 1)

    def candidates(self, source: Sequence[int] | np.ndarray,
                   settings: ShortlistSettings) -> np.ndarray:
        """The sentence's candidate target ids, ascending (so a tie between two
        candidates goes to the lower id, as over the whole vocabulary)."""
        ids = np.unique(np.asarray(source, dtype=np.int64))
        ids = ids[(ids >= 0) & (ids < self.source_vocab)]
        parts = [self.special, self.frequent[:settings.first].astype(np.int64)]
        if settings.best and ids.size:
            start, stop = self.indptr[ids], self.indptr[ids + 1]
            stop = np.minimum(stop, start + settings.best)
            for a, b in zip(start.tolist(), stop.tolist(), strict=True):
                if b > a:
                    kept = self.targets[a:b][self.scores[a:b] >= settings.threshold]
                    parts.append(kept.astype(np.int64))
        return np.unique(np.concatenate(parts))

    def arrays(self) -> dict[str, np.ndarray]:
        return {"indptr": self.indptr, "targets": self.targets, "scores": self.scores,
                "frequent": self.frequent, "special": self.special}


@dataclass(frozen=True)
class Projection:
    """The decoder's output projection as the shortlist decoder takes it: weight
    (D, V) in the decoder's dtype (float32, float16 or int8), bias (V,) float32
    (zeros without a final-logits bias)."""

    weight: np.ndarray
    bias: np.ndarray

    def gather(self, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """candidates (B, C) ids, PAD_CANDIDATE past each row's own -> the weight
        columns (B, D, C) and the bias (B, C), -inf at padded slots: their logits
        never win and add nothing to the log-softmax's normalisation."""
        valid = candidates != PAD_CANDIDATE
        ids = np.where(valid, candidates, 0)
        weight = np.ascontiguousarray(np.moveaxis(self.weight[:, ids], 0, 1))  # (B, D, C)
        weight[~np.broadcast_to(valid[:, None, :], weight.shape)] = 0
        bias = np.where(valid, self.bias[ids], -np.inf).astype(np.float32)
        return weight, bias


@dataclass(frozen=True)
class Shortlist:
    table: LexicalTable
    projection: Projection
    settings: ShortlistSettings

    def candidates(self, source: Sequence[int] | np.ndarray) -> np.ndarray:
        return self.table.candidates(source, self.settings)


def padded_candidates(rows: Sequence[np.ndarray], width: int | None = None) -> np.ndarray:
    """(B, C): each row's candidates then PAD_CANDIDATE, C a whole number of
    WIDTH_MULTIPLE blocks (at least `width`)."""
    longest = max([len(r) for r in rows] + [width or 0, 1])
    cols = -(-longest // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    out = np.full((len(rows), cols), PAD_CANDIDATE, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def save(path: Path, table: LexicalTable, projection: Projection) -> None:
    """shortlist.npz, compressed (it is read once, when a server loads the package)."""
    with open(path, "wb") as f:
        arrays: dict[str, Any] = {**table.arrays(), "weight": projection.weight,
                                  "bias": projection.bias}
        np.savez_compressed(f, **arrays)


def load(path: Path, settings: ShortlistSettings) -> Shortlist:
    """Read shortlist.npz (never pickled objects). Raises ValueError naming what is wrong."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path.name}: not a shortlist table ({e})") from None
    wanted = ("indptr", "targets", "scores", "frequent", "special", "weight", "bias")
    missing = [k for k in wanted if k not in arrays]
    if missing:
        raise ValueError(f"{path.name}: missing arrays {', '.join(missing)}")
    table = LexicalTable(arrays["indptr"].astype(np.int64), arrays["targets"],
                         arrays["scores"], arrays["frequent"],
                         arrays["special"].astype(np.int64))
    projection = Projection(arrays["weight"], arrays["bias"].astype(np.float32))
    vocab = projection.weight.shape[1]
    for name, ids in (("targets", table.targets), ("frequent", table.frequent),
                      ("special", table.special)):
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"{path.name}: {name} holds ids outside [0, {vocab})")
    if projection.bias.shape != (vocab,):
        raise ValueError(f"{path.name}: bias has shape {projection.bias.shape}, expected "
                         f"({vocab},)")
    return Shortlist(table, projection, settings)


# -- learning the table ---------------------------------------------------------------


def training_pairs(data: Path) -> list[tuple[Path, Path]]:
    """The (train.src, train.tgt) files of a corpus directory, or of each part of a
    mix (its corpus.json lists them under "parts")."""
    if (data / "train.src").is_file():
        return [(data / "train.src", data / "train.tgt")]
    meta = data / "corpus.json"
    if not meta.is_file():
        raise ValueError(f"{data}: neither train.src nor a corpus.json listing parts")
    parts = json.loads(meta.read_text(encoding="utf-8")).get("parts") or []
    root = _repo_root(data)
    out = []
    for part in parts:
        corpus = Path(part["corpus"])
        corpus = corpus if corpus.is_absolute() else root / corpus
        out += training_pairs(corpus)
    if not out:
        raise ValueError(f"{meta}: lists no parts")
    return out


def _repo_root(data: Path) -> Path:
    """Parts are named relative to the directory holding data/ (the repository)."""
    for parent in data.resolve().parents:
        if parent.name == "data":
            return parent.parent
    return Path.cwd()


def read_pairs(files: Iterable[tuple[Path, Path]]) -> Iterator[tuple[str, str]]:
    for src, tgt in files:
        with open(src, encoding="utf-8") as fs, open(tgt, encoding="utf-8") as ft:
            for s, t in zip(fs, ft, strict=True):
                yield s.rstrip("\n"), t.rstrip("\n")


def learn_table(pairs: Iterable[tuple[Sequence[int], Sequence[int]]], source_vocab: int,
                target_vocab: int, special: Sequence[int], keep: int = TABLE_TARGETS,
                chunk: int = 20000, measure: str = "conditional") -> LexicalTable:
    """The table of tokenized pairs (source ids, target ids), p(t | s) or Dice
    (`measure`, one of MEASURES). Counts are per sentence (a piece twice in a
    sentence counts once)."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    pair_counts = np.zeros(source_vocab * target_vocab, dtype=np.int32)
    src_counts = np.zeros(source_vocab, dtype=np.int64)
    tgt_counts = np.zeros(target_vocab, dtype=np.int64)
    codes: list[np.ndarray] = []
    pending = 0

    def flush() -> None:
        if codes:
            uniq, counts = np.unique(np.concatenate(codes), return_counts=True)
            pair_counts[uniq] += counts.astype(np.int32)
            codes.clear()

    for source, target in pairs:
        s = np.unique(np.asarray(source, dtype=np.int64))
        t = np.unique(np.asarray(target, dtype=np.int64))
        src_counts[s] += 1
        tgt_counts[t] += 1
        codes.append((s[:, None] * target_vocab + t[None, :]).ravel())
        pending += 1
        if pending % chunk == 0:
            flush()
    flush()
    matrix = pair_counts.reshape(source_vocab, target_vocab)
    indptr = np.zeros(source_vocab + 1, dtype=np.int64)
    targets: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    for lo in range(0, source_vocab, 512):
        block = matrix[lo:lo + 512].astype(np.float32)  # (b, V)
        if measure == "dice":
            score = 2 * block / (src_counts[lo:lo + 512, None] + tgt_counts[None, :]).clip(1)
        else:  # p(t | s), as extract_lex's lex.s2t (from co-occurrence, not alignments)
            score = block / src_counts[lo:lo + 512, None].clip(1)
        score[block < MIN_PAIR_COUNT] = 0
        k = min(keep, target_vocab)
        top = np.argpartition(-score, k - 1, axis=1)[:, :k]  # (b, k) unordered
        vals = np.take_along_axis(score, top, axis=1)
        order = np.lexsort((top, -vals), axis=1)  # score descending, then lower id
        top, vals = np.take_along_axis(top, order, 1), np.take_along_axis(vals, order, 1)
        for i in range(block.shape[0]):
            kept = vals[i] > 0
            targets.append(top[i][kept].astype(np.int32))
            scores.append(vals[i][kept].astype(np.float32))
            indptr[lo + i + 1] = indptr[lo + i] + int(kept.sum())
    frequent = np.lexsort((np.arange(target_vocab), -tgt_counts))
    frequent = frequent[tgt_counts[frequent] > 0].astype(np.int32)
    return LexicalTable(indptr, np.concatenate(targets) if targets else np.zeros(0, np.int32),
                        np.concatenate(scores) if scores else np.zeros(0, np.float32),
                        frequent, np.unique(np.asarray(special, dtype=np.int64)))
