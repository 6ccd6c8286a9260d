"""The server benchmarks' load generators (bench/server/clients.py): one closed
loop and one open loop, each told how to send one request."""

from __future__ import annotations

import asyncio

import pytest

from seq2serve.bench.server import clients


def test_closed_loop_sends_every_index_once_with_at_most_n_in_flight() -> None:
    in_flight, most = 0, 0

    async def send(i: int) -> int:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001 * (i % 3))
        in_flight -= 1
        return i * i

    run = asyncio.run(clients.closed_loop(send, clients=4, requests=20))
    assert run.answers == {i: i * i for i in range(20)}
    assert (run.sent, run.errors, run.unfinished) == (20, 0, 0)
    assert most == 4 and len(run.latencies) == 20 and run.seconds > 0


def test_closed_loop_counts_failures_and_raises_the_rest() -> None:
    async def send(i: int) -> int:
        if i % 2:
            raise ConnectionError(f"request {i}")
        return i

    run = asyncio.run(clients.closed_loop(send, 2, 6, failures=(ConnectionError,)))
    assert sorted(run.answers) == [0, 2, 4] and (run.sent, run.errors) == (6, 3)
    with pytest.raises(ConnectionError, match="request 1"):
        asyncio.run(clients.closed_loop(send, 2, 6))


def test_closed_loop_stops_sending_at_the_level_end_and_cancels_after_the_drain() -> None:
    async def send(i: int) -> int:
        await asyncio.sleep(0.05 if i < 2 else 60)  # the third never comes back
        return i

    # One client: 0 goes out at 0 s, 1 at 0.05 s; at 0.1 s the level is over.
    run = asyncio.run(clients.closed_loop(send, clients=1, requests=100, level_s=0.08,
                                          drain_s=0.1))
    assert sorted(run.answers) == [0, 1] and run.sent == 2 and run.unfinished == 0
    # Three at once: 2 is still unanswered when the drain ends, and is cancelled.
    run = asyncio.run(clients.closed_loop(send, clients=3, requests=3, level_s=0.2,
                                          drain_s=0.1))
    assert sorted(run.answers) == [0, 1] and (run.sent, run.unfinished) == (3, 1)


def test_open_loop_sends_at_the_arrival_times_whether_or_not_answered() -> None:
    sent_at: dict[int, float] = {}

    async def main() -> clients.Run[int]:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def send(i: int) -> int:
            sent_at[i] = loop.time() - start
            await asyncio.sleep(0.2)  # longer than the gaps: requests overlap
            return i

        return await clients.open_loop(send, [0.0, 0.05, 0.1, 5.0], level_s=1.0)

    run = asyncio.run(main())
    assert sorted(run.answers) == [0, 1, 2] and run.sent == 3  # 5.0 s is past the level
    arrivals = [0.0, 0.05, 0.1]
    assert all(sent_at[i] >= at - 0.01 for i, at in enumerate(arrivals))
    assert sent_at[2] - sent_at[0] < 0.2  # sent before the first answer came
