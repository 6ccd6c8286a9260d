"""Decoding as functions over arrays: log-prob processing, greedy, sampling, beam search.

Nothing here knows about ONNX Runtime or requests; the engine feeds the decoder
graph's log-probs in and gets tokens and beam reorderings out.

Shapes: B sources, K beams, N rows (hypotheses; N = B*K, rows b*K..b*K+K-1
belong to source b), V vocabulary, T history length. `history` holds each
row's tokens so far, decoder start token first (as Hugging Face's input_ids),
and `generated` counts the tokens generated before the current step.

The processors modify `log_probs` in place and return it: the engine owns that
(N, V) array, and a copy per processor would cost more than the processing.

Matching Hugging Face transformers (5.x, `generation/utils.py`,
`logits_process.py`), so scores are comparable with `generate()`:
- beam search runs on log-softmax outputs and every processor acts on those
  log-probs, as HF's `_beam_search` does. The repetition penalty therefore
  always multiplies (log-probs are <= 0). HF's greedy and sampling loops apply
  it to raw logits instead (dividing positive ones), which the graph does not
  output; ours applies it to log-probs in every mode, so greedy with a
  repetition penalty can differ from HF greedy (beam search matches);
- the penalty and n-gram blocking see the decoder start token, as HF's do;
- a finished hypothesis scores sum(log-probs) / length ** length_penalty,
  where length counts generated tokens including EOS (not the start token);
- EOS candidates join the finished set only from the top K of the 2K best
  candidates; at the length limit every top-K candidate is finished as is;
- early stopping: True stops a source once K hypotheses are finished; False
  (HF's default) also stops once the best running beam, normalised by the
  current length, cannot beat the worst finished one; "never" normalises by
  the maximum length when length_penalty > 0. The comparison is HF's,
  including its sticky flag.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

NEG_INF = np.float32(-np.inf)
# HF marks impossible beams with -1e9 rather than -inf; kept for identical ordering.
UNREACHABLE = np.float32(-1.0e9)


def along_rows(a: np.ndarray, index: np.ndarray) -> np.ndarray:
    """np.take_along_axis(a, index, axis=1) for an index of a's rank, or one rank
    less (whole trailing rows picked): plain indexing, without take_along_axis's
    per-call overhead (~8 us, several times a decoder step)."""
    picked: np.ndarray = a[np.arange(a.shape[0])[:, None], index]
    return picked


# -- log-prob processing ---------------------------------------------------------------

def suppress_tokens(log_probs: np.ndarray, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Tokens never generated (padding, a distinct start token)."""
    if len(token_ids):
        log_probs[:, np.asarray(token_ids, dtype=np.int64)] = NEG_INF
    return log_probs


def ban_eos_before_min_length(log_probs: np.ndarray, eos_id: int,
                              generated: np.ndarray | int, min_length: np.ndarray
                              ) -> np.ndarray:
    """min_length (N,) new tokens: EOS is impossible while fewer were generated
    (generated: per row, or for all rows)."""
    log_probs[generated < min_length, eos_id] = NEG_INF
    return log_probs


def apply_repetition_penalty(log_probs: np.ndarray, history: np.ndarray,
                             penalty: np.ndarray) -> np.ndarray:
    """CTRL's penalty as HF defines it: a token already in the row's history has its
    score multiplied by `penalty` when negative, divided when positive. Each token
    is penalised once however often it occurred. penalty (N,), 1 = off."""
    rows = np.flatnonzero(penalty != 1.0)
    if rows.size == 0:
        return log_probs
    hist = history[rows]  # (R, T)
    seen = np.take_along_axis(log_probs[rows], hist, axis=1)  # (R, T)
    pen = penalty[rows, None].astype(log_probs.dtype)
    # Duplicate ids in `hist` write the same value twice: computed from the originals.
    log_probs[rows[:, None], hist] = np.where(seen < 0, seen * pen, seen / pen)
    return log_probs


def block_repeated_ngrams(log_probs: np.ndarray, history: np.ndarray,
                          ngram_size: np.ndarray, lengths: np.ndarray | None = None
                          ) -> np.ndarray:
    """No n-gram occurs twice in a row's history (start token included, as in HF):
    a token that would complete an n-gram seen before is banned. ngram_size (N,),
    0 = off; lengths (N,) how many of a row's history columns are its own
    (default: all)."""
    rows_all, width = history.shape
    if lengths is None:
        lengths = np.full(rows_all, width)
    for n in np.unique(ngram_size):
        n = int(n)
        if n <= 0 or width < n:  # off, or no row has a complete n-gram yet
            continue
        rows = np.flatnonzero(ngram_size == n)
        hist, length = history[rows], lengths[rows]  # (R, W), (R,)
        windows = np.lib.stride_tricks.sliding_window_view(hist, n, axis=1)  # (R, W-n+1, n)
        # The prefix the next token would extend: each row's own last n-1 tokens.
        tail_at = np.maximum(length[:, None] - (n - 1) + np.arange(n - 1), 0)
        tail = np.take_along_axis(hist, tail_at, axis=1)  # (R, n-1)
        inside = np.arange(windows.shape[1])[None, :] + n <= length[:, None]  # row's own
        match = (windows[:, :, : n - 1] == tail[:, None, :]).all(axis=2) & inside
        r, w = np.nonzero(match)
        log_probs[rows[r], windows[r, w, n - 1]] = NEG_INF
    return log_probs


def block_source_ngrams(log_probs: np.ndarray, history: np.ndarray, lengths: np.ndarray,
                        size: int, source_ngrams: Sequence[np.ndarray]) -> np.ndarray:
    """HF's EncoderNoRepeatNGramLogitsProcessor: no row repeats an n-gram of its own
    source. A token that would complete, after the row's last size - 1 tokens of
    its history (start token included; lengths (N,) its own columns), one of the
    row's source n-grams (source_ngrams[r]: (W, size)) is banned."""
    keep = size - 1
    for r, windows in enumerate(source_ngrams):
        length = int(lengths[r])
        if length < keep or windows.shape[0] == 0:
            continue
        prefix = history[r, length - keep:length]
        match = (windows[:, :keep] == prefix).all(axis=1)
        log_probs[r, windows[match, keep]] = NEG_INF
    return log_probs


def source_ngrams(source: Sequence[int], size: int) -> np.ndarray:
    """A source's n-grams of `size` tokens (W, size), EOS included, as generate()
    reads its encoder input ids."""
    ids = np.asarray(source, dtype=np.int64)
    if ids.size < size:
        return np.zeros((0, size), dtype=np.int64)
    return np.lib.stride_tricks.sliding_window_view(ids, size)


def ban_bad_words(log_probs: np.ndarray, history: np.ndarray | None, single: np.ndarray,
                  longer: Sequence[Sequence[int]], lengths: np.ndarray | None = None
                  ) -> np.ndarray:
    """HF's `NoBadWordsLogitsProcessor` (a -inf `SequenceBiasLogitsProcessor`): the
    one-token bad words `single` are always banned; a `longer` one's last token is
    banned in the rows whose history (start token included) ends with the rest of
    it. lengths (N,): how many of a row's history columns are its own (default:
    all); history may be None when `longer` is empty."""
    if single.size:
        log_probs[:, single] = NEG_INF
    if not longer:
        return log_probs
    assert history is not None, "bad words of several tokens need the history"
    rows_all, width = history.shape
    if lengths is None:
        lengths = np.full(rows_all, width)
    for word in longer:
        prefix = np.asarray(word[:-1], dtype=np.int64)
        n = prefix.size
        at = lengths[:, None] - n + np.arange(n)  # (N, n) the row's last n columns
        fits = lengths >= n
        tail = np.take_along_axis(history, np.maximum(at, 0), axis=1)
        match = fits & (tail == prefix).all(axis=1)
        log_probs[match, int(word[-1])] = NEG_INF
    return log_probs


def force_token(log_probs: np.ndarray, rows: np.ndarray, token: int) -> np.ndarray:
    """HF's forced BOS/EOS processors: in the rows `rows` (a boolean mask (N,)),
    every log-prob becomes -inf but `token`'s, which becomes 0 (the forced token
    costs nothing and counts in the length, as in generate())."""
    if rows.any():
        log_probs[rows] = NEG_INF
        log_probs[rows, token] = 0.0
    return log_probs


NO_TOKEN = -1  # a forced token that is not set


def raise_eos_after(log_probs: np.ndarray, generated: np.ndarray, eos_id: int, start: int,
                    factor: float) -> np.ndarray:
    """HF's ExponentialDecayLengthPenalty: in the rows that generated more than
    `start` tokens (generated (N,)), EOS's finite log-prob x becomes
    x + |x| * (factor ** (generated - start) - 1)."""
    rows = np.flatnonzero(generated > start)
    if rows.size:
        eos = log_probs[rows, eos_id]
        growth = np.power(factor, (generated[rows] - start).astype(np.float64)) - 1.0
        penalty = (np.abs(eos) * growth.astype(np.float32)).astype(np.float32)
        log_probs[rows, eos_id] = np.where(np.isfinite(eos), eos + penalty, eos)
    return log_probs


def renormalize_from(log_probs: np.ndarray, columns: np.ndarray, before: np.ndarray,
                     exact: np.ndarray) -> np.ndarray:
    """`renormalize` for rows of log-probs (each summing to one, as the decoder's
    log-softmax gives them) of which processing changed only `columns`, whose
    values were `before` (N, C): a row's mass is then 1 + the change in those
    columns, found without a pass over the vocabulary (a full log-softmax of 32 x
    58k costs ~4 ms a step). The rows `exact` (N,) (forced ones, whose every column
    changed) and those that kept less than half their mass (where the float32
    rounding of the one would show) take the full log-softmax."""
    after = log_probs[:, columns].astype(np.float64)
    total = 1.0 + (np.exp(after) - np.exp(before.astype(np.float64))).sum(axis=1)
    full = exact | ~(total >= 0.5)
    shift = np.log(np.where(full, 1.0, total)).astype(log_probs.dtype)
    log_probs -= shift[:, None]
    if full.any():
        rows = np.flatnonzero(full)
        log_probs[rows] = renormalize(log_probs[rows])
    return log_probs


def renormalize(log_probs: np.ndarray) -> np.ndarray:
    """HF's LogitNormalization (renormalize_logits): each row's log-softmax again,
    after the processors banned or changed some of its log-probs. A row with no
    possible token stays as it is."""
    top = log_probs.max(axis=1, keepdims=True)  # (N, 1)
    top = np.where(np.isfinite(top), top, np.float32(0.0))
    total = np.exp(log_probs - top).sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        shift = np.where(total > 0, np.log(total) + top, np.float32(0.0))
    log_probs -= shift.astype(log_probs.dtype)
    return log_probs


@dataclass(frozen=True)
class Processing:
    """Per-row processing parameters (N,) plus the model's special tokens.
    forced_bos: per row, generate()'s forced_bos_token_id (the first new token: the
    package's, or a multilingual request's target language), NO_TOKEN where none;
    None: no row has one. forced_eos: generate()'s forced_eos_token_id (the last new
    token a row's limit allows, `max_new`), NO_TOKEN when not set; bad_words:
    generate()'s bad_words_ids."""

    eos_id: int
    suppress: tuple[int, ...]
    min_length: np.ndarray
    repetition_penalty: np.ndarray
    no_repeat_ngram_size: np.ndarray
    max_new: np.ndarray | None = None  # (N,) each row's limit; needed with forced_eos
    forced_bos: np.ndarray | None = None  # (N,)
    forced_eos: int = NO_TOKEN
    bad_words: tuple[tuple[int, ...], ...] = ()
    # generate()'s begin_suppress_tokens, exponential_decay_length_penalty
    # (decay_start NO_TOKEN: off) and renormalize_logits: the model's, every row's.
    begin_suppress: tuple[int, ...] = ()
    decay_start: int = NO_TOKEN
    decay_factor: float = 1.0
    renormalize: bool = False
    # generate()'s encoder_no_repeat_ngram_size (0: off), and then each row's
    # source n-grams (`source_ngrams`).
    encoder_ngram: int = 0
    source_ngrams: tuple[np.ndarray, ...] = ()

    def rows(self, index: np.ndarray) -> Processing:
        """The parameters of a subset or reordering of the rows."""
        return replace(self, min_length=self.min_length[index],
                       source_ngrams=tuple(self.source_ngrams[int(i)] for i in index)
                       if self.source_ngrams else (),
                       repetition_penalty=self.repetition_penalty[index],
                       no_repeat_ngram_size=self.no_repeat_ngram_size[index],
                       max_new=None if self.max_new is None else self.max_new[index],
                       forced_bos=None if self.forced_bos is None else self.forced_bos[index])

    @cached_property
    def reads_history(self) -> bool:
        """Whether some row has a repetition penalty, n-gram blocking or a bad word
        of several tokens (the processors that read the history); without, a step
        only bans tokens, forces tokens and bans EOS before min_length."""
        return bool(np.any(self.repetition_penalty != 1.0)
                    or np.any(self.no_repeat_ngram_size > 0)
                    or bool(self.longer_bad_words) or self.encoder_ngram > 0)

    @cached_property
    def single_bad_words(self) -> np.ndarray:
        """The one-token bad words' ids, once (the decoding loop bans them every step)."""
        return np.asarray([w[0] for w in self.bad_words if len(w) == 1], dtype=np.int64)

    @cached_property
    def longer_bad_words(self) -> tuple[tuple[int, ...], ...]:
        return tuple(w for w in self.bad_words if len(w) > 1)

    @cached_property
    def suppress_ids(self) -> np.ndarray:
        return np.asarray(self.suppress, dtype=np.int64)

    @cached_property
    def begin_suppress_ids(self) -> np.ndarray:
        return np.asarray(self.begin_suppress, dtype=np.int64)

    @cached_property
    def touched_columns(self) -> np.ndarray:
        """The columns `process_without_history` may change in a row it does not
        force: the one-token bad words, EOS, the suppressed and begin-suppressed ids."""
        return np.unique(np.concatenate([
            self.single_bad_words, np.asarray([self.eos_id], dtype=np.int64),
            self.suppress_ids, self.begin_suppress_ids]).astype(np.int64))

    def forced_rows(self, generated: np.ndarray, beams: int = 1) -> np.ndarray:
        """(N,) whether `force` forces each row's token at this step."""
        forced = np.zeros(generated.shape, dtype=bool)
        if self.forced_bos is not None:
            forced |= (generated == 0) & (self.forced_bos != NO_TOKEN)
        if self.forced_eos != NO_TOKEN and self.max_new is not None:
            forced |= generated == self.max_new - 1
        return np.repeat(forced, beams)

    def finish(self, log_probs: np.ndarray, generated: np.ndarray, beams: int = 1,
               before: np.ndarray | None = None) -> np.ndarray:
        """generate()'s processors after the forced tokens, in its order: the
        exponential decay of EOS, suppress_tokens, begin_suppress_tokens, then
        renormalize_logits; this Processing's rows generated `generated` tokens so
        far, each of them `beams` rows of log_probs. before: where only
        `touched_columns` changed in the rows not forced, their values before
        processing (N, C), which renormalize from them (`renormalize_from`)."""
        if self.decay_start != NO_TOKEN:
            raise_eos_after(log_probs, np.repeat(generated, beams), self.eos_id,
                            self.decay_start, self.decay_factor)
        suppress_tokens(log_probs, self.suppress_ids)
        if self.begin_suppress:
            # generate()'s begin index: the first new token, the second after a forced BOS.
            first = np.zeros(generated.shape, dtype=np.int64) if self.forced_bos is None \
                else (self.forced_bos != NO_TOKEN).astype(np.int64)
            rows = np.flatnonzero(np.repeat(generated == first, beams))
            if rows.size:
                log_probs[rows[:, None], self.begin_suppress_ids[None, :]] = NEG_INF
        if self.renormalize and before is None:
            renormalize(log_probs)
        elif self.renormalize and before is not None:
            renormalize_from(log_probs, self.touched_columns, before,
                             self.forced_rows(generated, beams))
        return log_probs

    @cached_property
    def longest_min_length(self) -> int:
        return int(self.min_length.max()) if self.min_length.size else 0

    def force(self, log_probs: np.ndarray, generated: np.ndarray, beams: int = 1
              ) -> np.ndarray:
        """HF's forced BOS, then forced EOS, where this Processing's rows generated
        `generated` tokens so far; each of them is `beams` rows of log_probs."""
        if self.forced_bos is not None:
            first = (generated == 0) & (self.forced_bos != NO_TOKEN)
            if first.any():  # one step of a row's life: no mask on the others
                rows = np.flatnonzero(np.repeat(first, beams))
                log_probs[rows] = NEG_INF
                log_probs[rows, np.repeat(self.forced_bos, beams)[rows]] = 0.0
        if self.forced_eos != NO_TOKEN:
            assert self.max_new is not None, "a forced EOS needs each row's limit"
            last = generated == self.max_new - 1
            if last.any():
                force_token(log_probs, np.repeat(last, beams), self.forced_eos)
        return log_probs


def process_without_history(log_probs: np.ndarray, generated: np.ndarray, beams: int,
                            p: Processing) -> np.ndarray:
    """`process_log_probs` for per-source parameters p (B,) that read no history
    (`p.reads_history` False), with `generated` (B,) and `beams` rows per source:
    the same result without its per-row arrays."""
    before = log_probs[:, p.touched_columns] if p.renormalize else None  # a copy
    if p.bad_words:
        ban_bad_words(log_probs, None, p.single_bad_words, ())
    if p.longest_min_length > 0:
        early = generated < p.min_length
        if early.any():
            log_probs[np.repeat(early, beams), p.eos_id] = NEG_INF
    p.force(log_probs, generated, beams)
    return p.finish(log_probs, generated, beams, before)


def process_log_probs(log_probs: np.ndarray, history: np.ndarray,
                      generated: np.ndarray | int, p: Processing) -> np.ndarray:
    """Every processor, in HF's order (repetition penalty, n-grams, the source's
    n-grams, bad words, min
    length, forced BOS, forced EOS, EOS's exponential decay, suppression, begin
    suppression, renormalization). The penalty, the decay and renormalization
    change values; the rest set -inf (the forced tokens 0).
    generated: per row (N,) or for all rows; row r's history is its first
    generated[r] + 1 columns, then padding with a token already in the history
    (the start token), which the penalty counts once anyway."""
    apply_repetition_penalty(log_probs, history, p.repetition_penalty)
    lengths = np.broadcast_to(np.asarray(generated) + 1, (log_probs.shape[0],))
    block_repeated_ngrams(log_probs, history, p.no_repeat_ngram_size, lengths)
    if p.encoder_ngram > 0:
        block_source_ngrams(log_probs, history, lengths, p.encoder_ngram, p.source_ngrams)
    if p.bad_words:
        ban_bad_words(log_probs, history, p.single_bad_words, p.longer_bad_words, lengths)
    ban_eos_before_min_length(log_probs, p.eos_id, generated, p.min_length)
    p.force(log_probs, np.asarray(lengths - 1))
    return p.finish(log_probs, np.asarray(lengths - 1))


# -- stop rules --------------------------------------------------------------------------

class StopRule:
    """Whether a candidate ends its hypothesis. tokens (any shape) are the candidates
    of this step, `generated` counts tokens including them; generated and limit
    broadcast to tokens."""

    def __call__(self, tokens: np.ndarray, generated: np.ndarray | int,
                 limit: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class EosStop(StopRule):
    eos_id: int

    def __call__(self, tokens: np.ndarray, generated: np.ndarray | int,
                 limit: np.ndarray) -> np.ndarray:
        return np.asarray(tokens == self.eos_id)


class LengthStop(StopRule):
    """The per-source limit on generated tokens is reached."""

    def __call__(self, tokens: np.ndarray, generated: np.ndarray | int,
                 limit: np.ndarray) -> np.ndarray:
        reached = np.zeros(tokens.shape, dtype=bool)
        reached[...] = generated >= limit  # broadcast (np.broadcast_to costs more)
        return reached


def stops(rules: Sequence[StopRule], tokens: np.ndarray, generated: np.ndarray | int,
          limit: np.ndarray) -> np.ndarray:
    out = np.zeros(tokens.shape, dtype=bool)
    for rule in rules:
        out |= rule(tokens, generated, limit)
    return out


# -- selection helpers -------------------------------------------------------------------

def top_k(x: np.ndarray, k: int, group: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of each row, sorted descending, and their columns.

    For wide rows a full argpartition over (N, V) dominates the host side of a
    step (~12 ms for 64 x 58k here, against ~1 ms for this). Instead split the
    columns into groups of `group` (column c in group c mod G, so the maxima are
    an elementwise max over contiguous slices), keep the k groups with the
    highest maxima (every top-k value is in one of them: a value outside has k
    larger group maxima above it) and select among their k*group values plus
    the few columns left over. Ties are broken arbitrarily, as by torch.topk.
    """
    n, width = x.shape
    k = min(k, width)
    groups = width // group
    rows = np.arange(n)[:, None]  # along_rows' row index, made once
    if groups <= 4 * k:
        cols = x.argpartition(width - k, axis=1)[:, width - k:] if k < width else \
            np.broadcast_to(np.arange(width), (n, width))
        vals = x[rows, cols]
    else:
        main = groups * group
        maxima = x[:, :main].reshape(n, group, groups).max(axis=1)  # (N, G)
        best = np.argpartition(maxima, groups - k, axis=1)[:, groups - k:]  # (N, k)
        cand = (best[:, :, None] + groups * np.arange(group)).reshape(n, k * group)
        if main < width:
            cand = np.concatenate([cand, np.broadcast_to(np.arange(main, width),
                                                         (n, width - main))], axis=1)
        cand_vals = x[rows, cand]
        part = np.argpartition(cand_vals, cand_vals.shape[1] - k, axis=1)[:, -k:]
        cols = cand[rows, part]
        vals = cand_vals[rows, part]
    order = (-vals).argsort(axis=1, kind="stable")  # the method: np.argsort wraps it
    return vals[rows, order], cols[rows, order]


def top_k_exact(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of each row, sorted descending, and their columns, ties
    to the lower column (the select graph's contract), on rows that are narrow
    enough to scan a few times (a shortlist's few hundred candidates): the k-th
    value by a partition, every column above it, then the lowest columns equal to it."""
    n, width = x.shape
    k = min(k, width)
    kth = -np.partition(-x, k - 1, axis=1)[:, k - 1]  # (N,)
    above = x > kth[:, None]
    tied = x == kth[:, None]
    need = k - above.sum(axis=1)
    take = above | (tied & (np.cumsum(tied, axis=1) <= need[:, None]))
    cols = np.nonzero(take)[1].reshape(n, k)  # ascending within each row
    vals = along_rows(x, cols)
    order = np.argsort(-vals, axis=1, kind="stable")
    return along_rows(vals, order), along_rows(cols, order)


# Each row's k best values, sorted descending, and their columns: `top_k`, or the
# runner's TopK graph.
Select = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


# -- greedy and sampling -----------------------------------------------------------------

def greedy_tokens(log_probs: np.ndarray) -> np.ndarray:
    return np.asarray(log_probs.argmax(axis=1))


def warp_for_sampling(log_probs: np.ndarray, temperature: np.ndarray, top_k_: np.ndarray,
                      top_p: np.ndarray) -> np.ndarray:
    """HF's warpers in HF's order on a float64 copy: temperature, top-k (ties with
    the k-th value kept), top-p (smallest set of top tokens whose mass reaches p;
    the best token always kept). Per-row parameters (N,); 0 / 1 = off."""
    scores: np.ndarray = log_probs.astype(np.float64) / temperature[:, None]
    n, width = scores.shape
    k_rows = np.flatnonzero((top_k_ > 0) & (top_k_ < width))
    if k_rows.size:
        kth = np.sort(scores[k_rows], axis=1)[np.arange(k_rows.size), width - top_k_[k_rows]]
        sub = scores[k_rows]
        sub[sub < kth[:, None]] = -np.inf
        scores[k_rows] = sub
    p_rows = np.flatnonzero(top_p < 1.0)
    if p_rows.size:
        sub = scores[p_rows]
        order = np.argsort(sub, axis=1, kind="stable")  # ascending, as HF
        sorted_scores = np.take_along_axis(sub, order, axis=1)
        probs = np.exp(sorted_scores - sorted_scores[:, -1:])
        cumulative = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
        remove = cumulative <= (1.0 - top_p[p_rows, None])
        remove[:, -1] = False
        np.put_along_axis(sub, order, np.where(remove, -np.inf, sorted_scores), axis=1)
        scores[p_rows] = sub
    return scores


def sample_tokens(scores: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw from softmax(scores) with one uniform in [0, 1) per row.
    The uniforms come from each request's own seeded Generator, so a draw does
    not depend on which other requests share the batch."""
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    cdf = np.cumsum(probs, axis=1)
    target = uniforms * cdf[:, -1]
    # The first index whose cdf exceeds the target: never a zero-probability token.
    tokens = (cdf <= target[:, None]).sum(axis=1)
    return np.asarray(np.minimum(tokens, scores.shape[1] - 1))


# -- beam search -------------------------------------------------------------------------

def length_normalizer(length: np.ndarray | int, length_penalty: np.ndarray | float) -> np.ndarray:
    """HF's denominator: length ** length_penalty, length = generated tokens incl. EOS."""
    return np.power(np.asarray(length, dtype=np.float64), length_penalty)


@dataclass(frozen=True)
class BeamParams:
    """Per-source beam parameters (B,)."""

    length_penalty: np.ndarray
    early_stopping: np.ndarray  # bool: HF's early_stopping=True
    never_stop_early: np.ndarray  # bool: HF's early_stopping="never"
    max_new: np.ndarray  # generated-token limit

    @cached_property
    def fixed_horizon(self) -> np.ndarray | None:
        """The sources whose early-stop check normalises by max_new rather than the
        current length (HF's "never" with length_penalty > 0); None when none does."""
        fixed = self.never_stop_early & (self.length_penalty > 0)
        return fixed if fixed.any() else None

    def sources(self, index: np.ndarray) -> BeamParams:
        return BeamParams(self.length_penalty[index], self.early_stopping[index],
                          self.never_stop_early[index], self.max_new[index])

    def concatenate(self, other: BeamParams) -> BeamParams:
        return BeamParams(*(np.concatenate([a, b]) for a, b in (
            (self.length_penalty, other.length_penalty),
            (self.early_stopping, other.early_stopping),
            (self.never_stop_early, other.never_stop_early), (self.max_new, other.max_new))))


@dataclass(frozen=True)
class BeamState:
    """running (B, K) cumulative log-probs of the live beams; the finished set per
    source: scores (B, K) length-normalised and sorted descending, tokens
    (B, K, L) without the start token, lengths (B, K), flags (B, K) whether the
    slot holds a hypothesis; improvable (B,) HF's sticky early-stop flag;
    finished_alignment (B, K, L) each finished token's source position."""

    running: np.ndarray
    finished_scores: np.ndarray
    finished_tokens: np.ndarray
    finished_lengths: np.ndarray
    finished: np.ndarray
    improvable: np.ndarray
    finished_alignment: np.ndarray

    @classmethod
    def start(cls, sources: int, beams: int, max_new: int) -> BeamState:
        """K rows per source from the first step, as Hugging Face starts: the copies
        of the first beam score -1e9, so the first step's best 2K candidates all
        come from beam 0, exactly as with one row per source, while every step
        has the same K rows per source (rows at different steps share a call)."""
        running = np.zeros((sources, beams), dtype=np.float32)
        running[:, 1:] = UNREACHABLE
        return cls(
            running=running,
            finished_scores=np.full((sources, beams), UNREACHABLE, dtype=np.float32),
            finished_tokens=np.zeros((sources, beams, max_new), dtype=np.int64),
            finished_lengths=np.zeros((sources, beams), dtype=np.int64),
            finished=np.zeros((sources, beams), dtype=bool),
            improvable=np.ones(sources, dtype=bool),
            finished_alignment=np.zeros((sources, beams, max_new), dtype=np.int64),
        )

    def advanced(self, running: np.ndarray, improvable: np.ndarray) -> BeamState:
        """This finished set with a step's running scores and early-stop flags."""
        return BeamState(running, self.finished_scores, self.finished_tokens,
                         self.finished_lengths, self.finished, improvable,
                         self.finished_alignment)

    def sources(self, index: np.ndarray) -> BeamState:
        return BeamState(self.running[index], self.finished_scores[index],
                         self.finished_tokens[index], self.finished_lengths[index],
                         self.finished[index], self.improvable[index],
                         self.finished_alignment[index])

    def concatenate(self, other: BeamState) -> BeamState:
        """Both states' sources; the finished token arrays padded to the wider one."""
        width = max(self.finished_tokens.shape[2], other.finished_tokens.shape[2])

        def wide(a: np.ndarray) -> np.ndarray:
            return np.pad(a, [(0, 0), (0, 0), (0, width - a.shape[2])])

        return BeamState(
            np.concatenate([self.running, other.running]),
            np.concatenate([self.finished_scores, other.finished_scores]),
            np.concatenate([wide(self.finished_tokens), wide(other.finished_tokens)]),
            np.concatenate([self.finished_lengths, other.finished_lengths]),
            np.concatenate([self.finished, other.finished]),
            np.concatenate([self.improvable, other.improvable]),
            np.concatenate([wide(self.finished_alignment), wide(other.finished_alignment)]))

    def nbest(self, source: int, n: int) -> list[tuple[np.ndarray, float]]:
        """The n best finished hypotheses of one source: (tokens, score), best first."""
        out = []
        for slot in range(n):
            if self.finished[source, slot]:
                length = self.finished_lengths[source, slot]
                out.append((self.finished_tokens[source, slot, :length],
                            float(self.finished_scores[source, slot])))
        return out

    def nbest_alignments(self, source: int, n: int) -> list[np.ndarray]:
        """The alignments of `nbest(source, n)`, token for token."""
        return [self.finished_alignment[source, slot, :self.finished_lengths[source, slot]]
                for slot in range(n) if self.finished[source, slot]]


@dataclass(frozen=True)
class BeamStep:
    state: BeamState
    tokens: np.ndarray  # (B*K,) the next input token of each beam
    origin: np.ndarray  # (B*K,) the row (of this step's N rows) each beam continues
    done: np.ndarray  # (B,) sources whose finished set can no longer change


def beam_step(state: BeamState, log_probs: np.ndarray, history: np.ndarray,
              generated: np.ndarray | int, params: BeamParams, rules: Sequence[StopRule],
              alignment: np.ndarray | None = None, select: Select = top_k) -> BeamStep:
    """One step of beam search for B sources at once, each at its own step.

    log_probs (B*K_in, V) processed; K_in is 1 on the first step (every beam of a
    source would be the same; HF gives copies -1e9 instead) and K afterwards.
    `generated` (B,) or one for all counts each source's tokens before this step.
    history (B*K_in, W): row r's start token and tokens in its first
    generated + 1 columns (padding after them). alignment (B*K_in, W), optional:
    per row, the source position of each generated token, this step's included
    (at column `generated`); finished hypotheses keep theirs.
    `select` ranks the (N, V) log-probs (`top_k`'s contract).

    A step runs a few dozen numpy calls on arrays of a few elements per source,
    so each costs its call more than its arithmetic: candidates are addressed by
    flat indices, and the usual step (no candidate stops, no source has finished
    hypotheses yet) skips the work that would change nothing.
    """
    sources, beams = state.running.shape
    rows = log_probs.shape[0]
    k_in = rows // sources
    width = 2 * beams  # enough that K beams survive even if K candidates end
    # A source's best 2K candidates over K_in*V lie among each row's best 2K; adding
    # the row's running score after the per-row selection keeps the (N, V) work small.
    row_vals, row_tokens = select(log_probs, width)  # (N, C), C = 2K
    per_row = row_vals.shape[1]
    acc = (row_vals + state.running[:, :k_in].reshape(rows, 1)).reshape(sources, k_in * per_row)
    values, flat = top_k(acc, width)  # (B, 2K) sorted descending
    at = flat + np.arange(0, sources * k_in * per_row, k_in * per_row)[:, None]  # in (N, C)
    tokens = row_tokens.reshape(-1)[at]  # (B, 2K)
    cand_rows = at // per_row  # (B, 2K) the row each candidate extends
    new_len = np.asarray(generated, dtype=np.int64) + 1
    if new_len.ndim == 0:
        new_len = np.full(sources, new_len)
    hits = stops(rules, tokens, new_len[:, None], params.max_new[:, None])  # (B, 2K)

    finished = state
    any_hit = bool(hits.any())
    if any_hit:
        # Live beams: the best K candidates that did not stop (a stable sort keeps order).
        live = np.argsort(hits, axis=1, kind="stable")[:, :beams]  # (B, K)
        live += np.arange(0, sources * width, width)[:, None]  # in (B, 2K)
        live_values = values.reshape(-1)[live]
        running = np.where(hits.reshape(-1)[live], UNREACHABLE + live_values,
                           live_values).astype(np.float32)
        origin = cand_rows.reshape(-1)[live].reshape(-1)
        next_tokens = tokens.reshape(-1)[live].reshape(-1)
        # Finished set: only the top K of the 2K may finish (the rest are backups).
        just_finished = hits.copy()
        just_finished[:, beams:] = False
        if just_finished.any():
            finished = _merge_finished(state, values, cand_rows, tokens, history, just_finished,
                                       new_len, params, alignment)
    else:  # the usual step: the best K candidates live on, none finishes
        running = values[:, :beams].astype(np.float32)
        origin = cand_rows[:, :beams].reshape(-1)
        next_tokens = tokens[:, :beams].reshape(-1)

    # HF's early-stop heuristic (`_check_early_stop_heuristic`), per source.
    hypothetical = new_len if params.fixed_horizon is None else \
        np.where(params.fixed_horizon, params.max_new, new_len)
    best_running = running[:, 0] / length_normalizer(hypothetical, params.length_penalty) \
        .astype(np.float32)
    if finished.finished.any():
        worst = np.where(finished.finished,
                         finished.finished_scores.min(axis=1, keepdims=True), UNREACHABLE)
        improvable = finished.improvable & (best_running[:, None] > worst).any(axis=1)
        done = ~improvable | (params.early_stopping & finished.finished.all(axis=1))
    else:  # every worst finished score is UNREACHABLE, and no source is full
        improvable = finished.improvable & (best_running > UNREACHABLE)
        done = ~improvable
    if any_hit:
        done |= hits.all(axis=1)
    return BeamStep(finished.advanced(running, improvable), next_tokens, origin, done)


def _merge_finished(state: BeamState, values: np.ndarray, cand_rows: np.ndarray,
                    tokens: np.ndarray, history: np.ndarray, just_finished: np.ndarray,
                    new_len: np.ndarray, params: BeamParams, alignment: np.ndarray | None
                    ) -> BeamState:
    """HF's `_update_finished_beams`: candidates normalised by length, impossible
    ones pushed to -1e9, then the best K of old and new kept. cand_rows (B, 2K):
    the row of history (and alignment) each candidate extends."""
    sources, beams = state.running.shape
    scores = values / length_normalizer(new_len, params.length_penalty).astype(np.float32)[:, None]
    full = params.early_stopping & state.finished.all(axis=1)
    blocked = full[:, None] | ~state.improvable[:, None] | ~just_finished
    scores = np.where(blocked, scores + UNREACHABLE, scores).astype(np.float32)
    merged_scores = np.concatenate([state.finished_scores, scores], axis=1)  # (B, 3K)
    keep = top_k(merged_scores, beams)[1]  # (B, K) sorted by score

    width = state.finished_tokens.shape[2]
    rows = cand_rows.reshape(-1)
    cand_len = np.repeat(new_len, 2 * beams)  # (B*2K,)
    candidates = np.arange(rows.size)
    cand_tokens: np.ndarray = np.zeros((rows.size, width), dtype=np.int64)
    # Each row's tokens (the start token dropped); what a shorter row holds past its
    # own length is overwritten by its new token or lies past its length.
    kept = min(history.shape[1] - 1, width)
    cand_tokens[:, :kept] = history[rows, 1:kept + 1]
    cand_tokens[candidates, cand_len - 1] = tokens.reshape(-1)
    cand_tokens = cand_tokens.reshape(sources, 2 * beams, width)
    merged_tokens = np.concatenate([state.finished_tokens, cand_tokens], axis=1)
    merged_lengths = np.concatenate(
        [state.finished_lengths, np.broadcast_to(new_len[:, None], (sources, 2 * beams))],
        axis=1)
    merged_flags = np.concatenate([state.finished, just_finished], axis=1)
    cand_alignment = np.zeros_like(cand_tokens)
    if alignment is not None:
        kept = min(alignment.shape[1], width)
        cand_alignment[:, :, :kept] = alignment[rows, :kept].reshape(sources, 2 * beams, kept)
    merged_alignment = np.concatenate([state.finished_alignment, cand_alignment], axis=1)
    return replace(
        state,
        finished_scores=along_rows(merged_scores, keep),
        finished_tokens=along_rows(merged_tokens, keep),
        finished_lengths=along_rows(merged_lengths, keep),
        finished=along_rows(merged_flags, keep),
        finished_alignment=along_rows(merged_alignment, keep),
    )

