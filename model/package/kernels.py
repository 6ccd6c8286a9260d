"""ONNX Runtime's kernel registrations per execution provider, as a table a CPU
machine can read: which (op, domain, opset versions, input types) each provider
has a kernel for. A CPU wheel of onnxruntime cannot list the CUDA provider's
kernels, so the table is vendored (`data/operator_kernels.json`), parsed from
ONNX Runtime's own `docs/OperatorKernels.md` (generated from the registered
kernels by its tools/python/gen_opkernel_doc.py), or dumped from a live
onnxruntime build that has the provider (`--from-runtime`: the exact registrations
of that build, one entry per registered kernel). kernels_from_wheel.py runs
`--from-runtime` in the pinned onnxruntime-gpu wheel on a machine without a GPU,
which is how the vendored table is made.

    python -m seq2serve.model.package.kernels --markdown OperatorKernels.md \\
        --version 1.31.1 --source "microsoft/onnxruntime@v1.31.1"
    python -m seq2serve.model.package.kernels --from-runtime --source "onnxruntime-gpu 1.31.1"
    python -m seq2serve.model.package.kernels_from_wheel 1.31.1 --constraints deploy/constraints.txt

The table is {provider: {domain: {op: [[first, last or None, {constraint:
[types]}], ...]}}} with domain "" for ai.onnx and types as the element names
("float", "float16", "int8"; "seq(tensor(float))" as written for non-tensors).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "operator_kernels.json"
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
# The markdown's domain names: ai.onnx is the empty domain of a node.
_DOMAINS = {"ai.onnx": ""}
_SECTION = re.compile(r"^## Operators implemented by (\w+)")
_DOMAIN_ROW = re.compile(r"^\|\*\*Operator Domain:\*\* \*([\w.]+)\*")
_CONSTRAINT = re.compile(r"\*\*(\w+)\*\* = (.*)")


@dataclass(frozen=True)
class Kernel:
    """One registration: opset versions first..last (None: every later one) and
    the element types each type constraint takes."""

    first: int
    last: int | None
    types: Mapping[str, frozenset[str]]

    def covers(self, since_version: int) -> bool:
        return self.first <= since_version and (self.last is None or since_version <= self.last)


@dataclass(frozen=True)
class KernelTable:
    """The kernels of one provider of one onnxruntime release."""

    provider: str
    onnxruntime: str  # the release the registrations are those of
    source: str  # where they were read (a tag's OperatorKernels.md, a live build)
    kernels: Mapping[tuple[str, str], tuple[Kernel, ...]]  # (domain, op) -> registrations

    def registrations(self, domain: str, op: str) -> tuple[Kernel, ...]:
        return self.kernels.get((domain, op), ())


def element(type_name: str) -> str:
    """"tensor(float)" -> "float"; other kinds ("seq(tensor(float))") as written."""
    name = type_name.strip()
    if name.startswith("tensor(") and name.endswith(")"):
        return name[len("tensor("):-1]
    return name


def parse_markdown(text: str) -> dict[str, dict[str, dict[str, list[Any]]]]:
    """OperatorKernels.md's tables: {provider: {domain: {op: [[first, last, {T: types}]]}}}."""
    out: dict[str, dict[str, dict[str, list[Any]]]] = {}
    provider: str | None = None
    domain = ""
    op = ""
    for line in text.splitlines():
        if (section := _SECTION.match(line)) is not None:
            provider = section.group(1)
            out[provider] = {}
            continue
        if provider is None or not line.startswith("|"):
            continue
        if (row := _DOMAIN_ROW.match(line)) is not None:
            domain = _DOMAINS.get(row.group(1), row.group(1))
            continue
        cells = line.split("|")
        if len(cells) < 6 or cells[1].strip().startswith(("Op Name", "---")):
            continue
        op = cells[1].strip() or op  # an empty name continues the op above
        first, last = _versions(cells[3])
        out[provider].setdefault(domain, {}).setdefault(op, []).append(
            [first, last, _constraints(cells[4])])
    return out


def _versions(cell: str) -> tuple[int, int | None]:
    cell = cell.strip()
    if cell.endswith("+"):
        return int(cell[:-1]), None
    if cell.startswith("["):
        first, last = cell.strip("[]").split(",")
        return int(first), int(last)
    return int(cell), int(cell)


def _constraints(cell: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for part in cell.split("<br/>"):
        match = _CONSTRAINT.search(part.strip())
        if match is not None:
            found[match.group(1)] = sorted({element(n) for n in _top_level(match.group(2))})
    return found


def _top_level(types: str) -> list[str]:
    """"seq(tensor(float)), optional(seq(tensor(int8)))" split at its top-level commas."""
    names, depth, start = [], 0, 0
    for i, char in enumerate(types):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            names.append(types[start:i])
            start = i + 1
    names.append(types[start:])
    return [n.strip() for n in names if n.strip()]


def from_runtime() -> dict[str, dict[str, dict[str, list[Any]]]]:
    """The registrations of the onnxruntime imported here, every provider its build
    has (what gen_opkernel_doc.py reads): on a GPU machine with onnxruntime-gpu,
    the CUDA provider's exact kernels."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    out: dict[str, dict[str, dict[str, list[Any]]]] = {}
    for k in C.get_all_opkernel_def():
        first, last = k.version_range
        entry = [int(first), None if last >= 2**31 - 1 else int(last),
                 {name: sorted({element(t) for t in types})
                  for name, types in sorted(k.type_constraints.items())}]
        domain = _DOMAINS.get(k.domain, k.domain)
        out.setdefault(k.provider, {}).setdefault(domain, {}).setdefault(k.op_name, []).append(
            entry)
    for ops in (ops for domains in out.values() for ops in domains.values()):
        for entries in ops.values():  # the registry's order is a hash map's: sort for diffs
            entries.sort(key=lambda e: (e[0], e[1] or 0, json.dumps(e[2], sort_keys=True)))
    return out


def load(provider: str, path: Path = DATA) -> KernelTable:
    """The vendored table of `provider` (ValueError naming the providers it has)."""
    return _load(provider, path)


@cache
def _load(provider: str, path: Path) -> KernelTable:
    data = json.loads(path.read_text(encoding="utf-8"))
    providers = data["providers"]
    if provider not in providers:
        raise ValueError(f"{path} has no kernels of {provider} (it has "
                         f"{', '.join(sorted(providers))})")
    kernels = {(domain, op): tuple(Kernel(first, last, {t: frozenset(v) for t, v in c.items()})
                                   for first, last, c in entries)
               for domain, ops in providers[provider].items() for op, entries in ops.items()}
    return KernelTable(provider, data["onnxruntime"], data["source"], kernels)


def vendored_version(path: Path = DATA) -> str:
    return str(json.loads(path.read_text(encoding="utf-8"))["onnxruntime"])


def write(tables: Mapping[str, Any], version: str, source: str, out: Path,
          providers: Sequence[str] = (CPU, CUDA)) -> None:
    """The tables of `providers` as the vendored JSON (compact: one provider's op a line)."""
    missing = [p for p in providers if p not in tables]
    if missing:
        raise ValueError(f"no kernels of {', '.join(missing)} in the source "
                         f"(it has {', '.join(sorted(tables))})")
    lines = ["{", f'"onnxruntime": {json.dumps(version)},', f'"source": {json.dumps(source)},',
             '"providers": {']
    for i, provider in enumerate(providers):
        lines.append(f"{json.dumps(provider)}: {{")
        domains = sorted(tables[provider].items())
        for j, (domain, ops) in enumerate(domains):
            lines.append(f"  {json.dumps(domain)}: {{")
            rows = [f"    {json.dumps(op)}: {json.dumps(entries, separators=(',', ':'))}"
                    for op, entries in sorted(ops.items())]
            lines.append(",\n".join(rows))
            lines.append("  }" + ("," if j < len(domains) - 1 else ""))
        lines.append("}" + ("," if i < len(providers) - 1 else ""))
    lines += ["}", "}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="refresh the vendored kernel table")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--markdown", type=Path, help="ONNX Runtime's docs/OperatorKernels.md "
                        "at the release tag of the pinned onnxruntime-gpu")
    source.add_argument("--from-runtime", action="store_true", help="the registrations of the "
                        "onnxruntime imported here (onnxruntime-gpu on a GPU machine)")
    parser.add_argument("--version", help="the onnxruntime release the registrations are "
                        "those of (default with --from-runtime: the imported one's)")
    parser.add_argument("--source", required=True, help="where they come from, for the record")
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args(argv)
    if args.from_runtime:
        import onnxruntime

        tables, version = from_runtime(), args.version or onnxruntime.__version__
    else:
        if not args.version:
            parser.error("--markdown needs --version")
        tables, version = parse_markdown(args.markdown.read_text(encoding="utf-8")), args.version
    write(tables, version, args.source, args.out)
    print(f"wrote {args.out}: onnxruntime {version}, from {args.source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
