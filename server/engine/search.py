"""Search strategies: small step objects over a DecodeState (CTranslate2's SearchStrategy).

`start()` builds the state of newly admitted sources, `step()` consumes one
decoder call's log-probs for the state's rows and says which sources are
done, `finish()` turns a done source into its n-best. Greedy search and
sampling share K = 1 (a sampling source draws where a greedy one takes the
argmax); beam search keeps K rows per source from the first step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import overload

import numpy as np

from seq2serve.server.engine.decode_state import DecodeState, Request, Sampler
from seq2serve.server.engine.decoding import (
    NEG_INF,
    NO_TOKEN,
    BeamParams,
    BeamState,
    Processing,
    Select,
    StopRule,
    along_rows,
    beam_step,
    greedy_tokens,
    process_log_probs,
    process_without_history,
    sample_tokens,
    source_ngrams,
    stops,
    top_k,
    top_k_exact,
    warp_for_sampling,
)
from seq2serve.server.engine.edits import StepEdits, step_edits
from seq2serve.server.engine.runner import Picked


class FinishReason(str, Enum):
    EOS = "eos"  # the model ended it
    LENGTH = "length"  # cut at the length limit


@dataclass(frozen=True)
class Hypothesis:
    token_ids: list[int]  # without the start token and without EOS
    score: float | None  # None unless return_scores
    finish_reason: FinishReason
    # per token, the source token position it attended to most; None unless requested
    alignment: list[int] | None = None


@dataclass(frozen=True)
class Result(Sequence[Hypothesis]):
    """The n-best of one source, best first; a cancelled source has none. Read as
    a sequence, it is its hypotheses."""

    hypotheses: tuple[Hypothesis, ...] = ()
    cancelled: bool = False

    @overload
    def __getitem__(self, index: int) -> Hypothesis: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Hypothesis]: ...

    def __getitem__(self, index: int | slice) -> Hypothesis | Sequence[Hypothesis]:
        return self.hypotheses[index]

    def __len__(self) -> int:
        return len(self.hypotheses)


@dataclass(frozen=True)
class Special:
    """The model's token ids the strategies need: the package's special tokens and
    its generation defaults' forced tokens and bad words (the model's, applied to
    every request as generate() applies them; NO_TOKEN: not forced)."""

    start: int
    eos: int
    suppress: tuple[int, ...]
    forced_bos: int = NO_TOKEN
    forced_eos: int = NO_TOKEN
    bad_words: tuple[tuple[int, ...], ...] = ()
    # generate()'s begin_suppress_tokens, exponential_decay_length_penalty (start
    # NO_TOKEN: off) and renormalize_logits (decoding.Processing's).
    begin_suppress: tuple[int, ...] = ()
    decay_start: int = NO_TOKEN
    decay_factor: float = 1.0
    renormalize: bool = False
    encoder_ngram: int = 0  # generate()'s encoder_no_repeat_ngram_size
    vocab: int = 0  # the target vocabulary's size (a device step's row width)


@dataclass(frozen=True)
class Candidates:
    """The log-prob columns of a shortlist step: ids (B, C), per source of the
    state, the target id of each column (ascending, then padding whose log-probs
    are -inf); `vocab` the model's target vocabulary."""

    ids: np.ndarray
    vocab: int

    def expand(self, log_probs: np.ndarray, beams: int) -> np.ndarray:
        """(N, V): each row's candidates' log-probs at their ids, -inf elsewhere:
        what the history-reading processors and sampling take (a whole-vocabulary
        row, as over the full vocabulary with every other piece impossible)."""
        rows = log_probs.shape[0]
        full = np.full((rows, self.vocab), NEG_INF, dtype=np.float32)
        ids = np.repeat(self.ids, beams, axis=0)  # (N, C)
        valid = ids >= 0
        row_index = np.broadcast_to(np.arange(rows)[:, None], ids.shape)
        full[row_index[valid], ids[valid]] = log_probs[valid]
        return full

    def columns_of(self, token_ids: Sequence[int]) -> np.ndarray | None:
        """The column of each id, when it is the same column in every source's
        candidates (the special pieces, lowest ids, are the first columns); None
        when not."""
        out = []
        for token in token_ids:
            col = np.argmax(self.ids == token, axis=1)  # (B,)
            if not (bool(np.all(self.ids[np.arange(self.ids.shape[0]), col] == token))
                    and bool(np.all(col == col[0]))):
                return None
            out.append(int(col[0]))
        return np.asarray(out, dtype=np.int64)

    def tokens(self, cols: np.ndarray, beams: int) -> np.ndarray:
        """The ids of chosen columns (N,) or (N, k), row r of source r // beams."""
        source = np.arange(cols.shape[0]) // beams
        picked: np.ndarray = (self.ids[source, cols] if cols.ndim == 1
                              else self.ids[source[:, None], cols])
        return picked


@dataclass(frozen=True)
class _View:
    """A step's log-probs as the search reads them: `log_probs` over the vocabulary
    (candidates None) or over the candidates' columns, with the processing
    parameters in the same terms (EOS and suppressed ids as columns)."""

    log_probs: np.ndarray
    processing: Processing
    candidates: Candidates | None

    def tokens(self, cols: np.ndarray, beams: int) -> np.ndarray:
        return cols if self.candidates is None else self.candidates.tokens(cols, beams)


def _candidate_select(candidates: Candidates, rows_per_source: int) -> Select:
    """Beam search's per-row selection over a shortlist's columns, giving ids."""
    def select(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        values, cols = top_k_exact(x, k)  # ties to the lower column: the lower id
        return values, candidates.tokens(cols, rows_per_source)

    return select


class SearchStrategy:
    beams: int

    def __init__(self, special: Special, rules: Sequence[StopRule]):
        self.special = special
        self.rules = tuple(rules)

    def start(self, requests: Sequence[Request]) -> DecodeState:
        opts = [r.options for r in requests]
        rows = len(requests) * self.beams
        tokens = np.full(rows, self.special.start, dtype=np.int64)
        aligned = any(o.return_alignment for o in opts)
        return DecodeState(
            requests=tuple(requests), beams=self.beams,
            generated=np.zeros(len(requests), dtype=np.int64), tokens=tokens,
            origin=None, history=tokens[:, None].copy(),
            alignment=np.zeros((rows, 0), dtype=np.int64) if aligned else None,
            scores=np.zeros(rows, dtype=np.float64),
            max_new=np.array([o.max_new for o in opts], dtype=np.int64),
            streaming=np.array([r.on_token is not None for r in requests], dtype=bool),
            processing=Processing(
                self.special.eos, self.special.suppress,
                np.array([o.min_length for o in opts], dtype=np.int64),
                np.array([o.repetition_penalty for o in opts], dtype=np.float32),
                np.array([o.no_repeat_ngram_size for o in opts], dtype=np.int64),
                max_new=np.array([o.max_new for o in opts], dtype=np.int64),
                forced_bos=_forced_bos(requests, self.special.forced_bos),
                forced_eos=self.special.forced_eos,
                bad_words=self.special.bad_words,
                begin_suppress=self.special.begin_suppress,
                decay_start=self.special.decay_start, decay_factor=self.special.decay_factor,
                renormalize=self.special.renormalize,
                encoder_ngram=self.special.encoder_ngram,
                source_ngrams=tuple(source_ngrams(r.source, self.special.encoder_ngram)
                                    for r in requests) if self.special.encoder_ngram else ()),
            sampler=None, beam=None, beam_params=None,
            # History padding: the start token, which every history holds already,
            # so the repetition penalty (once per token) cannot tell it is there.
            fill=self.special.start)

    def step(self, state: DecodeState, log_probs: np.ndarray, aligned: np.ndarray,
             candidates: Candidates | None = None) -> tuple[DecodeState, np.ndarray]:
        """log_probs (N, V) of the state's rows (modified in place), aligned (N,) the
        source position each row's token attended to. With `candidates` (a
        shortlist step) log_probs are (N, C) over each source's candidates.
        Returns the next state (all sources kept) and done (B,)."""
        raise NotImplementedError

    def _view(self, state: DecodeState, log_probs: np.ndarray,
              candidates: Candidates | None) -> _View:
        """Shortlist log-probs stay over the candidates where the step needs only
        EOS and suppressed ids as columns (greedy, beam); history processing and
        sampling read them over the whole vocabulary (`Candidates.expand`)."""
        p = self._column_processing(state, candidates)
        if candidates is None:
            return _View(log_probs, state.processing, None)
        if p is None:
            return _View(candidates.expand(log_probs, state.beams), state.processing, None)
        return _View(log_probs, p, candidates)

    def _column_processing(self, state: DecodeState, candidates: Candidates | None
                           ) -> Processing | None:
        """The step's processing over the candidates' columns (EOS and the banned
        and forced ids as columns), or None when it needs the whole vocabulary;
        the state's own without candidates."""
        p = state.processing
        if candidates is None:
            return p
        sampling = state.sampler is not None and bool(state.sampler.sampling.any())
        if p.forced_bos is not None:
            # A row's first step forces its own token: over the whole vocabulary
            # (a first step is one of a row's life); the later steps force none.
            if bool(np.any((state.generated == 0) & (p.forced_bos != NO_TOKEN))):
                return None
            if not p.begin_suppress:  # which says where begin suppression applies
                p = replace(p, forced_bos=None)
        forced = [p.forced_eos] if p.forced_eos != NO_TOKEN else []
        banned = [w[0] for w in p.bad_words]  # one token each: else reads_history
        ids = [p.eos_id, *p.suppress, *forced, *banned, *p.begin_suppress]
        columns = None if p.reads_history or sampling else candidates.columns_of(ids)
        if columns is None:
            return None
        col = dict(zip(ids, (int(c) for c in columns), strict=True))
        return replace(
            p, eos_id=col[p.eos_id], suppress=tuple(col[t] for t in p.suppress),
            forced_eos=col.get(p.forced_eos, NO_TOKEN),
            bad_words=tuple((col[t],) for t in banned),
            begin_suppress=tuple(col[t] for t in p.begin_suppress))

    # -- on a device: the step's processing sent as edits, k candidates back ---------------

    def plan(self, state: DecodeState, candidates: Candidates | None = None) -> Plan | None:
        """What a device step needs: the processing as edits and how many
        candidates per row decide the step; None when they cannot (the step takes
        the whole rows: a shortlist step that needs the vocabulary, sampling
        without top-k)."""
        p = self._column_processing(state, candidates)
        if p is None:
            return None
        k = self._candidates_needed(state)
        if k is None:
            return None
        width = self.special_width(candidates)
        return Plan(step_edits(p, state.history, state.generated, state.beams, width), k)

    def special_width(self, candidates: Candidates | None) -> int:
        """The columns of a step's rows: the vocabulary, or the candidates'."""
        return self.special.vocab if candidates is None else int(candidates.ids.shape[1])

    def _candidates_needed(self, state: DecodeState) -> int | None:
        raise NotImplementedError

    def step_picked(self, state: DecodeState, picked: Picked, aligned: np.ndarray,
                    candidates: Candidates | None = None
                    ) -> tuple[DecodeState, np.ndarray] | None:
        """`step` from each row's k best processed log-probs (the plan's); None when
        they do not decide it (then `step` over the whole rows)."""
        raise NotImplementedError

    def finish(self, state: DecodeState, source: int) -> list[Hypothesis]:
        raise NotImplementedError

    def _process(self, state: DecodeState, view: _View) -> None:
        if view.processing.reads_history:
            process_log_probs(view.log_probs, state.history, state.row_generated(),
                              view.processing.rows(np.repeat(np.arange(state.sources),
                                                             state.beams)))
        else:  # the usual case: no per-row arrays needed
            process_without_history(view.log_probs, state.generated, state.beams,
                                    view.processing)

    def _hypotheses(self, state: DecodeState, source: int,
                    found: Sequence[tuple[np.ndarray, float]],
                    alignments: Sequence[np.ndarray | None]) -> list[Hypothesis]:
        opts = state.requests[source].options
        eos = self.special.eos
        out = []
        for (tokens, score), alignment in zip(found, alignments, strict=True):
            ended = tokens.size > 0 and tokens[-1] == eos
            kept = tokens.size - 1 if ended else tokens.size  # EOS is not an output token
            out.append(Hypothesis(
                token_ids=[int(t) for t in tokens[:kept]],
                score=score if opts.return_scores else None,
                finish_reason=FinishReason.EOS if ended else FinishReason.LENGTH,
                alignment=[int(a) for a in alignment[:kept]]
                if opts.return_alignment and alignment is not None else None))
        return out


class GreedySearch(SearchStrategy):
    """One row per source: the best token, or a draw for sampling sources."""

    beams = 1

    def start(self, requests: Sequence[Request]) -> DecodeState:
        state = super().start(requests)
        opts = [r.options for r in requests]
        return replace(state, sampler=Sampler.of(opts) if any(o.sampling for o in opts)
                       else None)

    def step(self, state: DecodeState, log_probs: np.ndarray, aligned: np.ndarray,
             candidates: Candidates | None = None) -> tuple[DecodeState, np.ndarray]:
        view = self._view(state, log_probs, candidates)
        log_probs = view.log_probs
        self._process(state, view)
        tokens = greedy_tokens(log_probs)
        sampler = state.sampler
        if sampler is not None:
            rows = np.flatnonzero(sampler.sampling)
            if rows.size:
                warped = warp_for_sampling(log_probs[rows], sampler.temperature[rows],
                                           sampler.top_k[rows], sampler.top_p[rows])
                tokens[rows] = sample_tokens(warped,
                                             sampler.uniforms[rows, state.generated[rows]])
        scores = state.scores + log_probs[np.arange(state.rows), tokens]
        return self._advance(state, view.tokens(tokens, 1), scores, aligned)

    def _candidates_needed(self, state: DecodeState) -> int | None:
        sampler = state.sampler
        if sampler is None or not bool(sampler.sampling.any()):
            return 1
        top_k = sampler.top_k[sampler.sampling]
        if bool(np.any(top_k <= 0)):  # top-p alone reads the whole distribution
            return None
        return int(top_k.max()) + 1  # one more: ties at the k-th value show

    def step_picked(self, state: DecodeState, picked: Picked, aligned: np.ndarray,
                    candidates: Candidates | None = None
                    ) -> tuple[DecodeState, np.ndarray] | None:
        tokens = picked.ids[:, 0].copy()
        chosen = picked.values[:, 0].copy()
        sampler = state.sampler
        rows = np.flatnonzero(sampler.sampling) if sampler is not None else np.zeros(0, int)
        if sampler is not None and rows.size:
            values, ids = picked.values[rows], picked.ids[rows]
            kth = values[np.arange(rows.size), np.minimum(sampler.top_k[rows],
                                                          values.shape[1]) - 1]
            if bool(np.any(np.isfinite(kth) & (values[:, -1] == kth)
                           & (values.shape[1] < self.special_width(candidates)))):
                return None  # HF keeps every tie of the k-th value: more than came back
            # The candidates in id order: the draw walks the vocabulary in that order.
            order = np.argsort(ids, axis=1, kind="stable")
            values, ids = along_rows(values, order), along_rows(ids, order)
            warped = warp_for_sampling(values, sampler.temperature[rows], sampler.top_k[rows],
                                       sampler.top_p[rows])
            drawn = sample_tokens(warped, sampler.uniforms[rows, state.generated[rows]])
            tokens[rows] = ids[np.arange(rows.size), drawn]
            chosen[rows] = values[np.arange(rows.size), drawn]
        if candidates is not None:
            tokens = candidates.tokens(tokens, 1)
        return self._advance(state, tokens, state.scores + chosen, aligned)

    def _advance(self, state: DecodeState, tokens: np.ndarray, scores: np.ndarray,
                 aligned: np.ndarray) -> tuple[DecodeState, np.ndarray]:
        """The state after choosing `tokens` (ids) with `scores` (N,)."""
        history = state.with_tokens(tokens)
        alignment = state.with_aligned(aligned)
        generated = state.generated + 1
        done = stops(self.rules, tokens, generated, state.max_new)
        for source in np.flatnonzero(state.streaming):  # the streaming sources only
            on_token = state.requests[source].on_token
            if on_token is not None:  # always so: `streaming` marks the sources with one
                on_token(int(tokens[source]))
        return state.advanced(tokens, np.arange(state.rows, dtype=np.int64), history,
                              alignment, scores=scores), done

    def finish(self, state: DecodeState, source: int) -> list[Hypothesis]:
        end = int(state.generated[source]) + 1
        alignment = None if state.alignment is None else state.alignment[source, :end - 1]
        return self._hypotheses(state, source, [(state.history[source, 1:end],
                                                 float(state.scores[source]))], [alignment])


class BeamSearch(SearchStrategy):
    """K rows per source (beam_step in decoding.py); never streams, as a beam has
    no stable prefix. `select` ranks each row's log-probs (the runner's TopK
    graph; numpy's `top_k` by default)."""

    def __init__(self, special: Special, rules: Sequence[StopRule], beams: int,
                 select: Select = top_k):
        super().__init__(special, rules)
        self.beams = beams
        self.select = select

    def start(self, requests: Sequence[Request]) -> DecodeState:
        state = super().start(requests)
        opts = [r.options for r in requests]
        return replace(
            state, beam=BeamState.start(len(opts), self.beams, int(state.max_new.max())),
            beam_params=BeamParams(
                np.array([o.length_penalty for o in opts], dtype=np.float64),
                np.array([o.early_stopping for o in opts]),
                np.array([o.never_stop_early for o in opts]), state.max_new))

    def step(self, state: DecodeState, log_probs: np.ndarray, aligned: np.ndarray,
             candidates: Candidates | None = None) -> tuple[DecodeState, np.ndarray]:
        assert state.beam is not None and state.beam_params is not None
        view = self._view(state, log_probs, candidates)
        self._process(state, view)
        alignment = state.with_aligned(aligned)  # the finished need this step's too
        select = self.select if view.candidates is None else _candidate_select(
            view.candidates, view.log_probs.shape[0] // max(state.sources, 1))
        return self._advance(state, view.log_probs, alignment, select)

    def _candidates_needed(self, state: DecodeState) -> int | None:
        return 2 * self.beams  # beam_step's width

    def step_picked(self, state: DecodeState, picked: Picked, aligned: np.ndarray,
                    candidates: Candidates | None = None
                    ) -> tuple[DecodeState, np.ndarray] | None:
        assert state.beam is not None and state.beam_params is not None
        alignment = state.with_aligned(aligned)
        ids = picked.ids if candidates is None else \
            candidates.tokens(picked.ids, state.rows // max(state.sources, 1))

        def select(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            return picked.values[:, :k], ids[:, :k]

        return self._advance(state, picked.values, alignment, select)

    def _advance(self, state: DecodeState, scores: np.ndarray, alignment: np.ndarray | None,
                 select: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]
                 ) -> tuple[DecodeState, np.ndarray]:
        """The beam's step over this step's scores (each row's log-probs, or the k picked
        on a device), as `select` chooses among them; the state it leaves."""
        assert state.beam is not None and state.beam_params is not None
        result = beam_step(state.beam, scores, state.history, state.generated,
                           state.beam_params, self.rules, alignment, select)
        origin = result.origin
        history = state.with_tokens(result.tokens, origin)
        return state.advanced(result.tokens, origin, history,
                              None if alignment is None else alignment[origin],
                              beam=result.state), result.done

    def finish(self, state: DecodeState, source: int) -> list[Hypothesis]:
        assert state.beam is not None
        count = state.requests[source].options.num_hypotheses
        alignments: list[np.ndarray | None] = list(state.beam.nbest_alignments(source, count))
        return self._hypotheses(state, source, state.beam.nbest(source, count), alignments)


@dataclass(frozen=True)
class Plan:
    """A device step's: the processing as edits, and candidates per row."""

    edits: StepEdits
    k: int


def _forced_bos(requests: Sequence[Request], default: int) -> np.ndarray | None:
    """Each request's forced first token (its own, else the package's); None when
    no request has one."""
    forced = np.array([default if r.forced_bos is None else r.forced_bos for r in requests],
                      dtype=np.int64)
    return forced if bool(np.any(forced != NO_TOKEN)) else None
