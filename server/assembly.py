"""The assembly of served models: model packages and the server's config in, a
registry of ready models out (one engine per thread share, a scheduler and its
workers per model), beside server/app.py, which starts it as a lifecycle part.

Which directories are packages (`find_packages`): `models_dir` itself when it
holds manifest.json; otherwise every directory directly below it that holds a
manifest.json or an ONNX graph (`*.onnx`), so a package that lost its manifest
is reported, not skipped. Anything else is not a package and is ignored: other
directories (the shipped `models/checkpoints/`, training checkpoints beside
the packages), hidden ones (".git", the "..data" links of a Kubernetes
ConfigMap or Secret volume), `lost+found` and plain files.

One rule for broken packages (a manifest missing or invalid, a file missing or
tampered with, a name served twice, an engine that will not load): every one is
reported, each naming its directory and the problem, and the server does not
start. With `serve_valid_models` it serves the others and logs each broken one
as an error (and counts them in `seq2serve_broken_packages`).

The config's values become the layers' own limits here (`option_limits`,
`batch_limits`): the engine and the scheduler are given them, never read the config.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from seq2serve.model.package.manifest import MANIFEST, ModelPackage, PackageError, load_package
from seq2serve.model.package.placement import enforce_placement
from seq2serve.model.package.tokenizer import package_tokenizer
from seq2serve.server.batching.scheduler import BatchLimits, Scheduler
from seq2serve.server.batching.worker import ModelWorker
from seq2serve.server.config import ServerConfig
from seq2serve.server.core.options import DecodingOptions, InvalidOptions
from seq2serve.server.core.registry import ModelHandle, ModelRegistry
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.options import OptionLimits
from seq2serve.server.engine.runner import CPU, CUDA, RunnerConfig, choose_provider
from seq2serve.server.metrics import Metrics
from seq2serve.server.resources import usable_cores

log = logging.getLogger("seq2serve.server")


def option_limits(config: ServerConfig) -> OptionLimits:
    """The caps every request's decoding options are checked against."""
    return OptionLimits(max_beam_size=config.max_beam_size, max_length=config.max_length_cap)


def default_limits() -> OptionLimits:
    """A server's limits with every setting at its default (benchmarks, tests)."""
    return option_limits(ServerConfig(models_dir=None))


def batch_limits(config: ServerConfig) -> BatchLimits:
    """What the scheduler of each model enforces."""
    return BatchLimits(max_batch_size=config.max_batch_size,
                       max_batch_tokens=config.max_batch_tokens,
                       max_queue_delay_s=config.max_queue_delay_ms / 1000.0,
                       max_queue_size=config.max_queue_size,
                       max_running_rows=config.max_running_rows,
                       max_cache_tokens=config.max_cache_tokens,
                       max_running_beam=config.max_running_beam,
                       similar_lengths=config.batch_similar_lengths)


# On 2 CPU cores, two engines with one intra-op thread each decode 1.76x (beam 4)
# to 1.95x (greedy) the tokens/s of one engine with two threads (docs/benchmarks.md):
# ONNX Runtime splits few of a small model's kernels well across threads. Past a few
# engines each is one more copy of the sessions for a smaller share of the queue.
MAX_AUTO_ENGINES = 4


def engine_layout(threads: int, engines: int, provider: str) -> tuple[int, int]:
    """(engines, intra-op threads per engine) for one model: `threads` (0 = the
    usable cores) shared out among `engines` (0 = auto: one per thread up to
    MAX_AUTO_ENGINES on CPU; one on CUDA, where a second session only splits the
    same device)."""
    total = threads or usable_cores()
    if engines == 0:
        engines = 1 if provider == CUDA else min(total, MAX_AUTO_ENGINES)
    return engines, max(1, total // engines)


IGNORED_DIRS = frozenset({"lost+found"})  # what mkfs leaves at a volume's root


def find_packages(models_dir: Path) -> list[Path]:
    """The package directories of `models_dir`, sorted (see the module docstring)."""
    if (models_dir / MANIFEST).is_file():
        return [models_dir]
    return sorted(p for p in models_dir.iterdir()
                  if p.is_dir() and not _ignored(p.name) and _looks_like_a_package(p))


def _ignored(name: str) -> bool:
    return name.startswith(".") or name in IGNORED_DIRS


def _looks_like_a_package(directory: Path) -> bool:
    return (directory / MANIFEST).is_file() or any(directory.glob("*.onnx"))


@dataclass(frozen=True)
class BrokenPackage:
    path: Path
    problem: str  # one line


class ModelLoadError(Exception):
    """The models cannot be served as configured; the message lists every problem."""


def _one_line(error: BaseException) -> str:
    if isinstance(error, PackageError):
        return "; ".join(error.problems)
    text = " ".join(str(error).split()) or type(error).__name__
    return text if isinstance(error, OSError) else f"{type(error).__name__}: {text}"


def load_models(registry: ModelRegistry, config: ServerConfig, metrics: Metrics) -> None:
    """Verify every package, then load and warm up the valid ones into `registry`,
    and mark it loaded. Raises ModelLoadError naming every broken package (unless
    `serve_valid_models`)."""
    if config.models_dir is None:
        raise ModelLoadError("no --models-dir given and no shipped models/ folder")
    models_dir = Path(config.models_dir)
    paths = find_packages(models_dir)
    if not paths:
        raise ModelLoadError(f"no model package in {models_dir} (a package is a "
                             f"directory holding {MANIFEST} and the files it lists)")
    broken: list[BrokenPackage] = []
    packages: list[ModelPackage] = []
    names: dict[str, Path] = {}
    for path in paths:  # verify all first: every problem shows before any model loads
        try:
            package = load_package(path)
        except (PackageError, OSError) as e:
            broken.append(BrokenPackage(path, _one_line(e)))
            continue
        name = package.manifest.name
        if name in names:
            broken.append(BrokenPackage(path, f"model name {name!r} is already served from "
                                              f"{names[name]}: export one with another "
                                              f"--name (seq2serve export --name NAME)"))
            continue
        names[name] = path
        packages.append(package)
    _check(config, models_dir, len(paths), broken)
    _check_preferred(config, models_dir, names)
    for package in packages:
        try:
            registry.add(build_handle(package, config, metrics))
        except Exception as e:  # noqa: BLE001 - any failure makes this package broken
            broken.append(BrokenPackage(package.path, _one_line(e)))
    try:
        _check(config, models_dir, len(paths), broken)
    except ModelLoadError:
        registry.close(drain=False, timeout=5)
        raise
    for package_problem in broken:
        log.error("model package %s is broken and not served: %s", package_problem.path,
                  package_problem.problem)
    metrics.broken_packages.set(len(broken))
    registry.loaded()


def _check_preferred(config: ServerConfig, models_dir: Path, names: dict[str, Path]) -> None:
    """--prefer-model names models served here (a name of none is a typo); with
    --serve-valid-models a broken package's name is only logged."""
    unknown = [name for name in config.preferred_models() if name not in names]
    if not unknown:
        return
    message = (f"--prefer-model names {', '.join(map(repr, unknown))}, which no valid package "
               f"in {models_dir} is; the models: {', '.join(sorted(names)) or 'none'}")
    if not config.serve_valid_models:
        raise ModelLoadError(message)
    log.error("%s", message)


def _check(config: ServerConfig, models_dir: Path, candidates: int,
           broken: list[BrokenPackage]) -> None:
    if not broken:
        return
    if config.serve_valid_models and len(broken) < candidates:
        return
    advice = ("none is left to serve" if config.serve_valid_models else
              "fix or remove them, or pass --serve-valid-models to serve the others")
    lines = [f"{len(broken)} of the {candidates} model package directories in "
             f"{models_dir} cannot be served; {advice}:"]
    lines += [f"  {b.path}: {b.problem}" for b in broken]
    raise ModelLoadError("\n".join(lines))


def build_handle(package: ModelPackage, config: ServerConfig, metrics: Metrics) -> ModelHandle:
    """One served model: its engines (started workers) over one scheduler."""
    name = package.manifest.name
    provider = choose_provider(config.provider)
    if provider != CPU:  # known before a session is made: what the device cannot run
        enforce_placement(package, provider, config.allow_cpu_nodes)
    count, threads = engine_layout(config.threads, config.engines, provider)
    runner = RunnerConfig(provider=config.provider, intra_op_threads=threads,
                          emulate_device=config.emulate_device, device_id=config.device_id,
                          cuda=config.cuda_settings())
    limits = option_limits(config)
    engines = [Engine(package, runner, limits)]
    try:  # a default no request can override must not fail every call
        engines[0].resolve(DecodingOptions())
    except InvalidOptions as e:
        raise PackageError(package.path, [f"{MANIFEST}: generation defaults do not apply "
                                          f"on this server: {e}"]) from None
    engines += [Engine(package, runner, limits) for _ in range(count - 1)]
    tokenizer = package_tokenizer(package)
    scheduler = Scheduler(batch_limits(config))
    workers = tuple(ModelWorker(name, engine, scheduler, metrics, index=i).start()
                    for i, engine in enumerate(engines))
    provider = engines[0].provider
    metrics.set_model_info(name, package.manifest.precision, provider, package.manifest.task)
    metrics.watch_transfers(name, [e.runner.memory.counter.read for e in engines])
    log.info("loaded %s (%s, %s, %s, %d engine%s x %d threads) from %s", name,
             package.manifest.task, package.manifest.precision, provider, count,
             "s" if count > 1 else "", threads, package.path)
    return ModelHandle(name, package, tokenizer, engines[0], scheduler, workers)


class ModelWorkers:
    """The served models as a lifecycle part (BACK): start() loads and warms them
    up, stop() ends their workers (see ModelRegistry.close)."""

    def __init__(self, registry: ModelRegistry, config: ServerConfig, metrics: Metrics) -> None:
        self.registry, self.config, self.metrics = registry, config, metrics

    async def start(self) -> None:
        # Loading and warm-up are blocking ONNX Runtime work: keep the loop answering
        # health checks meanwhile.
        await asyncio.get_running_loop().run_in_executor(
            None, load_models, self.registry, self.config, self.metrics)

    async def stop(self, grace: float) -> None:
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.registry.close(drain=False, timeout=grace))
