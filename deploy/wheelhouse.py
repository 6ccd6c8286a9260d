"""Fill the image's wheelhouse on the host, so `docker build` needs no network.

    python3 deploy/wheelhouse.py --variant cpu --python 3.11 --machine x86_64 \
        --glibc 2.36 --out deploy/wheelhouse

Writes into --out: a wheel of seq2serve built from this checkout (the build runs
grpcio-tools and generates the protobuf modules here, not in the image), every
runtime dependency as a wheel for the target interpreter and platform, pip's own
wheel (the image runs pip from it, so the base image needs python3 and nothing
else), `requirements-<variant>.txt`, the list the Dockerfile installs, and
`constraints.txt`, the versions both take (deploy/constraints.txt by default:
the releases the test suite passed on, so an image built today and one built
next year hold the same ones).

The runtime requirements are read from the seq2serve wheel's metadata (their one
home is pyproject.toml); the GPU variant swaps `onnxruntime` for the `gpu` extra's
`onnxruntime-gpu` with NVIDIA's CUDA and cuDNN wheels (`[cuda,cudnn]`), so no
CUDA base image is needed. Both packages install the same `onnxruntime` module,
so exactly one of them may be in an image. `--constraints FILE` pins other
versions (`--constraints ''`: none, the newest releases the ranges allow).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("cpu", "gpu")
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_name(requirement: str) -> str:
    """The normalised project name of a requirement line (PEP 503)."""
    match = _NAME.match(requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def wheel_requirements(wheel: Path) -> tuple[list[str], dict[str, list[str]]]:
    """(unconditional requirements, {extra: its requirements}) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = z.read(name).decode("utf-8")
    base: list[str] = []
    extras: dict[str, list[str]] = {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec, _, marker = line.split(":", 1)[1].partition(";")
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if extra:
            extras.setdefault(extra.group(1), []).append(spec.strip())
        else:
            base.append(line.split(":", 1)[1].strip())
    return base, extras


def runtime_requirements(wheel: Path, variant: str) -> list[str]:
    """What the image installs besides seq2serve itself, for one variant."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    base, extras = wheel_requirements(wheel)
    if variant == "cpu":
        return base
    gpu = [r for r in extras.get("gpu", []) if requirement_name(r) == "onnxruntime-gpu"]
    if len(gpu) != 1:
        raise ValueError(f"{wheel.name}: the 'gpu' extra must require onnxruntime-gpu once, "
                         f"got {extras.get('gpu')}")
    # The extra names NVIDIA's CUDA/cuDNN wheels itself (pyproject: onnxruntime-gpu[cuda,cudnn]).
    return [r for r in base if requirement_name(r) != "onnxruntime"] + gpu


def manylinux_platforms(machine: str, glibc: str) -> list[str]:
    """Every manylinux tag a glibc `glibc` on `machine` accepts, newest first (PEP 600
    plus the legacy aliases), as pip would compute them on the target itself."""
    major, minor = (int(x) for x in glibc.split(".")[:2])
    if major != 2:
        raise ValueError(f"unexpected glibc version {glibc!r}")
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{machine}" for m, name in legacy.items() if m <= minor]
    return tags


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def build(out: Path, variant: str, python: str, machine: str, glibc: str,
          constraints: Path | None = CONSTRAINTS) -> Path:
    if out.exists():
        shutil.rmtree(out)  # a stale wheel of another version must not be picked up
    out.mkdir(parents=True)
    pip("wheel", "--no-deps", "--wheel-dir", str(out), str(ROOT))
    [wheel] = out.glob("seq2serve-*.whl")
    requirements = out / f"requirements-{variant}.txt"
    requirements.write_text("\n".join(runtime_requirements(wheel, variant)) + "\n")
    # The Dockerfile installs with --constraint constraints.txt: an empty file
    # constrains nothing.
    pinned = out / "constraints.txt"
    pinned.write_text(constraints.read_text(encoding="utf-8") if constraints else "",
                      encoding="utf-8")
    target = ["--only-binary=:all:", "--implementation", "cp", "--python-version", python]
    for platform in manylinux_platforms(machine, glibc):
        target += ["--platform", platform]
    pip("download", "--dest", str(out), *target, "--constraint", str(pinned),
        "--requirement", str(requirements), "pip")
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=VARIANTS, default="cpu")
    parser.add_argument("--python", required=True, metavar="X.Y",
                        help="the base image's Python version")
    parser.add_argument("--machine", required=True, help="the base image's machine, e.g. x86_64")
    parser.add_argument("--glibc", required=True, metavar="2.N",
                        help="the base image's glibc version")
    parser.add_argument("--out", type=Path, default=ROOT / "deploy" / "wheelhouse")
    parser.add_argument("--constraints", default=str(CONSTRAINTS), metavar="FILE",
                        help="the versions to take ('' for none; default: %(default)s)")
    args = parser.parse_args(argv)
    build(args.out, args.variant, args.python, args.machine, args.glibc,
          Path(args.constraints) if args.constraints else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
