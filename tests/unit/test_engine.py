"""The engine against Hugging Face `generate()` on the same Marian model, plus
batching, shrinking, sampling, cancellation, streaming and precisions.

HF runs with `forced_eos_token_id=None` (the fixture folder's generation_config
forces none, so neither does its package) and `suppress_tokens=[pad]` (the
package bans padding as its generation_config's bad word), and
`max_new_tokens` = the engine's `max_length`. The limit (40) is long enough
that hypotheses end with EOS and beams stop early, so the early-stop rules
and the batch shrinking are exercised, not only the length limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from conftest import CORPUS
from cuda_device import requires_cuda
from family_checks import run_joined
from hf_reference import reference_nbest

from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions, InvalidOptions
from seq2serve.server.engine.decoding import top_k
from seq2serve.server.engine.engine import Engine, Result
from seq2serve.server.engine.options import SourceError
from seq2serve.server.engine.runner import (
    DecoderCache,
    EncoderState,
    RunnerConfig,
    padded_width,
)
from seq2serve.server.engine.source_slots import COMPACT_WHEN, SourceSlots

MAX_NEW = 40
TEXTS = CORPUS[:6] + ["unseen wörds: ☃ zebra", "Open"]
SCORE_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def hf(marian_dir: Path) -> tuple[Any, Any]:
    tok = transformers.MarianTokenizer.from_pretrained(marian_dir)
    return tok, transformers.MarianMTModel.from_pretrained(marian_dir).eval()


@pytest.fixture(scope="module")
def engine(marian_package: Path) -> Engine:
    # One intra-op thread: the test machine's cores are shared with other work.
    return Engine(marian_package, RunnerConfig(provider="cpu", intra_op_threads=1),
                  default_limits())


@pytest.fixture(scope="module")
def batch(hf: tuple[Any, Any]) -> dict[str, torch.Tensor]:
    return hf[0](TEXTS, return_tensors="pt", padding=True)


@pytest.fixture(scope="module")
def sources(batch: dict[str, torch.Tensor]) -> list[list[int]]:
    return [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
            for i in range(len(TEXTS))]


def hf_generate(model: Any, batch: dict[str, torch.Tensor], num_beams: int = 1,
                n: int = 1, **kwargs: Any) -> list[list[tuple[list[int], float]]]:
    """HF's n-best per source: tokens without start, EOS and padding; the score is
    `sequences_scores` for beams, the sum of log-softmax(logits) of the chosen
    tokens (EOS included) for greedy."""
    cfg = model.config
    with torch.no_grad():
        out = model.generate(**batch, num_beams=num_beams, num_return_sequences=n,
                             do_sample=False, max_new_tokens=MAX_NEW,
                             forced_eos_token_id=None, suppress_tokens=[cfg.pad_token_id],
                             output_scores=True, output_logits=True,
                             return_dict_in_generate=True, **kwargs)
    seqs = out.sequences[:, 1:]
    if num_beams > 1:
        scores = out.sequences_scores.tolist()
    else:
        log_probs = torch.stack(out.logits, dim=1).log_softmax(-1)  # (B, T, V)
        chosen = log_probs.gather(2, seqs[:, :, None])[:, :, 0]
        before_eos = (torch.cumsum((seqs == cfg.eos_token_id).int(), 1)
                      - (seqs == cfg.eos_token_id).int()) == 0
        scores = (chosen * before_eos).sum(1).tolist()
    found = []
    for row in seqs.tolist():
        tokens = row[: row.index(cfg.eos_token_id)] if cfg.eos_token_id in row else row
        found.append([t for t in tokens if t != cfg.pad_token_id])
    count = len(found) // n
    return [[(found[i * n + j], scores[i * n + j]) for j in range(n)] for i in range(count)]


PARITY = {
    "greedy": ({}, {"beam_size": 1}),
    "greedy_ngram_min_length": ({"no_repeat_ngram_size": 2, "min_new_tokens": 5},
                                {"beam_size": 1, "no_repeat_ngram_size": 2, "min_length": 5}),
    "beam4_length_penalty_1.0": ({"num_beams": 4, "length_penalty": 1.0},
                                 {"beam_size": 4, "length_penalty": 1.0}),
    "beam5_nbest3": ({"num_beams": 5, "n": 3}, {"beam_size": 5, "num_hypotheses": 3}),
    "beam4_nbest3_length_penalty_0.6": (
        {"num_beams": 4, "n": 3, "length_penalty": 0.6},
        {"beam_size": 4, "num_hypotheses": 3, "length_penalty": 0.6}),
    "min_length": ({"num_beams": 4, "min_new_tokens": 30}, {"beam_size": 4, "min_length": 30}),
    "no_repeat_ngram_3": ({"num_beams": 4, "no_repeat_ngram_size": 3},
                          {"beam_size": 4, "no_repeat_ngram_size": 3}),
    "repetition_penalty": ({"num_beams": 4, "repetition_penalty": 1.5},
                           {"beam_size": 4, "repetition_penalty": 1.5}),
    "early_stopping_true": ({"num_beams": 4, "early_stopping": True},
                            {"beam_size": 4, "early_stopping": True}),
    "early_stopping_never": ({"num_beams": 4, "early_stopping": "never", "length_penalty": 1.5},
                             {"beam_size": 4, "early_stopping": "never",
                              "length_penalty": 1.5}),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_matches_hf_generate(case: str, engine: Engine, hf: tuple[Any, Any],
                             batch: dict[str, torch.Tensor], sources: list[list[int]]) -> None:
    hf_kwargs, ours = PARITY[case]
    ref = hf_generate(hf[1], batch, **hf_kwargs)
    results = engine.generate(sources, DecodingOptions(max_length=MAX_NEW, max_length_ratio=0,
                                                       **ours))
    assert [[h.token_ids for h in r] for r in results] == [[t for t, _ in r] for r in ref]
    diff = max(abs(h.score - s) for r, o in zip(ref, results, strict=True)
               for (_, s), h in zip(r, o, strict=True))
    assert diff <= SCORE_TOLERANCE
    assert all(h.finish_reason in ("eos", "length") for r in results for h in r)


def test_batch_equals_one_at_a_time(engine: Engine, sources: list[list[int]]) -> None:
    options = DecodingOptions(beam_size=4, num_hypotheses=2, max_length=MAX_NEW)
    together = engine.generate(sources, options)
    for src, result in zip(sources, together, strict=True):
        alone = engine.generate([src], options)[0]
        assert [h.token_ids for h in alone] == [h.token_ids for h in result]
        assert [h.score for h in alone] == pytest.approx([h.score for h in result], abs=1e-5)


def test_mixed_options_in_one_batch(engine: Engine, sources: list[list[int]]) -> None:
    """Per-source options: each source decodes as it would alone with its own."""
    options = [DecodingOptions(beam_size=1 + (i % 3), max_length=MAX_NEW - i)
               for i in range(len(sources))]
    mixed = engine.generate(sources, options)
    for src, opt, result in zip(sources, options, mixed, strict=True):
        alone = engine.generate([src], opt)[0]
        assert [h.token_ids for h in alone] == [h.token_ids for h in result]


def test_finished_sources_leave_the_batch(engine: Engine, sources: list[list[int]]) -> None:
    stats = engine.generate(sources, DecodingOptions(beam_size=4, max_length=MAX_NEW)).stats
    steps = stats.steps
    rows = [s.rows for s in steps]
    assert rows[0] == 4 * len(sources)  # K rows per source from the first step, as HF
    assert all(a >= b for a, b in zip(rows[:-1], rows[1:], strict=True))  # N never grows
    assert rows[-1] < rows[0]  # and shrinks as sources finish
    # Finished sources leave holes that run idle until a quarter of the rows are idle,
    # then the batch compacts.
    assert all(4 * s.sources <= s.rows and (s.rows - 4 * s.sources) * COMPACT_WHEN <= s.rows
               for s in steps)
    assert any(s.rows > 4 * s.sources for s in steps)  # holes did run
    assert all(s.cache_length % 16 == 0 and s.cache_length > s.step for s in steps)
    assert stats.ort_seconds > 0 and stats.host_seconds > 0


def test_max_length_absolute_and_relative(engine: Engine, sources: list[list[int]]) -> None:
    short = engine.generate(sources, DecodingOptions(beam_size=1, max_length=3))
    assert all(len(r[0].token_ids) <= 3 for r in short)
    assert any(r[0].finish_reason == "length" for r in short)
    ratio = engine.generate(sources, DecodingOptions(beam_size=2, max_length=MAX_NEW,
                                                     max_length_ratio=0.25))
    for src, r in zip(sources, ratio, strict=True):
        limit = int(np.ceil(0.25 * len(src)))
        assert len(r[0].token_ids) + (r[0].finish_reason == "eos") <= limit


def test_sampling_is_reproducible_per_seed(engine: Engine, sources: list[list[int]]) -> None:
    def run(seed: int, subset: list[list[int]] = sources) -> list[list[int]]:
        opts = DecodingOptions(sampling_temperature=1.5, sampling_top_k=20, seed=seed,
                               max_length=MAX_NEW)
        return [r[0].token_ids for r in engine.generate(subset, opts)]

    first = run(1)
    assert run(1) == first
    assert run(2) != first
    assert run(1, sources[2:3]) == first[2:3]  # a draw does not depend on the batch
    greedy = [r[0].token_ids for r in engine.generate(sources, DecodingOptions(beam_size=1))]
    assert first != greedy


def test_cancellation_drops_the_source(engine: Engine, sources: list[list[int]]) -> None:
    calls = {"n": 0}

    def cancel_after_three() -> bool:
        calls["n"] += 1
        return calls["n"] > 3  # checked before steps 0..3; true before step 3

    options = DecodingOptions(beam_size=4, max_length=MAX_NEW)
    reference = engine.generate(sources, options)
    results = engine.generate(sources, options,
                              cancelled=[None, cancel_after_three] + [None] * (len(sources) - 2))
    steps = results.stats.steps
    assert isinstance(results[1], Result) and results[1].cancelled and list(results[1]) == []
    assert calls["n"] == 4  # never asked again once it was gone
    assert steps[2].sources == len(sources)
    assert steps[3].sources == len(sources) - 1  # gone from step 3 on
    for i in (0, *range(2, len(sources))):
        assert not results[i].cancelled
        assert [h.token_ids for h in results[i]] == [h.token_ids for h in reference[i]]


def test_streaming_callback_sees_every_token(engine: Engine, sources: list[list[int]]) -> None:
    seen: list[int] = []
    result = engine.generate(sources[:3], DecodingOptions(beam_size=1, max_length=MAX_NEW),
                             on_token=[None, seen.append, None])[1][0]
    assert seen == result.token_ids + ([engine.eos_id] if result.finish_reason == "eos" else [])


@pytest.mark.parametrize("options", [{"beam_size": 1}, {"beam_size": 4, "num_hypotheses": 3}],
                         ids=["greedy", "beam4_nbest3"])
def test_alignment_is_hf_last_layer_cross_attention_argmax(
        engine: Engine, marian_dir: Path, sources: list[list[int]],
        options: dict[str, int]) -> None:
    """Each output token's alignment is the source position that Hugging Face's last
    decoder layer's cross-attention, averaged over heads, weighs most when the model
    is teacher-forced on that hypothesis (the step that produced the token)."""
    model = transformers.MarianMTModel.from_pretrained(marian_dir,
                                                       attn_implementation="eager").eval()
    results = engine.generate(sources, DecodingOptions(max_length=MAX_NEW, return_alignment=True,
                                                       **options))
    checked = 0
    for source, result in zip(sources, results, strict=True):
        assert len(result) == options.get("num_hypotheses", 1)
        for hyp in result:
            assert hyp.alignment is not None and len(hyp.alignment) == len(hyp.token_ids)
            decoder_ids = torch.tensor([[model.config.decoder_start_token_id, *hyp.token_ids]])
            with torch.no_grad():
                out = model(input_ids=torch.tensor([source]), decoder_input_ids=decoder_ids,
                            output_attentions=True)
            weights = out.cross_attentions[-1][0].mean(dim=0)  # (H, T+1, S) -> (T+1, S)
            assert hyp.alignment == weights[:-1].argmax(dim=-1).tolist()
            checked += len(hyp.token_ids)
    assert checked > 50
    plain = engine.generate(sources[:1], DecodingOptions(max_length=MAX_NEW, **options))
    assert plain[0][0].alignment is None and plain[0][0].token_ids == results[0][0].token_ids


def test_options_errors_reach_the_caller(engine: Engine, sources: list[list[int]]) -> None:
    with pytest.raises(InvalidOptions, match="beam_size must be in"):
        engine.generate(sources, DecodingOptions(beam_size=0))
    with pytest.raises(SourceError, match="source 1 is empty"):
        engine.generate([sources[0], []], DecodingOptions())
    with pytest.raises(SourceError, match="outside"):
        engine.generate([[10**6]], DecodingOptions())
    assert len(engine.generate([], DecodingOptions())) == 0
    no_scores = engine.generate(sources[:1], DecodingOptions(return_scores=False))
    assert no_scores[0][0].score is None


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_reduced_precision_package_runs(marian_dir: Path, tmp_path: Path,
                                        sources: list[list[int]], precision: str) -> None:
    from seq2serve.export.exporter import export

    report = export(marian_dir, tmp_path / precision, precision=precision, progress=False)
    engine = Engine(report.package, RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    # fp16 graphs take fp16 caches; int8 (weights only) keeps fp32 ones
    assert engine.runner.cache_dtype == (np.float16 if precision == "fp16" else np.float32)
    results = engine.generate(sources[:4], DecodingOptions(beam_size=4, max_length=MAX_NEW))
    assert all(r[0].token_ids and np.isfinite(r[0].score) for r in results)
    greedy = engine.generate(sources[:4], DecodingOptions(beam_size=1, max_length=MAX_NEW))
    assert all(r[0].token_ids for r in greedy)


def test_runner_config() -> None:
    with pytest.raises(ValueError, match="provider must be one of"):
        RunnerConfig(provider="tpu").validate()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        from seq2serve.server.engine.runner import choose_provider

        with pytest.raises(RuntimeError, match="onnxruntime-gpu"):
            choose_provider("cuda")
        assert choose_provider("auto") == "CPUExecutionProvider"


@pytest.mark.gpu
@requires_cuda()  # a device answers, not only a build with the provider
def test_cuda_matches_cpu(marian_package: Path, engine: Engine,
                          sources: list[list[int]]) -> None:
    cuda = Engine(marian_package, RunnerConfig(provider="cuda"), default_limits())
    assert cuda.runner.device == "cuda"
    for options in (DecodingOptions(beam_size=1, max_length=MAX_NEW),
                    DecodingOptions(beam_size=4, num_hypotheses=2, max_length=MAX_NEW)):
        on_gpu = cuda.generate(sources, options)
        on_cpu = engine.generate(sources, options)
        assert [[h.token_ids for h in r] for r in on_gpu] == \
            [[h.token_ids for h in r] for r in on_cpu]
        assert [h.score for r in on_gpu for h in r] == \
            pytest.approx([h.score for r in on_cpu for h in r], abs=1e-3)


# -- iteration-level batching: joining a running batch -----------------------------------

def key(result: Result) -> list[tuple[list[int], float | None, list[int] | None]]:
    return [(h.token_ids, h.score, h.alignment) for h in result]


@pytest.mark.parametrize("case", ["greedy", "greedy_ngram_min_length",
                                  "beam4_nbest3_length_penalty_0.6", "no_repeat_ngram_3",
                                  "repetition_penalty", "min_length"])
def test_joining_mid_batch_equals_alone_and_hf(case: str, engine: Engine, hf: tuple[Any, Any],
                                               batch: dict[str, torch.Tensor],
                                               sources: list[list[int]]) -> None:
    """The same sources joining at different steps into different running batches
    give bit-identical tokens, scores and alignments to decoding each alone, and
    Hugging Face's tokens."""
    hf_kwargs, ours = PARITY[case]
    options = DecodingOptions(max_length=MAX_NEW, max_length_ratio=0, return_alignment=True,
                              **ours)
    alone = [key(engine.generate([s], options)[0]) for s in sources]
    ref = hf_generate(hf[1], batch, **hf_kwargs)
    assert [[t for t, _, _ in a] for a in alone] == [[t for t, _ in r] for r in ref]
    half = len(sources) // 2
    for at_step in (0, 1, 3, 9, 17):
        for first, joining in ((range(half), range(half, len(sources))),
                               (range(half, len(sources)), range(half))):
            order = [*first, *joining]
            got = run_joined(engine, [sources[i] for i in first],
                             [sources[i] for i in joining], options, at_step)
            assert {order[k]: key(r) for k, r in got.items()} == dict(enumerate(alone)), \
                (case, at_step)


def test_joining_streams_and_leaves(engine: Engine, sources: list[list[int]]) -> None:
    """A source that joins mid-batch streams from its first step; finished and
    cancelled sources leave at once, their holes idle at most a quarter of the rows."""
    options = engine.resolve(DecodingOptions(beam_size=1, max_length=MAX_NEW))
    batch = engine.start_batch(1)
    batch.admit([engine.request(i, s, options) for i, s in enumerate(sources[:4])])
    for _ in range(2):
        batch.step()
    seen: list[int] = []
    stop = {"now": False}
    batch.admit([engine.request("late", sources[4], options, on_token=seen.append),
                 engine.request("gone", sources[5], options, cancelled=lambda: stop["now"])])
    outcome = batch.step()
    assert len(seen) == 1 and outcome.stats is not None and outcome.stats.rows == 6
    stop["now"] = True
    outcome = batch.step()
    assert ("gone", Result(cancelled=True)) in outcome.finished
    assert [r.cancelled for k, r in outcome.finished if k == "gone"] == [True]
    results = dict(outcome.finished)
    while batch.rows:
        outcome = batch.step()
        stats = outcome.stats
        assert stats is not None and stats.rows >= stats.sources
        assert (stats.rows - stats.sources) * COMPACT_WHEN <= stats.rows
        results.update(outcome.finished)
    alone = engine.generate([sources[4]], options)[0]
    assert results["late"][0].token_ids == alone[0].token_ids
    assert seen[:len(alone[0].token_ids)] == alone[0].token_ids


def test_decode_state_concatenate_and_filter(engine: Engine, sources: list[list[int]]) -> None:
    options = engine.resolve(DecodingOptions(beam_size=3, max_length=MAX_NEW))
    search = engine.strategy(3)
    a = search.start([engine.request(i, s, options) for i, s in enumerate(sources[:2])])
    b = search.start([engine.request(i, s, options) for i, s in enumerate(sources[2:5], 2)])
    both = a.concatenate(b)
    assert both.sources == 5 and both.rows == 15
    assert both.beam is not None and both.beam.running.shape == (5, 3)
    back = both.filter(np.array([2, 3, 4]))
    assert [r.key for r in back.requests] == [r.key for r in b.requests]
    assert np.array_equal(back.tokens, b.tokens) and np.array_equal(back.max_new, b.max_new)
    with pytest.raises(ValueError, match="beam"):
        a.concatenate(engine.strategy(1).start([engine.request(0, sources[0], options)]))


def test_decode_state_holds_sources_at_different_steps(engine: Engine,
                                                       sources: list[list[int]]) -> None:
    """One state for sources that joined at different steps: each row's history is
    its own, padded with the start token after it, and trimmed when the longest
    leaves; a sampling source keeps sampling next to greedy ones."""
    greedy = engine.resolve(DecodingOptions(beam_size=1, max_length=MAX_NEW))
    sampling = engine.resolve(DecodingOptions(beam_size=1, max_length=MAX_NEW,
                                              sampling_temperature=1.0, seed=7))
    search = engine.strategy(1)
    a = search.start([engine.request(0, sources[0], greedy)])
    vocab = engine.runner.vocab_size
    for _ in range(3):
        a, _ = search.step(a, np.zeros((1, vocab), np.float32), np.zeros(1, np.int64))
    b = search.start([engine.request(1, sources[1], sampling)])
    both = a.concatenate(b)
    start = engine.special.start
    assert both.generated.tolist() == [3, 0]
    assert both.history.shape == (2, 4) and both.history[1].tolist() == [start] * 4
    assert both.sampler is not None and both.sampler.sampling.tolist() == [False, True]
    step, _ = search.step(both, np.zeros((2, vocab), np.float32), np.zeros(2, np.int64))
    assert step.generated.tolist() == [4, 1] and step.history.shape == (2, 5)
    assert step.history[1, 2:].tolist() == [start] * 3  # its one token, then padding
    assert step.filter(np.array([1])).history.shape == (1, 2)


def test_source_slots_fill_holes_and_compact(engine: Engine, sources: list[list[int]]) -> None:
    """A newcomer's cross K/V go into a hole; compaction moves the live sources down
    and trims the source axis; the decoder reads exactly the encoder's values."""
    runner = engine.runner

    def encoded(batch: list[list[int]]) -> EncoderState:
        width = padded_width(max(map(len, batch)))
        ids = np.full((len(batch), width), engine.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, s in enumerate(batch):
            ids[i, :len(s)], mask[i, :len(s)] = s, 1
        return runner.encode(ids, mask)

    def values(enc: EncoderState, source: int) -> tuple[np.ndarray, np.ndarray]:
        length = int(enc.lengths[source])
        return (np.stack([k.numpy()[source, :, :length] for k in enc.cross_k]),
                enc.src_mask.numpy()[source])

    first, second = encoded(sources[:4]), encoded([max(sources, key=len)])
    slots = SourceSlots(runner.memory)
    assert slots.place(first).tolist() == [0, 1, 2, 3]
    slots.release(np.array([1]))
    assert (slots.used, slots.holes) == (4, 1)
    assert slots.place(second).tolist() == [1]  # the hole, not a new slot
    view = slots.encoder_state()
    assert view.sources == 4 and view.width == max(first.width, second.width)
    got, want = values(view, 1), values(second, 0)
    assert np.array_equal(got[0], want[0])
    assert np.array_equal(got[1][:second.width], want[1]) and not got[1][second.width:].any()
    for source in (0, 2, 3):  # widened in place, values kept
        assert np.array_equal(values(view, source)[0], values(first, source)[0])
    slots.release(np.array([1, 2]))
    assert (slots.used, slots.holes) == (4, 2) and slots.should_compact()
    moved = slots.compact()
    assert moved.tolist() == [0, -1, -1, 1] and (slots.used, slots.holes) == (2, 0)
    view = slots.encoder_state()
    assert view.width == padded_width(max(len(sources[0]), len(sources[3])))
    assert np.array_equal(values(view, 1)[0], values(first, 3)[0])
    slots.release(np.array([1]))
    assert slots.used == 1  # a trailing hole leaves the call at once


def test_cache_is_written_in_place_on_cpu(engine: Engine, sources: list[list[int]]) -> None:
    """A step whose rows did not move writes the new slot into the cache's own
    buffers, and decoding gives exactly what fresh output buffers give."""
    runner = engine.runner
    assert runner.in_place
    enc = engine.start_batch(1)
    enc.admit([engine.request(0, sources[0], engine.resolve(DecodingOptions(beam_size=1)))])
    cache = runner.empty_cache(1, 16)
    pointers = [v.data_ptr() for v in (*cache.self_k, *cache.self_v)]
    tokens, positions = np.array([engine.special.start]), np.array([0])
    _, new, _ = runner.step(tokens, positions, cache, enc.slots.encoder_state())
    assert [v.data_ptr() for v in (*new.self_k, *new.self_v)] == pointers
    assert np.abs(new.self_k[0].numpy()[:, :, 0]).sum() > 0  # slot 0 was written
    for beams in (1, 4):
        options = DecodingOptions(beam_size=beams, num_hypotheses=beams, max_length=MAX_NEW)
        in_place = engine.generate(sources, options)
        runner.in_place = False
        try:
            fresh = engine.generate(sources, options)
        finally:
            runner.in_place = True
        assert [[(h.token_ids, h.score) for h in r] for r in in_place] == \
            [[(h.token_ids, h.score) for h in r] for r in fresh]


def test_moving_rows_in_place_equals_gathering_them(engine: Engine) -> None:
    """Beam search's reorder with the same rows in and out rewrites only the rows
    that moved, in the cache's own buffers (the move graph), and gives what a
    gather of every row gives: repeated origins, a cycle, rows kept."""
    runner = engine.runner
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((6, runner.heads, 16, runner.head_dim)).astype(np.float32)
              for _ in range(2 * runner.layers)]
    cache = DecoderCache(tuple(map(runner.to_device, arrays[:runner.layers])),
                         tuple(map(runner.to_device, arrays[runner.layers:])))
    pointers = [v.data_ptr() for v in (*cache.self_k, *cache.self_v)]
    arrays = [a.copy() for a in arrays]  # on CPU the OrtValues share the arrays' memory
    origin = np.array([2, 0, 1, 3, 3, 3])  # 0 <- 2 <- 1 <- 0, row 3 kept and copied twice
    moved = runner.reorder_cache(cache, origin)
    assert [v.data_ptr() for v in (*moved.self_k, *moved.self_v)] == pointers
    for value, array in zip((*moved.self_k, *moved.self_v), arrays, strict=True):
        assert np.array_equal(value.numpy(), array[origin])


def test_select_graph_ranks_like_numpy(engine: Engine) -> None:
    rng = np.random.default_rng(1)
    log_probs = rng.standard_normal((5, engine.runner.vocab_size)).astype(np.float32)
    log_probs[:, 3] = -np.inf  # suppressed tokens
    values, ids = engine.runner.top_k(log_probs, 8)
    ref_values, ref_ids = top_k(log_probs, 8)
    assert np.array_equal(values, ref_values) and np.array_equal(ids, ref_ids)


def test_beams_continue_their_rows_across_a_compaction(engine: Engine,
                                                       sources: list[list[int]]) -> None:
    """Beam search whose batch compacts (the first sources cancelled, the rest moved
    down) while a newcomer with other options joins: every source still gets
    exactly what it gets alone."""
    plain = engine.resolve(DecodingOptions(beam_size=4, max_length=MAX_NEW, return_scores=True))
    aligned = engine.resolve(DecodingOptions(beam_size=4, max_length=MAX_NEW, return_scores=True,
                                             return_alignment=True, length_penalty=0.6))
    alone = {i: key(engine.generate([s], plain)[0]) for i, s in enumerate(sources)}
    newcomer = key(engine.generate([sources[0]], aligned)[0])
    gone = set(range(len(sources) // 2 + 1))
    batch = engine.start_batch(4)
    batch.admit([engine.request(i, s, plain, cancelled=lambda i=i: i in gone and batch.steps >= 2)
                 for i, s in enumerate(sources)])
    compactions = []
    compact = batch.slots.compact
    batch.slots.compact = lambda: compactions.append(batch.steps) or compact()  # type: ignore
    results: dict[Any, Result] = {}
    while batch.rows:
        results.update(batch.step().finished)  # type: ignore[arg-type]
        if batch.steps == 3:
            batch.admit([engine.request("new", sources[0], aligned)])
    assert compactions and compactions[0] <= 3  # before the newcomer's first step
    assert all(results[i].cancelled for i in gone)
    assert {i: key(results[i]) for i in range(len(sources)) if i not in gone} == \
        {i: r for i, r in alone.items() if i not in gone}
    assert key(results["new"]) == newcomer


# -- a forced first token per source (a multilingual model's target language) -----------

@pytest.mark.parametrize(("beams", "ngram"), [(1, 0), (4, 0), (4, 2)])
def test_each_source_its_own_forced_first_token(beams: int, ngram: int, engine: Engine,
                                                hf: tuple[Any, Any],
                                                batch: dict[str, torch.Tensor],
                                                sources: list[list[int]]) -> None:
    """Sources forced to different first tokens (as a multilingual model's target
    languages are) decode in one batch, and joining a running batch, exactly as
    each alone, and each alone as generate() with that forced_bos_token_id."""
    vocab = hf[1].config.vocab_size
    forced = [7 + 13 * i % (vocab - 10) for i in range(len(sources))]
    options = DecodingOptions(beam_size=beams, num_hypotheses=min(beams, 2), max_length=MAX_NEW,
                              max_length_ratio=0, return_alignment=True,
                              no_repeat_ngram_size=ngram)
    alone = [key(engine.generate([s], options, forced_bos=[f])[0])
             for s, f in zip(sources, forced, strict=True)]
    for i, token in enumerate(forced):
        one = {k: v[i: i + 1] for k, v in batch.items()}
        [ref] = reference_nbest(hf[1], one, num_beams=beams, num_return_sequences=min(beams, 2),
                                do_sample=False, max_new_tokens=MAX_NEW,
                                forced_eos_token_id=None, forced_bos_token_id=token,
                                no_repeat_ngram_size=ngram,
                                suppress_tokens=[hf[1].config.pad_token_id])
        assert [t for t, _, _ in alone[i]] == [t for t, _ in ref]
        assert all(t[0] == token for t, _, _ in alone[i])
        assert max(abs(h[1] - s) for h, (_, s) in zip(alone[i], ref, strict=True)) \
            <= SCORE_TOLERANCE
    together = engine.generate(sources, options, forced_bos=forced)
    assert [key(r) for r in together] == alone
    # joining at step 2: the newcomers' first step forces their tokens, not the others'
    half = len(sources) // 2
    resolved = engine.resolve(options)
    running = engine.start_batch(resolved.beam_size)
    running.admit([engine.request(i, sources[i], resolved, forced_bos=forced[i])
                   for i in range(half)])
    results: dict[int, Result] = {}
    for _ in range(2):
        results.update(running.step().finished)  # type: ignore[arg-type]
    running.admit([engine.request(i, sources[i], resolved, forced_bos=forced[i])
                   for i in range(half, len(sources))])
    while running.rows:
        results.update(running.step().finished)  # type: ignore[arg-type]
    assert {k: key(r) for k, r in results.items()} == dict(enumerate(alone))
    with pytest.raises(SourceError, match="forced first token"):
        engine.request(0, sources[0], resolved, forced_bos=vocab)
