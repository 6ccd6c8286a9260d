"""One lifecycle for every part of the serving process that runs.

A part is anything with `async start()` and `async stop(grace)`: a listener
that takes calls (gRPC, HTTP), the model workers behind them, the /metrics
endpoint beside them. Each is added with its stage, and the stage decides
when it starts and stops:

- start: SIDE, then FRONT, then BACK. The metrics endpoint is up first; the
  listeners open before the models load, so health answers NOT_SERVING while
  they warm up;
- stop: every FRONT part at once (each refuses new calls and lets the calls in
  flight run until the grace period ends), then BACK (queued work fails with
  UNAVAILABLE, running work past the deadline is terminated, threads joined),
  then SIDE, so /metrics can be scraped through the whole drain.

A part that fails to start stops the parts started before it (no grace) and
the failure propagates. A part that fails to stop is logged and the others
still stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

log = logging.getLogger("seq2serve.server")


class Stage(str, Enum):
    SIDE = "side"  # beside the serving path: up from first to last (the /metrics endpoint)
    FRONT = "front"  # takes calls (the gRPC and HTTP listeners)
    BACK = "back"  # does the work the calls queue (the model workers)


START_ORDER = (Stage.SIDE, Stage.FRONT, Stage.BACK)
STOP_ORDER = (Stage.FRONT, Stage.BACK, Stage.SIDE)


class Part(Protocol):
    async def start(self) -> None:
        """Start serving; raise (one line, naming the port or file) when it cannot."""

    async def stop(self, grace: float) -> None:
        """Stop: refuse new work at once, let the work in flight run for up to
        `grace` seconds, then end it; return once nothing of this part runs."""


@dataclass(frozen=True)
class _Entry:
    name: str
    stage: Stage
    part: Part


class Lifecycle:
    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._started: list[_Entry] = []

    def add(self, stage: Stage, name: str, part: Part) -> None:
        """Add a part; `name` is what the logs call it ("gRPC", "HTTP")."""
        self._entries.append(_Entry(name, stage, part))

    async def start(self) -> None:
        for stage in START_ORDER:
            for entry in self._entries:
                if entry.stage != stage:
                    continue
                try:
                    await entry.part.start()
                except BaseException:
                    await self.stop(grace=0.0)
                    raise
                self._started.append(entry)

    async def stop(self, grace: float) -> None:
        """Stop the started parts by stage (see the module docstring), all within
        one grace period that starts now."""
        end = time.monotonic() + grace
        for stage in STOP_ORDER:
            entries = [e for e in self._started if e.stage == stage]
            left = max(0.0, end - time.monotonic())
            results = await asyncio.gather(*(e.part.stop(left) for e in entries),
                                           return_exceptions=True)
            for entry, result in zip(entries, results, strict=True):
                self._started.remove(entry)
                if isinstance(result, BaseException):
                    log.error("stopping %s failed: %s", entry.name, result, exc_info=result)
