"""The load generators of the server benchmarks: one closed loop and one open loop,
each told how to send one request.

`send(i)` sends request i (0, 1, 2, ...: each index once, in the order they go
out) and returns what the benchmark keeps of the answer; an exception of
`failures` counts as an error, any other ends the run. Both loops are bounded: no
request goes out after `level_s`, and what is still unanswered `drain_s` later is
cancelled and counted as unfinished (an overloaded server shows up there, not as
an endless run). Infinite bounds wait for every answer.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
Send = Callable[[int], Awaitable[T]]


@dataclass
class Run(Generic[T]):
    """What a loop saw."""

    answers: dict[int, T] = field(default_factory=dict)  # by request index
    latencies: list[float] = field(default_factory=list)  # seconds, send to answer
    sent: int = 0
    errors: int = 0
    seconds: float = 0.0  # from the first send to the last answer

    @property
    def unfinished(self) -> int:
        """Sent, neither answered nor failed: cancelled at the level's time limit."""
        return self.sent - len(self.answers) - self.errors


class _Requests(Generic[T]):
    """Sends requests and keeps the tally of one run."""

    def __init__(self, send: Send[T], failures: tuple[type[BaseException], ...]) -> None:
        self.send, self.failures = send, failures
        self.run: Run[T] = Run()
        self.start = self.last = time.perf_counter()

    def one(self, i: int) -> Coroutine[None, None, None]:
        """Request i, counted as sent now (an open loop's task may be cancelled
        before it runs)."""
        self.run.sent += 1
        return self._answer(i)

    async def _answer(self, i: int) -> None:
        sent = time.perf_counter()
        try:
            answer = await self.send(i)
        except self.failures:
            self.run.errors += 1
            return
        self.last = time.perf_counter()
        self.run.answers[i] = answer
        self.run.latencies.append(self.last - sent)

    async def settle(self, tasks: list[asyncio.Task[None]], level_s: float,
                     drain_s: float) -> Run[T]:
        """Wait for `tasks` until `drain_s` after the level's end and cancel the rest;
        an exception outside `failures` cancels them all and is raised."""
        if tasks:
            left = self.start + level_s + drain_s - time.perf_counter()
            _, pending = await asyncio.wait(
                tasks, timeout=None if math.isinf(left) else max(left, 0.0),
                return_when=asyncio.FIRST_EXCEPTION)
            for task in pending:
                task.cancel()
            ended = await asyncio.gather(*tasks, return_exceptions=True)
            raised = [e for e in ended if isinstance(e, BaseException)
                      and not isinstance(e, asyncio.CancelledError)]
            if raised:  # outside `failures`: the caller's
                raise raised[0]
        self.run.seconds = self.last - self.start
        return self.run


async def closed_loop(send: Send[T], clients: int, requests: int,
                      level_s: float = math.inf, drain_s: float = math.inf,
                      failures: tuple[type[BaseException], ...] = ()) -> Run[T]:
    """`clients` callers, each sending the next request as soon as its last one is
    answered, until `requests` have gone out or `level_s` has passed."""
    requester = _Requests(send, failures)
    indexes = itertools.count()

    async def client() -> None:
        while (i := next(indexes)) < requests and \
                time.perf_counter() - requester.start < level_s:
            await requester.one(i)

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    return await requester.settle(tasks, level_s, drain_s)


async def open_loop(send: Send[T], arrivals: Sequence[float], level_s: float = math.inf,
                    drain_s: float = math.inf,
                    failures: tuple[type[BaseException], ...] = ()) -> Run[T]:
    """Request i sent `arrivals[i]` seconds after the start, whether or not the
    earlier ones were answered; none after `level_s`."""
    requester = _Requests(send, failures)
    tasks = []
    for i, at in enumerate(arrivals):
        if at > level_s:
            break
        await asyncio.sleep(max(0.0, requester.start + at - time.perf_counter()))
        tasks.append(asyncio.create_task(requester.one(i)))
    return await requester.settle(tasks, level_s, drain_s)
