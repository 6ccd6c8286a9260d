"""The Engine: tokenized sources in, n-best hypotheses out.

Two ways in:
- `generate()` decodes a whole batch (the request-level path, benchmarks,
  tests): sources are grouped by beam width and each group runs to the end.
- `start_batch()` returns a RunningBatch for iteration-level batching: the
  caller `admit()`s requests at any step boundary and calls `step()`, which
  runs one decoder call over every live row and hands back the sources that
  finished, as values (StepOutcome).

A running batch has one beam width K (the decoder graph groups the K rows of
a source for cross-attention). It holds one DecodeState for all its live
sources, each at its own step (one search step per decoder call, whoever
joined when), the shared self-attention cache and the cross K/V of every live
source, one slot per source. The decoder graph writes each row's step at its
own cache slot and masks the rest, so a row's floats do not depend on the step
it joined at or its neighbours.

A source leaves as soon as its result is fixed (EOS, length limit, the beam
early-stop rule, or cancellation): its cross K/V slot and its rows become a
hole for the next newcomer (source_slots.py), so leaving copies nothing. Cache
rows move only when rows moved: beam search every step (only the moved rows,
in place on CPU), greedy and sampling only when the batch grows past its rows
or compacts.

A batch decodes over the whole vocabulary or, in a package with a vocabulary
shortlist, over each source's candidates (a request's `shortlist` option, the
model's default otherwise): the two never share a batch. A shortlist source's
candidates are fixed when it is admitted (runner.shortlist_columns), so its
output never depends on its batch-mates.

An Engine runs one batch at a time (the runner reuses its buffers between
steps); the model's worker thread is its caller.

Scores are comparable with Hugging Face: beam search returns HF's
`sequences_scores` (sum of processed log-probs / length ** length_penalty);
greedy and sampling return the plain sum of the processed log-probs of the
chosen tokens (EOS included; sampling's temperature/top-k/top-p not applied).
Hypotheses stop at EOS or the length limit. The package's forced tokens
(generation_config's forced_bos_token_id / forced_eos_token_id), bad words,
encoder_no_repeat_ngram_size, begin_suppress_tokens,
exponential_decay_length_penalty and renormalize_logits apply to every source
as generate() applies them: the forced EOS at the last token the source's own
limit allows (its max_length, lowered by
max_length_ratio for its length), so a row's tokens never depend on its
batch-mates. Without a forced EOS, a hypothesis cut at the limit ends with
finish_reason "length".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import overload

import numpy as np

from seq2serve.model.package.manifest import ModelPackage, load_package
from seq2serve.server.engine.decode_state import (
    CancelCheck,
    DecodeState,
    Request,
    SourceOptions,
    TokenCallback,
)
from seq2serve.server.engine.decoding import NO_TOKEN, EosStop, LengthStop, StopRule
from seq2serve.server.engine.options import OptionLimits, Resolvable, ResolvedOptions, SourceError
from seq2serve.server.engine.runner import (
    CACHE_BLOCK,
    DecoderCache,
    Runner,
    RunnerConfig,
    padded_width,
)
from seq2serve.server.engine.search import (
    BeamSearch,
    Candidates,
    GreedySearch,
    Hypothesis,
    Result,
    SearchStrategy,
    Special,
)
from seq2serve.server.engine.source_slots import SourceSlots

__all__ = ["Engine", "Generation", "GenerateStats", "Hypothesis", "Request", "Result",
           "RunningBatch", "SourceOptions", "StepOutcome", "StepStats"]


AnyOptions = Resolvable | ResolvedOptions  # a request's, or already resolved


@dataclass(frozen=True)
class StepStats:
    step: int  # decoder calls of this batch before this one
    sources: int
    rows: int  # N, the decoder graph's batch
    cache_length: int  # slots per row in the self-attention cache
    ort_seconds: float
    host_seconds: float  # log-prob processing, selection, bookkeeping


@dataclass
class GenerateStats:
    steps: list[StepStats] = field(default_factory=list)
    encode_seconds: float = 0.0

    @property
    def ort_seconds(self) -> float:
        return self.encode_seconds + sum(s.ort_seconds for s in self.steps)

    @property
    def host_seconds(self) -> float:
        return sum(s.host_seconds for s in self.steps)


@dataclass(frozen=True)
class Generation(Sequence[Result]):
    """generate()'s value: one Result per source, in order, and the stats of the
    run. Read as a sequence, it is its results."""

    results: tuple[Result, ...]
    stats: GenerateStats

    @overload
    def __getitem__(self, index: int) -> Result: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Result]: ...

    def __getitem__(self, index: int | slice) -> Result | Sequence[Result]:
        return self.results[index]

    def __len__(self) -> int:
        return len(self.results)


@dataclass(frozen=True)
class StepOutcome:
    finished: list[tuple[int, Result]]  # (request key, result), cancelled ones too
    stats: StepStats | None  # None when no row was left to run


class Engine:
    def __init__(self, package: str | Path | ModelPackage, runner: RunnerConfig | None,
                 limits: OptionLimits):
        self.package = package if isinstance(package, ModelPackage) else load_package(package)
        self.runner = Runner(self.package, runner)
        manifest = self.package.manifest
        tokens = manifest.special_tokens
        self.eos_id = tokens.eos
        self.pad_id = tokens.pad
        generation = manifest.generation
        self.special = Special(
            tokens.decoder_start, self.eos_id, tokens.suppress,
            forced_bos=_token_or_none(generation.forced_bos_token_id),
            forced_eos=_token_or_none(generation.forced_eos_token_id),
            bad_words=generation.bad_words_ids or (),
            begin_suppress=generation.begin_suppress_tokens or (),
            decay_start=_token_or_none(generation.exponential_decay_start),
            decay_factor=1.0 if generation.exponential_decay_factor is None
            else generation.exponential_decay_factor,
            renormalize=generation.renormalize_logits is True,
            encoder_ngram=generation.encoder_no_repeat_ngram_size or 0,
            vocab=manifest.config.tgt_vocab_size)
        self.src_vocab_size = manifest.config.src_vocab_size
        self.tgt_vocab_size = manifest.config.tgt_vocab_size
        self.max_source_length = manifest.max_source_length
        # The decoder's positions end at max_positions: one per generated token.
        self.limits = OptionLimits(limits.max_beam_size,
                                   min(limits.max_length, self.runner.max_positions))
        self.defaults = manifest.generation.as_dict()
        self.stop_rules: tuple[StopRule, ...] = (EosStop(self.eos_id), LengthStop())

    # -- requests ----------------------------------------------------------------------

    @property
    def max_positions(self) -> int:
        """The decoder's position count: no hypothesis grows longer."""
        return self.runner.max_positions

    @property
    def provider(self) -> str:
        """The ONNX Runtime execution provider the sessions run on."""
        return self.runner.provider

    @property
    def has_shortlist(self) -> bool:
        """Whether the package has a vocabulary shortlist (format 8)."""
        return self.runner.shortlist is not None

    def resolve(self, options: Resolvable) -> ResolvedOptions:
        """Options with the model's defaults filled in, validated for this engine.
        A model without a shortlist decodes over its vocabulary whatever was asked."""
        resolved = options.resolve(self.defaults, self.limits)
        if resolved.shortlist and not self.has_shortlist:
            resolved = replace(resolved, shortlist=False)
        return resolved

    def check_source(self, source: Sequence[int], index: int = 0) -> None:
        if len(source) == 0:
            raise SourceError("source", f"source {index} is empty (expected token ids "
                                 "ending with EOS)")
        if len(source) > self.max_source_length:
            raise SourceError("source", f"source {index} has {len(source)} tokens; this "
                                 f"model accepts at most {self.max_source_length}")
        low, high = min(source), max(source)
        if low < 0 or high >= self.src_vocab_size:
            raise SourceError("source", f"source {index} has token id "
                                 f"{low if low < 0 else high} outside "
                                 f"[0, {self.src_vocab_size})")

    def request(self, key: int, source: Sequence[int], options: ResolvedOptions, *,
                cancelled: CancelCheck | None = None, on_token: TokenCallback | None = None,
                index: int = 0, forced_bos: int | None = None) -> Request:
        """A checked request. options: already resolved (`resolve()`). forced_bos:
        its hypotheses' first token (a multilingual model's target language)."""
        self.check_source(source, index)
        if forced_bos is not None and not 0 <= forced_bos < self.tgt_vocab_size:
            raise SourceError("forced_bos", f"source {index}'s forced first token "
                              f"{forced_bos} is outside [0, {self.tgt_vocab_size})")
        return Request(key, list(source), SourceOptions.of(options, len(source)), cancelled,
                       on_token, forced_bos)

    def strategy(self, beams: int) -> SearchStrategy:
        if beams == 1:
            return GreedySearch(self.special, self.stop_rules)
        return BeamSearch(self.special, self.stop_rules, beams, select=self.runner.top_k)

    def start_batch(self, beams: int, shortlist: bool = False) -> RunningBatch:
        return RunningBatch(self, beams, shortlist and self.has_shortlist)

    def terminate(self) -> None:
        """End the ONNX Runtime runs in progress (the server's grace period is over)."""
        self.runner.terminate()

    def generate(self, sources: Sequence[Sequence[int]],
                 options: AnyOptions | Sequence[AnyOptions], *,
                 cancelled: Sequence[CancelCheck | None] | None = None,
                 on_token: Sequence[TokenCallback | None] | None = None,
                 forced_bos: Sequence[int | None] | None = None) -> Generation:
        """Decode a batch. sources: token ids with EOS, as the tokenizer makes them.

        options: one for all sources or one per source, resolved or not (a
        request's None fields take the model's defaults). cancelled: per source,
        checked at every step boundary; a cancelled source leaves the batch and its
        Result is marked.
        on_token: per source, called with every token of a greedy or sampling
        hypothesis as it is chosen, the final EOS included (beam search has no
        stable prefix to stream, so beam sources never call it).
        forced_bos: per source, its hypotheses' first token (a multilingual model's
        target language), None for the package's.
        """
        count = len(sources)
        if not isinstance(options, Sequence):
            options = [options] * count
        if len(options) != count:
            raise ValueError(f"{len(options)} options for {count} sources")
        resolved_by_id: dict[int, ResolvedOptions] = {}
        for opt in options:  # a shared options object is resolved once
            if id(opt) not in resolved_by_id:
                resolved_by_id[id(opt)] = (opt if isinstance(opt, ResolvedOptions)
                                           else self.resolve(opt))
        cancel = list(cancelled) if cancelled is not None else [None] * count
        stream = list(on_token) if on_token is not None else [None] * count
        forced = list(forced_bos) if forced_bos is not None else [None] * count
        requests = [self.request(i, src, resolved_by_id[id(opt)], cancelled=cancel[i],
                                 on_token=stream[i], index=i, forced_bos=forced[i])
                    for i, (src, opt) in enumerate(zip(sources, options, strict=True))]
        stats = GenerateStats()
        results: list[Result] = [Result() for _ in range(count)]
        groups: dict[tuple[int, bool], list[Request]] = {}
        for r in requests:
            groups.setdefault((r.options.beam_size, r.options.shortlist), []).append(r)
        for (beams, shortlist), members in sorted(groups.items()):
            batch = self.start_batch(beams, shortlist)
            stats.encode_seconds += batch.admit(members)
            while batch.rows:
                outcome = batch.step()
                if outcome.stats is not None:
                    stats.steps.append(outcome.stats)
                for key, result in outcome.finished:
                    results[key] = result
        return Generation(tuple(results), stats)


@dataclass(frozen=True)
class _Placed:
    """The decode state and where its sources' rows are: `slots` in the next
    decoder call, `prev` in the last one (-1 for sources that have not run;
    they differ only after a compaction). `settled`: every source ran in the
    last call, in the slot it has now (prev is slots), as after most steps."""

    state: DecodeState
    slots: np.ndarray  # (B,)
    prev: np.ndarray  # (B,)
    settled: bool = False

    @classmethod
    def ran(cls, state: DecodeState, slots: np.ndarray) -> _Placed:
        """After a decoder call: every source ran, in the slot it keeps."""
        return cls(state, slots, slots, settled=True)

    def only(self, keep: np.ndarray) -> _Placed:
        state = self.state.filter(keep) if keep.size < self.state.sources else self.state
        slots = self.slots[keep]
        return _Placed(state, slots, slots if self.settled else self.prev[keep], self.settled)


class RunningBatch:
    """Live sources of one beam width, at possibly different steps, in one decode
    state (one search step per decoder call, whoever joined when). Each source
    owns a slot of the cross K/V (source_slots.py) and the K decoder rows
    slot*K .. slot*K+K-1; rows of holes run idle until a newcomer fills them."""

    def __init__(self, engine: Engine, beams: int, shortlist: bool = False):
        self.engine = engine
        self.runner = engine.runner
        self.beams = beams
        self.shortlist = shortlist
        self.search = engine.strategy(beams)
        self.placed: _Placed | None = None
        self.slots = SourceSlots(self.runner.memory)
        self.cache: DecoderCache | None = None
        self.steps = 0

    # -- plain numbers for the scheduler -------------------------------------------------

    @property
    def sources(self) -> int:
        return self.placed.state.sources if self.placed is not None else 0

    @property
    def rows(self) -> int:
        return self.placed.state.rows if self.placed is not None else 0

    @property
    def longest_reach(self) -> int:
        """The cache length the live rows may reach (their limits, in whole blocks)."""
        if self.placed is None or not self.placed.state.sources:
            return 0
        return padded_width(int(self.placed.state.max_new.max()), CACHE_BLOCK)

    # -- admission ---------------------------------------------------------------------

    def admit(self, requests: Sequence[Request]) -> float:
        """Encode the requests (checked by Engine.request, beam width equal to
        this batch's) once and write them into free slots; they run from the
        next step. Returns the encoder's seconds. On an error nothing was admitted."""
        if not requests:
            return 0.0
        for r in requests:
            if r.options.beam_size != self.beams:
                raise ValueError(f"a beam {r.options.beam_size} request cannot join a "
                                 f"beam {self.beams} batch")
            if r.options.shortlist != self.shortlist:
                raise ValueError("a request over the " + ("shortlist" if r.options.shortlist
                                                          else "whole vocabulary")
                                 + " cannot join a batch decoding over the other")
        start = time.perf_counter()
        lengths = [len(r.source) for r in requests]
        width = padded_width(max(lengths))
        src_ids = np.full((len(requests), width), self.engine.pad_id, dtype=np.int64)
        src_mask = np.zeros((len(requests), width), dtype=np.int64)
        for i, r in enumerate(requests):
            src_ids[i, : lengths[i]] = r.source
            src_mask[i, : lengths[i]] = 1
        enc = self.runner.encode(src_ids, src_mask)
        if self.shortlist:
            enc = replace(enc, shortlist=self.runner.shortlist_columns(
                [r.source for r in requests]))
        state = self.search.start(requests)
        slots = self.slots.place(enc)
        placed = _Placed(state, slots, np.full(slots.size, -1, dtype=np.int64))
        if self.placed is not None:
            last = self.placed
            placed = _Placed(last.state.concatenate(state), np.concatenate([last.slots, slots]),
                             np.concatenate([last.prev, placed.prev]))
        # Sources in slot order: their rows are then mostly one slice of the log-probs.
        order = np.argsort(placed.slots, kind="stable")
        if not bool(np.all(order == np.arange(order.size))):
            placed = _Placed(placed.state.filter(order), placed.slots[order], placed.prev[order])
        self.placed = placed
        return time.perf_counter() - start

    # -- one step ----------------------------------------------------------------------

    def step(self) -> StepOutcome:
        finished: list[tuple[int, Result]] = []
        self._drop_cancelled(finished)
        if self.placed is None:
            self._reset()
            return StepOutcome(finished, None)
        if self.slots.should_compact():
            moved = self.slots.compact()
            p = self.placed
            self.placed = _Placed(p.state, moved[p.slots], p.prev)
        t0 = time.perf_counter()
        p = self.placed
        state = p.state
        rows = self.slots.used * self.beams
        at = _rows(p.slots, self.beams)
        tokens, positions = self._inputs(state, at, rows)
        cache = self._cache_for(p, at, rows)
        enc = self.slots.encoder_state()
        candidates = None if enc.shortlist is None else \
            Candidates(enc.shortlist.candidates[p.slots], self.runner.vocab_size)
        plan = self.search.plan(state, candidates) if self.runner.memory.on_device else None
        if plan is None:  # the CPU's way: the log-probs on the host
            log_probs, self.cache, aligned = self.runner.step(tokens, positions, cache, enc)
            t1 = time.perf_counter()
            state, done = self.search.step(state, log_probs[at], aligned[at], candidates)
        else:  # a device's: each row's k best come back
            picked, self.cache, aligned = self.runner.step_picked(
                tokens, positions, cache, enc, plan.edits.placed(at, rows), plan.k)
            t1 = time.perf_counter()
            decided = self.search.step_picked(state, picked.rows(at), aligned[at],
                                              candidates)
            if decided is None:  # the candidates cannot decide it: the whole rows
                decided = self.search.step(state, self.runner.last_log_probs()[at],
                                           aligned[at], candidates)
            state, done = decided
        length = self.cache.length
        sources = self.sources
        if done.any():
            for i in np.flatnonzero(done):
                hypotheses = tuple(self.search.finish(state, int(i)))
                finished.append((state.requests[i].key, Result(hypotheses)))
            keep = np.flatnonzero(~done)
            self._adopt(_Placed.ran(state, p.slots).only(keep) if keep.size else None,
                        p.slots[done])
        else:
            self.placed = _Placed.ran(state, p.slots)
        stats = StepStats(self.steps, sources, rows, length, t1 - t0, time.perf_counter() - t1)
        self.steps += 1
        return StepOutcome(finished, stats)

    def _inputs(self, state: DecodeState, at: slice | np.ndarray, rows: int
                ) -> tuple[np.ndarray, np.ndarray]:
        """Each decoder row's token and position: the state's rows at `at`; holes'
        rows are idle (any token, position 0)."""
        if _covers(at, rows):  # no holes: the state's rows are the call's, in order
            return state.tokens, state.row_generated()
        tokens = np.full(rows, self.engine.pad_id, dtype=np.int64)
        positions = np.zeros(rows, dtype=np.int64)
        tokens[at] = state.tokens
        positions[at] = state.row_generated()
        return tokens, positions

    def _cache_for(self, p: _Placed, at: slice | np.ndarray, rows: int) -> DecoderCache:
        """The cache whose row r is the row that decoder row r continues (the
        last call's cache itself when no row moved: the step writes in place)."""
        if self.cache is None:
            return self.runner.empty_cache(rows)
        return self.runner.reorder_cache(self.cache,
                                         self._origin(p, at, rows, self.cache.rows))

    def _origin(self, p: _Placed, at: slice | np.ndarray, rows: int, before: int
                ) -> np.ndarray:
        """The cache row (of the `before` rows of the last call) each of this
        call's rows continues. A row continues a row of its own source (beam
        search reorders within a source), which sat in the source's previous
        slot. A row that does not continue one (new, idle) stays where it is
        when the cache has that row: its slots are masked, so whatever they hold
        is never read."""
        beams = self.beams
        state = p.state
        if state.origin is not None and p.settled and _covers(at, rows):  # the usual step
            settled: np.ndarray = (p.slots[:, None] * beams
                                   + (state.origin % beams).reshape(-1, beams)).reshape(-1)
            return settled
        origin = np.arange(rows, dtype=np.int64)
        origin[before:] = 0
        ran = np.flatnonzero(p.prev >= 0)
        if ran.size and state.origin is not None:
            ran_rows = state.rows_of(ran)
            origin[_rows(p.slots[ran], beams)] = \
                np.repeat(p.prev[ran], beams) * beams + state.origin[ran_rows] % beams
        return origin

    def _drop_cancelled(self, finished: list[tuple[int, Result]]) -> None:
        """Cancellation is checked at step boundaries, where a source leaves for free."""
        p = self.placed
        if p is None:
            return
        gone = [i for i, r in enumerate(p.state.requests)
                if r.cancelled is not None and r.cancelled()]
        if not gone:
            return
        for i in gone:
            finished.append((p.state.requests[i].key, Result(cancelled=True)))
        left = np.zeros(p.state.sources, dtype=bool)
        left[gone] = True
        keep = np.flatnonzero(~left)
        self._adopt(p.only(keep) if keep.size else None, p.slots[left])

    def _adopt(self, placed: _Placed | None, left: np.ndarray) -> None:
        self.placed = placed
        if placed is None:
            self._reset()
        elif left.size:
            self.slots.release(left)

    def _reset(self) -> None:
        """Nothing live: the next admission starts a fresh cache and fresh slots."""
        self.placed = None
        self.slots.reset()
        self.cache = None


def _token_or_none(token: int | None) -> int:
    return NO_TOKEN if token is None else token


def _covers(at: slice | np.ndarray, rows: int) -> bool:
    """Whether the rows `at` (`_rows`) are all `rows` rows, in order."""
    return isinstance(at, slice) and at.start == 0 and at.stop == rows


def _rows(slots: np.ndarray, beams: int) -> slice | np.ndarray:
    """The decoder rows of sources in these slots: a slice (a view of the
    log-probs, no copy) when the slots are consecutive, as they mostly are."""
    first, count = int(slots[0]), int(slots.size)
    if int(slots[-1]) - first == count - 1 and (count < 3 or bool(np.all(np.diff(slots) == 1))):
        return slice(first * beams, (first + count) * beams)
    return (slots[:, None] * beams + np.arange(beams)).reshape(-1)
