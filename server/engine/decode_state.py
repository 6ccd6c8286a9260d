"""The decode state: plain per-row and per-source arrays of a running batch's sources.

A running batch (engine.py) holds one of these for all its live sources, which
may be at different steps: `generated` is per source, and each row's history
(and alignment) is left-aligned and padded on the right, so the history-based
processors and beam search see, row by row, exactly what they would see if the
source ran alone. `filter(keep)` drops sources (finished, cancelled),
`concatenate(other)` appends newly admitted ones (TGI's
Batch.filter/concatenate). The cache and the cross K/V are the batch's, not
the state's: they live with the runner as device tensors.

Shapes: B sources, K rows per source (the batch's beam width, 1 for greedy
and sampling), N = B*K rows, g (B,) tokens generated so far, W the history's
width (1 + the largest g).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from seq2serve.server.engine.decoding import NO_TOKEN, BeamParams, BeamState, Processing
from seq2serve.server.engine.options import ResolvedOptions

CancelCheck = Callable[[], bool]
TokenCallback = Callable[[int], None]  # called with each new token id (greedy/sampling)


@dataclass(frozen=True)
class SourceOptions:
    """One source's decoding settings, resolved for its length: no field is None."""

    beam_size: int
    num_hypotheses: int
    max_new: int  # generated-token limit (max_length, max_length_ratio applied)
    min_length: int
    length_penalty: float
    early_stopping: bool  # HF's early_stopping=True
    never_stop_early: bool  # HF's early_stopping="never"
    no_repeat_ngram_size: int
    repetition_penalty: float
    sampling: bool
    temperature: float  # 1.0 unless sampling
    top_k: int
    top_p: float
    seed: int  # a fresh one when the request set none
    return_scores: bool
    return_alignment: bool
    shortlist: bool = False  # over the package's vocabulary shortlist

    @classmethod
    def of(cls, options: ResolvedOptions, source_length: int) -> SourceOptions:
        """From resolved options and the source's length."""
        return cls(
            beam_size=options.beam_size,
            num_hypotheses=options.num_hypotheses,
            max_new=options.max_new_tokens(source_length),
            min_length=options.min_length,
            length_penalty=float(options.length_penalty),  # a manifest may say 1
            early_stopping=options.early_stopping is True,
            never_stop_early=options.early_stopping == "never",
            no_repeat_ngram_size=options.no_repeat_ngram_size,
            repetition_penalty=float(options.repetition_penalty),
            sampling=options.sampling,
            temperature=float(options.sampling_temperature) if options.sampling else 1.0,
            top_k=options.sampling_top_k,
            top_p=float(options.sampling_top_p),
            seed=secrets.randbits(64) if options.seed is None else options.seed,
            return_scores=options.return_scores,
            return_alignment=options.return_alignment,
            shortlist=options.shortlist)


@dataclass(frozen=True)
class Request:
    """One source for the engine; `key` names it in the results (the caller's
    number for it: generate()'s index, the worker's work item id). forced_bos: the
    first token of its every hypothesis (a multilingual model's target language),
    in place of the package's; None: the package's, if any."""

    key: int
    source: Sequence[int]  # token ids, EOS included
    options: SourceOptions
    cancelled: CancelCheck | None = None
    on_token: TokenCallback | None = None
    forced_bos: int | None = None


@dataclass(frozen=True)
class Sampler:
    """Per-source sampling parameters and random streams. Each source's uniforms
    come from its own Generator (its seed), drawn up front, so its tokens do not
    depend on the batch it shares or the step it joined at."""

    sampling: np.ndarray  # (B,) bool; greedy sources share K = 1 states
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    uniforms: np.ndarray  # (B, longest max_new)

    @classmethod
    def of(cls, options: Sequence[SourceOptions]) -> Sampler:
        longest = max(o.max_new for o in options)
        uniforms = np.zeros((len(options), longest))
        for i, o in enumerate(options):
            if o.sampling:
                uniforms[i] = np.random.default_rng(o.seed).random(longest)
        return cls(np.array([o.sampling for o in options]),
                   np.array([o.temperature for o in options], dtype=np.float64),
                   np.array([o.top_k for o in options], dtype=np.int64),
                   np.array([o.top_p for o in options], dtype=np.float64), uniforms)

    def sources(self, index: np.ndarray) -> Sampler:
        return Sampler(self.sampling[index], self.temperature[index], self.top_k[index],
                       self.top_p[index], self.uniforms[index])

    def concatenate(self, other: Sampler) -> Sampler:
        width = max(self.uniforms.shape[1], other.uniforms.shape[1])
        return Sampler(np.concatenate([self.sampling, other.sampling]),
                       np.concatenate([self.temperature, other.temperature]),
                       np.concatenate([self.top_k, other.top_k]),
                       np.concatenate([self.top_p, other.top_p]),
                       np.concatenate([_pad_last(self.uniforms, width),
                                       _pad_last(other.uniforms, width)]))


@dataclass(frozen=True)
class DecodeState:
    """Live sources of one beam width, each at its own step.

    origin (N,) is, per row, the row (of this state's rows in the previous
    decoder call) it continues; None before the first call, and meaningless for
    sources admitted since (the engine knows them: they have no previous row).
    history (N, W): row r's start token and generated tokens in columns
    0..g[r], then `fill`: the start token, which column 0 holds already, so the
    repetition penalty (once per distinct token) is the same with it or without;
    n-gram blocking reads only a row's own columns.
    alignment (N, W - 1), padded alike, is kept only when some source asked for it.
    """

    requests: tuple[Request, ...]  # (B,)
    beams: int
    generated: np.ndarray  # (B,) int64
    tokens: np.ndarray  # (N,) each row's next input token
    origin: np.ndarray | None
    history: np.ndarray  # (N, W), decoder start token first
    alignment: np.ndarray | None  # (N, W - 1)
    scores: np.ndarray  # (N,) greedy/sampling: sum of processed log-probs
    max_new: np.ndarray  # (B,)
    streaming: np.ndarray  # (B,) bool: the source has an on_token callback
    processing: Processing  # per source (B,)
    sampler: Sampler | None  # K = 1 states
    beam: BeamState | None  # K > 1 states
    beam_params: BeamParams | None
    fill: int  # history padding

    @property
    def sources(self) -> int:
        return len(self.requests)

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])

    def row_generated(self) -> np.ndarray:
        """Tokens generated so far, per row (N,), a new array. Not cached: the usual
        step asks once per state, and a cached_property (its lock, on Python 3.11)
        costs more than the repeat."""
        return self.generated.repeat(self.beams)

    def row_processing(self) -> Processing:
        """Processing parameters per row (N,)."""
        return self.processing.rows(np.repeat(np.arange(self.sources), self.beams))

    def rows_of(self, sources: np.ndarray) -> np.ndarray:
        """The rows of the given sources, in order."""
        return (sources[:, None] * self.beams + np.arange(self.beams)).reshape(-1)

    def with_tokens(self, tokens: np.ndarray, origin: np.ndarray | None = None) -> np.ndarray:
        """A new history: this state's rows (reordered by `origin`, rows of one
        source among themselves) with each row's new token after its last one:
        a column appended when every row is at the same step, else written at
        each row's own column (widened where needed)."""
        history = self.history if origin is None else self.history[origin]
        if self.rows and int(self.generated.min()) + 1 == history.shape[1]:
            # Every row's new token goes after the last column (all sources at one
            # step, as in a batch that started together): a column appended.
            return np.concatenate([history, tokens[:, None]], axis=1, dtype=history.dtype)
        at = self.row_generated() + 1
        if self.rows and int(at.max()) >= history.shape[1]:
            history = _pad_last(history, int(at.max()) + 1, self.fill)
        elif origin is None:
            history = history.copy()
        history[np.arange(self.rows), at] = tokens
        return history

    def advanced(self, tokens: np.ndarray, origin: np.ndarray, history: np.ndarray,
                 alignment: np.ndarray | None, *, scores: np.ndarray | None = None,
                 beam: BeamState | None = None) -> DecodeState:
        """The state one decoder step on: every source one token longer, with the
        step's rows (built directly: dataclasses.replace costs several times more,
        and this runs every step)."""
        return DecodeState(
            requests=self.requests, beams=self.beams, generated=self.generated + 1,
            tokens=tokens, origin=origin, history=history, alignment=alignment,
            scores=self.scores if scores is None else scores, max_new=self.max_new,
            streaming=self.streaming, processing=self.processing, sampler=self.sampler,
            beam=self.beam if beam is None else beam, beam_params=self.beam_params,
            fill=self.fill)

    def with_aligned(self, aligned: np.ndarray) -> np.ndarray | None:
        """The alignment with this step's source position (N,) per row after the
        row's own (a new array); None when no source asked for alignment."""
        if self.alignment is None:
            return None
        at = self.row_generated()
        alignment = _pad_last(self.alignment, max(self.alignment.shape[1],
                                                  int(at.max()) + 1 if self.rows else 0))
        alignment = alignment.copy() if alignment is self.alignment else alignment
        alignment[np.arange(self.rows), at] = aligned
        return alignment

    def filter(self, keep: np.ndarray) -> DecodeState:
        """Only the sources `keep` (indices into this state's sources), in that order."""
        rows = self.rows_of(keep)
        generated = self.generated[keep]
        width = int(generated.max()) + 1 if generated.size else 1
        return replace(
            self, requests=tuple(self.requests[int(i)] for i in keep), generated=generated,
            tokens=self.tokens[rows], origin=None if self.origin is None else self.origin[rows],
            history=self.history[rows, :width],
            alignment=None if self.alignment is None else self.alignment[rows, :width - 1],
            scores=self.scores[rows], max_new=self.max_new[keep],
            streaming=self.streaming[keep], processing=self.processing.rows(keep),
            sampler=None if self.sampler is None else self.sampler.sources(keep),
            beam=None if self.beam is None else self.beam.sources(keep),
            beam_params=None if self.beam_params is None else self.beam_params.sources(keep))

    def concatenate(self, other: DecodeState) -> DecodeState:
        """This state's sources, then other's, at any steps; same beam width. The
        result's origin is this state's (other's rows have none to continue)."""
        if other.beams != self.beams:
            raise ValueError(f"cannot concatenate a beam {other.beams} state to a beam "
                             f"{self.beams} state")
        width = max(self.history.shape[1], other.history.shape[1])

        def cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.concatenate([a, b])

        alignment = None
        if self.alignment is not None or other.alignment is not None:
            alignment = cat(*(_pad_last(s.alignment, width - 1) if s.alignment is not None
                              else np.zeros((s.rows, width - 1), dtype=np.int64)
                              for s in (self, other)))
        origin = None
        if self.origin is not None or other.origin is not None:
            origin = cat(*(s.origin if s.origin is not None
                           else np.arange(s.rows, dtype=np.int64) for s in (self, other)))
        return replace(
            self, requests=self.requests + other.requests,
            generated=cat(self.generated, other.generated), tokens=cat(self.tokens, other.tokens),
            origin=origin,
            history=cat(_pad_last(self.history, width, self.fill),
                        _pad_last(other.history, width, self.fill)),
            alignment=alignment,
            scores=cat(self.scores, other.scores), max_new=cat(self.max_new, other.max_new),
            streaming=cat(self.streaming, other.streaming),
            processing=replace(
                self.processing,
                min_length=cat(self.processing.min_length, other.processing.min_length),
                repetition_penalty=cat(self.processing.repetition_penalty,
                                       other.processing.repetition_penalty),
                no_repeat_ngram_size=cat(self.processing.no_repeat_ngram_size,
                                         other.processing.no_repeat_ngram_size),
                max_new=None if self.processing.max_new is None
                or other.processing.max_new is None
                else cat(self.processing.max_new, other.processing.max_new),
                forced_bos=_forced(self.processing, other.processing),
                source_ngrams=self.processing.source_ngrams + other.processing.source_ngrams),
            sampler=None if self.sampler is None and other.sampler is None
            else self._sampler().concatenate(other._sampler()),
            beam=(self.beam.concatenate(other.beam)
                  if self.beam is not None and other.beam is not None else None),
            beam_params=(self.beam_params.concatenate(other.beam_params)
                         if self.beam_params is not None and other.beam_params is not None
                         else None))

    def _sampler(self) -> Sampler:
        """The sampler, or (a state with no sampling source has none) a greedy one."""
        return self.sampler or Sampler.of([r.options for r in self.requests])


def _pad_last(array: np.ndarray, width: int, fill: int = 0) -> np.ndarray:
    if width == array.shape[-1]:
        return array
    # np.full and a slice copy: np.pad's generality costs ~50 us a call, once per step.
    out = np.full((*array.shape[:-1], width), fill, dtype=array.dtype)
    out[..., :array.shape[-1]] = array
    return out


def _forced(a: Processing, b: Processing) -> np.ndarray | None:
    """The forced first tokens of two states' sources, one after the other."""
    if a.forced_bos is None and b.forced_bos is None:
        return None
    return np.concatenate([
        p.forced_bos if p.forced_bos is not None
        else np.full(p.min_length.shape[0], NO_TOKEN, dtype=np.int64) for p in (a, b)])
