"""A text's output never depends on its batch-mates or its padding (issue 10).

Real sentences (tests/fixtures/ddtp_en_test_sample.txt: every fifth line of
the en-de DDTP test split under 400 characters) through the shipped int8
package and an fp32 export of the same checkpoint: decoded alone, then in
shuffled batches of mixed sizes and lengths, through the engine and through
the server. Tokens and scores must be identical, bit for bit. The same over the
vocabulary shortlist (issue 35), whose candidate sets differ from sentence to
sentence: int8 and fp32 exports of the checkpoint with a table learned from the
DDTP training pairs.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from invariance import decode_joining, result_key
from onnx import TensorProto, helper, numpy_helper
from serving import RunningServer, server_config

from seq2serve.export.quantize import per_row_activations, quantize_int8
from seq2serve.model.package.manifest import GRAPH_IR_VERSION
from seq2serve.model.package.tokenizer import package_tokenizer
from seq2serve.server.assembly import default_limits
from seq2serve.server.client import Seq2ServeClient
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import RunnerConfig

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = (Path(__file__).parents[1] / "fixtures" / "ddtp_en_test_sample.txt").read_text(
    encoding="utf-8").splitlines()


# -- the quantizer on one MatMul -------------------------------------------------------

def _matmul_model(path: Path, weight: np.ndarray) -> None:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "proj",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", weight.shape[1]])],
        [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=GRAPH_IR_VERSION), path)


@pytest.fixture(scope="module")
def quantized_matmul(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(64, 48)).astype(np.float32)
    out = tmp_path_factory.mktemp("quant")
    _matmul_model(out / "fp32.onnx", weight)
    quantize_int8(out / "fp32.onnx", out / "int8.onnx")
    return out / "int8.onnx", weight


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()  # every graph optimization on, as the server runs it
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_a_row_is_quantized_alone(quantized_matmul: tuple[Path, np.ndarray]) -> None:
    path, _ = quantized_matmul
    rng = np.random.default_rng(1)
    row = rng.normal(size=(1, 64)).astype(np.float32)
    alone = _run(path, row)
    # Loud neighbours: with one scale per tensor they would coarsen this row's steps 100x.
    loud = rng.normal(size=(5, 64)).astype(np.float32) * 100
    for mates in (np.vstack([row, loud]), np.vstack([loud, row, loud])):
        index = int(np.flatnonzero((mates == row).all(axis=1))[0])
        assert np.array_equal(_run(path, mates)[index], alone[0])


def test_quantizer_matches_a_numpy_reference(quantized_matmul: tuple[Path, np.ndarray]) -> None:
    path, weight = quantized_matmul
    model = onnx.load(str(path))
    assert "DynamicQuantizeLinear" not in {n.op_type for n in model.graph.node}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    w_q, w_scale = inits["w_quantized"], inits["w_scale"]  # quantize_dynamic's names
    assert w_q.dtype == np.int8 and w_q.shape == weight.shape and w_scale.size == 1
    x = np.random.default_rng(2).normal(size=(7, 64)).astype(np.float32)
    x[3] = 0.0  # an all-zero row must not divide by zero
    scale = np.maximum(np.abs(x).max(axis=1, keepdims=True) / np.float32(127), 1e-12)
    q = np.round(x / scale)  # symmetric, zero point 128 after the shift
    want = (q @ w_q.astype(np.float64)) * scale * w_scale
    got = _run(path, x)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.abs(got - x @ weight).max() < 0.05 * np.abs(x @ weight).max()  # still a MatMul


def test_graph_optimizations_do_not_fuse_the_row_scale_away(
        quantized_matmul: tuple[Path, np.ndarray]) -> None:
    """ONNX Runtime's MatMulIntegerToFloat fusion reads the activation scale as one
    scalar; the rewritten graph must give the same numbers at every level."""
    path, _ = quantized_matmul
    x = np.random.default_rng(3).normal(size=(4, 64)).astype(np.float32) * [[1], [10], [0.1], [5]]
    results = []
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                  ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        results.append(session.run(None, {"x": x.astype(np.float32)})[0])
    assert np.allclose(results[0], results[1], rtol=1e-6, atol=1e-6)


def test_rewrite_counts_every_quantizer() -> None:
    model = onnx.load(str(ROOT / "models" / "en-de" / "decoder.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert "DynamicQuantizeLinear" not in ops  # the shipped package is the per-row one
    assert ops.count("MatMulIntegerToFloat") > 0 and "MatMulInteger" not in ops
    assert per_row_activations(model) == 0


# -- real sentences through the engine ----------------------------------------------------

@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from seq2serve.export.exporter import export

    fp32 = tmp_path_factory.mktemp("fp32") / "en-de-fp32"
    export(ROOT / "models" / "checkpoints" / "en-de", fp32, name="en-de-fp32", progress=False)
    return {"int8": ROOT / "models" / "en-de", "fp32": fp32}


@pytest.fixture(scope="module")
def shortlisted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shipped en-de with a shortlist table learned from the fixture's 200 DDTP
    sentences and the shipped model's own greedy German for them (a clean checkout
    has no corpus; what matters here is that each sentence gets its own candidates)."""
    from seq2serve.export.exporter import export

    root = tmp_path_factory.mktemp("shortlisted")
    engine = Engine(ROOT / "models" / "en-de", RunnerConfig(intra_op_threads=1), default_limits())
    tokenizer = package_tokenizer(engine.package)
    sources = [tokenizer.encode(s)[:engine.max_source_length] for s in SENTENCES]
    options = engine.resolve(DecodingOptions(beam_size=1, max_length=64))
    german = [tokenizer.decode(r[0].token_ids) for r in engine.generate(sources, options)]
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "train.src").write_text("".join(f"{s}\n" for s in SENTENCES), encoding="utf-8")
    (corpus / "train.tgt").write_text("".join(f"{t}\n" for t in german), encoding="utf-8")
    return {precision: export(ROOT / "models" / "checkpoints" / "en-de", root / precision,
                              name=f"en-de-{precision}", precision=precision, progress=False,
                              shortlist_from=corpus).package
            for precision in ("int8", "fp32")}


def _engine(request: pytest.FixtureRequest, precision: str, shortlist: bool) -> Engine:
    """The package of that precision, with a shortlist table when it is used."""
    chosen = request.getfixturevalue("shortlisted" if shortlist else "packages")
    return Engine(chosen[precision], RunnerConfig(provider="cpu", intra_op_threads=2),
                  default_limits())


def _batches(count: int, seed: int) -> list[list[int]]:
    """Shuffled indices cut into batches of mixed sizes (1 to 16)."""
    rng = random.Random(seed)
    order = list(range(count))
    rng.shuffle(order)
    out, start = [], 0
    while start < count:
        size = rng.choice([1, 3, 7, 16])
        out.append(order[start:start + size])
        start += size
    return out


@pytest.mark.slow
@pytest.mark.parametrize("shortlist", [False, True], ids=["vocabulary", "shortlist"])
@pytest.mark.parametrize("precision", ["int8", "fp32"])
@pytest.mark.parametrize("beam", [1, 4])
def test_engine_output_is_independent_of_the_batch(request: pytest.FixtureRequest,
                                                   precision: str, beam: int,
                                                   shortlist: bool) -> None:
    engine = _engine(request, precision, shortlist)
    tokenizer = package_tokenizer(engine.package)
    sources = [tokenizer.encode(s)[:engine.max_source_length] for s in SENTENCES[:48]]
    options = DecodingOptions(beam_size=beam, num_hypotheses=min(beam, 2), return_scores=True,
                              shortlist=shortlist)


    alone = [result_key(engine.generate([s], options)[0]) for s in sources]
    for seed in (0, 1):
        for batch in _batches(len(sources), seed):
            results = engine.generate([sources[i] for i in batch], options)
            assert [result_key(r) for r in results] == [alone[i] for i in batch]


@pytest.mark.slow
@pytest.mark.parametrize("shortlist", [False, True], ids=["vocabulary", "shortlist"])
@pytest.mark.parametrize("precision", ["int8", "fp32"])
@pytest.mark.parametrize("beam", [1, 4])
def test_joining_a_running_batch_changes_nothing(request: pytest.FixtureRequest,
                                                 precision: str, beam: int,
                                                 shortlist: bool) -> None:
    """Iteration-level batching: sentences joining running batches of other sentences
    at different steps decode bit for bit as they do alone (tokens and scores)."""
    engine = _engine(request, precision, shortlist)
    tokenizer = package_tokenizer(engine.package)
    sources = [tokenizer.encode(s)[:engine.max_source_length] for s in SENTENCES[96:120]]
    options = engine.resolve(DecodingOptions(beam_size=beam, num_hypotheses=min(beam, 2),
                                             return_scores=True, max_length=48,
                                             shortlist=shortlist))
    assert options.shortlist is shortlist


    alone = [result_key(engine.generate([s], options)[0]) for s in sources]
    rng = random.Random(beam)
    order = list(range(len(sources)))
    rng.shuffle(order)
    batch = engine.start_batch(beam, shortlist)
    assert decode_joining(engine, batch, sources, options, order, rng) == dict(enumerate(alone))


# -- and through the server ---------------------------------------------------------------

@pytest.fixture(scope="module")
def server(packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("served")
    for path in packages.values():
        shutil.copytree(path, root / path.name)
    running = RunningServer(server_config(root, threads=2, max_queue_delay_ms=30.0))
    yield running
    running.stop()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["en-de", "en-de-fp32"])
def test_served_output_is_independent_of_the_batch(server: RunningServer, model: str) -> None:
    texts = SENTENCES[48:96]
    options = dict(model=model, return_token_ids=True, return_scores=True, max_length=64)

    def call(index: int) -> list[tuple[list[int], float]]:
        with Seq2ServeClient(server.target, timeout=120) as c:
            [hyps] = c.translate([texts[index]], beam_size=1 + 3 * (index % 2), **options)
            return [(list(h.token_ids), h.score) for h in hyps]

    alone = [call(i) for i in range(len(texts))]
    batches_before = sum(h.batches for h in server.server.registry.handles())
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)
    with ThreadPoolExecutor(16) as pool:
        together = dict(zip(order, pool.map(call, order), strict=True))
    batches = sum(h.batches for h in server.server.registry.handles()) - batches_before
    assert [together[i] for i in range(len(texts))] == alone
    assert batches < len(texts)  # they did share batches
    # Many texts in one request: greedy and beam rows apart, each batched with the others.
    with Seq2ServeClient(server.target, timeout=120) as c:
        greedy = c.translate(texts[0::2], beam_size=1, **options)
    assert [[(list(h.token_ids), h.score) for h in hyps] for hyps in greedy] == alone[0::2]
