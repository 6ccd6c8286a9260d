"""Placement known before serving (issue 52): which nodes of a package the CUDA
provider has no kernel for, from ONNX Runtime's kernel registrations
(model/package/kernels.py, placement.py), checked on the graphs as ONNX Runtime's
level-1 optimizations leave them; `check-package`, `serve --provider cuda`'s refusal
and `export --for cuda` on it."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import onnx
import pytest
from conftest import make_marian_dir
from multilingual_folders import make_folder
from packaging.requirements import Requirement
from test_bart_parity import make_bart_dir
from test_pegasus_parity import make_pegasus_dir
from test_t5_parity import make_t5_package_dir

from seq2serve.export.exporter import export
from seq2serve.model.families.source import SourceError
from seq2serve.model.package import kernels, placement
from seq2serve.model.package.manifest import PackageError, load_package
from seq2serve.server.cli.main import main as cli

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (ROOT / "models").iterdir() if (p / "manifest.json").is_file())
CUDA = kernels.CUDA


def graph_ops(package: Path) -> Counter[tuple[str, str, str]]:
    """(graph, domain, op) of every node as the files have them (onnx's own reading)."""
    found: Counter[tuple[str, str, str]] = Counter()
    for file in placement.graph_files(load_package(package)):
        for node in onnx.load(package / file, load_external_data=False).graph.node:
            found[(file, node.domain, node.op_type)] += 1
    return found


def on_cpu(found: placement.Placement) -> Counter[tuple[str, str, str]]:
    return Counter((n.graph, n.domain, n.op) for n in found.on_cpu)


# -- the table ----------------------------------------------------------------------------


def test_markdown_rows_parse_as_onnxruntime_writes_them() -> None:
    text = "\n".join([
        "## Operators implemented by CUDAExecutionProvider", "",
        "| Op Name | Parameters | OpSet Version | Types Supported |",
        "|---------|------------|---------------|-----------------|",
        "|**Operator Domain:** *ai.onnx*||||",
        "|Add|*in* A:**T**<br> *in* B:**T**<br> *out* C:**T**|14+|**T** = tensor(float), "
        "tensor(float16)|",
        "|||[7, 12]|**T** = tensor(float)|",
        "|**Operator Domain:** *com.microsoft*||||",
        "|Mix|*in* A:**T1**|1+|**T1** = seq(tensor(float)), optional(seq(tensor(int8)))<br/> "
        "**M** = tensor(int32)|"])
    table = kernels.parse_markdown(text)["CUDAExecutionProvider"]
    assert table[""]["Add"] == [[14, None, {"T": ["float", "float16"]}],
                                [7, 12, {"T": ["float"]}]]
    assert table["com.microsoft"]["Mix"] == [[1, None, {
        "T1": ["optional(seq(tensor(int8)))", "seq(tensor(float))"], "M": ["int32"]}]]


def test_the_table_is_the_pinned_onnxruntime_gpu_release() -> None:
    pins = {Requirement(line.split("#")[0]).name: Requirement(line.split("#")[0])
            for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines()
            if line.split("#")[0].strip()}
    [spec] = pins["onnxruntime-gpu"].specifier
    assert kernels.vendored_version() == spec.version


@pytest.mark.parametrize("package", ["models/en-de", "fp16-fused", "fp16-plain"])
def test_the_cpu_table_agrees_with_the_installed_onnxruntime(package: str,
                                                             exported: dict[str, Path]) -> None:
    """Every node of the shipped int8 package and of fp16 packages (format 6 and 7) has
    a kernel in the vendored CPU table, as in the installed onnxruntime's own
    registrations (`get_all_opkernel_def`), which run them: the parsing and the
    matching (opset versions, type constraints) read the table as ONNX Runtime does."""
    path = ROOT / package if package.startswith("models/") else exported[package]
    found = placement.check_package(load_package(path), kernels.CPU)
    assert found.nodes > 100 and found.ok, found.summary()
    live = kernels.KernelTable(kernels.CPU, "installed", "get_all_opkernel_def", {
        (domain, op): tuple(kernels.Kernel(f, last, {t: frozenset(v) for t, v in c.items()})
                            for f, last, c in entries)
        for domain, ops in kernels.from_runtime()[kernels.CPU].items()
        for op, entries in ops.items()})
    nodes = [n for file in placement.graph_files(load_package(path))
             for n in placement.optimized_nodes(path / file)]
    assert all(placement.has_kernel(live, n) for n in nodes)
    # and a node of a type no kernel takes is one the table says so of
    node = next(n for n in nodes if n.op == "LogSoftmax")
    odd = placement.Node(node.graph, node.name, node.op, node.domain, node.since_version,
                         ("int8",) * len(node.input_types), node.type_args)
    assert not placement.has_kernel(live, odd)
    assert not placement.has_kernel(kernels.load(kernels.CPU), odd)


# -- the check on packages ------------------------------------------------------------------


@pytest.mark.parametrize("package", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_int8_packages_leave_exactly_their_matmulintegertofloat_to_the_cpu(
        package: Path) -> None:
    found = placement.check_package(load_package(package), CUDA)
    ops = graph_ops(package)
    expected = Counter({k: v for k, v in ops.items() if k[2] == "MatMulIntegerToFloat"})
    assert expected and on_cpu(found) == expected
    assert all(n.input_types[:2] == ("uint8", "int8") for n in found.on_cpu)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny Marian folder at fp16 (format 6 and 7) and fp32 fused."""
    root = tmp_path_factory.mktemp("placement")
    folder = make_marian_dir(root / "opus-mt-en-de")
    out = {}
    for precision, attention in (("fp16", "plain"), ("fp16", "fused"), ("fp32", "fused")):
        out[f"{precision}-{attention}"] = root / f"{precision}-{attention}"
        export(folder, out[f"{precision}-{attention}"], precision=precision,
               attention=attention, progress=False)
    return out


def test_fp32_fused_leaves_group_query_attention_to_the_cpu(exported: dict[str, Path]) -> None:
    found = placement.check_package(load_package(exported["fp32-fused"]), CUDA)
    ops = graph_ops(exported["fp32-fused"])
    assert on_cpu(found) == Counter({k: v for k, v in ops.items()
                                     if k[2] == "GroupQueryAttention"})
    assert all(n.input_types[0] == "float" for n in found.on_cpu)


FOLDERS: dict[str, Any] = {
    "marian": make_marian_dir, "bart": make_bart_dir, "pegasus": make_pegasus_dir,
    "t5": lambda out: make_t5_package_dir(out, "t5"),
    "mt5": lambda out: make_t5_package_dir(out, "mt5"),
    **{family: (lambda out, family=family: make_folder(family, out))
       for family in ("m2m100", "nllb", "mbart50")},
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FOLDERS))
def test_each_family_at_fp16_runs_whole_on_cuda_and_int8_does_not(
        family: str, tmp_path: Path) -> None:
    """fp16, format 6 and 7: every node has a CUDA kernel, but a fused T5's
    GroupQueryAttention with its position bias, which CUDA's kernel refuses; int8:
    the MatMulIntegerToFloat nodes, all of them and nothing else."""
    folder = FOLDERS[family](tmp_path / family)
    for precision, attention in (("fp16", "plain"), ("fp16", "fused"), ("int8", "plain")):
        package = tmp_path / f"{precision}-{attention}"
        export(folder, package, precision=precision, attention=attention, progress=False)
        found = placement.check_package(load_package(package), CUDA)
        ops = graph_ops(package)
        if precision == "int8":
            wanted = {k: v for k, v in ops.items() if k[2] == "MatMulIntegerToFloat"}
        elif attention == "fused" and family in ("t5", "mt5"):
            wanted = {k: v for k, v in ops.items() if k[2] == "GroupQueryAttention"}
            assert all(placement.refusal(CUDA, n) for n in found.on_cpu)
        else:
            wanted = {}
        assert on_cpu(found) == Counter(wanted), (family, precision, attention)
        assert precision != "int8" or wanted


# -- check-package, serve, export --for ---------------------------------------------------


def test_check_package_exits_1_listing_the_nodes_and_0_when_none(
        exported: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    shipped = ROOT / "models" / "en-de"
    assert cli(["check-package", str(shipped), "--provider", "cuda"]) == 1
    text = capsys.readouterr().out
    names = [n.name for n in placement.check_package(load_package(shipped), CUDA).on_cpu]
    assert all(name in text for name in names)
    assert "MatMulIntegerToFloat" in text and "--precision fp16 --for cuda" in text
    assert cli(["check-package", str(exported["fp16-plain"]), str(exported["fp16-fused"])]) == 0
    assert capsys.readouterr().out.count("every node has a kernel") == 2
    assert cli(["check-package", str(ROOT / "models" / "checkpoints")]) == 2


def test_serving_on_cuda_refuses_cpu_placed_nodes_unless_allowed(
        caplog: pytest.LogCaptureFixture) -> None:
    package = load_package(ROOT / "models" / "en-de")
    with pytest.raises(PackageError) as refused:
        placement.enforce_placement(package, CUDA, allow_cpu_nodes=False)
    message = str(refused.value)
    assert "MatMulIntegerToFloat" in message and "--precision fp16" in message
    assert "--allow-cpu-nodes" in message
    with caplog.at_level(logging.INFO, logger=placement.log.name):
        found = placement.enforce_placement(package, CUDA, allow_cpu_nodes=True)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == len(found.on_cpu) > 0
    assert all("MatMulIntegerToFloat" in r.getMessage() for r in warned)


def test_a_package_cuda_runs_whole_is_logged_at_info(exported: dict[str, Path],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=placement.log.name):
        placement.enforce_placement(load_package(exported["fp16-fused"]), CUDA, False)
    assert any("have a CUDAExecutionProvider kernel" in r.getMessage() for r in caplog.records)


def test_export_for_cuda_refuses_what_the_device_cannot_run(tmp_path: Path) -> None:
    marian = make_marian_dir(tmp_path / "marian")
    t5 = make_t5_package_dir(tmp_path / "t5", "t5")
    cases = [(marian, "int8", "plain", "MatMulIntegerToFloat"),
             (marian, "fp32", "fused", "GroupQueryAttention takes bfloat16, float16 only"),
             (t5, "fp16", "fused", "refuses attention_bias")]
    for folder, precision, attention, reason in cases:
        with pytest.raises(SourceError, match=reason):
            export(folder, tmp_path / "out", precision=precision, attention=attention,
                   progress=False, for_provider="cuda")
        assert not (tmp_path / "out").exists()
    report = export(marian, tmp_path / "fp16", precision="fp16", attention="fused",
                    progress=False, for_provider="cuda")
    assert placement.check_package(load_package(report.package), CUDA).ok
