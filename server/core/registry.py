"""The served models: one package, engine, scheduler and worker per model.

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
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from seq2serve.export.package import MANIFEST, Manifest, ModelPackage, PackageError, load_package
from seq2serve.export.tokenizer import PackageTokenizer
from seq2serve.server.batching.scheduler import Scheduler
from seq2serve.server.batching.worker import ModelWorker
from seq2serve.server.config import ServerConfig
from seq2serve.server.core.errors import InvalidArgument, NotFound, Unavailable, echo
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.options import DecodingOptions, InvalidOptions
from seq2serve.server.engine.resources import usable_cores
from seq2serve.server.engine.runner import CUDA, RunnerConfig, choose_provider
from seq2serve.server.metrics import Metrics

log = logging.getLogger("seq2serve.server")
# After ONNX Runtime runs are terminated, how long their threads may take to end
# (the flag is checked between kernels: milliseconds).
TERMINATE_JOIN_S = 10.0


def package_tokenizer(package: ModelPackage) -> PackageTokenizer:
    files, tokens = package.manifest.tokenizer, package.manifest.special_tokens
    return PackageTokenizer(package.file(files.source_model), package.file(files.target_model),
                            package.file(files.vocab), unk_id=tokens.unk, eos_id=tokens.eos,
                            pad_id=tokens.pad)


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


@dataclass
class ModelHandle:
    name: str
    package: ModelPackage
    tokenizer: PackageTokenizer
    engine: Engine  # the first engine: options, limits and provider are the same in all
    scheduler: Scheduler
    workers: tuple[ModelWorker, ...]  # one per engine, all taking from `scheduler`

    @property
    def manifest(self) -> Manifest:
        return self.package.manifest

    @functools.cached_property
    def digest(self) -> str:
        return self.manifest.digest

    @property
    def batches(self) -> int:
        return sum(w.batches for w in self.workers)

    @property
    def provider(self) -> str:
        return self.engine.runner.provider


# The language every chain goes through: each shipped model reads or writes it.
PIVOT = "en"


@dataclass(frozen=True)
class Route:
    """The models that serve a language pair, in order: one (direct), two (a chain
    through PIVOT), or none (source and target the same language: the text itself)."""

    source_language: str
    target_language: str
    models: tuple[ModelHandle, ...]

    @property
    def chained(self) -> bool:
        return len(self.models) > 1

    @property
    def kind(self) -> str:
        """The metrics' route label: "direct", "chained" or "same_language"."""
        return {0: "same_language", 1: "direct"}.get(len(self.models), "chained")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.models)

    @property
    def name(self) -> str:
        """The model's name; a chain's names joined by "+"; "" for the text itself."""
        return "+".join(self.names)


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


class ModelRegistry:
    def __init__(self) -> None:
        self._handles: dict[str, ModelHandle] = {}
        self.broken: list[BrokenPackage] = []
        self.ready = False
        # Counts the changes to what is served (a model added, loading finished): what
        # a door derives from the served models is derived again when it moves.
        self.generation = 0

    def load(self, config: ServerConfig, metrics: Metrics) -> None:
        """Verify every package, then load and warm up the valid ones. Raises
        ModelLoadError naming every broken package (unless `serve_valid_models`)."""
        if config.models_dir is None:
            raise ModelLoadError("no --models-dir given and no shipped models/ folder")
        models_dir = Path(config.models_dir)
        paths = find_packages(models_dir)
        if not paths:
            raise ModelLoadError(f"no model package in {models_dir} (a package is a "
                                 f"directory holding {MANIFEST} and the files it lists)")
        packages: list[ModelPackage] = []
        names: dict[str, Path] = {}
        for path in paths:  # verify all first: every problem shows before any model loads
            try:
                package = load_package(path)
            except (PackageError, OSError) as e:
                self.broken.append(BrokenPackage(path, _one_line(e)))
                continue
            name = package.manifest.name
            if name in names:
                self.broken.append(BrokenPackage(path, f"model name {name!r} is already "
                                                       f"served from {names[name]}"))
                continue
            names[name] = path
            packages.append(package)
        self._check(config, models_dir, len(paths))
        for package in packages:
            try:
                self._add(package, config, metrics)
            except Exception as e:  # noqa: BLE001 - any failure makes this package broken
                self.broken.append(BrokenPackage(package.path, _one_line(e)))
        try:
            self._check(config, models_dir, len(paths))
        except ModelLoadError:
            self.close(drain=False, timeout=5)
            raise
        for broken in self.broken:
            log.error("model package %s is broken and not served: %s", broken.path,
                      broken.problem)
        metrics.broken_packages.set(len(self.broken))
        self.ready = True
        self.generation += 1

    def _check(self, config: ServerConfig, models_dir: Path, candidates: int) -> None:
        if not self.broken:
            return
        if config.serve_valid_models and len(self.broken) < candidates:
            return
        advice = ("none is left to serve" if config.serve_valid_models else
                  "fix or remove them, or pass --serve-valid-models to serve the others")
        lines = [f"{len(self.broken)} of the {candidates} model package directories in "
                 f"{models_dir} cannot be served; {advice}:"]
        lines += [f"  {b.path}: {b.problem}" for b in self.broken]
        raise ModelLoadError("\n".join(lines))

    def _add(self, package: ModelPackage, config: ServerConfig, metrics: Metrics) -> None:
        name = package.manifest.name
        count, threads = engine_layout(config.threads, config.engines,
                                       choose_provider(config.provider))
        runner = RunnerConfig(provider=config.provider, intra_op_threads=threads)
        engines = [Engine(package, runner, config.option_limits())]
        try:  # a default no request can override must not fail every call
            engines[0].resolve(DecodingOptions())
        except InvalidOptions as e:
            raise PackageError(package.path, [f"{MANIFEST}: generation defaults do not apply "
                                              f"on this server: {e}"]) from None
        engines += [Engine(package, runner, config.option_limits()) for _ in range(count - 1)]
        tokenizer = package_tokenizer(package)
        scheduler = Scheduler(config.batch_limits())
        workers = tuple(ModelWorker(name, engine, scheduler, metrics, index=i).start()
                        for i, engine in enumerate(engines))
        provider = engines[0].runner.provider
        metrics.set_model_info(name, package.manifest.precision, provider, package.manifest.task)
        self._handles[name] = ModelHandle(name, package, tokenizer, engines[0], scheduler,
                                          workers)
        self.generation += 1
        log.info("loaded %s (%s, %s, %s, %d engine%s x %d threads) from %s", name,
                 package.manifest.task, package.manifest.precision, provider, count,
                 "s" if count > 1 else "", threads, package.path)

    def handles(self) -> list[ModelHandle]:
        """The models loaded so far (all of them once `ready`)."""
        return list(self._handles.values())

    def require_ready(self) -> None:
        """Raise Unavailable until every model is loaded: before that, what is served
        is not yet known (a pair still loading is not a pair this server lacks)."""
        if not self.ready:
            raise Unavailable("models are still loading; retry shortly")

    def pick(self, task: str, name: str, source_language: str = "",
             target_language: str = "") -> ModelHandle:
        """The one model that serves `task` (by name, else by language pair)."""
        route = self.route(task, name, source_language, target_language, chains=False)
        return route.models[-1]

    def route(self, task: str, name: str, source_language: str = "",
              target_language: str = "", *, chains: bool = True) -> Route:
        """How a request is served: the model it names; else the one model of its
        pair (a direct model always wins); else, for translation, a chain of two
        through English (de->fr = de->en, en->fr); else source and target the same
        served language (`Route.models` empty: the text comes back unchanged)."""
        self.require_ready()
        if name:
            handle = self._handles.get(name)
            if handle is None:
                raise NotFound(f"model {echo(name)} is not served; available: "
                               f"{', '.join(sorted(self._handles)) or 'none'}")
            if handle.manifest.task != task:
                raise InvalidArgument(f"model {name!r} is a {handle.manifest.task} model, not "
                                      f"{task}")
            return Route(handle.manifest.source_language, handle.manifest.target_language,
                         (handle,))
        candidates = self._direct(task, source_language, target_language)
        if len(candidates) == 1:
            handle = candidates[0]
            return Route(handle.manifest.source_language, handle.manifest.target_language,
                         (handle,))
        if len(candidates) > 1:
            raise InvalidArgument(f"model is required: {len(candidates)} {task} models match "
                                  f"(set model, or source_language and target_language); "
                                  f"available: {self._served()}")
        if chains and task == "translate" and source_language and target_language:
            if source_language == target_language and source_language in self.languages():
                return Route(source_language, target_language, ())
            chain = self._chain(source_language, target_language)
            if chain is not None:
                return chain
        raise NotFound(f"no {task} model for source_language={echo(source_language)} "
                       f"target_language={echo(target_language)}; available: "
                       f"{self._served(chains=chains and task == 'translate') or 'none'}")

    def _direct(self, task: str, source: str, target: str) -> list[ModelHandle]:
        return [h for h in self._handles.values() if h.manifest.task == task
                and (not source or h.manifest.source_language == source)
                and (not target or h.manifest.target_language == target)]

    def _chain(self, source: str, target: str) -> Route | None:
        """source -> PIVOT -> target with one model for each leg, or None. Never a
        model chained with itself, and never through a pivot that is an end."""
        if PIVOT in (source, target) or source == target:
            return None
        first = self._direct("translate", source, PIVOT)
        second = self._direct("translate", PIVOT, target)
        if len(first) != 1 or len(second) != 1 or first[0] is second[0]:
            return None
        return Route(source, target, (first[0], second[0]))

    def languages(self) -> set[str]:
        """Every language a translation model reads or writes."""
        return {code for h in self._handles.values() if h.manifest.task == "translate"
                for code in (h.manifest.source_language, h.manifest.target_language)}

    def routes(self) -> list[Route]:
        """Every translation pair served, direct or chained through English, sorted
        by pair (a pair with several direct models lists each)."""
        out = [Route(h.manifest.source_language, h.manifest.target_language, (h,))
               for h in self._handles.values() if h.manifest.task == "translate"]
        direct = {(r.source_language, r.target_language) for r in out}
        languages = sorted(self.languages())
        for source in languages:
            for target in languages:
                if (source, target) not in direct and (chain := self._chain(source, target)):
                    out.append(chain)
        return sorted(out, key=lambda r: (r.source_language, r.target_language, r.name))

    def _served(self, chains: bool = False) -> str:
        models = ", ".join(f"{h.name} ({h.manifest.task} {h.manifest.source_language}->"
                           f"{h.manifest.target_language})" for h in self._handles.values())
        chained = [r for r in self.routes() if r.chained] if chains else []
        if not chained:
            return models
        return (f"{models}; through {PIVOT}: "
                + ", ".join(f"{r.source_language}->{r.target_language}" for r in chained))

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop every model's workers, all at once, within `timeout` for the whole
        close (None: as long as they take). drain: serve what is queued first;
        otherwise queued work fails with `Draining` (UNAVAILABLE) at once. What is
        still running at the deadline is terminated (its ONNX Runtime runs end),
        and every engine thread is joined before this returns."""
        workers = [w for handle in self._handles.values() for w in handle.workers]
        for worker in workers:  # all stop at once ...
            worker.stop(drain=drain, timeout=0)
        end = None if timeout is None else time.monotonic() + timeout
        for worker in workers:  # ... then share one deadline for the joins
            left = None if end is None else max(0.0, end - time.monotonic())
            worker.stop(drain=drain, timeout=left)
        late = [w for w in workers if w.running]
        for worker in late:  # every run ends at once ...
            worker.terminate(timeout=0)
        end = time.monotonic() + TERMINATE_JOIN_S
        for worker in late:  # ... and the threads are joined
            if not worker.terminate(timeout=max(0.0, end - time.monotonic())):
                log.error("model %s: an engine thread is still running %gs after its runs "
                          "were terminated", worker.name, TERMINATE_JOIN_S)
        if late:
            log.info("terminated the work in flight of %d engine(s) at the deadline", len(late))
