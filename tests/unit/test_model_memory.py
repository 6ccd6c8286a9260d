"""What a loaded model holds (resident memory, /proc/self/status's VmRSS), measured:
engines of one model share one copy of the weights, a package's cost (known before
it loads) is what loading it takes, and loading and unloading a model again and
again leaks neither memory nor threads. Each measurement runs in a process of its
own (a fresh heap), except the cycles, which compare a process with itself."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from seq2serve.model.package.manifest import load_package
from seq2serve.server.assembly import (
    ENGINE_BYTES,
    build_handle,
    device_cost,
    device_graphs,
    load_models,
    package_handle,
)
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.registry import ModelRegistry
from seq2serve.server.core.residency import ModelState
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.options import OptionLimits
from seq2serve.server.engine.runner import RunnerConfig
from seq2serve.server.metrics import Metrics
from tests.serving import server_config

SHIPPED = Path(__file__).resolve().parents[2] / "models"
needs_shipped = pytest.mark.skipif(not (SHIPPED / "en-de" / "manifest.json").is_file(),
                                   reason="the shipped models are not built")

# Loads packages (argv: threads, engines, then package folders) one after another in
# this fresh process and prints each one's RSS growth and cost, as JSON lines.
MEASURE = """
import gc, json, sys
from pathlib import Path
from seq2serve.model.package.manifest import load_package
from seq2serve.server.assembly import build_handle, package_handle
from seq2serve.server.config import ServerConfig
from seq2serve.server.metrics import Metrics

def rss():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmRSS:"))

config = ServerConfig(models_dir=None, provider="cpu", threads=int(sys.argv[1]),
                      engines=int(sys.argv[2]))
metrics, held = Metrics(), []
for folder in sys.argv[3:]:
    gc.collect()
    before = rss()
    handle = package_handle(load_package(Path(folder)), config)
    held.append(build_handle(handle, config, metrics))  # loaded and warmed up
    gc.collect()
    print(json.dumps({"name": handle.name, "grew": rss() - before, "cost": handle.cost}))
"""


def measure(threads: int, engines: int, *folders: Path) -> list[dict[str, int]]:
    done = subprocess.run([sys.executable, "-c", MEASURE, str(threads), str(engines),
                           *map(str, folders)], capture_output=True, text=True, check=True,
                          timeout=600)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@needs_shipped
def test_engines_of_a_model_share_one_copy_of_the_weights() -> None:
    # The first model of a process also pays ONNX Runtime's own start: each measured
    # model here comes second, after the same first one.
    grew = {n: measure(n, n, SHIPPED / "fr-en", SHIPPED / "en-de")[1]["grew"]
            for n in (1, 2, 4)}
    assert grew[2] <= 1.15 * grew[1], grew
    assert grew[4] <= 1.15 * grew[1], grew


def test_the_engines_hold_one_set_of_sessions(marian_package: Path) -> None:
    config = server_config(marian_package.parent, threads=2, engines=2)
    handle = package_handle(load_package(marian_package), config)
    loaded = build_handle(handle, config, Metrics())
    try:
        first, second = (w.engine for w in loaded.workers)
        assert isinstance(first, Engine) and isinstance(second, Engine)
        assert first.runner.sessions is second.runner.sessions
        assert first.runner is not second.runner  # each its own bindings and cache
    finally:
        for worker in loaded.workers:
            worker.stop(drain=False, timeout=10)


def test_the_options_known_before_loading_are_the_engines(marian_package: Path) -> None:
    config = server_config(marian_package.parent, max_length_cap=64)
    package = load_package(marian_package)
    before = package_handle(package, config).engine
    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=1),
                    OptionLimits(config.max_beam_size, config.max_length_cap))
    assert before.limits == engine.limits
    assert before.max_positions == engine.max_positions
    for options in (DecodingOptions(), DecodingOptions(beam_size=2, shortlist=True),
                    DecodingOptions(beam_size=1, sampling_temperature=0.7, seed=3)):
        assert before.resolve(options) == engine.resolve(options)


@needs_shipped
def test_a_packages_cost_is_what_loading_it_takes() -> None:
    # The cost is a bound (a fixed share sized for large packages): what loading takes
    # is below it, but not far below (an int8 NLLB-600M: 0.92-0.97 of it).
    for row in measure(2, 2, SHIPPED / "fr-en", SHIPPED / "en-de", SHIPPED / "summarize-en")[1:]:
        assert 0.55 * row["cost"] <= row["grew"] <= row["cost"], row


def _tensor_bytes(graph: Path) -> int:
    """The bytes of a graph's weights, as the onnx library reads them: its initializers
    and its Constant nodes' values."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph))
    tensors = [*model.graph.initializer,
               *(a.t for n in model.graph.node if n.op_type == "Constant"
                 for a in n.attribute if a.name == "value")]
    return sum(numpy_helper.to_array(t).nbytes for t in tensors)


@needs_shipped
def test_a_packages_device_cost_is_its_device_graphs_weights() -> None:
    for pair in ("en-de", "fr-en"):
        package = load_package(SHIPPED / pair)
        assert [p.name for p in device_graphs(package)] == [
            "encoder.onnx", "decoder.onnx", "reorder.onnx", "move.onnx"]  # select: the host's
        weights = sum(_tensor_bytes(graph) for graph in device_graphs(package))
        for engines in (1, 2):
            graphs = device_cost(package, engines) - engines * ENGINE_BYTES
            # The files hold the weights at the package's precision, and the graphs'
            # structure beside them (an int8 graph's many small nodes: 10%).
            assert weights <= graphs <= 1.15 * weights, (pair, weights, graphs)


def test_a_device_budget_where_no_model_is_on_a_device_is_said(
        models_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    registry = ModelRegistry()
    with caplog.at_level("WARNING", logger="seq2serve.server"):
        load_models(registry, server_config(models_dir, lazy=True, provider="auto",
                                            max_device_memory=10**9), Metrics())
    on_device = [h.device_cost for h in registry.handles()]
    registry.close(drain=False, timeout=10)
    if any(on_device):
        pytest.skip("this onnxruntime found CUDA: the models are on the device")
    assert "--max-device-memory is set but no model runs on a device" in caplog.text
    emulated = ModelRegistry()
    load_models(emulated, server_config(models_dir, lazy=True, emulate_device=True,
                                        max_device_memory=10**9), Metrics())
    assert all(h.device_cost > 0 for h in emulated.handles())
    emulated.close(drain=False, timeout=10)


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status
                    if line.startswith("VmRSS:"))


CYCLES = 1000
SETTLE = 100  # cycles before the first count: arenas and caches reach their size


def test_a_thousand_loads_and_unloads_leak_no_memory_nor_threads(models_dir: Path) -> None:
    registry = ModelRegistry()
    load_models(registry, server_config(models_dir, lazy=True, threads=1, engines=1),
                Metrics())
    [handle] = registry.handles()
    residency = registry.residency
    counted: tuple[int, int] = (0, 0)
    try:
        for cycle in range(CYCLES):
            if cycle == SETTLE:
                counted = (_rss(), threading.active_count())
            residency.load(handle).result(60)
            assert handle.state is ModelState.READY and len(handle.workers) == 1
            residency.unload(handle).result(60)
            assert handle.state is ModelState.AVAILABLE and handle.workers == ()
        assert threading.active_count() == counted[1]
        grew = _rss() - counted[0]
        # One load holds several MiB; a leak of anything per cycle would show 900 times.
        assert grew < 8 * 2**20, f"RSS grew {grew / 2**20:.1f} MiB over {CYCLES - SETTLE} cycles"
    finally:
        registry.close(drain=False, timeout=10)
