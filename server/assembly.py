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
import ctypes
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from seq2serve.model.package.languages import CodeTable
from seq2serve.model.package.manifest import (
    MANIFEST,
    Manifest,
    ModelPackage,
    PackageError,
    load_package,
)
from seq2serve.model.package.placement import enforce_placement
from seq2serve.model.package.tokenizer import package_tokenizer
from seq2serve.server.batching.scheduler import BatchLimits, Scheduler
from seq2serve.server.batching.worker import ModelWorker
from seq2serve.server.config import ServerConfig
from seq2serve.server.core.options import DecodingOptions, InvalidOptions
from seq2serve.server.core.registry import ModelHandle, ModelRegistry, stop_workers
from seq2serve.server.core.residency import Loaded, ModelState, Resource
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.options import OptionLimits, Resolvable, ResolvedOptions
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
    """Verify every package (those --load-only chooses), then serve them in `registry`:
    each loaded and warmed up now, or at its first request with --lazy (and, with a
    memory budget, those past it too), and mark it ready. Raises ModelLoadError naming
    every broken package (unless `serve_valid_models`)."""
    if config.models_dir is None:
        raise ModelLoadError("no --models-dir given and no shipped models/ folder")
    models_dir = Path(config.models_dir)
    paths = find_packages(models_dir)
    if not paths:
        raise ModelLoadError(f"no model package in {models_dir} (a package is a "
                             f"directory holding {MANIFEST} and the files it lists)")
    packages, broken = verify_packages(paths)
    packages = chosen_packages(config, packages)
    names = {p.manifest.name: p.path for p in packages}
    _check(config, models_dir, len(paths), broken)
    _check_preferred(config, models_dir, names)
    configure(registry, config, metrics)
    handles = []
    for package in packages:
        try:
            handles.append(package_handle(package, config))
        except Exception as e:  # noqa: BLE001 - any failure makes this package broken
            broken.append(BrokenPackage(package.path, _one_line(e)))
    for handle in handles:
        registry.add(handle)
        metrics.set_model_state(handle.name, handle.state.value)
    if config.max_device_memory and not any(h.device_cost for h in handles):
        log.warning("--max-device-memory is set but no model runs on a device (provider "
                    "%s chose the CPU): the device budget applies to none", config.provider)
    if not config.lazy:
        broken += _load_now(registry, handles)
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


def verify_packages(paths: list[Path]) -> tuple[list[ModelPackage], list[BrokenPackage]]:
    """Each path's package (manifest, files, hashes verified), or why it is broken;
    a name served twice is broken in its second directory."""
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
    return packages, broken


def chosen_packages(config: ServerConfig, packages: list[ModelPackage]) -> list[ModelPackage]:
    """The packages --load-only names: a model by its name, or, by language codes
    (LibreTranslate's LT_LOAD_ONLY), each package whose languages are all among them
    (a multilingual model's: at least two of them). ModelLoadError for a name that is
    neither a model nor a language of one."""
    wanted = config.load_only_names()
    if not wanted:
        return packages
    by_name = {p.manifest.name for p in packages}
    codes = [w for w in wanted if w not in by_name]
    chosen = []
    used: set[str] = set()
    for package in packages:
        manifest = package.manifest
        if manifest.name in wanted:
            chosen.append(package)
            continue
        table = CodeTable.of(_codes(manifest))
        have = {w for w in codes if table.find(w) is not None}
        if codes and (len(have) >= 2 if manifest.languages is not None
                      else len(have) == len(set(_codes(manifest)))):
            chosen.append(package)
            used |= have
    unknown = [w for w in codes if w not in used]
    if unknown:
        raise ModelLoadError(f"--load-only names {', '.join(map(repr, unknown))}, which is "
                             f"no model here nor a language of a package chosen; the models: "
                             f"{', '.join(sorted(by_name)) or 'none'}")
    return chosen


def _codes(manifest: Manifest) -> list[str]:
    if manifest.languages is not None:
        return list(manifest.languages.listed())
    return list(dict.fromkeys((manifest.source_language, manifest.target_language)))


def configure(registry: ModelRegistry, config: ServerConfig, metrics: Metrics) -> None:
    """The registry's loads and unloads as this config builds and stops models."""
    residency = registry.residency
    residency.build = lambda handle: build_handle(handle, config, metrics)
    residency.stop = lambda handle, loaded: stop_handle(handle, loaded, metrics)
    residency.freed = return_freed_memory
    residency.budgets = {Resource.HOST: config.max_model_memory,
                         Resource.DEVICE: config.max_device_memory}
    residency.wait_s = config.load_wait_s

    def changed(handle: ModelHandle) -> None:
        if registry.serves(handle) or handle.state is not ModelState.AVAILABLE:
            metrics.set_model_state(handle.name, handle.state.value)
        else:  # a package removed from the folder, now unloaded: no series left
            metrics.clear_model(handle.name, keep_state=False)

    registry.on_change = changed


def _load_now(registry: ModelRegistry, handles: list[ModelHandle]) -> list[BrokenPackage]:
    """Load `handles` in order (those the memory budget holds; the rest at their first
    request); the ones that fail, as broken packages (no longer served)."""
    broken = []
    residency = registry.residency
    for handle in handles:
        short = residency.short_of(handle)
        if short is not None:
            log.info("%s (%d bytes of %s) is left to its first request: the loaded models "
                     "fill the %s budget of %d bytes (%s)", handle.name, short.cost(handle),
                     short.value, short.value, residency.budgets[short], short.option)
            continue
        try:
            residency.load(handle).result()
        except Exception:  # noqa: BLE001 - the handle's error says why
            broken.append(BrokenPackage(handle.package.path, handle.error))
            registry.remove(handle.name)
    return broken


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


# A loaded package holds its files' bytes and a little more (ONNX Runtime's prepacked
# weights and arenas), a fixed share (the tokenizer's tables, the sessions' own
# state) and a little per engine (its bindings and buffers; the weights are shared).
# Measured after warm-up, a model loaded after another (2 CPU cores): the shipped
# en-de (16.2 MiB of files) adds 26 MiB with 2 engines; an int8 package of
# nllb-200-distilled-600M's shape (1,091 MiB) 1,174 MiB with 1 engine, 1,242 with 2,
# 1,244 with 4. tests/unit/test_model_memory.py holds the cost to what loading takes.
LOAD_FACTOR = 1.15
MODEL_BYTES = 16 * 2**20
ENGINE_BYTES = 2 * 2**20


def package_cost(package: ModelPackage, engines: int) -> int:
    """The bytes a package holds once loaded, known before it loads: its files (the
    graphs' weights, held once whatever the engines: they share the sessions) with
    ONNX Runtime's share, a fixed share, and each engine's own buffers."""
    files = sum(p.stat().st_size for p in package.path.iterdir() if p.is_file())
    return int(files * LOAD_FACTOR) + MODEL_BYTES + engines * ENGINE_BYTES


def device_graphs(package: ModelPackage) -> list[Path]:
    """The graphs whose sessions run on a device provider (runner.Runner: the step's
    selection runs on the host's log-probs, so select.onnx stays on the CPU)."""
    graphs = [package.encoder_path, package.decoder_path, package.reorder_path,
              package.move_path]
    shortlist = package.shortlist_decoder_path
    return graphs if shortlist is None else [*graphs, shortlist]


def device_cost(package: ModelPackage, engines: int) -> int:
    """The bytes a package holds on a device once loaded, known before it loads: the
    weights of the graphs run there (their files' bytes, at the package's precision;
    engines share the sessions, so once) and each engine's own buffers (the share
    measured on the host). Not counted: the decoding's caches and activations, which
    grow with the traffic in ONNX Runtime's arena (--gpu-mem-limit-mb bounds it)."""
    weights = sum(p.stat().st_size for p in device_graphs(package))
    return weights + engines * ENGINE_BYTES


@dataclass
class PackageOptions:
    """A package's options as its engines resolve them (engine.Engine.resolve; its
    test holds the two equal), known before the model loads, for admission and
    ListModels."""

    limits: OptionLimits
    defaults: dict[str, Any]
    has_shortlist: bool
    max_positions: int
    provider: str

    def resolve(self, options: Resolvable) -> ResolvedOptions:
        resolved = options.resolve(self.defaults, self.limits)
        if resolved.shortlist and not self.has_shortlist:
            resolved = replace(resolved, shortlist=False)
        return resolved


def package_options(package: ModelPackage, config: ServerConfig, provider: str) -> PackageOptions:
    manifest = package.manifest
    limits = option_limits(config)
    positions = manifest.config.max_positions
    return PackageOptions(OptionLimits(limits.max_beam_size, min(limits.max_length, positions)),
                          manifest.generation.as_dict(), manifest.shortlist is not None,
                          positions, provider)


def package_handle(package: ModelPackage, config: ServerConfig) -> ModelHandle:
    """A verified package as a model to serve, not loaded yet: its tokenizer, its
    options (a default no request can override must not fail every call) and cost."""
    provider = choose_provider(config.provider)
    options = package_options(package, config, provider)
    try:
        options.resolve(DecodingOptions())
    except InvalidOptions as e:
        raise PackageError(package.path, [f"{MANIFEST}: generation defaults do not apply "
                                          f"on this server: {e}"]) from None
    count, _ = engine_layout(config.threads, config.engines, provider)
    on_device = provider == CUDA or config.emulate_device
    return ModelHandle(package.manifest.name, package, package_tokenizer(package), options,
                       cost=package_cost(package, count),
                       device_cost=device_cost(package, count) if on_device else 0)


def build_handle(handle: ModelHandle, config: ServerConfig, metrics: Metrics) -> Loaded:
    """Load one served model: its engines, sharing one set of sessions (the weights
    held once), as started workers over one scheduler."""
    package = handle.package
    name = package.manifest.name
    provider = choose_provider(config.provider)
    if provider != CPU:  # known before a session is made: what the device cannot run
        enforce_placement(package, provider, config.allow_cpu_nodes)
    count, threads = engine_layout(config.threads, config.engines, provider)
    runner = RunnerConfig(provider=config.provider, intra_op_threads=threads,
                          emulate_device=config.emulate_device, device_id=config.device_id,
                          cuda=config.cuda_settings())
    limits = option_limits(config)
    first = Engine(package, runner, limits)
    engines = [first] + [Engine(package, runner, limits, sessions=first.runner.sessions)
                         for _ in range(count - 1)]
    scheduler = Scheduler(batch_limits(config))
    workers = tuple(ModelWorker(name, engine, scheduler, metrics, index=i).start()
                    for i, engine in enumerate(engines))
    provider = first.provider
    metrics.set_model_info(name, package.manifest.precision, provider, package.manifest.task)
    metrics.watch_transfers(name, [e.runner.memory.counter.read for e in engines])
    metrics.model_bytes.labels(name).set(handle.cost)
    metrics.model_device_bytes.labels(name).set(handle.device_cost)
    log.info("loaded %s (%s, %s, %s, %d engine%s x %d threads, sharing one copy of the "
             "weights) from %s", name, package.manifest.task, package.manifest.precision,
             provider, count, "s" if count > 1 else "", threads, package.path)
    return Loaded(scheduler, workers)


def stop_handle(handle: ModelHandle, loaded: Loaded, metrics: Metrics) -> None:
    """Unload a model whose requests have finished: its workers stopped and joined,
    its series cleared (its state kept)."""
    stop_workers(loaded.workers, drain=True, timeout=None)
    metrics.clear_model(handle.name)


def return_freed_memory() -> None:
    """Hand the heap an unloaded model freed back to the system (glibc keeps freed
    memory in its per-thread arenas: measured, 20 MiB of 115 after 18 loads of the
    shipped models under a budget of two), so that resident memory follows the budget.
    A no-op where the C library has no malloc_trim."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(path: Path) -> Fingerprint:
    """What a rescan compares without hashing: each file's name, size and mtime."""
    try:
        return tuple(sorted((p.name, (st := p.stat()).st_size, st.st_mtime_ns)
                            for p in path.iterdir() if p.is_file()))
    except OSError:
        return ()


class ModelWorkers:
    """The served models as a lifecycle part (BACK): start() verifies them and loads
    them (all, or none with --lazy), then polls the folder (--poll-models-s); stop()
    ends their workers (see ModelRegistry.close)."""

    def __init__(self, registry: ModelRegistry, config: ServerConfig, metrics: Metrics) -> None:
        self.registry, self.config, self.metrics = registry, config, metrics
        self._known: dict[Path, Fingerprint] = {}
        self._poll: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Loading and warm-up are blocking ONNX Runtime work: keep the loop answering
        # health checks meanwhile.
        await asyncio.get_running_loop().run_in_executor(None, self._load)
        if self.config.poll_models_s:
            self._poll = asyncio.ensure_future(self._polling(self.config.poll_models_s))

    def _load(self) -> None:
        load_models(self.registry, self.config, self.metrics)
        self._known = {h.package.path: fingerprint(h.package.path)
                       for h in self.registry.handles()}

    async def _polling(self, every: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every)
            try:
                await loop.run_in_executor(None, self.rescan)
            except Exception:  # noqa: BLE001 - a failed scan is logged; the next one runs
                log.exception("rescanning %s failed", self.config.models_dir)

    def rescan(self) -> None:
        """Serve the packages added to the folder (verified first; loaded now unless
        --lazy), and unload the ones removed or changed once their requests finish (a
        changed one is then served again from its new files)."""
        if self.config.models_dir is None:
            return
        registry = self.registry
        paths = {p: fingerprint(p) for p in find_packages(Path(self.config.models_dir))}
        served = {h.package.path: h for h in registry.handles()}
        for path, handle in served.items():
            if paths.get(path) != self._known.get(path):
                log.info("model package %s was %s: unloading %s once its requests finish",
                         path, "changed" if path in paths else "removed", handle.name)
                registry.remove(handle.name)
                registry.residency.unload(handle)
                self._known.pop(path, None)
        names = {h.name for h in registry.handles()}
        for path, seen in paths.items():
            if path in self._known:
                continue
            self._known[path] = seen  # a broken one is reported once, not every scan
            self._add(path, names)

    def _add(self, path: Path, names: set[str]) -> None:
        packages, broken = verify_packages([path])
        try:
            packages = chosen_packages(self.config, packages) if packages else []
        except ModelLoadError:
            packages = []  # not one --load-only chooses
        for problem in broken:
            log.error("model package %s is broken and not served: %s", problem.path,
                      problem.problem)
        for package in packages:
            if package.manifest.name in names:
                log.error("model package %s is not served: model name %r is already served",
                          package.path, package.manifest.name)
                continue
            try:
                handle = package_handle(package, self.config)
            except Exception as e:  # noqa: BLE001 - this package's problem only
                log.error("model package %s is not served: %s", package.path, _one_line(e))
                continue
            self.registry.add(handle)
            self.metrics.set_model_state(handle.name, handle.state.value)
            log.info("found %s in %s", handle.name, package.path)
            if not self.config.lazy:
                self.registry.residency.load(handle)

    async def stop(self, grace: float) -> None:
        if self._poll is not None:
            self._poll.cancel()
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.registry.close(drain=False, timeout=grace))
