"""The served models: one package, engine, scheduler and worker per model."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from seq2serve.export.package import MANIFEST, Manifest, ModelPackage, PackageError, load_package
from seq2serve.export.tokenizer import PackageTokenizer

from .config import ServerConfig
from .engine import Engine
from .errors import InvalidArgument, NotFound, Unavailable
from .metrics import Metrics
from .runner import RunnerConfig
from .scheduler import Scheduler
from .worker import ModelWorker

log = logging.getLogger("seq2serve.server")


def package_tokenizer(package: ModelPackage) -> PackageTokenizer:
    m = package.manifest
    return PackageTokenizer(package.file(m.tokenizer["source_model"]),
                            package.file(m.tokenizer["target_model"]),
                            package.file(m.tokenizer["vocab"]),
                            unk_id=m.special_tokens["unk"], eos_id=m.special_tokens["eos"],
                            pad_id=m.special_tokens["pad"])


@dataclass
class ModelHandle:
    name: str
    package: ModelPackage
    tokenizer: PackageTokenizer
    engine: Engine
    scheduler: Scheduler
    worker: ModelWorker

    @property
    def manifest(self) -> Manifest:
        return self.package.manifest

    @property
    def provider(self) -> str:
        return self.engine.runner.provider


def find_packages(models_dir: Path) -> list[Path]:
    """Every package directly below models_dir (a directory holding manifest.json)."""
    if (models_dir / MANIFEST).is_file():
        return [models_dir]
    return sorted(p for p in models_dir.iterdir() if (p / MANIFEST).is_file())


class ModelRegistry:
    def __init__(self) -> None:
        self._handles: dict[str, ModelHandle] = {}
        self.ready = False

    def load(self, config: ServerConfig, metrics: Metrics) -> None:
        """Load, verify and warm up every package; refuses the whole set on any
        verification failure, naming the package and file."""
        if config.models_dir is None:
            raise PackageError(Path("."), ["no --models-dir given and no shipped models/"])
        paths = find_packages(config.models_dir)
        if not paths:
            raise PackageError(config.models_dir, [f"no model package (a directory with "
                                                   f"{MANIFEST}) in {config.models_dir}"])
        runner = RunnerConfig(provider=config.provider, intra_op_threads=config.threads)
        for path in paths:
            package = load_package(path)
            name = package.manifest.name
            if name in self._handles:
                raise PackageError(path, [f"model name {name!r} is served twice"])
            engine = Engine(package, runner, config.option_limits())
            scheduler = Scheduler(config.batch_limits())
            worker = ModelWorker(name, engine, scheduler, metrics).start()
            metrics.set_model_info(name, package.manifest.precision, engine.runner.provider,
                                   package.manifest.task)
            self._handles[name] = ModelHandle(name, package, package_tokenizer(package), engine,
                                              scheduler, worker)
            log.info("loaded %s (%s, %s, %s) from %s", name, package.manifest.task,
                     package.manifest.precision, engine.runner.provider, path)
        self.ready = True

    def handles(self) -> list[ModelHandle]:
        return list(self._handles.values())

    def pick(self, task: str, name: str, source_language: str = "",
             target_language: str = "") -> ModelHandle:
        if not self.ready:
            raise Unavailable("models are still loading; retry shortly")
        if name:
            handle = self._handles.get(name)
            if handle is None:
                raise NotFound(f"model {name!r} is not served; available: "
                               f"{', '.join(sorted(self._handles)) or 'none'}")
            if handle.manifest.task != task:
                raise InvalidArgument(f"model {name!r} is a {handle.manifest.task} model, not "
                                      f"{task}")
            return handle
        candidates = [h for h in self._handles.values() if h.manifest.task == task
                      and (not source_language or h.manifest.source_language == source_language)
                      and (not target_language or h.manifest.target_language == target_language)]
        if len(candidates) == 1:
            return candidates[0]
        served = ", ".join(f"{h.name} ({h.manifest.task} {h.manifest.source_language}->"
                           f"{h.manifest.target_language})" for h in self._handles.values())
        if not candidates:
            raise NotFound(f"no {task} model for source_language={source_language!r} "
                           f"target_language={target_language!r}; available: {served or 'none'}")
        raise InvalidArgument(f"model is required: {len(candidates)} {task} models match "
                              f"(set model, or source_language and target_language); "
                              f"available: {served}")

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop every model's worker; `timeout` bounds the whole close, not each model."""
        handles = list(self._handles.values())
        for handle in handles:  # all stop at once ...
            handle.worker.stop(drain=drain, timeout=0)
        end = None if timeout is None else time.monotonic() + timeout
        for handle in handles:  # ... then share one deadline for the joins
            left = None if end is None else max(0.0, end - time.monotonic())
            handle.worker.stop(drain=drain, timeout=left)
