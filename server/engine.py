"""The Engine: tokenized sources in, n-best hypotheses out.

`generate()` takes a batch (the scheduler's, or a benchmark's) with one
DecodingOptions per source. Sources are grouped by beam width (the decoder
graph needs N = B*K rows, K equal across the batch); greedy and sampling
sources share the K = 1 group. Per group: the encoder runs once, cross K/V are
kept once per source, and each decoder step processes every live row at once;
the per-source differences (lengths, penalties, temperatures) are per-row
arrays, so the step loop has no per-hypothesis Python loop.

A source leaves its group as soon as its result is fixed (EOS, length limit,
the beam early-stop rule, or cancellation): its rows vanish from the next
step's beam_origin and its cross K/V are dropped, so it costs nothing further.
`StepStats` (rows, sources, seconds in ONNX Runtime and in Python) are kept
per step for metrics, tests and profiling.

An Engine runs one generate() at a time (the runner reuses its buffers between
steps); the scheduler's single worker thread is its caller.

Scores are comparable with Hugging Face: beam search returns HF's
`sequences_scores` (sum of processed log-probs / length ** length_penalty);
greedy and sampling return the plain sum of the processed log-probs of the
chosen tokens (EOS included; sampling's temperature/top-k/top-p not applied).
Hypotheses stop at EOS or the length limit; unlike HF's Marian default
(`forced_eos_token_id`), no EOS is forced at the limit: such a hypothesis ends
with finish_reason "length".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seq2serve.export.package import ModelPackage, load_package

from .decoding import (
    BeamParams,
    BeamState,
    EosStop,
    LengthStop,
    Processing,
    StopRule,
    beam_step,
    greedy_tokens,
    process_log_probs,
    sample_tokens,
    stops,
    warp_for_sampling,
)
from .options import DecodingOptions, InvalidOptions, OptionLimits
from .runner import DecoderCache, Runner, RunnerConfig, padded_width

CancelCheck = Callable[[], bool]
TokenCallback = Callable[[int], None]  # called with each new token id (greedy/sampling)


@dataclass(frozen=True)
class Hypothesis:
    token_ids: list[int]  # without the start token and without EOS
    score: float | None  # None unless return_scores
    finish_reason: str  # "eos" or "length"
    # per token, the source token position it attended to most; None unless requested
    alignment: list[int] | None = None


class Result(list[Hypothesis]):
    """The n-best of one source, best first; `cancelled` sources have none."""

    def __init__(self, hypotheses: Sequence[Hypothesis] = (), cancelled: bool = False):
        super().__init__(hypotheses)
        self.cancelled = cancelled


@dataclass(frozen=True)
class StepStats:
    step: int
    sources: int
    rows: int  # N, the decoder graph's batch
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


class Engine:
    def __init__(self, package: str | Path | ModelPackage, runner: RunnerConfig | None = None,
                 limits: OptionLimits | None = None):
        self.package = package if isinstance(package, ModelPackage) else load_package(package)
        self.runner = Runner(self.package, runner)
        manifest = self.package.manifest
        cfg = manifest.config
        self.eos_id = int(manifest.special_tokens["eos"])
        self.pad_id = int(manifest.special_tokens["pad"])
        self.start_id = int(manifest.special_tokens["decoder_start"])
        self.suppress = tuple(int(t) for t in manifest.special_tokens.get("suppress", []))
        self.src_vocab_size = int(cfg["src_vocab_size"])
        self.max_source_length = int(manifest.max_source_length)
        limits = limits or OptionLimits()
        # The decoder's positions end at max_positions: one per generated token.
        self.limits = OptionLimits(limits.max_beam_size,
                                   min(limits.max_length, self.runner.max_positions))
        self.defaults = dict(manifest.generation)
        self.stop_rules: tuple[StopRule, ...] = (EosStop(self.eos_id), LengthStop())
        self.last_stats = GenerateStats()

    # -- requests ----------------------------------------------------------------------

    def resolve(self, options: DecodingOptions | None) -> DecodingOptions:
        """Options with the model's defaults filled in, validated for this engine."""
        return (options or DecodingOptions()).resolve(self.defaults, self.limits)

    def _check_source(self, index: int, source: Sequence[int]) -> None:
        if len(source) == 0:
            raise InvalidOptions("source", f"source {index} is empty (expected token ids "
                                 "ending with EOS)")
        if len(source) > self.max_source_length:
            raise InvalidOptions("source", f"source {index} has {len(source)} tokens; this "
                                 f"model accepts at most {self.max_source_length}")
        low, high = min(source), max(source)
        if low < 0 or high >= self.src_vocab_size:
            raise InvalidOptions("source", f"source {index} has token id "
                                 f"{low if low < 0 else high} outside "
                                 f"[0, {self.src_vocab_size})")

    def generate(self, sources: Sequence[Sequence[int]],
                 options: DecodingOptions | Sequence[DecodingOptions] | None = None, *,
                 cancelled: Sequence[CancelCheck | None] | None = None,
                 on_token: Sequence[TokenCallback | None] | None = None) -> list[Result]:
        """Decode a batch. sources: token ids with EOS, as the tokenizer makes them.

        options: one for all sources or one per source (None fields take the
        model's defaults). cancelled: per source, checked at every step
        boundary; a cancelled source leaves the batch and its Result is marked.
        on_token: per source, called with every token of a greedy or sampling
        hypothesis as it is chosen, the final EOS included (beam search has no
        stable prefix to stream, so beam sources never call it).
        """
        count = len(sources)
        if isinstance(options, DecodingOptions) or options is None:
            options = [options or DecodingOptions()] * count
        if len(options) != count:
            raise ValueError(f"{len(options)} options for {count} sources")
        resolved_by_id: dict[int, DecodingOptions] = {}
        resolved = []
        for opt in options:  # a shared options object is resolved once
            if id(opt) not in resolved_by_id:
                resolved_by_id[id(opt)] = self.resolve(opt)
            resolved.append(resolved_by_id[id(opt)])
        for i, src in enumerate(sources):
            self._check_source(i, src)
        cancel = list(cancelled) if cancelled is not None else [None] * count
        stream = list(on_token) if on_token is not None else [None] * count
        self.last_stats = GenerateStats()
        results: list[Result | None] = [None] * count
        groups: dict[int, list[int]] = {}
        for i, opt in enumerate(resolved):
            groups.setdefault(opt.beam_size, []).append(i)
        for beams, members in sorted(groups.items()):
            batch = _Batch(self, [list(sources[i]) for i in members],
                           [resolved[i] for i in members], [cancel[i] for i in members],
                           [stream[i] for i in members], beams)
            for i, result in zip(members, batch.run(), strict=True):
                results[i] = result
        return [r if r is not None else Result() for r in results]


class _Batch:
    """The decoding loop for sources sharing one beam width. Arrays indexed by
    source are (B,) over the live sources; by row, (N,) over their hypotheses."""

    def __init__(self, engine: Engine, sources: list[list[int]], options: list[DecodingOptions],
                 cancel: list[CancelCheck | None], stream: list[TokenCallback | None],
                 beams: int):
        self.engine = engine
        self.runner = engine.runner
        self.options = options
        self.cancel = cancel
        self.stream = stream
        self.beams = beams
        self.count = len(sources)
        self.results: list[Result | None] = [None] * self.count
        lengths = np.array([len(s) for s in sources], dtype=np.int64)
        width = padded_width(int(lengths.max()))
        self.src_ids = np.full((self.count, width), engine.pad_id, dtype=np.int64)
        self.src_mask = np.zeros((self.count, width), dtype=np.int64)
        for i, src in enumerate(sources):
            self.src_ids[i, : len(src)] = src
            self.src_mask[i, : len(src)] = 1
        self.max_new = np.array([o.max_new_tokens(int(n)) for o, n in zip(options, lengths,
                                                                            strict=True)])

    def _per_source(self, name: str, dtype: type) -> np.ndarray:
        return np.array([getattr(o, name) for o in self.options], dtype=dtype)

    def run(self) -> list[Result]:
        engine, runner = self.engine, self.runner
        stats = engine.last_stats
        start = time.perf_counter()
        self.enc = runner.encode(self.src_ids, self.src_mask)
        stats.encode_seconds += time.perf_counter() - start

        # Per source (B,): indices of the live sources into this batch, and their state.
        self.alive = np.arange(self.count)
        self.proc = Processing(engine.eos_id, engine.suppress,
                               self._per_source("min_length", np.int64),
                               self._per_source("repetition_penalty", np.float32),
                               self._per_source("no_repeat_ngram_size", np.int64))
        self.streaming = np.array([s is not None for s in self.stream])
        self.sampler = _Sampler.from_options(self.options) if self.beams == 1 else None
        self.beam: BeamState | None = None
        self.beam_params: BeamParams | None = None
        if self.beams > 1:
            self.beam = BeamState.start(self.count, self.beams, int(self.max_new.max()))
            self.beam_params = BeamParams(
                self._per_source("length_penalty", np.float64),
                np.array([o.early_stopping is True for o in self.options]),
                np.array([o.early_stopping == "never" for o in self.options]), self.max_new)
        # Per row (N,): the first step has one row per source, beam search K afterwards.
        self.k = 1
        self.tokens = np.full(self.count, engine.start_id, dtype=np.int64)
        self.history = self.tokens[:, None].copy()  # (N, generated + 1)
        self.alignment = np.zeros((self.count, 0), dtype=np.int64)  # (N, generated)
        self.origin = np.arange(self.count, dtype=np.int64)
        self.scores = np.zeros(self.count, dtype=np.float64)  # greedy/sampling sums
        cache: DecoderCache = runner.empty_cache(self.count)

        for generated in range(int(self.max_new.max())):
            # Cancellation is checked at step boundaries, where a source leaves for free.
            gone = np.array([self.cancel[i] is not None and bool(self.cancel[i]())  # type: ignore[misc]
                             for i in self.alive], dtype=bool)
            if gone.any():
                for i in self.alive[gone]:
                    self.results[i] = Result(cancelled=True)
                self._keep(np.flatnonzero(~gone))
                if self.alive.size == 0:
                    break

            t0 = time.perf_counter()
            positions = np.full(self.tokens.shape[0], generated, dtype=np.int64)
            log_probs, cache, aligned = runner.step(self.tokens, positions, self.origin, cache,
                                                    self.enc)
            t1 = time.perf_counter()
            # This step's token of every row attended to aligned[row]: (N, generated + 1).
            alignment = np.concatenate([self.alignment, aligned[:, None]], axis=1)
            sources = self.alive.size
            process_log_probs(log_probs, self.history, generated,
                              self.proc.rows(np.repeat(np.arange(sources), self.k)))
            if self.beam is not None and self.beam_params is not None:
                step = beam_step(self.beam, log_probs, self.history, generated,
                                 self.beam_params, engine.stop_rules, alignment)
                self.beam, self.tokens, self.origin = step.state, step.tokens, step.origin
                done = step.done
                self.k = self.beams
                self.history = np.concatenate([self.history[self.origin],
                                               self.tokens[:, None]], axis=1)
                self.alignment = alignment[self.origin]
            else:
                if self.sampler is not None and self.sampler.any:
                    self.tokens = self.sampler.choose(log_probs, generated)
                else:
                    self.tokens = greedy_tokens(log_probs)
                self.scores += log_probs[np.arange(sources), self.tokens]
                self.origin = np.arange(sources, dtype=np.int64)  # each row continues itself
                self.history = np.concatenate([self.history, self.tokens[:, None]], axis=1)
                self.alignment = alignment
                done = stops(engine.stop_rules, self.tokens, generated + 1, self.max_new)
                for row in np.flatnonzero(self.streaming):
                    self.stream[self.alive[row]](int(self.tokens[row]))  # type: ignore[misc]

            if done.any():
                for src in np.flatnonzero(done):
                    self._finish(int(src))
                self._keep(np.flatnonzero(~done))
            stats.steps.append(StepStats(generated, sources, int(log_probs.shape[0]),
                                         t1 - t0, time.perf_counter() - t1))
            if self.alive.size == 0:
                break
        return [r if r is not None else Result() for r in self.results]

    def _keep(self, keep: np.ndarray) -> None:
        """Drop every source not in `keep` (indices into the live sources)."""
        rows = (keep[:, None] * self.k + np.arange(self.k)).reshape(-1)
        self.alive, self.max_new = self.alive[keep], self.max_new[keep]
        self.streaming, self.proc = self.streaming[keep], self.proc.rows(keep)
        # The next step's beam_origin no longer names the dropped rows, so the graph's
        # gather leaves them out of the cache: nothing to copy here.
        self.tokens, self.origin = self.tokens[rows], self.origin[rows]
        self.history, self.alignment = self.history[rows], self.alignment[rows]
        if self.beam is None:
            self.scores = self.scores[rows]
        if self.sampler is not None:
            self.sampler = self.sampler.sources(keep)
        if self.beam is not None and self.beam_params is not None:
            self.beam, self.beam_params = self.beam.sources(keep), self.beam_params.sources(keep)
        if keep.size:
            self.enc = self.runner.select_sources(self.enc, keep)

    def _finish(self, src: int) -> None:
        """Record the result of live source `src`."""
        index = int(self.alive[src])
        opts = self.options[index]
        eos = self.engine.eos_id
        if self.beam is not None:
            found = self.beam.nbest(src, opts.num_hypotheses)
            alignments = self.beam.nbest_alignments(src, opts.num_hypotheses)
        else:
            found = [(self.history[src, 1:], float(self.scores[src]))]
            alignments = [self.alignment[src]]
        hyps = []
        for (tokens, score), alignment in zip(found, alignments, strict=True):
            ended = tokens.size > 0 and tokens[-1] == eos
            kept = tokens.size - 1 if ended else tokens.size  # EOS is not an output token
            hyps.append(Hypothesis(
                token_ids=[int(t) for t in tokens[:kept]],
                score=score if opts.return_scores else None,
                finish_reason="eos" if ended else "length",
                alignment=[int(a) for a in alignment[:kept]] if opts.return_alignment
                else None))
        self.results[index] = Result(hyps)


@dataclass(frozen=True)
class _Sampler:
    """Per-source sampling parameters and random streams. Each request's uniforms
    come from its own Generator (its seed, or fresh entropy when unset), drawn up
    front, so its tokens do not depend on the batch it shares."""

    sampling: np.ndarray  # (B,) bool; greedy sources share the K=1 batch
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    uniforms: np.ndarray  # (B, longest max_length)

    @classmethod
    def from_options(cls, options: list[DecodingOptions]) -> _Sampler:
        longest = max(o.max_length for o in options)
        uniforms = np.zeros((len(options), longest))
        for i, o in enumerate(options):
            if o.sampling:
                uniforms[i] = np.random.default_rng(o.seed).random(longest)
        return cls(np.array([o.sampling for o in options]),
                   np.array([o.sampling_temperature or 1.0 for o in options]),
                   np.array([o.sampling_top_k for o in options], dtype=np.int64),
                   np.array([o.sampling_top_p for o in options], dtype=np.float64), uniforms)

    @property
    def any(self) -> bool:
        return bool(self.sampling.any())

    def sources(self, index: np.ndarray) -> _Sampler:
        return _Sampler(self.sampling[index], self.temperature[index], self.top_k[index],
                        self.top_p[index], self.uniforms[index])

    def choose(self, log_probs: np.ndarray, generated: int) -> np.ndarray:
        tokens = greedy_tokens(log_probs)
        rows = np.flatnonzero(self.sampling)
        if rows.size:
            warped = warp_for_sampling(log_probs[rows], self.temperature[rows],
                                       self.top_k[rows], self.top_p[rows])
            tokens[rows] = sample_tokens(warped, self.uniforms[rows, generated])
        return tokens
