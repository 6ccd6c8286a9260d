"""Refresh deploy/constraints.txt: the exact versions the test suite passed on.

    python3 deploy/constraints.py                # fresh venv, newest releases, suite, lock
    python3 deploy/constraints.py --venv .venv   # lock a venv the suite has passed in

Without --venv it makes a fresh virtual environment, installs the project as the
README's test command does but without the constraints (torch at the README's
pin, every other package at the newest release that pyproject.toml's ranges
allow, plus the lint tools .ci/run installs), runs the README's pytest there, and
writes the file only if the suite passes. The file lists every package of that
environment (`pip freeze`, without seq2serve itself and without local version
labels such as torch's `+cpu`, so that `torch==2.13.0` fits the CPU and the CUDA
build alike), then what the `gpu` extra and PyPI's CUDA build of torch add,
resolved together for CPython on manylinux x86_64 (metadata only, nothing is
installed), so that `.[train,gpu]` installs with the same file. onnxruntime is
installed at onnxruntime-gpu's newest release (its releases may lag), so that the
suite tests the release the GPU image runs; the file is refused unless they agree.
Constraints only constrain: a package that an install does not need is not installed.

Run it where pip sees PyPI's torch: an index or find-links that serves torch's
+cpu build hides the CUDA build's dependencies from the gpu section.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "constraints.txt"
TORCH = "torch==2.13.0"  # the README's and .ci/run's pin (unpinned, pip may pick another build)
EXTRAS = ".[train,test,bench]"
TOOLS = ["ruff", "mypy"]  # what .ci/run installs besides the project
GPU = "onnxruntime-gpu[cuda,cudnn]"  # pyproject's `gpu` extra, without its range

HEADER = """\
# The exact versions the whole test suite passed on, for installs that do not
# drift: the README's commands, .ci/run, the image's wheelhouse and Dockerfile
# install with `-c deploy/constraints.txt`. Constraints only constrain: an install
# gets only what it asks for, at these versions. pyproject.toml keeps ranges, so
# the project still installs without this file, with versions of one's own.
# Tested on Python {python}; the pins apply from there on (on older Pythons, whose
# wheels some of these releases lack, they constrain nothing).
# Refresh (a fresh venv, newest releases, the whole suite, then this file):
#   python3 deploy/constraints.py
"""
GPU_HEADER = """
# The `gpu` extra (onnxruntime-gpu with NVIDIA's CUDA and cuDNN wheels) and the
# CUDA build of torch that PyPI serves on Linux, resolved together so that
# `.[train,gpu]` installs with this file too.
"""


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run(*command: str, cwd: Path = ROOT) -> str:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, cwd=cwd, check=True, text=True,
                          stdout=subprocess.PIPE).stdout


def frozen(venv: Path) -> dict[str, str]:
    """{normalised name: 'Name==version'} of the venv, seq2serve and local labels out."""
    lines = run(str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all",
                "--exclude-editable")
    pins = {}
    for line in lines.splitlines():
        name, sep, version = line.partition("==")
        if not sep or normalise(name) in ("seq2serve", "pip"):
            continue  # `name @ url` cannot be pinned; the project; the installer itself
        pins[normalise(name)] = f"{name}=={version.split('+')[0]}"
    return pins


def gpu_pins(venv: Path, python: str, known: dict[str, str]) -> list[str]:
    """What the gpu extra and the CUDA build of torch add to `known` (which constrains
    everything they share), resolved for CPython `python` on manylinux x86_64 with
    Debian bookworm's glibc, as the GPU image's wheelhouse is."""
    sys.path.insert(0, str(ROOT / "deploy"))
    from wheelhouse import manylinux_platforms

    platforms = [a for p in manylinux_platforms("x86_64", "2.36") for a in ("--platform", p)]
    with tempfile.TemporaryDirectory() as tmp:
        report, tested = Path(tmp) / "report.json", Path(tmp) / "tested.txt"
        tested.write_text("\n".join(known.values()) + "\n", encoding="utf-8")
        run(str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet",
            "--ignore-installed", "--only-binary=:all:", "--implementation", "cp",
            "--python-version", python, *platforms, "--target", str(Path(tmp) / "target"),
            "--report", str(report), "--constraint", str(tested), known.get("torch", TORCH),
            GPU)
        resolved = json.loads(report.read_text())["install"]
    pins = {normalise(i["metadata"]["name"]): f"{i['metadata']['name']}=={i['metadata']['version']}"
            for i in resolved}
    return sorted((p for n, p in pins.items() if n not in known), key=str.lower)


def newest_gpu_onnxruntime(venv: Path, python: str) -> str:
    """The newest onnxruntime-gpu release for CPython `python` on manylinux x86_64:
    the CPU suite runs onnxruntime at that version, so that the CPU and the GPU image
    run one release (onnxruntime-gpu's releases may lag onnxruntime's)."""
    sys.path.insert(0, str(ROOT / "deploy"))
    from wheelhouse import manylinux_platforms

    platforms = [a for p in manylinux_platforms("x86_64", "2.36") for a in ("--platform", p)]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run(str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet",
            "--ignore-installed", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
            "--python-version", python, *platforms, "--target", str(Path(tmp) / "target"),
            "--report", str(report), "onnxruntime-gpu")
        [item] = json.loads(report.read_text())["install"]
    return str(item["metadata"]["version"])


def fresh_venv(where: Path) -> Path:
    venv = where / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    run(*pip, TORCH)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    run(*pip, "-e", EXTRAS, *TOOLS, f"onnxruntime=={newest_gpu_onnxruntime(venv, python)}")
    run(str(venv / "bin" / "python"), "-m", "pytest", "-q")
    return venv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, help="lock this virtual environment (the suite "
                        "must have passed in it) instead of making and testing a fresh one")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        venv = args.venv.resolve() if args.venv else fresh_venv(Path(tmp))
        python = run(str(venv / "bin" / "python"), "-c",
                     "import sys; print('%d.%d' % sys.version_info[:2])").strip()
        pins = frozen(venv)
        gpu = gpu_pins(venv, python, pins)
    cpu_ort = pins.get("onnxruntime", "")
    gpu_ort = next((p for p in gpu if p.startswith("onnxruntime-gpu==")), "")
    if cpu_ort.partition("==")[2] != gpu_ort.partition("==")[2]:
        print(f"{cpu_ort} but {gpu_ort}: the CPU and GPU builds must be one release "
              "(install onnxruntime at onnxruntime-gpu's newest release and rerun)")
        return 1
    marker = f' ; python_version >= "{python}"'
    text = (HEADER.format(python=python)
            + "".join(p + marker + "\n" for p in sorted(pins.values(), key=str.lower))
            + GPU_HEADER + "".join(p + marker + "\n" for p in gpu))
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {len(pins)} + {len(gpu)} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
