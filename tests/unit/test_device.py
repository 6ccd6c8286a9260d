"""The device path on CPU (issue 52 items 3, 4, 6): the emulated device
(RunnerConfig.emulate_device) takes every branch a CUDA device takes and counts
every host<->device crossing.

- device memory: the CPU's numpy edits and the device's one-node graphs agree;
- the pick graph: the step's processing as edits, applied on the device, gives
  the host's processed log-probs' k best (decoding.process_log_probs then the
  select contract) for every processor generate() has;
- the engine on the emulated device gives the CPU's tokens and scores (greedy,
  beam 4 with n-best, sampling, forced tokens and the package-wide processors,
  a multilingual mixed batch, a vocabulary shortlist, iteration-level joining);
- traffic: per step, what goes down is a few ints per row plus a constant and
  what comes back is each row's k candidates (id + score) and its alignment plus
  a constant; nothing of the cache or the encoder's keys/values crosses after
  admission; the counters reach /metrics.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from invariance import decode_joining, result_key
from multilingual_folders import make_folder

from seq2serve.export.exporter import export
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.decoding import (
    NO_TOKEN,
    Processing,
    process_log_probs,
    top_k_exact,
)
from seq2serve.server.engine.device import DeviceMemory, HostMemory, Memory, Transfers
from seq2serve.server.engine.edits import step_edits
from seq2serve.server.engine.engine import Engine, RunningBatch
from seq2serve.server.engine.pick import Picker
from seq2serve.server.engine.runner import RunnerConfig
from seq2serve.server.metrics import Metrics

SCORE_TOLERANCE = 1e-4
MAX_NEW = 30
# The bound per decoder row and step, each way (bytes): down, the token, the
# position, the beam origin, the forced column and a few banned (row, id) pairs;
# back, the alignment (8) and k candidates of an id (8) and a score (4).
DOWN_PER_ROW = 16 * 8
CANDIDATE_BYTES = 8 + 4
ALIGNMENT_BYTES = 8
HISTORY_ENTRY_BYTES = 16 + 4 + 16
# Per step whatever the rows: a cache resize's pads, a slot view's bounds, k.
STEP_CONSTANT = 4096


def emulated(package: Path | str, threads: int = 1) -> Engine:
    return Engine(package, RunnerConfig(provider="cpu", intra_op_threads=threads,
                                        emulate_device=True), default_limits())


def cpu(package: Path | str, threads: int = 1) -> Engine:
    return Engine(package, RunnerConfig(provider="cpu", intra_op_threads=threads),
                  default_limits())


@pytest.fixture(scope="module")
def engines(marian_package: Path) -> tuple[Engine, Engine]:
    return cpu(marian_package), emulated(marian_package)


@pytest.fixture(scope="module")
def sources(engines: tuple[Engine, Engine]) -> list[list[int]]:
    return random_sources(engines[0], 10)


def random_sources(engine: Engine, count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    high = engine.src_vocab_size
    return [[*rng.integers(3, high, size=int(rng.integers(3, 14))).tolist(), engine.eos_id]
            for _ in range(count)]


def assert_same(want: Any, got: Any) -> None:
    """Tokens identical, scores within SCORE_TOLERANCE, source by source."""
    assert len(want) == len(got)
    for a, b in zip(want, got, strict=True):
        assert [h.token_ids for h in a] == [h.token_ids for h in b]
        for h, g in zip(a, b, strict=True):
            assert (h.score is None) == (g.score is None)
            if h.score is not None:
                assert abs(h.score - g.score) <= SCORE_TOLERANCE


OPTIONS = {
    "greedy": DecodingOptions(beam_size=1, max_length=MAX_NEW),
    "beam4-nbest": DecodingOptions(beam_size=4, num_hypotheses=4, max_length=MAX_NEW),
    "sampling": DecodingOptions(beam_size=1, sampling_temperature=0.8, sampling_top_k=7,
                                sampling_top_p=0.9, seed=11, max_length=MAX_NEW),
    "history": DecodingOptions(beam_size=4, num_hypotheses=2, max_length=MAX_NEW,
                               repetition_penalty=1.3, no_repeat_ngram_size=2,
                               min_length=3),
}


# -- device memory ----------------------------------------------------------------------

def memories() -> list[Memory]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return [HostMemory(), DeviceMemory("cpu", 0, ["CPUExecutionProvider"], options,
                                       ort.RunOptions())]


def test_memory_edits_agree_and_only_the_device_counts() -> None:
    rng = np.random.default_rng(0)
    store = rng.standard_normal((5, 2, 8, 3)).astype(np.float32)
    new = rng.standard_normal((2, 2, 4, 3)).astype(np.float32)
    got = []
    for memory in memories():
        value = memory.upload(store)
        value = memory.put(value, np.array([4, 1]), memory.upload(new), fill=-1.0)
        value = memory.resize(memory.take(value, np.array([4, 0, 1])), 2, 12)
        value = memory.resize(memory.head(value, 2), 2, 6)
        got.append(memory.download(value))
    host, device = got
    want = store.copy()
    want[[4, 1]] = -1.0
    want[[4, 1], :, :4] = new
    want = want[[4, 0], :, :6]
    assert np.array_equal(host, want) and np.array_equal(device, want)


def test_device_tensors_never_alias_host_arrays() -> None:
    memory = memories()[1]
    array = np.zeros(4, dtype=np.float32)
    value = memory.upload(array)
    array[0] = 1.0
    assert memory.download(value)[0] == 0.0
    assert memory.counter.read() == Transfers(1, 16, 1, 16)


# -- the pick graph -----------------------------------------------------------------------

def processing(rows: int, renormalize: bool) -> Processing:
    rng = np.random.default_rng(1)
    return Processing(
        eos_id=2, suppress=(0, 5), min_length=rng.integers(0, 4, rows),
        repetition_penalty=np.where(rng.random(rows) < 0.5, 1.4, 1.0).astype(np.float32),
        no_repeat_ngram_size=rng.integers(0, 3, rows),
        max_new=np.full(rows, 6), forced_bos=np.where(rng.random(rows) < 0.5, 7, NO_TOKEN),
        forced_eos=2, bad_words=((9,), (3, 4), (11, 12, 13)), begin_suppress=(6, 8),
        decay_start=1, decay_factor=1.5, renormalize=renormalize, encoder_ngram=2,
        source_ngrams=tuple(np.lib.stride_tricks.sliding_window_view(
            rng.integers(3, 20, 6), 2) for _ in range(rows)))


@pytest.mark.parametrize("renormalize", [False, True])
def test_pick_graph_is_the_hosts_processing_and_selection(renormalize: bool) -> None:
    """Every processor at once, rows at several steps (first: forced BOS; limit - 1:
    forced EOS; past the decay's start), against decoding.process_log_probs and
    the select graph's contract (ties to the lower id)."""
    rng = np.random.default_rng(2)
    rows, vocab, k = 12, 40, 6
    p = processing(rows, renormalize)
    generated = rng.integers(0, 6, rows)
    history = np.full((rows, 8), 1, dtype=np.int64)  # start token 1, then the tokens
    for r in range(rows):
        history[r, 1:generated[r] + 1] = rng.integers(3, 20, generated[r])
    logits = rng.standard_normal((rows, vocab)).astype(np.float32)
    logits[:, 10] = logits[:, 14]  # a tie: the lower id first
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    want = process_log_probs(log_probs.copy(), history, generated, p)
    want_values, want_ids = top_k_exact(want, k)
    edits = step_edits(p, history, generated, 1, vocab)
    memory = memories()[1]
    picker = Picker(memory, ort.SessionOptions(), ["CPUExecutionProvider"], ort.RunOptions(),
                    vocab)
    values, ids = picker.pick(memory.upload(log_probs), edits, k)
    finite = np.isfinite(want_values)
    assert np.array_equal(finite, np.isfinite(values))
    assert np.array_equal(ids[finite], want_ids[finite])
    tolerance = 1e-6 if renormalize else 0.0
    assert np.allclose(values[finite], want_values[finite], rtol=0, atol=tolerance)


# -- the engine: the emulated device gives the CPU's outputs ---------------------------------

@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_emulated_device_matches_cpu(engines: tuple[Engine, Engine],
                                     sources: list[list[int]], name: str) -> None:
    plain, device = engines
    assert_same(plain.generate(sources, OPTIONS[name]), device.generate(sources, OPTIONS[name]))


def test_emulated_device_with_the_packages_processors(marian_package: Path,
                                                      sources: list[list[int]]) -> None:
    """generate()'s forced EOS, bad words, begin suppression, EOS decay and
    renormalization (as a package's generation_config sets them) on both."""
    pair = [cpu(marian_package), emulated(marian_package)]
    for engine in pair:
        eos = engine.eos_id
        engine.special = replace(engine.special, forced_eos=eos, bad_words=((7,), (8, 9)),
                                 begin_suppress=(eos, 10), decay_start=2, decay_factor=1.3,
                                 renormalize=True, encoder_ngram=3)
    for name in ("greedy", "beam4-nbest"):
        assert_same(pair[0].generate(sources, OPTIONS[name]),
                    pair[1].generate(sources, OPTIONS[name]))


def test_emulated_device_joining_is_batch_invariant(engines: tuple[Engine, Engine],
                                                     sources: list[list[int]]) -> None:
    """Sources joining a running batch at random steps on the emulated device get
    what each gets alone on the CPU."""
    plain, device = engines
    for name in ("beam4-nbest", "sampling"):
        options = plain.resolve(OPTIONS[name])
        alone = {i: result_key(plain.generate([s], options)[0]) for i, s in enumerate(sources)}
        running = device.start_batch(options.beam_size)
        joined = decode_joining(device, running, sources, options, range(len(sources)),
                                random.Random(3))
        for i, key in alone.items():
            assert [t for t, _ in joined[i]] == [t for t, _ in key]
            for (_, a), (_, b) in zip(joined[i], key, strict=True):
                assert a is not None and b is not None and abs(a - b) <= SCORE_TOLERANCE


# -- traffic ------------------------------------------------------------------------------

def run_counted(engine: Engine, sources: list[list[int]], options: DecodingOptions,
                join_at: int = 3) -> list[tuple[int, int, Transfers]]:
    """Half the sources start a batch, the rest join after `join_at` steps; per
    step (rows, k, bytes that crossed during it), admissions not counted in."""
    resolved = engine.resolve(options)
    counter = engine.runner.memory.counter
    batch: RunningBatch = engine.start_batch(resolved.beam_size, resolved.shortlist)
    half = len(sources) // 2
    batch.admit([engine.request(i, s, resolved) for i, s in enumerate(sources[:half])])
    steps = []
    while batch.rows:
        if len(steps) == join_at:
            batch.admit([engine.request(half + i, s, resolved)
                         for i, s in enumerate(sources[half:])])
        before = counter.read()
        plan = batch.search.plan(batch.placed.state) if batch.placed is not None else None
        outcome = batch.step()
        if outcome.stats is not None:
            k = plan.k if plan is not None else 0
            steps.append((outcome.stats.rows, k, counter.read() - before))
    return steps


@pytest.mark.parametrize("name", ["greedy", "beam4-nbest", "sampling", "history"])
def test_per_step_traffic_is_bounded_by_rows_and_candidates(
        engines: tuple[Engine, Engine], sources: list[list[int]], name: str) -> None:
    _, device = engines
    steps = run_counted(device, sources, OPTIONS[name])
    cache_row = (2 * device.runner.layers * device.runner.heads * device.runner.head_dim
                 * np.dtype(device.runner.cache_dtype).itemsize)  # one slot of one row
    # The history's processors send per row a list as long as its history: the
    # repetition penalty a (row, id) pair and a factor per distinct token, n-gram
    # blocking a (row, id) pair per banned token.
    down = DOWN_PER_ROW + (HISTORY_ENTRY_BYTES * (MAX_NEW + 1) if name == "history" else 0)
    for rows, k, moved in steps:
        assert k > 0, "every step of these options stays on the device"
        assert moved.to_device_bytes <= rows * down + STEP_CONSTANT
        assert moved.to_host_bytes <= rows * (ALIGNMENT_BYTES + k * CANDIDATE_BYTES) \
            + STEP_CONSTANT
        # Nothing of the cache (nor the vocabulary's log-probs) came back.
        assert moved.to_host_bytes < rows * min(cache_row, 4 * device.tgt_vocab_size)


def test_nothing_of_the_cache_or_encoder_state_crosses_after_admission(
        engines: tuple[Engine, Engine], sources: list[list[int]]) -> None:
    """A whole run with joining, departures, cache growth and compaction: what came
    back is only the candidates and alignments, and what went down during steps
    only the per-row lists, far below one source's cross keys/values."""
    _, device = engines
    steps = run_counted(device, sources * 2, OPTIONS["beam4-nbest"], join_at=2)
    back = sum(m.to_host_bytes for _, _, m in steps)
    down = sum(m.to_device_bytes for _, _, m in steps)
    row_steps = sum(rows for rows, _, _ in steps)
    assert back <= row_steps * (ALIGNMENT_BYTES + 8 * CANDIDATE_BYTES) + len(steps) * 64
    assert down <= row_steps * DOWN_PER_ROW + len(steps) * STEP_CONSTANT


def test_cpu_moves_nothing(engines: tuple[Engine, Engine], sources: list[list[int]]) -> None:
    plain, _ = engines
    plain.generate(sources, OPTIONS["beam4-nbest"])
    assert plain.runner.memory.counter.read() == Transfers()
    assert not plain.runner.memory.on_device


def test_transfer_counters_reach_metrics(engines: tuple[Engine, Engine],
                                         sources: list[list[int]]) -> None:
    _, device = engines
    metrics = Metrics()
    metrics.watch_transfers("m", [device.runner.memory.counter.read])
    device.generate(sources[:2], OPTIONS["greedy"])
    counts = device.runner.memory.counter.read()
    text = metrics.render().decode()
    assert any(line.startswith("# TYPE seq2serve_host_device_bytes") and line.endswith(" counter")
               for line in text.splitlines())
    assert (f'seq2serve_host_device_bytes_total{{direction="to_host",model="m"}} '
            f"{float(counts.to_host_bytes)}") in text
    assert (f'seq2serve_host_device_bytes_total{{direction="to_device",model="m"}} '
            f"{float(counts.to_device_bytes)}") in text


# -- a multilingual package: forced target languages, mixed in one batch ----------------------

@pytest.fixture(scope="module")
def m2m100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = make_folder("m2m100", tmp_path_factory.mktemp("m2m100") / "tiny-m2m100")
    out = tmp_path_factory.mktemp("packages") / "tiny-m2m100"
    export(folder, out, progress=False)
    return out


def test_multilingual_mixed_batch_on_the_emulated_device(m2m100: Path) -> None:
    plain, device = cpu(m2m100), emulated(m2m100)
    sources = random_sources(plain, 6, seed=4)
    vocab = plain.tgt_vocab_size
    targets = [vocab - 1 - (i % 3) for i in range(len(sources))]  # any valid ids
    for name in ("greedy", "beam4-nbest"):
        before = device.runner.memory.counter.read()
        got = device.generate(sources, OPTIONS[name], forced_bos=targets)
        assert_same(plain.generate(sources, OPTIONS[name], forced_bos=targets), got)
        assert all(h.token_ids[0] == t for r, t in zip(got, targets, strict=True) for h in r)
        moved = device.runner.memory.counter.read() - before
        row_steps = sum(s.rows for s in got.stats.steps)
        assert moved.to_host_bytes <= row_steps * (ALIGNMENT_BYTES + 8 * CANDIDATE_BYTES) \
            + len(got.stats.steps) * 64


# -- a vocabulary shortlist: candidates over each source's columns ----------------------------

@pytest.fixture(scope="module")
def shortlisted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import CORPUS
    from test_export import drawn_checkpoint

    from seq2serve.model.package import shortlist as lexical

    corpus = tmp_path_factory.mktemp("corpus")
    lines = "\n".join(CORPUS * 3) + "\n"
    (corpus / "train.src").write_text(lines, encoding="utf-8")
    (corpus / "train.tgt").write_text(lines, encoding="utf-8")
    drawn = drawn_checkpoint(tmp_path_factory.mktemp("drawn") / "model")[0]
    return export(drawn, tmp_path_factory.mktemp("shortlist") / "fp32", precision="fp32",
                  progress=False, shortlist_from=corpus,
                  shortlist=lexical.ShortlistSettings(first=8, best=6)).package


def test_shortlist_on_the_emulated_device(shortlisted: Path) -> None:
    plain, device = cpu(shortlisted), emulated(shortlisted)
    sources = random_sources(plain, 8, seed=5)
    for name in ("greedy", "beam4-nbest", "sampling"):
        options = replace(OPTIONS[name], shortlist=True)
        assert plain.resolve(options).shortlist
        assert_same(plain.generate(sources, options), device.generate(sources, options))
    # Greedy and beam over the candidates stay on the device, step by step.
    for rows, k, moved in run_counted(device, sources, replace(OPTIONS["beam4-nbest"],
                                                                shortlist=True)):
        assert moved.to_host_bytes <= rows * (ALIGNMENT_BYTES + k * CANDIDATE_BYTES) \
            + STEP_CONSTANT


# -- the figure: at most 256 bytes per decoder row-step each way --------------------

ROW_STEP_BUDGET = 256
ROOT = Path(__file__).resolve().parents[2]


def per_row_step(engine: Engine, sources: list[list[int]], options: DecodingOptions,
                 forced_bos: list[int | None] | None = None) -> tuple[Any, float, float]:
    """A generate() run's results and its bytes per row-step, down and back, over
    the whole run (admissions included)."""
    before = engine.runner.memory.counter.read()
    got = engine.generate(sources, options, forced_bos=forced_bos)
    moved = engine.runner.memory.counter.read() - before
    row_steps = sum(s.rows for s in got.stats.steps)
    return got, moved.to_device_bytes / row_steps, moved.to_host_bytes / row_steps


def test_shipped_en_de_beam4_moves_at_most_256_bytes_per_row_step() -> None:
    from conftest import CORPUS

    from seq2serve.model.package.manifest import load_package
    from seq2serve.model.package.tokenizer import package_tokenizer

    package = load_package(ROOT / "models" / "en-de")
    tokenizer = package_tokenizer(package)
    corpus = (ROOT / "tests" / "fixtures" / "tiny_corpus" / "train.src").read_text()
    texts = (CORPUS[:8] + corpus.splitlines())[:32]
    sources = [tokenizer.encode(t) for t in texts]
    assert len(sources) == 32
    options = DecodingOptions(beam_size=4)
    got, down, back = per_row_step(emulated(package), sources, options)
    assert down <= ROW_STEP_BUDGET and back <= ROW_STEP_BUDGET
    assert_same(cpu(package).generate(sources, options), got)


def test_multilingual_moves_at_most_256_bytes_per_row_step(m2m100: Path) -> None:
    device = emulated(m2m100)
    sources = random_sources(device, 32, seed=6)
    vocab = device.tgt_vocab_size
    targets: list[int | None] = [vocab - 1 - (i % 3) for i in range(len(sources))]
    _, down, back = per_row_step(device, sources, DecodingOptions(beam_size=4), targets)
    assert down <= ROW_STEP_BUDGET and back <= ROW_STEP_BUDGET


# -- format 7: the fused attention writes the cache in place on the device too ---------------

@pytest.fixture(scope="module")
def fused(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(marian_dir, tmp_path_factory.mktemp("fused") / "pkg", precision="fp32",
                  progress=False, attention="fused").package


def test_fused_attention_package_on_the_emulated_device(fused: Path,
                                                        sources: list[list[int]]) -> None:
    plain, device = cpu(fused), emulated(fused)
    assert device.runner.in_place and not device.runner.memory.host_outputs
    for name in ("greedy", "beam4-nbest"):
        assert_same(plain.generate(sources, OPTIONS[name]), device.generate(sources, OPTIONS[name]))
    for rows, k, moved in run_counted(device, sources, OPTIONS["beam4-nbest"]):
        assert moved.to_host_bytes <= rows * (ALIGNMENT_BYTES + k * CANDIDATE_BYTES) \
            + STEP_CONSTANT


def test_serve_flag_reaches_the_engines_and_metrics(marian_package: Path) -> None:
    """`seq2serve serve --emulate-device` (SEQ2SERVE_EMULATE_DEVICE alike): the
    served model's engines take the device's branches and /metrics shows their bytes."""
    import argparse

    from seq2serve.model.package.manifest import load_package
    from seq2serve.server.assembly import build_handle, package_handle, stop_handle
    from seq2serve.server.config import add_arguments, from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = from_args(parser.parse_args(["--emulate-device", "--provider", "cpu",
                                          "--threads", "1", "--engines", "1"]), environ={})
    assert config.emulate_device
    metrics = Metrics()
    handle = package_handle(load_package(marian_package), config)
    loaded = build_handle(handle, config, metrics)
    try:
        [engine] = [worker.engine for worker in loaded.workers]
        assert engine.runner.memory.on_device
        name = handle.name
        text = metrics.render().decode()
        # The warm-up ran on the emulated device: its bytes are counted already.
        assert f'seq2serve_host_device_bytes_total{{direction="to_host",model="{name}"}}' \
            in text
        assert engine.runner.memory.counter.read().to_host_bytes > 0
    finally:
        stop_handle(handle, loaded, metrics)


def test_a_step_the_candidates_cannot_decide_takes_the_whole_rows(
        engines: tuple[Engine, Engine], sources: list[list[int]]) -> None:
    """Sampling's top-k keeps every tie of the k-th value (HF): when the last
    candidate that came back ties it, the step is undecided, and the engine then
    brings the step's log-probs over whole and takes the CPU's path, with the
    same result."""
    plain, device = engines
    options = device.resolve(OPTIONS["sampling"])
    search = device.strategy(1)
    state = search.start([device.request(0, sources[0], options)])
    plan = search.plan(state)
    assert plan is not None and plan.k == options.sampling_top_k + 1
    values = np.array([[-0.5, *([-1.0] * options.sampling_top_k)]], dtype=np.float32)
    ids = np.arange(values.shape[1], dtype=np.int64)[None, :]
    from seq2serve.server.engine.runner import Picked

    assert search.step_picked(state, Picked(values, ids), np.zeros(1, dtype=np.int64)) is None
    values[0, -1] = -2.0  # no tie past the k-th: decided
    assert search.step_picked(state, Picked(values, ids), np.zeros(1, dtype=np.int64)) \
        is not None

    # Every step undecided: the whole rows come back, and the outputs are the CPU's.
    batch = device.start_batch(1)
    batch.search.step_picked = lambda *args, **kwargs: None  # type: ignore[method-assign]
    batch.admit([device.request(i, s, options) for i, s in enumerate(sources)])
    got: dict[int, Any] = {}
    while batch.rows:
        got.update(batch.step().finished)
    want = plain.generate(sources, options)
    assert_same(want, [got[i] for i in range(len(sources))])


def test_a_steps_ban_list_is_np_unique_of_its_parts() -> None:
    """edits._union skips the concatenation and np.unique's sort where one list is
    already distinct and in order; its answer is np.unique's, array for array."""
    from seq2serve.server.engine.edits import _union

    rng = np.random.default_rng(3)
    for _ in range(300):
        parts = [rng.integers(0, 5, size=(int(rng.integers(0, 6)), 2)).astype(np.int64)
                 for _ in range(int(rng.integers(1, 4)))]
        if rng.random() < 0.5:  # one list in order, the usual step
            parts = [np.unique(parts[0], axis=0)] + [p[:0] for p in parts[1:]]
        want = np.unique(np.concatenate(parts), axis=0)
        got = _union(parts)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), (parts, got, want)
