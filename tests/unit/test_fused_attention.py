"""Package format 7: ONNX Runtime's fused attention operators and the cache written
in place (export/fused_attention.py, server/engine/runner.py), beside format 6
packages, which still load and serve."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import transformers
from invariance import decode_joining, result_key
from test_engine import MAX_NEW, PARITY, SCORE_TOLERANCE, TEXTS, hf_generate

from seq2serve.export.exporter import ExportError, export
from seq2serve.model.package.manifest import (
    FORMAT_VERSION,
    READABLE_FORMATS,
    PackageError,
    load_package,
    sha256_file,
)
from seq2serve.model.package.tokenizer import package_tokenizer
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import CACHE_BLOCK, Runner, RunnerConfig

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = (ROOT / "tests" / "fixtures" / "ddtp_en_test_sample.txt").read_text(
    encoding="utf-8").splitlines()
CPU = RunnerConfig(provider="cpu", intra_op_threads=1)


def _ops(path: Path) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in onnx.load(str(path)).graph.node]


@pytest.fixture(scope="module")
def fused_package(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fused") / "marian-fused"
    export(marian_dir, out, progress=False, attention="fused")
    return out


@pytest.fixture(scope="module")
def plain_package(marian_package: Path) -> Path:
    """The conftest's package: `export`'s default, plain attention (format 6)."""
    return marian_package


def test_graphs_use_the_fused_operators(fused_package: Path) -> None:
    package = load_package(fused_package)
    assert package.manifest.format_version == 7  # format 8 is 6 or 7 with a shortlist
    assert FORMAT_VERSION == 8
    layers = package.manifest.config.decoder_layers
    encoder, decoder = _ops(package.encoder_path), _ops(package.decoder_path)
    ms = "com.microsoft"
    assert encoder.count((ms, "MultiHeadAttention")) == package.manifest.config.encoder_layers
    assert decoder.count((ms, "GroupQueryAttention")) == layers
    # Every cross-attention but the last, whose weights give the alignment.
    assert decoder.count((ms, "MultiHeadAttention")) == layers - 1
    assert ("", "ScatterND") not in decoder
    # Each GroupQueryAttention writes the graph's cache outputs itself: nothing
    # stands between it and the buffer the runner binds as both past and present.
    graph = onnx.load(str(package.decoder_path)).graph
    for node in (n for n in graph.node if n.op_type == "GroupQueryAttention"):
        assert node.input[3].startswith("self_k.") and node.output[1].startswith("new_self_k.")
        assert node.input[4].startswith("self_v.") and node.output[2].startswith("new_self_v.")
        assert {a.name: a.i for a in node.attribute if a.name.endswith("num_heads")} == {
            "num_heads": package.manifest.config.decoder_heads,
            "kv_num_heads": package.manifest.config.decoder_heads}


@pytest.mark.parametrize("case", list(PARITY))
def test_fused_package_matches_hf_generate(case: str, fused_package: Path,
                                           marian_dir: Path) -> None:
    """test_engine.py's parity cases against Hugging Face's generate(), on the
    format 7 package."""
    tokenizer = transformers.MarianTokenizer.from_pretrained(marian_dir)
    hf = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    batch: dict[str, Any] = tokenizer(TEXTS, return_tensors="pt", padding=True)
    sources = [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
               for i in range(len(TEXTS))]
    hf_kwargs, ours = PARITY[case]
    with torch.no_grad():
        ref = hf_generate(hf, batch, **hf_kwargs)
    engine = Engine(fused_package, CPU, default_limits())
    results = engine.generate(sources, DecodingOptions(max_length=MAX_NEW, max_length_ratio=0,
                                                       **ours))
    assert [[h.token_ids for h in r] for r in results] == [[t for t, _ in r] for r in ref]
    assert max(abs(h.score - s) for r, o in zip(ref, results, strict=True)
               for (_, s), h in zip(r, o, strict=True)) <= SCORE_TOLERANCE


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_reduced_precision_fused_package_runs(marian_dir: Path, tmp_path: Path,
                                              precision: str) -> None:
    """int8 (CPU) and fp16 (meant for CUDA, where GroupQueryAttention has its
    fp16 kernel; here on the CPU provider) in format 7, as test_engine.py checks
    format 6."""
    report = export(marian_dir, tmp_path / precision, precision=precision, progress=False,
                    attention="fused")
    engine = Engine(report.package, CPU, default_limits())
    assert engine.runner.fused_attention
    assert engine.runner.cache_dtype == (np.float16 if precision == "fp16" else np.float32)
    sources = [[5, 6, 7, 8, 9, 2], [10, 11, 2], [12, 13, 14, 15, 2], [16, 2]]
    for beam in (1, 4):
        results = engine.generate(sources, DecodingOptions(beam_size=beam, max_length=MAX_NEW))
        assert all(r[0].token_ids and np.isfinite(r[0].score) for r in results)
    assert report.fp32_deviation["log_probs"] <= 1e-4  # the fused fp32 graphs it came from


def test_export_verified_the_fused_graphs_against_pytorch(fused_package: Path) -> None:
    deviation = load_package(fused_package).manifest.exporter["fp32_deviation"]
    assert isinstance(deviation, dict)
    for key in ("log_probs", "path_log_probs", "encoder", "cross_kv", "cache"):
        assert deviation[key] <= 1e-4, key
    assert deviation["alignment_equal"] and deviation["argmax_flips"] == 0


def test_verification_fails_loudly_past_tolerance(marian_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused operator that computed something else (here: another scale) must
    stop the export, and leave nothing behind."""
    from seq2serve.export import fused_attention

    symbolic = fused_attention._GroupQueryAttention.symbolic

    def wrong_scale(g, *args):  # noqa: ANN001, ANN202 - the exporter's graph context
        out = symbolic(g, *args)
        out[0].node().f_("scale", 0.5)
        return out

    monkeypatch.setattr(fused_attention._GroupQueryAttention, "symbolic",
                        staticmethod(wrong_scale))
    with pytest.raises(ExportError, match="verification failed"):
        export(marian_dir, tmp_path / "out", progress=False, attention="fused")
    assert not (tmp_path / "out").exists()


def test_plain_export_is_format_6_and_decodes_alike(fused_package: Path,
                                                   plain_package: Path) -> None:
    """`--attention plain` (the default) writes the format 6 graphs (no contrib
    operators), and both formats decode the same tokens (fp32, scores to rounding)."""
    plain = load_package(plain_package)
    assert plain.manifest.format_version == 6
    assert not [op for op in _ops(plain.decoder_path) + _ops(plain.encoder_path) if op[0]]
    sources = [[5, 6, 7, 8, 9, 2], [10, 11, 2], [12, 13, 14, 15, 2]]
    for beam in (1, 4):
        options = DecodingOptions(beam_size=beam, num_hypotheses=beam, max_length=24,
                                  return_scores=True)
        fused = Engine(fused_package, CPU, default_limits()).generate(sources, options)
        old = Engine(plain_package, CPU, default_limits()).generate(sources, options)
        for a, b in zip(fused, old, strict=True):
            assert [h.token_ids for h in a] == [h.token_ids for h in b]
            assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-4)


def test_old_and_unknown_format_versions(plain_package: Path, tmp_path: Path) -> None:
    assert READABLE_FORMATS == (6, 7, 8)
    copy = tmp_path / "pkg"
    shutil.copytree(plain_package, copy)
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    manifest["format_version"] = 5
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(PackageError, match="format_version 5 is not supported"):
        load_package(copy)


def test_the_cache_is_one_buffer_across_steps(fused_package: Path) -> None:
    """Past and present are one buffer: each step writes each row's slot into the
    OrtValues the runner bound, which stay the same across steps; the other slots
    keep their values."""
    runner = Runner(load_package(fused_package), CPU)
    assert runner.fused_attention and runner.in_place
    enc = runner.encode(np.array([[5, 6, 7, 2], [8, 9, 2, 0]]),
                        np.array([[1, 1, 1, 1], [1, 1, 1, 0]]))
    cache = runner.empty_cache(2, runner.cache_slots(1))
    pointers = [v.data_ptr() for v in (*cache.self_k, *cache.self_v)]
    tokens = np.full(2, runner.decoder_start_id)
    before = cache.self_k[0].numpy().copy()
    for step in range(3):
        _, cache, _ = runner.step(tokens, np.full(2, step), cache, enc)
        assert [v.data_ptr() for v in (*cache.self_k, *cache.self_v)] == pointers
        after = cache.self_k[0].numpy()
        assert np.abs(after[:, :, step]).sum() > 0  # this step's slot was written
        assert np.array_equal(after[:, :, step + 1:], before[:, :, step + 1:])
        before = after.copy()


def test_cache_length_choice() -> None:
    """Both formats take the longest row in whole blocks of CACHE_BLOCK; format 7
    (which reads only a row's own slots) one block more where that is a multiple of
    64 slots, where row after row would collide in the CPU's caches."""
    fused = Runner.__new__(Runner)
    fused.fused_attention = True
    plain = Runner.__new__(Runner)
    plain.fused_attention = False
    assert fused.cache_slots(0) == plain.cache_slots(0) == 0
    for longest in range(1, 600):
        blocks = -(-longest // CACHE_BLOCK) * CACHE_BLOCK
        assert plain.cache_slots(longest) == blocks
        assert fused.cache_slots(longest) == blocks + (CACHE_BLOCK if blocks % 64 == 0 else 0)
        assert fused.cache_slots(longest) % 64 != 0


# -- batch invariance of a fused int8 package on real sentences -------------------------

@pytest.fixture(scope="module", params=["int8", "fp32"])
def en_de_fused(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Path:
    out = tmp_path_factory.mktemp("en-de") / f"en-de-{request.param}"
    export(ROOT / "models" / "checkpoints" / "en-de", out, precision=request.param,
           progress=False, attention="fused")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("beam", [1, 4])
def test_fused_output_is_independent_of_the_batch(en_de_fused: Path, beam: int) -> None:
    """The shipped checkpoint's int8 and fp32 exports in format 7: each sentence
    decoded in shuffled batches of mixed sizes, and joining a running batch, gives
    its tokens and scores alone, bit for bit (tests/e2e/test_batch_invariance.py
    checks the shipped package and a format 6 fp32 export the same way)."""
    engine = Engine(en_de_fused, RunnerConfig(provider="cpu", intra_op_threads=2), default_limits())
    assert engine.runner.fused_attention
    tokenizer = package_tokenizer(engine.package)
    sources = [tokenizer.encode(s)[:engine.max_source_length] for s in SENTENCES[:24]]
    options = engine.resolve(DecodingOptions(beam_size=beam, num_hypotheses=min(beam, 2),
                                             return_scores=True, max_length=64))


    alone = [result_key(engine.generate([s], options)[0]) for s in sources]
    rng = random.Random(beam)
    order = list(range(len(sources)))
    rng.shuffle(order)
    start = 0
    while start < len(order):
        size = rng.choice([3, 7, 16])
        batch = order[start:start + size]
        start += size
        assert [result_key(r) for r in engine.generate([sources[i] for i in batch], options)] == \
            [alone[i] for i in batch]
    running = engine.start_batch(beam)
    assert decode_joining(engine, running, sources, options, order, rng) == \
        dict(enumerate(alone))


def test_hashes_cover_the_new_graphs(fused_package: Path) -> None:
    manifest = load_package(fused_package).manifest
    for name in ("encoder.onnx", "decoder.onnx"):
        assert manifest.files[name] == sha256_file(fused_package / name)
