"""One lifecycle for listeners and workers: start and stop order, a failed start,
and a worker stopped while its engine is inside a run."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import Box

from seq2serve.server.batching.scheduler import BatchLimits, Draining, Scheduler, WorkItem
from seq2serve.server.batching.worker import ModelWorker
from seq2serve.server.engine.runner import RunTerminated
from seq2serve.server.lifecycle import Lifecycle, Stage


@dataclass
class Recorder:
    events: list[str] = field(default_factory=list)


@dataclass
class FakePart:
    name: str
    recorder: Recorder
    fail_start: bool = False
    graces: list[float] = field(default_factory=list)

    async def start(self) -> None:
        self.recorder.events.append(f"start {self.name}")
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")

    async def stop(self, grace: float) -> None:
        self.recorder.events.append(f"stop {self.name}")
        self.graces.append(grace)
        await asyncio.sleep(0)


def test_parts_start_side_front_back_and_stop_front_back_side() -> None:
    recorder = Recorder()
    lifecycle = Lifecycle()
    grpc, http = FakePart("grpc", recorder), FakePart("http", recorder)
    lifecycle.add(Stage.BACK, "models", FakePart("models", recorder))
    lifecycle.add(Stage.FRONT, "gRPC", grpc)
    lifecycle.add(Stage.SIDE, "/metrics", FakePart("metrics", recorder))
    lifecycle.add(Stage.FRONT, "HTTP", http)

    async def run() -> None:
        await lifecycle.start()
        await lifecycle.stop(grace=30.0)
        await lifecycle.stop(grace=30.0)  # a second stop has nothing left to stop

    asyncio.run(run())
    assert recorder.events == ["start metrics", "start grpc", "start http", "start models",
                               "stop grpc", "stop http", "stop models", "stop metrics"]
    assert 29.0 < grpc.graces[0] <= 30.0 and 29.0 < http.graces[0] <= 30.0


def test_a_part_that_cannot_start_stops_the_ones_started_before_it() -> None:
    recorder = Recorder()
    lifecycle = Lifecycle()
    lifecycle.add(Stage.SIDE, "/metrics", FakePart("metrics", recorder))
    lifecycle.add(Stage.FRONT, "gRPC", FakePart("grpc", recorder))
    lifecycle.add(Stage.BACK, "models", FakePart("models", recorder, fail_start=True))
    with pytest.raises(RuntimeError, match="models cannot start"):
        asyncio.run(lifecycle.start())
    assert recorder.events == ["start metrics", "start grpc", "start models",
                               "stop grpc", "stop metrics"]


# -- a worker stopped in the middle of a run ------------------------------------------


@dataclass(frozen=True)
class Opts:
    beam_size: int = 4  # request-level batches
    max_length: int = 64
    shortlist: bool = False  # the full vocabulary

    def max_new_tokens(self, source_length: int) -> int:
        return self.max_length


class BlockingRunner:
    """Stands in for Runner: a run lasts until terminate()."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self._terminated = threading.Event()

    def terminate(self) -> None:
        self._terminated.set()

    def run(self) -> None:
        self.running.set()
        if self._terminated.wait(60):
            raise RunTerminated("the run was terminated: the server is stopping")


class BlockingEngine:
    def __init__(self) -> None:
        self.runner = BlockingRunner()

    def generate(self, sources: Any, options: Any, *, cancelled: Any = None,
                 on_token: Any = None, forced_bos: Any = None) -> Any:
        self.runner.run()
        raise AssertionError("a blocked run never finishes")

    def terminate(self) -> None:
        self.runner.terminate()


def item() -> WorkItem:
    return WorkItem(source=[5, 6, 2], options=Opts(), deliver=Box())


def test_terminate_ends_the_run_in_flight_fails_the_queue_and_joins_the_thread() -> None:
    engine = BlockingEngine()
    scheduler = Scheduler(BatchLimits(1, 8192, 0.0, 1024, 0, 131072, 1, False))  # one text a batch
    worker = ModelWorker("m", engine, scheduler, poll_s=0.02).start()  # type: ignore[arg-type]  # a stand-in engine
    running, queued = item(), item()
    scheduler.submit_many([running, queued])
    assert engine.runner.running.wait(5)
    assert not worker.stop(drain=False, timeout=0.2)  # the run goes on ...
    assert isinstance(queued.deliver.get(), Draining)  # ... the queue fails at once
    assert worker.terminate(timeout=5)  # the run ends and the thread is joined
    assert not worker.running
    assert isinstance(running.deliver.get(), RunTerminated)
