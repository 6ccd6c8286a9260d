"""What the image build rests on, without a Docker engine: the Dockerfile passes
hadolint, build-image.sh passes shellcheck, the wheelhouse's requirement lists
come from the package's own metadata (one onnxruntime, never both), and the GPU
variant's dependencies (onnxruntime-gpu with NVIDIA's CUDA and cuDNN wheels)
resolve for the image's interpreter and platform. The GPU image cannot run here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import system_tools
from deploy_helpers import DEPLOY, ROOT


def _wheelhouse() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wheelhouse", DEPLOY / "wheelhouse.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheelhouse = _wheelhouse()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """seq2serve's wheel, built as build-image.sh builds it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                    "--wheel-dir", str(out), str(ROOT)], check=True, timeout=600)
    [built] = out.glob("seq2serve-*.whl")
    return built


@pytest.mark.needs("hadolint")
def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = system_tools.path("hadolint")
    out = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / "Dockerfile")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


@pytest.mark.needs("shellcheck")
def test_build_script_is_shellcheck_clean() -> None:
    shellcheck = system_tools.path("shellcheck")
    out = subprocess.run([shellcheck, str(DEPLOY / "build-image.sh")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_wheel_carries_the_generated_protos(wheel: Path) -> None:
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "seq2serve/protos/translator_pb2.py" in names
    assert "seq2serve/protos/translator_pb2_grpc.py" in names


def test_requirements_swap_onnxruntime_for_the_gpu_build(wheel: Path) -> None:
    cpu = wheelhouse.runtime_requirements(wheel, "cpu")
    gpu = wheelhouse.runtime_requirements(wheel, "gpu")
    names = {variant: [wheelhouse.requirement_name(r) for r in reqs]
             for variant, reqs in (("cpu", cpu), ("gpu", gpu))}
    assert "onnxruntime" in names["cpu"] and "onnxruntime-gpu" not in names["cpu"]
    assert "onnxruntime-gpu" in names["gpu"] and "onnxruntime" not in names["gpu"]
    [ort_gpu] = [r for r in gpu if wheelhouse.requirement_name(r) == "onnxruntime-gpu"]
    assert ort_gpu.startswith("onnxruntime-gpu[cuda,cudnn]")
    # Everything else is the same list, and torch is in neither.
    assert set(cpu) - {r for r in cpu if r.startswith("onnxruntime")} == \
        set(gpu) - {ort_gpu}
    assert not any(n == "torch" for n in names["cpu"] + names["gpu"])
    with pytest.raises(ValueError, match="variant must be one of cpu, gpu"):
        wheelhouse.runtime_requirements(wheel, "rocm")


def test_manylinux_tags_follow_the_base_glibc() -> None:
    tags = wheelhouse.manylinux_platforms("x86_64", "2.36")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_37_x86_64" not in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_17_x86_64"} <= set(tags)
    assert "manylinux2014_aarch64" in wheelhouse.manylinux_platforms("aarch64", "2.28")


def test_gpu_variant_dependencies_resolve(wheel: Path, tmp_path: Path) -> None:
    """pip resolves the GPU image's list for CPython 3.11 on manylinux x86_64
    (Debian bookworm's glibc) from binary wheels only, as the image build would,
    to exactly the versions of deploy/constraints.txt."""
    requirements = tmp_path / "requirements-gpu.txt"
    requirements.write_text("\n".join(wheelhouse.runtime_requirements(wheel, "gpu")) + "\n")
    platforms = [a for p in wheelhouse.manylinux_platforms("x86_64", "2.36")
                 for a in ("--platform", p)]
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
         "--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
         *platforms, "--target", str(tmp_path / "target"), "--report", str(report),
         "--constraint", str(DEPLOY / "constraints.txt"), "--requirement", str(requirements)],
        capture_output=True, text=True, timeout=900)
    if out.returncode != 0 and "Could not fetch URL" in out.stderr + out.stdout:
        pytest.skip("PyPI cannot be reached from here")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    assert "onnxruntime-gpu" in resolved and "onnxruntime" not in resolved
    nvidia = {name for name in resolved if name.startswith("nvidia-")}
    assert any(n.startswith("nvidia-cudnn") for n in nvidia), sorted(resolved)
    assert any(n.startswith("nvidia-cuda-runtime") for n in nvidia), sorted(resolved)
    assert any(n.startswith("nvidia-cublas") for n in nvidia), sorted(resolved)
    pinned = dict(line.split(";")[0].strip().lower().split("==") for line
                  in (DEPLOY / "constraints.txt").read_text(encoding="utf-8").splitlines()
                  if line.strip() and not line.startswith("#"))
    pinned = {name.replace("_", "-"): version for name, version in pinned.items()}
    assert {n: v for n, v in resolved.items() if pinned.get(n.replace("_", "-")) != v} == {}
