"""Which nodes of a package an execution provider has no kernel for, known before
serving: those ONNX Runtime would run on the CPU instead, with a copy to the host
and back around each (`seq2serve check-package PACKAGE... --provider cuda`; `serve
--provider cuda` and `export --for cuda` run the same check).

The graphs are checked as ONNX Runtime places them. A session applies its level-1
(ORT_ENABLE_BASIC: constant folding, redundant node elimination, provider-
independent fusions) transforms, then partitions the graph among the providers,
and only then applies the extended and layout transforms, each to nodes already
placed on a provider it supports (ONNX Runtime's InferenceSession::TransformGraph).
So placement is decided on the graph ORT_ENABLE_BASIC leaves, which a CPU session
saves (`optimized_model_filepath`) in ONNX Runtime's own format: its nodes carry
their opset `since_version`, its values their types, and its kernel type string
resolver says which inputs each type constraint binds (no onnx import needed).
Each node is matched against the provider's kernel registrations (kernels.py):
its op and domain, a registration whose opset range holds its since_version, and
every constraint's inputs of a type the registration takes.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2serve.model.package import kernels
from seq2serve.model.package.manifest import ModelPackage, PackageError, load_package

log = logging.getLogger(__name__)

PROVIDERS = {"cuda": kernels.CUDA}  # --provider NAME -> the provider whose table is read
# The precision to export instead for a provider: the one its kernels cover.
EXPORT_FOR = {kernels.CUDA: "fp16"}
_INPUT = 0  # ArgType.INPUT in ONNX Runtime's flatbuffers schema
# Kernels that exist but refuse some inputs at run time, which a registration table
# cannot say: (provider, domain, op) -> (the input index whose presence is refused,
# why). CUDA's GroupQueryAttention answers INVALID_ARGUMENT for an attention_bias
# (input 10: T5's relative position bias), so a fused T5 decoder fails at warm-up.
REFUSED_INPUTS = {
    (kernels.CUDA, "com.microsoft", "GroupQueryAttention"): (
        10, "its CUDA kernel refuses attention_bias (T5's relative positions)"),
}


@dataclass(frozen=True)
class Node:
    """One node of an optimized graph: where it is and what its inputs are."""

    graph: str  # the package's file
    name: str
    op: str
    domain: str  # "" for ai.onnx
    since_version: int
    input_types: tuple[str, ...]  # element types in input order ("" for an absent one)
    type_args: Mapping[str, tuple[int, ...]]  # constraint -> the inputs it binds

    @property
    def op_id(self) -> str:
        return f"{self.domain + '::' if self.domain else ''}{self.op}"

    def describe(self) -> str:
        types = ", ".join(t or "-" for t in self.input_types)
        return f"{self.graph}: {self.name or '(unnamed)'} {self.op_id} (opset " \
               f"{self.since_version}) inputs ({types})"


@dataclass(frozen=True)
class Placement:
    """A package's nodes on one provider: those it has no kernel for, by graph."""

    package: Path
    provider: str
    table: str  # the kernel table's release and source, for the record
    nodes: int  # every node checked
    on_cpu: tuple[Node, ...]

    @property
    def ok(self) -> bool:
        return not self.on_cpu

    def summary(self) -> list[str]:
        """One line per (graph, op, input types) with its count, most first."""
        counts = Counter((n.graph, n.op_id, n.input_types, self.why(n)) for n in self.on_cpu)
        return [f"{graph}: {count} x {op} ({', '.join(t or '-' for t in types)}): {why}"
                for (graph, op, types, why), count in sorted(
                    counts.items(), key=lambda kv: (kv[0][0], -kv[1]))]

    def why(self, node: Node) -> str:
        refused = refusal(self.provider, node)
        if refused is not None:
            return refused
        if kernels.load(self.provider).registrations(node.domain, node.op):
            return "no kernel for these input types or this opset version"
        return "no kernel of this op"

    def advice(self, precision: str) -> str:
        wanted = EXPORT_FOR.get(self.provider, "fp16")
        export = f"seq2serve export CHECKPOINT OUT --precision {wanted}"
        if any(refusal(self.provider, n) for n in self.on_cpu):
            return (f"export the model with plain attention for this provider: {export} "
                    f"--attention plain --for {short_name(self.provider)}")
        if precision == wanted:
            return f"no export of this model runs whole on {self.provider}"
        return (f"export the model at {wanted} for this provider: {export} "
                f"--for {short_name(self.provider)}")


def short_name(provider: str) -> str:
    return next((k for k, v in PROVIDERS.items() if v == provider), provider)


def graph_files(package: ModelPackage) -> list[str]:
    """Every graph a server runs of the package (the shortlist decoder too)."""
    graphs = package.manifest.graphs
    files = [graphs.encoder.file, graphs.decoder.file, graphs.reorder.file, graphs.move.file,
             graphs.select.file]
    if package.manifest.shortlist is not None:
        files.append(package.manifest.shortlist.decoder.file)
    return files


def check_package(package: ModelPackage, provider: str) -> Placement:
    """The package's nodes that `provider` (an ONNX Runtime provider name) has no
    kernel for, on its graphs as ORT_ENABLE_BASIC leaves them."""
    table = kernels.load(provider)
    nodes = [n for file in graph_files(package) for n in optimized_nodes(package.path / file)]
    missing = tuple(n for n in nodes if not has_kernel(table, n) or refusal(provider, n))
    return Placement(package.path, provider, f"onnxruntime {table.onnxruntime} ({table.source})",
                     len(nodes), missing)


def has_kernel(table: kernels.KernelTable, node: Node) -> bool:
    """Whether a registration of `table` takes `node`: its opset version and, for
    each type constraint of the registration, the types of the inputs it binds."""
    for kernel in table.registrations(node.domain, node.op):
        if kernel.covers(node.since_version) and all(
                node.input_types[i] in allowed
                for constraint, allowed in kernel.types.items()
                for i in node.type_args.get(constraint, ())
                if i < len(node.input_types) and node.input_types[i]):
            return True
    return False


def refusal(provider: str, node: Node) -> str | None:
    """Why `provider`'s kernel for `node` refuses it at run time (None: it does not)."""
    refused = REFUSED_INPUTS.get((provider, node.domain, node.op))
    if refused is None:
        return None
    index, why = refused
    return why if index < len(node.input_types) and node.input_types[index] else None


def optimized_nodes(path: Path) -> list[Node]:
    """The nodes of the ONNX graph at `path` after ONNX Runtime's provider-
    independent (level 1) optimizations, with their input types."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="seq2serve-placement-") as tmp:
        saved = Path(tmp) / "basic.ort"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(saved)
        options.add_session_config_entry("session.save_model_format", "ORT")
        options.log_severity_level = 3  # its notes on unused initializers are not ours
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return list(_read_ort_format(saved.read_bytes(), path.name))


def _read_ort_format(data: bytes, graph_name: str) -> Iterator[Node]:
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py import fbs

    session = fbs.InferenceSession.InferenceSession.GetRootAsInferenceSession(data, 0)
    graph = session.Model().Graph()
    names = {getattr(fbs.TensorDataType.TensorDataType, n): n.lower()
             for n in dir(fbs.TensorDataType.TensorDataType) if n.isupper()}
    types = dict(_value_types(graph, names))
    resolver = _type_args(session.KernelTypeStrResolver())
    for i in range(graph.NodesLength()):
        node = graph.Nodes(i)
        domain, op = _text(node.Domain()), _text(node.OpType())
        since = int(node.SinceVersion())
        inputs = tuple(_text(node.Inputs(j)) for j in range(node.InputsLength()))
        yield Node(graph_name, _text(node.Name()), op, domain, since,
                   tuple(types.get(name, "") if name else "" for name in inputs),
                   resolver.get(f"{domain}:{op}:{since}", {}))


def _value_types(graph: Any, names: Mapping[int, str]) -> Iterable[tuple[str, str]]:
    for i in range(graph.NodeArgsLength()):
        value = graph.NodeArgs(i)
        info = value.Type()
        if info is None or info.ValueType() != 1:  # 1: a tensor (TypeInfoValue.tensor_type)
            continue
        from onnxruntime.tools.ort_format_model.ort_flatbuffers_py import fbs

        tensor = fbs.TensorTypeAndShape.TensorTypeAndShape()
        tensor.Init(info.Value().Bytes, info.Value().Pos)
        yield _text(value.Name()), names.get(tensor.ElemType(), str(tensor.ElemType()))
    for i in range(graph.InitializersLength()):
        tensor = graph.Initializers(i)
        yield _text(tensor.Name()), names.get(tensor.DataType(), str(tensor.DataType()))


def _type_args(resolver: Any) -> dict[str, dict[str, tuple[int, ...]]]:
    """{"domain:op:since_version": {constraint: the input indices it binds}}."""
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    if resolver is None:
        return out
    for i in range(resolver.OpKernelTypeStrArgsLength()):
        entry = resolver.OpKernelTypeStrArgs(i)
        bound: dict[str, tuple[int, ...]] = {}
        for j in range(entry.KernelTypeStrArgsLength()):
            args = entry.KernelTypeStrArgs(j)
            bound[_text(args.KernelTypeStr())] = tuple(
                args.Args(k).Index() for k in range(args.ArgsLength())
                if args.Args(k).ArgType() == _INPUT)
        out[_text(entry.OpId())] = bound
    return out


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def enforce_placement(package: ModelPackage, provider: str, allow_cpu_nodes: bool) -> Placement:
    """The check `serve` runs on a device provider before it makes a session: the
    placement logged (INFO), and a package with nodes the provider cannot run
    refused (PackageError naming them and the precision to export instead), or,
    with `allow_cpu_nodes`, served with a warning per node."""
    placement = check_package(package, provider)
    if placement.ok:
        log.info("%s: all %d nodes have a %s kernel (kernels of %s)", package.path,
                 placement.nodes, provider, placement.table)
        return placement
    lines = report(placement, package.manifest.precision, every_node=False)
    if not allow_cpu_nodes:
        raise PackageError(package.path, [*(line.strip() for line in lines[1:]),
                                          "--allow-cpu-nodes serves it anyway"])
    log.info("%s (served: --allow-cpu-nodes)", lines[0])
    for node in placement.on_cpu:
        log.warning("%s: %s runs on the CPU: %s", package.path, node.describe(),
                    placement.why(node))
    return placement


# -- seq2serve check-package ------------------------------------------------------------


def report(placement: Placement, precision: str, every_node: bool = True) -> list[str]:
    """What `check-package` prints for one package."""
    head = (f"{placement.package}: {placement.provider}: "
            + ("every node has a kernel" if placement.ok else
               f"{len(placement.on_cpu)} of {placement.nodes} nodes cannot run there (they "
               f"would run on the CPU, or fail)"))
    if placement.ok:
        return [f"{head} ({placement.nodes} nodes)"]
    lines = [head, *(f"  {line}" for line in placement.summary())]
    if every_node:
        lines += [f"    {n.describe()}" for n in placement.on_cpu]
    lines.append(f"  {placement.advice(precision)}")
    return lines


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("packages", type=Path, nargs="+", metavar="PACKAGE",
                        help="model package directories")
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="cuda",
                        help="the execution provider to check for (default cuda)")
    parser.add_argument("--summary", action="store_true",
                        help="one line per op and input types, not every node")


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every package's every node has a kernel on the provider, 1 when
    some do not (listed), 2 when a package cannot be read."""
    provider = PROVIDERS[args.provider]
    status = 0
    for path in args.packages:
        try:
            package = load_package(path)
        except (PackageError, OSError) as e:
            print(f"{path}: {e}")
            status = 2
            continue
        placement = check_package(package, provider)
        print("\n".join(report(placement, package.manifest.precision, not args.summary)))
        if not placement.ok and status == 0:
            status = 1
    if status != 2:
        print(f"kernels: {kernels.load(provider).onnxruntime} "
              f"({kernels.load(provider).source})")
    return status

