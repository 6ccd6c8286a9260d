"""The training data side: corpus splits -> token cache -> token-budget batches.

A tokenized split is cached in the run directory (`cache/<split>[-<limit>].npz`)
under a fingerprint of everything it derives from. A weighted mix (`mix.py`:
parts and weights in corpus.json) is read part by part, each part's training
pairs tokenized once into a cache entry of its own, and its examples repeated
by the part's weight in every epoch. Training batches come from a
`BatchStream` whose (epoch, index) position is saved in checkpoints; an epoch's
batches derive from (seed, epoch) alone, so a resumed run rebuilds the same
epoch and continues with the same batches it would have taken.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from seq2serve.model.data import mix
from seq2serve.model.tokenizer import Tokenizer

CACHE_VERSION = 2  # part of the cache fingerprint: bump it when the cached content changes


def read_split(data_dir: str | os.PathLike[str], split: str,
               limit: int | None = None) -> tuple[list[str], list[str]]:
    """Aligned (sources, targets) of one split, at most `limit` pairs."""
    data_dir = Path(data_dir)
    sides = []
    for ext in ("src", "tgt"):
        path = data_dir / f"{split}.{ext}"
        if not path.is_file():
            raise FileNotFoundError(f"missing corpus file {path}")
        # Split on "\n" only: str.splitlines would also split on U+2028 and
        # friends and misalign the two sides.
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        sides.append(lines[:limit] if limit is not None else lines)
    if len(sides[0]) != len(sides[1]):
        raise ValueError(f"{data_dir}/{split}: {len(sides[0])} source lines but "
                         f"{len(sides[1])} target lines")
    return sides[0], sides[1]


@dataclass
class TokenData:
    """A tokenized split: ragged id sequences stored flat with offsets."""

    src_ids: np.ndarray  # (total_src_tokens,) int32
    src_offsets: np.ndarray  # (n + 1,) int64
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    repeats: np.ndarray | None = None  # (n,) times each example is in an epoch; None: once

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    @property
    def epoch_size(self) -> int:
        return len(self) if self.repeats is None else int(self.repeats.sum())

    def src(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_offsets[i]: self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_offsets[i]: self.tgt_offsets[i + 1]]


def _flatten(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    flat = np.fromiter((t for r in rows for t in r), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokenize_split(data_dir: Path, split: str, tokenizer: Tokenizer, cache_dir: Path,
                   max_src_len: int, max_tgt_len: int, limit: int | None = None,
                   threads: int = 2) -> TokenData:
    """Token ids of a split, from the cache when it matches the inputs exactly.

    Long sources are truncated (a summary of the first part is still a fair
    target) but pairs whose target exceeds `max_tgt_len` are dropped: a cut
    target ends in an EOS that would teach the model to stop mid-sentence.
    Pairs with an empty side are dropped too. The fingerprint covers the
    tokenizer, the text files and the length limits, so changing any of them
    rebuilds the cache.
    """
    files = [data_dir / f"{split}.src", data_dir / f"{split}.tgt"]
    fingerprint = json.dumps({
        "version": CACHE_VERSION, "tokenizer": _file_sha256(tokenizer.path),
        "files": _stats(files), "max_src_len": max_src_len, "max_tgt_len": max_tgt_len,
        "limit": limit,
    }, sort_keys=True)
    cache = cache_dir / f"{split}{'' if limit is None else f'-{limit}'}.npz"
    return _tokenize_cached(cache, fingerprint, lambda: read_split(data_dir, split, limit),
                            tokenizer, max_src_len, max_tgt_len, threads)


def tokenize_mix(data_dir: Path, tokenizer: Tokenizer, cache_dir: Path, max_src_len: int,
                 max_tgt_len: int, threads: int = 2) -> TokenData:
    """The training examples of a weighted mix: each part's train pairs without
    the mix's exclusions (`mix.exclusions`), tokenized and cached per part
    (`cache/train-<part>.npz`), then concatenated with each example repeated
    its part's weight times per epoch (`TokenData.repeats`). Filtering and
    length rules are `tokenize_split`'s, so the examples are those of the
    written mix with the same parts, as a multiset."""
    info = mix.read_info(data_dir)
    parts = mix.parts_of(info)
    excluded: tuple[set[tuple[str, str]], set[str]] | None = None
    held_files = [corpus / f"{split}.{ext}" for corpus, _ in parts
                  for split in ("valid", "test") for ext in ("src", "tgt")
                  if (corpus / f"{split}.src").is_file()] + [data_dir / mix.EXCLUDE_FILE]

    def read_part(corpus: Path) -> tuple[list[str], list[str]]:
        nonlocal excluded
        excluded = excluded or mix.exclusions(data_dir, info)
        rows = mix.part_train_rows(corpus, *excluded, reverse=mix.is_reversed(info))
        return [r[1] for r in rows], [r[2] for r in rows]

    datas = []
    for corpus, weight in parts:
        files = [corpus / "train.src", corpus / "train.tgt"]
        fingerprint = json.dumps({
            "version": CACHE_VERSION, "tokenizer": _file_sha256(tokenizer.path),
            "files": _stats(files), "held_out": _stats([f for f in held_files if f.is_file()]),
            "max_src_len": max_src_len, "max_tgt_len": max_tgt_len,
            "reverse": mix.is_reversed(info),
        }, sort_keys=True)
        name = hashlib.sha256(str(corpus.resolve()).encode("utf-8")).hexdigest()[:12]
        data = _tokenize_cached(cache_dir / f"train-{name}.npz", fingerprint,
                                lambda c=corpus: read_part(c), tokenizer, max_src_len,
                                max_tgt_len, threads)
        datas.append((data, weight))
    return concat(datas)


def concat(parts: list[tuple[TokenData, int]]) -> TokenData:
    """One TokenData of several, each part's examples `weight` times per epoch."""
    src_ids = np.concatenate([d.src_ids for d, _ in parts])
    tgt_ids = np.concatenate([d.tgt_ids for d, _ in parts])
    src_off, tgt_off = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    for data, _ in parts:
        src_off.append(data.src_offsets[1:] + src_off[-1][-1])
        tgt_off.append(data.tgt_offsets[1:] + tgt_off[-1][-1])
    repeats = np.concatenate([np.full(len(d), w, dtype=np.int64) for d, w in parts])
    return TokenData(src_ids, np.concatenate(src_off), tgt_ids, np.concatenate(tgt_off),
                     repeats)


def _stats(files: list[Path]) -> list[list[object]]:
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def _tokenize_cached(cache: Path, fingerprint: str,
                     read: Callable[[], tuple[list[str], list[str]]], tokenizer: Tokenizer,
                     max_src_len: int, max_tgt_len: int, threads: int) -> TokenData:
    if cache.is_file():
        with np.load(cache) as z:
            if str(z["fingerprint"]) == fingerprint:
                return TokenData(z["src_ids"], z["src_offsets"], z["tgt_ids"], z["tgt_offsets"])
    sources, targets = read()
    keep = [i for i, (s, t) in enumerate(zip(sources, targets, strict=True))
            if s.strip() and t.strip()]
    src = tokenizer.encode_batch([sources[i] for i in keep], max_src_len, num_threads=threads)
    tgt = tokenizer.encode_batch([targets[i] for i in keep], num_threads=threads)
    fits = [j for j, ids in enumerate(tgt) if len(ids) <= max_tgt_len]
    src, tgt = [src[j] for j in fits], [tgt[j] for j in fits]
    (src_ids, src_off), (tgt_ids, tgt_off) = _flatten(src), _flatten(tgt)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, src_ids=src_ids, src_offsets=src_off, tgt_ids=tgt_ids, tgt_offsets=tgt_off,
             fingerprint=np.array(fingerprint))
    tmp.replace(cache)
    return TokenData(src_ids, src_off, tgt_ids, tgt_off)


def pack_greedy(order: Iterable[int], max_tokens: int, src_lens: Sequence[int] | np.ndarray,
                tgt_lens: Sequence[int] | np.ndarray | None = None) -> list[list[int]]:
    """Indices in `order`, cut into consecutive batches of at most `max_tokens`
    padded tokens: B * (S + T), S and T the batch's longest source and target
    (T = 0 without `tgt_lens`). A single example over the budget still gets a
    batch of its own."""
    batches: list[list[int]] = []
    current: list[int] = []
    max_s = max_t = 0
    for i in order:
        s = max(max_s, int(src_lens[i]))
        t = 0 if tgt_lens is None else max(max_t, int(tgt_lens[i]))
        if current and (len(current) + 1) * (s + t) > max_tokens:
            batches.append(current)
            current = []
            s, t = int(src_lens[i]), 0 if tgt_lens is None else int(tgt_lens[i])
        current.append(i)
        max_s, max_t = s, t
    if current:
        batches.append(current)
    return batches


def length_batches(lengths: list[int] | np.ndarray, max_tokens: int) -> list[list[int]]:
    """Indices grouped into batches of similar length, each at most `max_tokens`
    padded tokens (a single longer example still gets a batch of its own)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return pack_greedy(order.tolist(), max_tokens, lengths)


def epoch_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int,
                  epoch: int, bucket_size: int = 20_000,
                  repeats: np.ndarray | None = None) -> list[np.ndarray]:
    """One epoch's batches: every example exactly once (`repeats[i]` times with
    `repeats`: a weighted mix), each batch at most `max_tokens` padded
    source+target tokens (B * (S + T)).

    Examples are shuffled, cut into buckets, sorted by length inside a bucket
    (little padding, yet no epoch-long curriculum by length), packed greedily,
    and the batch order shuffled. Everything derives from (seed, epoch), so a
    resumed run rebuilds the same epoch and skips to its position.
    """
    rng = np.random.default_rng([seed, epoch])
    if repeats is None:
        order = rng.permutation(len(src_lens))
    else:  # the same draw as for a written mix of len(examples) pairs
        examples = np.repeat(np.arange(len(src_lens)), repeats)
        order = examples[rng.permutation(len(examples))]
    batches: list[np.ndarray] = []
    for start in range(0, len(order), bucket_size):
        bucket = order[start: start + bucket_size]
        bucket = bucket[np.lexsort((tgt_lens[bucket], src_lens[bucket]))]
        batches.extend(np.array(b) for b in pack_greedy(bucket.tolist(), max_tokens,
                                                        src_lens, tgt_lens))
    rng.shuffle(batches)
    return batches


class BatchStream:
    """Endless batches, epoch after epoch, with a resumable (epoch, index) position."""

    def __init__(self, data: TokenData, max_tokens: int, seed: int, bucket_size: int,
                 epoch: int = 0, index: int = 0):
        self.data, self.max_tokens, self.seed, self.bucket_size = (
            data, max_tokens, seed, bucket_size)
        self.src_lens, self.tgt_lens, self.repeats = data.src_lens, data.tgt_lens, data.repeats
        self.epoch, self.index = epoch, index
        self._batches = self._build()

    def _build(self) -> list[np.ndarray]:
        return epoch_batches(self.src_lens, self.tgt_lens, self.max_tokens, self.seed,
                             self.epoch, self.bucket_size, self.repeats)

    def next(self) -> np.ndarray:
        if self.index >= len(self._batches):
            self.epoch, self.index = self.epoch + 1, 0
            self._batches = self._build()
        batch = self._batches[self.index]
        self.index += 1
        return batch


def pad_rows(rows: list[list[int]] | list[np.ndarray], pad_id: int) -> np.ndarray:
    """Rows padded on the right into one (B, longest) int64 array."""
    out = np.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def collate(data: TokenData, batch: np.ndarray, pad_id: int,
            start_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """(src (B, S), tgt_in (B, T), labels (B, T)); tgt_in is labels shifted right
    behind the decoder start token, so both have the target's length incl. EOS."""
    tgts = [data.tgt(i) for i in batch]
    src = pad_rows([data.src(i) for i in batch], pad_id)
    labels = pad_rows(tgts, pad_id)
    tgt_in = labels.copy()
    for row, t in enumerate(tgts):
        tgt_in[row, 0] = start_id
        tgt_in[row, 1: len(t)] = t[:-1]
    return torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(labels)
