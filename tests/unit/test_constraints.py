"""deploy/constraints.txt, the versions every install command takes (issue 33): it
pins each requirement of the project and of every extra exactly, within
pyproject.toml's ranges, and the README's commands, .ci/run and the image use it."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, Version]:
    """{name: version} of every line that applies on Python 3.11 (the tested one)."""
    found: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        req = Requirement(line)
        assert req.marker is None or req.marker.evaluate({"python_version": "3.11"}), line
        [spec] = req.specifier
        assert spec.operator == "==" and "+" not in spec.version, line  # exact, public
        assert normalise(req.name) not in found, f"{req.name} twice"
        found[normalise(req.name)] = Version(spec.version)
    return found


def test_every_requirement_of_every_extra_is_pinned_within_its_range() -> None:
    """pyproject.toml's requirements, as the installed project's metadata has them."""
    pinned = pins()
    extras = metadata.metadata("seq2serve").get_all("Provides-Extra") or []
    assert set(extras) == {"train", "test", "bench", "gpu"}
    for line in metadata.requires("seq2serve") or []:
        req = Requirement(line)
        extra = next((e for e in extras if req.marker and req.marker.evaluate({"extra": e})),
                     "")
        name = normalise(req.name)
        assert name in pinned, f"[{extra}] {req.name} has no pin"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"[{extra}] {line}: pinned {pinned[name]}")
    # torch at the README's pin; onnxruntime-gpu's CUDA and cuDNN wheels too.
    assert pinned["torch"] == Version("2.13.0")
    assert {"nvidia-cudnn-cu13", "nvidia-cuda-runtime", "nvidia-cublas"} <= set(pinned)


def test_the_pins_apply_from_the_tested_python_on() -> None:
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line:
            marker = Requirement(line).marker
            assert marker == Marker('python_version >= "3.11"'), line


def test_every_install_command_takes_the_constraints() -> None:
    """The README's two commands, each pip install of the project in .ci/run, and the
    image (wheelhouse download and Dockerfile install, both variants)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    installs = [line for text in (readme, ci) for line in text.splitlines()
                if re.search(r"\.venv/bin/pip install .*(-e |torch==)", line)]
    assert len(installs) >= 4
    for line in installs:
        for command in re.findall(r"\.venv/bin/pip install [^&]*", line):
            assert "-c deploy/constraints.txt" in command, command
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "--constraint /wheels/constraints.txt" in dockerfile
    wheelhouse = (ROOT / "deploy" / "wheelhouse.py").read_text(encoding="utf-8")
    assert '"--constraint", str(pinned)' in wheelhouse


def test_onnxruntime_and_onnxruntime_gpu_are_one_release() -> None:
    """The CPU suite tests the release the GPU image runs (issue 52): onnxruntime at
    the newest onnxruntime-gpu release, which may lag onnxruntime's own."""
    pinned = pins()
    assert pinned["onnxruntime"] == pinned["onnxruntime-gpu"]
    assert Version(metadata.version("onnxruntime")) == pinned["onnxruntime"]
