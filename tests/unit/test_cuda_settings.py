"""The settings a GPU operator sets (issue 52), checked without a device: what the
CUDA provider is given, from flags and environment, and the runner's check that
every provider of its list is the one ONNX Runtime enabled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest

from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.session import USE_ENV_ALLOCATORS, CudaSettings
from seq2serve.server.config import ConfigError, from_args
from seq2serve.server.engine import runner as runner_module
from seq2serve.server.engine.runner import Runner, RunnerConfig

ROOT = Path(__file__).resolve().parents[2]


def test_tf32_is_off_unless_allowed_and_the_arena_is_as_set() -> None:
    assert CudaSettings().provider_options(2) == {
        "device_id": "2", "use_tf32": "0", "arena_extend_strategy": "kNextPowerOfTwo"}
    allowed = CudaSettings(allow_tf32=True, gpu_mem_limit=2**30,
                           arena_extend_strategy="same_as_requested", shared_arena=False)
    assert allowed.provider_options(0) == {
        "device_id": "0", "use_tf32": "1", "arena_extend_strategy": "kSameAsRequested",
        "gpu_mem_limit": str(2**30)}
    assert CudaSettings().session_entries() == {USE_ENV_ALLOCATORS: "1"}
    assert allowed.session_entries() == {}


def test_server_settings_from_flags_and_environment() -> None:
    config = from_args(environ={"SEQ2SERVE_ALLOW_TF32": "yes", "SEQ2SERVE_GPU_MEM_LIMIT_MB": "512",
                                "SEQ2SERVE_ARENA_EXTEND_STRATEGY": "same_as_requested",
                                "SEQ2SERVE_DEVICE_ID": "1", "SEQ2SERVE_SHARED_ARENA": "0",
                                "SEQ2SERVE_MODELS_DIR": str(ROOT / "models")})
    assert config.device_id == 1 and not config.allow_cpu_nodes
    assert config.cuda_settings() == CudaSettings(
        allow_tf32=True, gpu_mem_limit=512 * 2**20, arena_extend_strategy="same_as_requested",
        shared_arena=False)
    with pytest.raises(ConfigError) as bad:
        from_args(environ={"SEQ2SERVE_ARENA_EXTEND_STRATEGY": "doubling",
                           "SEQ2SERVE_GPU_MEM_LIMIT_MB": "-1",
                           "SEQ2SERVE_MODELS_DIR": str(ROOT / "models")})
    assert {p.field for p in bad.value.problems} == {"arena_extend_strategy",
                                                     "gpu_mem_limit_mb"}
    assert "next_power_of_two, same_as_requested" in str(bad.value)
    with pytest.raises(ValueError, match="arena_extend_strategy must be one of"):
        RunnerConfig(cuda=CudaSettings(arena_extend_strategy="doubling")).validate()


def test_the_runner_checks_every_provider_onnxruntime_enabled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A session that enabled other providers than the list (in order) is refused,
    naming both, whichever position differs."""
    real = ort.InferenceSession

    class Other(real):  # type: ignore[misc, valid-type]
        def get_providers(self) -> list[str]:
            return [*super().get_providers(), "AzureExecutionProvider"]

    def session(*args: Any, **kwargs: Any) -> Any:
        return Other(*args, **kwargs)

    monkeypatch.setattr(runner_module.ort, "InferenceSession", session)
    refused = r"AzureExecutionProvider.*not \['CPUExecutionProvider'\]"
    with pytest.raises(RuntimeError, match=refused):
        Runner(load_package(ROOT / "models" / "en-de"),
               RunnerConfig(provider="cpu", intra_op_threads=1, warmup=False))
