"""The CUDA path on a device (issue 52; `pytest -m gpu`): what the GPU image serves
(fp16, format 6 and 7), T5 and a multilingual batch, each against the same package
on the CPU provider; fp32 with TF32 off; the session settings a GPU operator
sets. Skipped when no CUDA device answers (tests/cuda_device.py), not when
onnxruntime was built without the provider."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CORPUS, make_marian_dir
from cuda_device import requires_cuda
from family_checks import check_batch_equals_one_at_a_time
from multilingual_folders import PAIRS, make_folder
from test_t5_parity import make_t5_package_dir

from seq2serve.export.exporter import export
from seq2serve.model.package import kernels, placement
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.session import USE_ENV_ALLOCATORS, CudaSettings
from seq2serve.model.package.tokenizer import package_tokenizer
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import CUDA, RunnerConfig

pytestmark = [pytest.mark.gpu, requires_cuda()]
MAX_NEW = 20
DECODINGS = (DecodingOptions(beam_size=1, max_length=MAX_NEW),
             DecodingOptions(beam_size=4, num_hypotheses=2, max_length=MAX_NEW))


def engines(package: Path, **cuda: object) -> tuple[Engine, Engine]:
    """(on CUDA, on the CPU) for one package."""
    on_gpu = Engine(package, RunnerConfig(provider="cuda", cuda=CudaSettings(**cuda)),
                    default_limits())
    on_cpu = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=2), default_limits())
    assert on_gpu.runner.device == "cuda" and on_gpu.runner.encoder.get_providers()[0] == CUDA
    return on_gpu, on_cpu


def sources(package: Path, texts: list[str]) -> list[list[int]]:
    tokenizer = package_tokenizer(load_package(package))
    return [tokenizer.encode(t) for t in texts]


def assert_same_tokens(on_gpu: Engine, on_cpu: Engine, ids: list[list[int]],
                       score_tol: float) -> None:
    for options in DECODINGS:
        gpu, cpu = on_gpu.generate(ids, options), on_cpu.generate(ids, options)
        assert [[h.token_ids for h in r] for r in gpu] == [[h.token_ids for h in r] for r in cpu]
        assert [h.score for r in gpu for h in r] == \
            pytest.approx([h.score for r in cpu for h in r], abs=score_tol)


@pytest.fixture(scope="module")
def marian(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_marian_dir(tmp_path_factory.mktemp("cuda") / "opus-mt-en-de", train_steps=100)


@pytest.mark.parametrize("attention", ["plain", "fused"])  # format 6 and 7
def test_fp16_package_on_cuda_decodes_as_on_the_cpu(marian: Path, attention: str,
                                                    tmp_path: Path) -> None:
    package = export(marian, tmp_path / "fp16", precision="fp16", attention=attention,
                     progress=False, for_provider="cuda").package
    assert placement.check_package(load_package(package), kernels.CUDA).ok
    on_gpu, on_cpu = engines(package)
    assert on_gpu.runner.cache_dtype.name == "float16"
    assert_same_tokens(on_gpu, on_cpu, sources(package, CORPUS[:8]), score_tol=5e-2)


def test_fp32_on_cuda_is_fp32_with_tf32_off(marian: Path, tmp_path: Path) -> None:
    package = export(marian, tmp_path / "fp32", progress=False).package
    on_gpu, on_cpu = engines(package)
    options = on_gpu.runner.decoder.get_provider_options()[CUDA]
    assert options["use_tf32"] == "0"
    assert_same_tokens(on_gpu, on_cpu, sources(package, CORPUS[:8]), score_tol=1e-4)


def test_session_settings_reach_the_cuda_provider(marian: Path, tmp_path: Path) -> None:
    package = export(marian, tmp_path / "fp16", precision="fp16", progress=False).package
    settings = dict(allow_tf32=True, gpu_mem_limit=256 * 2**20,
                    arena_extend_strategy="same_as_requested", shared_arena=False)
    runner = engines(package, **settings)[0].runner
    options = runner.decoder.get_provider_options()[CUDA]
    assert options["use_tf32"] == "1" and options["gpu_mem_limit"] == str(256 * 2**20)
    assert options["arena_extend_strategy"] == "kSameAsRequested"
    # and one arena shared by two engines' sessions (the environment's allocator)
    first, second = (Engine(package, RunnerConfig(provider="cuda"), default_limits())
                     for _ in range(2))
    for engine in (first, second):
        assert engine.runner.decoder.get_session_options().get_session_config_entry(
            USE_ENV_ALLOCATORS) == "1"
    ids = sources(package, CORPUS[:4])
    assert [[h.token_ids for h in r] for r in first.generate(ids, DECODINGS[1])] == \
        [[h.token_ids for h in r] for r in second.generate(ids, DECODINGS[1])]


def test_t5_fp16_on_cuda_keeps_its_fp32_islands(tmp_path: Path) -> None:
    """T5 at fp16 (plain attention: CUDA's GroupQueryAttention refuses its position
    bias, and export --for cuda says so) decodes on CUDA as on the CPU."""
    folder = make_t5_package_dir(tmp_path / "t5", "mt5")
    package = export(folder, tmp_path / "fp16", precision="fp16", attention="plain",
                     progress=False, for_provider="cuda").package
    on_gpu, on_cpu = engines(package)
    ids = [package_tokenizer(load_package(package)).encode(t) for t in CORPUS[:6]]
    assert_same_tokens(on_gpu, on_cpu, ids, score_tol=5e-2)


def test_multilingual_batch_on_cuda(tmp_path: Path) -> None:
    """Texts of several pairs in one batch on CUDA: each as alone, and as on the CPU."""
    folder = make_folder("m2m100", tmp_path / "m2m100")
    package = export(folder, tmp_path / "fp16", precision="fp16", progress=False,
                     for_provider="cuda").package
    manifest = load_package(package).manifest
    assert manifest.languages is not None
    tokenizer = package_tokenizer(load_package(package))
    pairs = PAIRS["m2m100"]
    ids = [tokenizer.encode(CORPUS[i], manifest.languages.token(pairs[i % 3][0]))
           for i in range(6)]
    targets: list[int | None] = [manifest.languages.token(pairs[i % 3][1])
                                 for i in range(6)]
    on_gpu, on_cpu = engines(package)
    check_batch_equals_one_at_a_time(on_gpu, ids, MAX_NEW, forced_bos=targets)
    options = DECODINGS[1]
    assert [[h.token_ids for h in r] for r in on_gpu.generate(ids, options, forced_bos=targets)] \
        == [[h.token_ids for h in r] for r in on_cpu.generate(ids, options, forced_bos=targets)]
