"""Decoding functions on tiny hand-made arrays, and the options' validation.

Where Hugging Face has the same processor, the test runs HF's on the same
array: those are the definitions the engine's parity tests rely on.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers.generation import logits_process as hf

from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions, InvalidOptions
from seq2serve.server.engine.decoding import (
    BeamParams,
    BeamState,
    EosStop,
    LengthStop,
    Processing,
    apply_repetition_penalty,
    ban_eos_before_min_length,
    beam_step,
    block_repeated_ngrams,
    greedy_tokens,
    length_normalizer,
    process_log_probs,
    process_without_history,
    sample_tokens,
    stops,
    suppress_tokens,
    top_k,
    warp_for_sampling,
)
from seq2serve.server.engine.options import OptionLimits

# The server's own caps (ServerConfig is their one home).
LIMITS = default_limits()

EOS = 0
RULES = (EosStop(EOS), LengthStop())


def log(*probs: float) -> np.ndarray:
    return np.log(np.array(probs, dtype=np.float64)).astype(np.float32)


# -- processors ---------------------------------------------------------------------------

def test_suppress_and_min_length() -> None:
    lp = np.zeros((2, 4), dtype=np.float32)
    suppress_tokens(lp, [3])
    assert np.isneginf(lp[:, 3]).all()
    ban_eos_before_min_length(lp, EOS, generated=2, min_length=np.array([3, 2]))
    assert np.isneginf(lp[0, EOS]) and lp[1, EOS] == 0  # row 1 has its 2 tokens already


def test_repetition_penalty_by_hand_and_as_hf() -> None:
    scores = np.array([[-1.0, -2.0, -0.5, -3.0], [1.0, -1.0, 2.0, 0.5]], dtype=np.float32)
    history = np.array([[0, 2, 2], [0, 1, 2]])
    out = apply_repetition_penalty(scores.copy(), history, np.array([2.0, 2.0]))
    # negative scores are multiplied, positive divided; a repeated token once only
    np.testing.assert_allclose(out, [[-2.0, -2.0, -1.0, -3.0], [0.5, -2.0, 1.0, 0.5]])
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3, 11)).astype(np.float32)
    history = rng.integers(0, 11, (3, 6))
    ref = hf.RepetitionPenaltyLogitsProcessor(1.7)(torch.from_numpy(history),
                                                   torch.from_numpy(scores.copy()))
    ours = apply_repetition_penalty(scores.copy(), history, np.full(3, 1.7))
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-6)
    # penalty 1 leaves a row alone
    row = apply_repetition_penalty(scores.copy(), history, np.array([1.0, 1.7, 1.0]))
    np.testing.assert_array_equal(row[0], scores[0])


def test_no_repeat_ngram_by_hand_and_as_hf() -> None:
    lp = np.zeros((1, 6), dtype=np.float32)
    # "5 1 2 3 1 2": the bigram (1 2) was followed by 3, and (2, 3) by 1
    history = np.array([[5, 1, 2, 3, 1, 2]])
    out = block_repeated_ngrams(lp.copy(), history, np.array([3]))
    assert np.isneginf(out[0]).tolist() == [False, False, False, True, False, False]
    out = block_repeated_ngrams(lp.copy(), history, np.array([1]))  # every seen token
    assert np.isneginf(out[0]).tolist() == [False, True, True, True, False, True]
    assert not np.isneginf(block_repeated_ngrams(lp.copy(), history[:, :2], np.array([3]))).any()
    rng = np.random.default_rng(1)
    history = rng.integers(0, 4, (5, 12))  # a small vocabulary repeats n-grams
    for n in (2, 3):
        scores = rng.standard_normal((5, 4)).astype(np.float32)
        ref = hf.NoRepeatNGramLogitsProcessor(n)(torch.from_numpy(history),
                                                 torch.from_numpy(scores.copy()))
        ours = block_repeated_ngrams(scores.copy(), history, np.full(5, n))
        np.testing.assert_array_equal(ours, ref.numpy())
    # rows with different sizes in one call
    mixed = block_repeated_ngrams(np.zeros((2, 6), np.float32), np.array([[5, 1, 2, 3, 1, 2]] * 2),
                                  np.array([3, 0]))
    assert np.isneginf(mixed[0, 3]) and not np.isneginf(mixed[1]).any()
    # rows of different lengths, padded after their own tokens: each as HF on its own prefix
    lengths = np.array([12, 7, 3, 1, 9])
    padded = np.where(np.arange(12) < lengths[:, None], history, 0)
    for n in (1, 2, 3):
        scores = rng.standard_normal((5, 4)).astype(np.float32)
        ours = block_repeated_ngrams(scores.copy(), padded, np.full(5, n), lengths)
        for row, length in enumerate(lengths):
            ref = hf.NoRepeatNGramLogitsProcessor(n)(
                torch.from_numpy(history[row:row + 1, :length]),
                torch.from_numpy(scores[row:row + 1].copy()))
            np.testing.assert_array_equal(ours[row], ref.numpy()[0])


def test_process_log_probs_applies_all() -> None:
    lp = np.log(np.full((2, 5), 0.2, dtype=np.float32))
    p = Processing(EOS, (4,), np.array([2, 0]), np.array([1.0, 2.0], np.float32),
                   np.array([0, 0]))
    out = process_log_probs(lp, np.array([[4, 1], [4, 2]]), 1, p)
    assert np.isneginf(out[0, EOS]) and not np.isneginf(out[1, EOS])
    assert np.isneginf(out[:, 4]).all()
    assert out[1, 2] == pytest.approx(2 * math.log(0.2))


def test_bad_words_and_forced_tokens_as_hf() -> None:
    """Bad words (one token, several tokens, EOS dropped as HF drops it), min length,
    forced BOS and forced EOS, in HF's order, row by row at different lengths, as
    HF's processors on each row's own history; and the same without the history
    (process_without_history) where no bad word has several tokens."""
    rng = np.random.default_rng(2)
    vocab, max_new = 7, np.array([3, 5, 4, 6])
    bad = ((5,), (1, 2), (3, 1, 4))
    history = rng.integers(1, 4, (4, 6))
    history[:, 0] = 6  # the start token
    history[1, 1:4] = [3, 1, 1]  # row 1 ends in (3, 1) at length 3: 4 is banned
    lengths = np.array([1, 3, 4, 6])  # generated 0, 2, 3, 5: BOS forced in row 0, EOS in 2, 3
    p = Processing(EOS, (6,), np.array([2, 0, 0, 0]), np.ones(4, np.float32), np.zeros(4, int),
                   max_new=max_new, forced_bos=np.full(4, 4), forced_eos=EOS, bad_words=bad)
    scores = np.log(rng.dirichlet(np.ones(vocab), 4)).astype(np.float32)
    ours = process_log_probs(scores.copy(), np.where(np.arange(6) < lengths[:, None], history, 6),
                             lengths - 1, p)
    for row, length in enumerate(lengths):
        ids = torch.from_numpy(history[row:row + 1, :length])
        ref = torch.from_numpy(scores[row:row + 1].copy())
        for processor in (hf.NoBadWordsLogitsProcessor([list(w) for w in bad] + [[EOS]], EOS),
                          hf.MinLengthLogitsProcessor(3, EOS),  # min_length counts the start
                          hf.ForcedBOSTokenLogitsProcessor(4),
                          hf.ForcedEOSTokenLogitsProcessor(int(max_new[row]) + 1, EOS),
                          hf.SuppressTokensLogitsProcessor([6])):
            ref = processor(ids, ref)
        np.testing.assert_array_equal(ours[row], ref.numpy()[0], err_msg=f"row {row}")
    assert ours[0, 4] == 0 and ours[2, EOS] == 0 and ours[3, EOS] == 0
    # row 1 ends (3 1): 4 banned, and 2 by (1 2); 5 always, 6 suppressed
    assert np.isfinite(ours[1]).tolist() == [True, True, False, True, False, False, False]
    single = replace(p, bad_words=((5,),))
    assert not single.reads_history
    per_source = process_without_history(scores.copy(), lengths - 1, 1, single)
    np.testing.assert_array_equal(
        per_source, process_log_probs(scores.copy(), history, lengths - 1, single))


def test_stop_rules() -> None:
    tokens = np.array([[0, 3], [2, 0]])
    assert EosStop(0)(tokens, 1, np.array([[5], [5]])).tolist() == [[True, False], [False, True]]
    assert LengthStop()(tokens, 3, np.array([[3], [4]])).tolist() == [[True, True],
                                                                       [False, False]]
    assert stops(RULES, tokens, 3, np.array([[3], [4]])).tolist() == [[True, True],
                                                                       [False, True]]


# -- selection, greedy, sampling ----------------------------------------------------------

@pytest.mark.parametrize("width,group", [(7, 64), (50, 2), (97, 3), (200, 5)])
def test_top_k_is_sorted_and_exact(width: int, group: int) -> None:
    x = np.random.default_rng(width).standard_normal((4, width)).astype(np.float32)
    vals, cols = top_k(x, 3, group=group)
    np.testing.assert_array_equal(cols, np.argsort(-x, axis=1)[:, :3])
    np.testing.assert_array_equal(vals, -np.sort(-x, axis=1)[:, :3])


def test_greedy_takes_argmax() -> None:
    assert greedy_tokens(log(0.1, 0.6, 0.3)[None]).tolist() == [1]


def test_warpers_match_hf() -> None:
    rng = np.random.default_rng(2)
    lp = rng.standard_normal((3, 9)).astype(np.float32)
    for temperature, k, p in [(0.7, 0, 1.0), (1.0, 3, 1.0), (1.3, 0, 0.8), (0.5, 4, 0.6)]:
        ref = torch.from_numpy(lp.astype(np.float64))
        ref = hf.TemperatureLogitsWarper(temperature)(None, ref)
        if k:
            ref = hf.TopKLogitsWarper(k)(None, ref)
        if p < 1:
            ref = hf.TopPLogitsWarper(p)(None, ref)
        ours = warp_for_sampling(lp, np.full(3, temperature), np.full(3, k), np.full(3, p))
        np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-12)
    top1 = warp_for_sampling(lp, np.ones(3), np.array([1, 1, 1]), np.ones(3))
    assert (np.isfinite(top1).sum(axis=1) == 1).all()


def test_sampling_inverse_cdf_and_seed() -> None:
    scores = np.array([[math.log(0.5), -np.inf, math.log(0.25), math.log(0.25)]] * 4)
    tokens = sample_tokens(scores, np.array([0.0, 0.49, 0.5, 0.99]))
    assert tokens.tolist() == [0, 0, 2, 3]  # never the zero-probability token 1
    draws = [sample_tokens(np.repeat(scores[:1], 50, 0), np.random.default_rng(s).random(50))
             for s in (7, 7, 8)]
    assert (draws[0] == draws[1]).all() and not (draws[0] == draws[2]).all()
    assert set(draws[0].tolist()) <= {0, 2, 3}


# -- beam search --------------------------------------------------------------------------

def test_length_normalizer_is_hf() -> None:
    assert length_normalizer(4, 0.6) == pytest.approx(4 ** 0.6)
    assert length_normalizer(np.array([1, 3]), np.array([1.0, 0.0])).tolist() == [1.0, 1.0]


def params(max_new: int, length_penalty: float = 1.0, early: bool = False) -> BeamParams:
    return BeamParams(np.array([length_penalty]), np.array([early]), np.array([False]),
                      np.array([max_new]))


def test_beam_step_on_a_hand_made_table() -> None:
    """One source, K=2, V=5, EOS=0; start token 9 in the history."""
    state = BeamState.start(1, 2, max_new=3)
    # Step 0 (one row per source): candidates 1 (.5), 2 (.3), EOS (.1), 3 (.06). EOS
    # is third of 2K=4: a backup, so it does not finish.
    s0 = beam_step(state, log(0.1, 0.5, 0.3, 0.06, 0.04)[None], np.array([[9]]), 0,
                   params(3), RULES)
    assert s0.tokens.tolist() == [1, 2] and s0.origin.tolist() == [0, 0]
    assert not s0.state.finished.any() and not s0.done.any()
    np.testing.assert_allclose(s0.state.running, [log(0.5, 0.3)], rtol=1e-6)
    # Step 1: beam 0 (.5) ends with EOS (.6) -> .30; beam 1 (.3) continues with 3 (.6).
    table = np.stack([log(0.6, 0.2, 0.1, 0.05, 0.05), log(0.1, 0.1, 0.1, 0.6, 0.1)])
    s1 = beam_step(s0.state, table, np.array([[9, 1], [9, 2]]), 1, params(3), RULES)
    assert s1.tokens.tolist() == [3, 1] and s1.origin.tolist() == [1, 0]
    st = s1.state
    assert st.finished.tolist() == [[True, False]]
    assert st.finished_scores[0, 0] == pytest.approx(math.log(0.30) / 2, rel=1e-6)
    assert st.finished_tokens[0, 0, :2].tolist() == [1, EOS]
    np.testing.assert_allclose(st.running, [log(0.18, 0.10)], rtol=1e-6)
    assert not s1.done.any()
    # Step 2 reaches max_new=3: the top K candidates finish as they are.
    table = np.stack([log(0.1, 0.1, 0.1, 0.1, 0.6), log(0.1, 0.1, 0.1, 0.6, 0.1)])
    s2 = beam_step(st, table, np.array([[9, 2, 3], [9, 1, 1]]), 2, params(3), RULES)
    assert s2.done.tolist() == [True]
    best = s2.state.nbest(0, 2)
    # .18*.6=.108 over 3 tokens (-0.742) beats .30 over 2 (-0.602)? No: -0.602 is best.
    assert [t.tolist() for t, _ in best] == [[1, EOS], [2, 3, 4]]
    assert best[1][1] == pytest.approx(math.log(0.108) / 3, rel=1e-6)


def test_length_penalty_changes_the_winner() -> None:
    """A short and a long finished hypothesis: a larger length_penalty favours the long."""
    state = BeamState.start(1, 2, max_new=3)
    hist = np.array([[9, 1], [9, 2]])
    for lp, winner in [(0.0, [1, EOS]), (2.0, [2, 3, 4])]:
        s0 = beam_step(state, log(0.1, 0.5, 0.3, 0.06, 0.04)[None], hist[:1, :1], 0,
                       params(3, lp), RULES)
        table = np.stack([log(0.6, 0.2, 0.1, 0.05, 0.05), log(0.1, 0.1, 0.1, 0.6, 0.1)])
        s1 = beam_step(s0.state, table, hist, 1, params(3, lp), RULES)
        table = np.stack([log(0.1, 0.1, 0.1, 0.1, 0.6), log(0.1, 0.1, 0.1, 0.6, 0.1)])
        s2 = beam_step(s1.state, table, np.array([[9, 2, 3], [9, 1, 1]]), 2, params(3, lp),
                       RULES)
        assert s2.state.nbest(0, 1)[0][0].tolist() == winner


def test_early_stopping_rules() -> None:
    """With K finished and every running beam worse, HF's heuristic stops the source;
    early_stopping=True stops it as soon as K are finished."""
    state = BeamState.start(1, 2, max_new=10)
    # both top candidates are EOS... only one EOS per beam: use two beams' EOS
    s0 = beam_step(state, log(0.05, 0.5, 0.45, 0.0001, 0.0001)[None], np.array([[9]]), 0,
                   params(10), RULES)
    table = np.stack([log(0.9, 0.05, 0.02, 0.02, 0.01), log(0.9, 0.05, 0.02, 0.02, 0.01)])
    hist = np.array([[9, 1], [9, 2]])
    for early in (False, True):
        s1 = beam_step(s0.state, table, hist, 1, params(10, early=early), RULES)
        assert s1.state.finished.all()
        # the best running beam, .5*.05 = .025 over 2 tokens, is below both finished
        assert s1.done.tolist() == [True]
    # with a finished set not full, neither rule stops
    s0 = beam_step(state, log(0.05, 0.5, 0.45, 0.0001, 0.0001)[None], np.array([[9]]), 0,
                   params(10), RULES)
    table = np.stack([log(0.9, 0.05, 0.02, 0.02, 0.01), log(0.05, 0.9, 0.02, 0.02, 0.01)])
    s1 = beam_step(s0.state, table, hist, 1, params(10, early=True), RULES)
    assert s1.state.finished.sum() == 1 and not s1.done.any()


def test_beam_state_selects_sources() -> None:
    state = BeamState.start(3, 2, max_new=4)
    sub = state.sources(np.array([2, 0]))
    assert sub.running.shape == (2, 2) and sub.finished_tokens.shape == (2, 2, 4)


# -- options ------------------------------------------------------------------------------

@pytest.mark.parametrize("options,field,message", [
    (DecodingOptions(beam_size=0), "beam_size", "beam_size must be in [1, 16], got 0"),
    (DecodingOptions(beam_size=17), "beam_size", "beam_size must be in [1, 16], got 17"),
    (DecodingOptions(beam_size=4, num_hypotheses=5), "num_hypotheses",
     "num_hypotheses must be <= beam_size (4), got 5"),
    (DecodingOptions(num_hypotheses=0), "num_hypotheses", "num_hypotheses must be >= 1, got 0"),
    (DecodingOptions(sampling_top_p=1.5), "sampling_top_p",
     "sampling_top_p must be in (0, 1], got 1.5"),
    (DecodingOptions(sampling_top_p=0.0), "sampling_top_p",
     "sampling_top_p must be in (0, 1], got 0.0"),
    (DecodingOptions(sampling_temperature=-1.0), "sampling_temperature",
     "sampling_temperature must be >= 0 (0 = no sampling), got -1.0"),
    (DecodingOptions(sampling_top_k=-2), "sampling_top_k",
     "sampling_top_k must be >= 0 (0 = off), got -2"),
    (DecodingOptions(sampling_temperature=0.5, beam_size=4), "beam_size",
     "beam_size must be 1 when sampling (sampling_temperature > 0), got 4"),
    (DecodingOptions(sampling_temperature=0.0, sampling_top_k=5), "sampling_temperature",
     "sampling_top_k and sampling_top_p need sampling_temperature > 0, got 0.0"),
    (DecodingOptions(max_length=0), "max_length", "max_length must be in [1, 512], got 0"),
    (DecodingOptions(max_length=10, min_length=11), "min_length",
     "min_length must be in [0, max_length (10)], got 11"),
    (DecodingOptions(max_length_ratio=-0.5), "max_length_ratio",
     "max_length_ratio must be >= 0 (0 = no relative limit), got -0.5"),
    (DecodingOptions(repetition_penalty=0.0), "repetition_penalty",
     "repetition_penalty must be in (0, inf) (1 = off), got 0.0"),
    (DecodingOptions(length_penalty=float("nan")), "length_penalty",
     "length_penalty must be a finite number, got nan"),
    (DecodingOptions(no_repeat_ngram_size=-1), "no_repeat_ngram_size",
     "no_repeat_ngram_size must be in [0, max_length + 1"),
    (DecodingOptions(early_stopping="sometimes"), "early_stopping",  # type: ignore[arg-type]
     "early_stopping must be one of False, True, 'never', got 'sometimes'"),
    (DecodingOptions(beam_size=True), "beam_size",  # type: ignore[arg-type]
     "beam_size must be an integer, got True"),
    (DecodingOptions(seed=-1), "seed", "seed must be in [0, 18446744073709551615], got -1"),
])
def test_validation_names_field_and_range(options: DecodingOptions, field: str,
                                          message: str) -> None:
    with pytest.raises(InvalidOptions) as err:
        options.resolve({"beam_size": 4, "max_length": 256}, LIMITS)
    assert err.value.field == field
    assert str(err.value).startswith(message)
    assert isinstance(err.value, ValueError)


def test_resolve_defaults_and_limits() -> None:
    defaults = {"beam_size": 4, "max_length": 1000, "length_penalty": 0.6,
                "max_length_ratio": 2.0}
    opts = DecodingOptions().resolve(defaults, OptionLimits(max_beam_size=8, max_length=300))
    assert (opts.beam_size, opts.length_penalty, opts.max_length) == (4, 0.6, 300)
    assert opts.decoding == "beam" and opts.max_new_tokens(10) == 20
    assert opts.max_new_tokens(400) == 300
    # A default min_length above the max_length in force (the request's, or the
    # default's, capped) is lowered to it; a request's own is checked.
    with_min = {**defaults, "min_length": 56}
    assert DecodingOptions(max_length=10).resolve(with_min, LIMITS).min_length == 10
    assert DecodingOptions().resolve(with_min, OptionLimits(8, 30)).min_length == 30
    with pytest.raises(InvalidOptions, match="min_length"):
        DecodingOptions(max_length=10, min_length=11).resolve(with_min, LIMITS)
    sampled = DecodingOptions(sampling_top_p=0.9).resolve(defaults, LIMITS)
    assert sampled.decoding == "sampling" and sampled.beam_size == 1
    assert sampled.sampling_temperature == 1.0
    assert DecodingOptions(beam_size=1).resolve(defaults, LIMITS).decoding == "greedy"
    with pytest.raises(InvalidOptions, match=r"beam_size must be in \[1, 8\], got 9"):
        DecodingOptions(beam_size=9).resolve(defaults,
                                             OptionLimits(max_beam_size=8, max_length=512))
    with pytest.raises(InvalidOptions, match=r"max_length must be in \[1, 300\], got 400"):
        DecodingOptions(max_length=400).resolve(defaults,
                                                OptionLimits(max_beam_size=16, max_length=300))
