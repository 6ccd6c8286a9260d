"""Dynamic batching, the engine loop and the metrics, with a fake engine (no ONNX Runtime)."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from conftest import Box

from seq2serve.server.api.grpc_metrics import track
from seq2serve.server.assembly import batch_limits, default_limits
from seq2serve.server.batching.scheduler import (
    BatchReason,
    Draining,
    DropReason,
    ItemDropped,
    QueueFull,
    Running,
    Scheduler,
    WorkItem,
)
from seq2serve.server.batching.worker import ModelWorker
from seq2serve.server.config import MAX_BEAM_SIZE, ServerConfig
from seq2serve.server.core.delivery import deliver_to_future, mailbox
from seq2serve.server.core.errors import NotFound
from seq2serve.server.core.options import DecodingOptions, InvalidOptions
from seq2serve.server.engine.decode_state import Request, SourceOptions
from seq2serve.server.engine.engine import GenerateStats, Generation, StepOutcome, StepStats
from seq2serve.server.engine.options import OptionLimits, ResolvedOptions
from seq2serve.server.engine.search import FinishReason, Hypothesis, Result
from seq2serve.server.metrics import BATCH_REASONS, DROP_REASONS, Metrics

LONG = 10.0  # a queue delay no test waits for: batches must close for another reason


def opts(beam_size: int = 1, max_length: int = 64) -> ResolvedOptions:
    return DecodingOptions(beam_size=beam_size, max_length=max_length).resolve(
        None, OptionLimits(max_beam_size=16, max_length=512))


def item(length: int, beam: int = 1, first: int = 1, max_length: int = 64,
         **kw: Any) -> WorkItem:
    return WorkItem(source=list(range(first, first + length)),
                    options=opts(beam, max_length), deliver=Box(), **kw)


# The server's defaults, the one home of them; each test changes what it is about.
SERVER_LIMITS = batch_limits(ServerConfig(models_dir=None))


def sched(size: int = 32, tokens: int = 8192, delay: float = LONG,
          queue: int = 1024, rows: int = 0, cache: int = 131072) -> Scheduler:
    return Scheduler(replace(SERVER_LIMITS, max_batch_size=size, max_batch_tokens=tokens,
                             max_queue_delay_s=delay, max_queue_size=queue,
                             max_running_rows=rows, max_cache_tokens=cache,
                             max_running_beam=MAX_BEAM_SIZE))


def lengths(batch: Any) -> list[int]:
    return [len(i.source) for i in batch.items]


# -- forming batches ----------------------------------------------------------------------

def test_batch_closes_at_max_sequences_without_waiting() -> None:
    s = sched(size=3)
    items = [item(4) for _ in range(7)]
    for i in items:
        s.submit(i)
    start = time.monotonic()
    first, second = s.next_batch(), s.next_batch()
    assert time.monotonic() - start < 1.0
    assert (first.reason, second.reason) == ("full", "full")
    assert list(first.items) == items[:3] and list(second.items) == items[3:6]
    assert s.depth == 1


def test_token_budget_counts_padded_source_times_beam() -> None:
    s = sched(tokens=20)
    for _ in range(5):
        s.submit(item(5))
    b = s.next_batch()
    assert (len(b), b.tokens, b.source_tokens, b.reason) == (4, 20, 20, "tokens")
    s2 = sched(tokens=20)
    for _ in range(3):
        s2.submit(item(5, beam=2))
    b = s2.next_batch()
    assert (len(b), b.tokens, b.shape, b.reason) == (2, 20, 2, "tokens")


def test_item_over_the_budget_is_skipped_then_runs_alone() -> None:
    s = sched(tokens=12)
    for n in (4, 10, 4, 50):
        s.submit(item(n))
    assert lengths(s.next_batch()) == [4, 4]  # 10 would make 10 x 3 padded tokens
    b = s.next_batch()
    assert (lengths(b), b.reason) == ([10], "tokens")
    b = s.next_batch()  # above the budget on its own: it still runs
    assert (lengths(b), b.tokens, b.reason) == ([50], 50, "tokens")


def test_lone_item_waits_for_the_queue_delay() -> None:
    s = sched(delay=0.05)
    s.submit(item(3))
    start = time.monotonic()
    b = s.next_batch(timeout=1.0)
    waited = time.monotonic() - start
    assert (len(b), b.reason) == (1, "delay")
    assert 0.04 <= waited < 0.5


def test_delay_counts_from_the_oldest_arrival() -> None:
    s = sched(delay=1.0)
    s.submit(item(3))
    time.sleep(1.01)  # the worker was busy: the item has waited long enough
    start = time.monotonic()
    assert s.next_batch().reason == "delay"
    # Counted from this call instead, it would wait 1 s; half of that leaves room
    # for the scheduling delays of a loaded machine.
    assert time.monotonic() - start < 0.5


def test_late_arrivals_join_while_waiting() -> None:
    s = sched(size=2, delay=LONG)
    s.submit(item(3))
    threading.Timer(0.02, lambda: s.submit(item(4))).start()
    b = s.next_batch(timeout=1.0)
    assert (lengths(b), b.reason) == ([3, 4], "full")


def test_next_batch_times_out_when_idle() -> None:
    start = time.monotonic()
    assert sched().next_batch(timeout=0.02) is None
    assert time.monotonic() - start < 0.5


def test_grouped_by_beam_width_oldest_shape_first() -> None:
    s = sched(delay=0.0)
    for beam in (4, 1, 4, 1, 1):
        s.submit(item(3, beam=beam))
    b = s.next_batch()
    assert (b.shape, len(b)) == (4, 2)
    assert all(i.beam_size == 4 for i in b.items)
    b = s.next_batch()
    assert (b.shape, len(b)) == (1, 3)


def test_shortlist_and_full_vocabulary_never_share_a_batch() -> None:
    """A batch runs one decoder graph: over the vocabulary shortlist or the whole
    vocabulary (issue 35); the oldest item picks, as it picks the beam width."""
    s = sched(delay=0.0)
    over = [WorkItem(source=[1, 2, 3], options=replace(opts(), shortlist=k % 2 == 1),
                     deliver=Box()) for k in range(4)]
    for i in over:
        s.submit(i)
    first, second = s.next_batch(), s.next_batch()
    assert first.items == (over[0], over[2]) and not first.shortlist
    assert second.items == (over[1], over[3]) and second.shortlist
    s = sched(rows=10)
    s.submit(over[1])
    s.submit(over[0])
    assert s.joining(Running(shape=1, sources=1, rows=1, reach=16)) is None  # head: shortlist
    joined = s.joining(Running(shape=1, sources=1, rows=1, reach=16, shortlist=True))
    assert joined is not None and joined.items == (over[1],) and joined.shortlist


def test_fifo_fairness_across_shapes() -> None:
    """A steady stream of greedy items never starves an older beam item."""
    s = sched(size=2, delay=0.0)
    s.submit(item(3, beam=1))
    s.submit(item(3, beam=5))
    for _ in range(6):
        s.submit(item(3, beam=1))
    shapes = [s.next_batch().shape for _ in range(3)]
    assert shapes == [1, 5, 1]


def test_batch_is_length_sorted() -> None:
    s = sched(delay=0.0)
    for n in (9, 3, 6, 3):
        s.submit(item(n))
    b = s.next_batch()
    assert lengths(b) == [3, 3, 6, 9]
    assert b.tokens == 9 * 4 and b.source_tokens == 21


def test_batch_mates_of_the_nearest_lengths_from_a_deep_queue() -> None:
    """With similar_lengths the oldest item leads and takes the queued items whose
    lengths are nearest its own (FIFO among equal distances); without, the next
    ones in arrival order."""
    queued = (5, 40, 6, 41, 4, 39, 6)
    for similar, first, rest in ((True, [4, 5, 6, 6], [39, 40, 41]),
                                 (False, [5, 6, 40, 41], [4, 6, 39])):
        s = Scheduler(replace(sched(size=4, delay=0.0).limits, similar_lengths=similar))
        items = [item(n) for n in queued]
        for i in items:
            s.submit(i)
        b = s.next_batch()
        assert lengths(b) == first
        if similar:  # equal distances (6 and 4 from 5): the earlier arrivals won
            assert [i.id for i in b.items if len(i.source) == 6] == [items[2].id, items[6].id]
        assert lengths(s.next_batch()) == rest


def test_similar_lengths_never_starve_an_outlier() -> None:
    """A long text among a stream of short ones leads the batch after the one it
    was passed over in: the oldest queued item is always in the next batch."""
    s = Scheduler(replace(sched(size=2, delay=0.0).limits, similar_lengths=True))
    outlier = item(50)
    s.submit(item(5))
    s.submit(outlier)
    for _ in range(6):
        s.submit(item(5))
    first, second = s.next_batch(), s.next_batch()
    assert lengths(first) == [5, 5] and outlier not in first.items
    assert outlier in second.items and lengths(second) == [5, 50]


def test_similar_lengths_is_the_server_default() -> None:
    assert SERVER_LIMITS.similar_lengths


# -- queue bounds, cancellation, drain ----------------------------------------------------

def test_queue_full() -> None:
    s = sched(queue=2)
    s.submit(item(1))
    s.submit(item(1))
    with pytest.raises(QueueFull, match=r"the queue is full \(2 of 2 texts"):
        s.submit(item(1))
    s2 = sched(queue=3)
    s2.submit(item(1))
    with pytest.raises(QueueFull):
        s2.submit_many([item(1), item(1), item(1)])
    assert s2.depth == 1  # all or nothing: no half-queued request


def test_cancelled_and_expired_items_are_dropped_and_told() -> None:
    s = sched(delay=0.0)
    gone, late, flagged, ok = item(2), item(2, deadline=time.monotonic() - 1), \
        item(2, cancelled=lambda: True), item(2)
    gone.cancel()
    for i in (gone, late, flagged, ok):
        s.submit(i)
    b = s.next_batch()
    assert list(b.items) == [ok]
    assert sorted(d.reason for d in b.dropped) == ["cancelled", "cancelled", "deadline"]
    for i, reason in ((gone, "cancelled"), (late, "deadline"), (flagged, "cancelled")):
        error = i.deliver.get()
        assert isinstance(error, ItemDropped) and error.reason == reason
    assert ok.deliver.values == []


def test_deadline_wins_over_a_handler_flag_that_also_covers_it() -> None:
    i = item(2, deadline=time.monotonic() - 1, cancelled=lambda: True)
    assert i.drop_reason() == "deadline"


def test_only_dropped_items_give_an_empty_batch_with_the_drops() -> None:
    s = sched(delay=0.0)
    i = item(2)
    i.cancel()
    s.submit(i)
    b = s.next_batch(timeout=0.1)
    assert (b.items, b.reason, [d.item_id for d in b.dropped]) == ((), "dropped", [i.id])


def test_item_cancelled_while_the_batch_waits() -> None:
    s = sched(size=2, delay=0.05)
    i = item(2)
    s.submit(i)
    threading.Timer(0.01, i.cancel).start()
    b = s.next_batch(timeout=1.0)
    assert b.items == () and b.dropped[0].reason == "cancelled"


def test_drain_refuses_new_work_and_flushes_the_queue() -> None:
    s = sched(delay=LONG)
    queued = [item(2), item(3)]
    s.submit_many(queued)
    s.close()
    with pytest.raises(Draining):
        s.submit(item(1))
    start = time.monotonic()
    b = s.next_batch()
    assert time.monotonic() - start < 1.0  # no waiting for the delay while draining
    assert (list(b.items), b.reason) == (queued, "drain")
    assert s.next_batch() is None  # drained: returns at once


def test_abort_fails_everything_queued() -> None:
    s = sched()
    queued = [item(2), item(3)]
    s.submit_many(queued)
    assert s.abort(Draining("bye")) == 2
    assert all(isinstance(i.deliver.get(), Draining) for i in queued) and s.depth == 0


def test_deliver_is_called_once() -> None:
    i = item(1)
    assert i.resolve("first") and not i.resolve("second")
    assert i.deliver.values == ["first"]


# -- joining a running batch (iteration-level) ---------------------------------------------

def test_joining_takes_fifo_items_of_the_running_shape_within_the_budgets() -> None:
    s = sched(size=32, rows=10, cache=10 * 64)
    items = [item(4), item(5), item(6, beam=2), item(3)]
    for i in items:
        s.submit(i)
    joined = s.joining(Running(shape=1, sources=7, rows=7, reach=32))
    assert joined is not None and joined.items == (items[0], items[1]) and joined.reason == "join"
    # A beam-2 item leads now: nothing joins a beam-1 batch.
    assert s.joining(Running(shape=1, sources=0, rows=0, reach=0)) is None
    joined = s.joining(Running(shape=2, sources=4, rows=8, reach=32))
    assert joined is not None and joined.items == (items[2],)
    assert s.joining(Running(shape=1, sources=10, rows=10, reach=32)) is None  # rows full
    assert s.depth == 1
    texts_full = sched(size=4, rows=100)
    texts_full.submit(item(3))
    assert texts_full.joining(Running(shape=1, sources=4, rows=4, reach=16)) is None
    joined = texts_full.joining(Running(shape=1, sources=3, rows=3, reach=16))
    assert joined is not None and len(joined) == 1


def test_joining_respects_the_cache_budget_and_stops_at_the_first_misfit() -> None:
    s = sched(rows=100, cache=1000)
    long, short = item(3, max_length=200), item(3, max_length=10)
    s.submit(long)
    s.submit(short)
    # 5 rows reaching 200 slots fit 1000; 6 would not, though the short one is short.
    joined = s.joining(Running(shape=1, sources=4, rows=4, reach=10))
    assert joined is not None and joined.items == (long,)
    s2 = sched(rows=100, cache=1000)
    s2.submit(item(3, max_length=200))
    s2.submit(item(3, max_length=10))
    # FIFO: the short item does not skip ahead of the long one that does not fit.
    assert s2.joining(Running(shape=1, sources=5, rows=5, reach=10)) is None


def test_beams_wider_than_max_running_beam_run_request_level() -> None:
    """The server's default: greedy and sampling join running batches, beam search
    forms request-level batches (no rows budget, nothing joins)."""
    limits = replace(SERVER_LIMITS, max_queue_delay_s=0.0, max_running_rows=8,
                     max_cache_tokens=10**6, max_running_beam=1)
    assert limits.iterates(1) and not limits.iterates(4)
    assert not replace(SERVER_LIMITS, max_running_rows=0).iterates(1)
    s = Scheduler(limits)
    s.submit(item(3, beam=4))
    assert s.joining(Running(shape=4, sources=1, rows=4, reach=16)) is None
    for _ in range(5):
        s.submit(item(3, beam=4))
    batch = s.next_batch(timeout=1)  # 6 x 4 rows: past the rows budget of 8, all the same
    assert batch is not None and batch.shape == 4 and len(batch.items) == 6
    s.submit_many([item(3), item(3)])
    joined = s.joining(Running(shape=1, sources=1, rows=1, reach=16))
    assert joined is not None and len(joined.items) == 2
    with pytest.raises(ValueError, match="max_running_beam must be >= 1"):
        replace(SERVER_LIMITS, max_running_beam=0)


def test_joining_is_off_for_request_level_and_reports_drops() -> None:
    s = sched(rows=0)
    s.submit(item(3))
    assert s.joining(Running(shape=1, sources=1, rows=1, reach=16)) is None
    s = sched(rows=8)
    gone = item(3, deadline=time.monotonic() - 1)
    s.submit(gone)
    joined = s.joining(Running(shape=1, sources=1, rows=1, reach=16))
    assert joined is not None and joined.items == () and joined.dropped[0].reason == "deadline"
    assert isinstance(gone.deliver.get(), ItemDropped)


def test_first_batch_respects_the_rows_budget() -> None:
    s = sched(size=32, delay=0.0, rows=8)
    for _ in range(5):
        s.submit(item(3, beam=2))
    batch = s.next_batch(timeout=1)
    assert batch is not None and len(batch) == 4  # 4 texts x beam 2 = 8 rows


# -- the worker ---------------------------------------------------------------------------

def reversal(source: list[int] | tuple[int, ...]) -> Result:
    """The fake engines' answer: the source reversed, scored by its length."""
    return Result((Hypothesis(list(reversed(source)), -float(len(source)),
                              FinishReason.EOS),))


@dataclass
class FakeRunning:
    """A running batch whose every admitted source finishes at its next step."""

    beams: int
    engine: FakeEngine
    waiting: list[Request] = field(default_factory=list)
    steps: int = 0
    shortlist: bool = False

    @property
    def sources(self) -> int:
        return len(self.waiting)

    @property
    def rows(self) -> int:
        return len(self.waiting) * self.beams

    @property
    def longest_reach(self) -> int:
        return 16

    def admit(self, requests: Sequence[Request]) -> float:
        self.engine.check([r.source for r in requests])
        self.waiting.extend(requests)
        return 0.002

    def step(self) -> StepOutcome:
        done, self.waiting = self.waiting, []
        finished = []
        for r in done:
            if r.cancelled is not None and r.cancelled():
                finished.append((r.key, Result(cancelled=True)))
                continue
            if r.on_token is not None:
                for token in reversed(r.source):
                    r.on_token(token)
            finished.append((r.key, reversal(r.source)))
        self.steps += 1
        return StepOutcome(finished, StepStats(self.steps, len(done), len(done), 16, 0.001, 0.0))


@dataclass
class FakeEngine:
    """Answers each source with its reversal; can fail, block or cancel. Implements
    the whole BatchEngine protocol (request-level and iteration-level)."""

    fail_on: int | None = None  # a token that makes the whole call raise
    always_fail: bool = False
    gate: threading.Event | None = None
    hook: Any = None  # called first in every generate()
    calls: list[int] = field(default_factory=list)
    terminated: bool = False

    def check(self, sources: Sequence[Sequence[int]]) -> None:
        self.calls.append(len(sources))
        if self.hook is not None:
            self.hook()
        if self.gate is not None:
            assert self.gate.wait(5)
        if self.always_fail or any(self.fail_on in s for s in sources):
            raise RuntimeError("engine exploded")

    def request(self, key: int, source: Sequence[int], options: ResolvedOptions, *,
                cancelled: Any = None, on_token: Any = None, index: int = 0) -> Request:
        return Request(key, list(source), SourceOptions.of(options, len(source)), cancelled,
                       on_token)

    def start_batch(self, beams: int, shortlist: bool = False) -> FakeRunning:
        return FakeRunning(beams, self, shortlist=shortlist)

    def generate(self, sources: Sequence[Sequence[int]], options: Any, *,
                 cancelled: Any = None, on_token: Any = None,
                 forced_bos: Any = None) -> Generation:
        self.check(sources)
        out = []
        for i, src in enumerate(sources):
            if cancelled and cancelled[i]():
                out.append(Result(cancelled=True))
                continue
            if on_token and on_token[i]:
                for t in reversed(src):
                    on_token[i](t)
            out.append(reversal(list(src)))
        return Generation(tuple(out), GenerateStats(
            [StepStats(0, len(out), len(out), 16, 0.001, 0.0)], encode_seconds=0.002))

    def terminate(self) -> None:
        self.terminated = True


def served(engine: FakeEngine, **limits: Any) -> tuple[Scheduler, ModelWorker, Metrics]:
    s = sched(**{"delay": 0.002, **limits})
    m = Metrics()
    return s, ModelWorker("m", engine, s, m, poll_s=0.02).start(), m


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_concurrent_submitters_get_exactly_their_own_results() -> None:
    engine = FakeEngine()
    s, w, m = served(engine, size=8)
    errors: list[str] = []

    def client(n: int) -> None:
        for k in range(20):
            i = item(1 + (n + k) % 5, first=1000 * n + 10 * k)
            s.submit(i)
            got = i.deliver.get()
            if [h.token_ids for h in got] != [list(reversed(i.source))]:
                errors.append(f"client {n} item {k} got {got}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert w.stop(timeout=5)
    assert errors == []
    assert sum(engine.calls) == 160 and max(engine.calls) > 1  # really batched
    assert sample(m, "seq2serve_batch_size_count", model="m") == len(engine.calls)
    assert sample(m, "seq2serve_queue_duration_seconds_count", model="m") == 160
    assert sample(m, "seq2serve_generated_tokens_total", model="m") == sample(
        m, "seq2serve_input_tokens_total", model="m") > 0


def test_a_failing_batch_fails_only_its_culprit_and_the_worker_keeps_serving() -> None:
    s, w, m = served(FakeEngine(fail_on=13), size=4, delay=0.05)
    good, bad, other = item(3, first=1), item(3, first=12), item(2, first=40)
    s.submit_many([good, bad, other])
    assert isinstance(bad.deliver.get(), RuntimeError)
    assert good.deliver.get()[0].token_ids == [3, 2, 1]
    assert other.deliver.get()[0].token_ids == [41, 40]
    later = item(2, first=7)
    s.submit(later)
    assert later.deliver.get()[0].token_ids == [8, 7]
    assert w.stop(timeout=5)
    assert sample(m, "seq2serve_engine_errors_total", model="m") == 2  # batch, then culprit


def test_an_engine_that_always_fails_delivers_its_error_to_every_item() -> None:
    s, w, _ = served(FakeEngine(always_fail=True), size=4, delay=0.05)
    items = [item(2), item(3)]
    s.submit_many(items)
    assert all(str(i.deliver.get()) == "engine exploded" for i in items)
    assert w.running
    assert w.stop(timeout=5)


def test_streamed_item_is_not_retried_after_a_failure() -> None:
    class StreamThenFail(FakeEngine):
        def generate(self, sources, options, *, cancelled=None, on_token=None, forced_bos=None):
            for cb in on_token or []:
                if cb:
                    cb(5)
            raise RuntimeError("late failure")

    s, w, _ = served(StreamThenFail(), size=4, delay=0.05)
    tokens: list[int] = []
    streamed = item(2, on_token=tokens.append)
    s.submit_many([streamed, item(2)])
    assert str(streamed.deliver.get()) == "late failure" and tokens == [5]
    assert w.stop(timeout=5)


def test_engine_cancellation_is_delivered_and_counted() -> None:
    flag = threading.Event()
    engine = FakeEngine(hook=flag.set)  # the client goes away once its batch is running
    s, w, m = served(engine)
    i = item(2, cancelled=flag.is_set)
    s.submit(i)
    error = i.deliver.get()
    assert isinstance(error, ItemDropped) and error.reason == "cancelled"
    assert w.stop(timeout=5)
    assert engine.calls == [1]  # it left inside the engine, not in the queue
    assert sample(m, "seq2serve_cancelled_total", model="m", reason="cancelled") == 1


def test_queue_drops_are_counted_by_the_worker() -> None:
    s, w, m = served(FakeEngine())
    i = item(2, deadline=time.monotonic() - 1)
    s.submit(i)
    assert i.deliver.get().reason == "deadline"
    assert w.stop(timeout=5)
    assert sample(m, "seq2serve_cancelled_total", model="m", reason="deadline") == 1


def test_stop_with_drain_serves_what_is_queued() -> None:
    gate = threading.Event()
    s, w, _ = served(FakeEngine(gate=gate), size=1)
    items = [item(2, first=k * 10) for k in range(3)]
    s.submit_many(items)
    stopper = threading.Thread(target=w.stop)
    stopper.start()
    gate.set()
    stopper.join(5)
    assert not w.running
    assert [i.deliver.get()[0].token_ids for i in items] == [
        list(reversed(i.source)) for i in items]


def test_stop_without_drain_finishes_the_batch_in_flight_only() -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    s, w, _ = served(engine, size=1)
    running, queued = item(2), item(3)
    s.submit(running)
    deadline = time.monotonic() + 5
    while not engine.calls and time.monotonic() < deadline:
        time.sleep(0.005)
    s.submit(queued)
    stopper = threading.Thread(target=w.stop, kwargs={"drain": False})
    stopper.start()
    time.sleep(0.02)
    assert stopper.is_alive()  # waits for the batch in flight
    gate.set()
    stopper.join(5)
    assert running.deliver.get()[0].token_ids == [2, 1]
    assert isinstance(queued.deliver.get(), Draining)


def test_deliver_to_future_hops_to_the_loop() -> None:
    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        ok, bad = loop.create_future(), loop.create_future()
        threading.Thread(target=deliver_to_future(loop, ok), args=(["hyps"],)).start()
        threading.Thread(target=deliver_to_future(loop, bad),
                         args=(ItemDropped("deadline", 1),)).start()
        return await asyncio.gather(ok, bad, return_exceptions=True)

    got = asyncio.run(main())
    assert got[0] == ["hyps"] and isinstance(got[1], ItemDropped)


def test_mailbox_wakes_the_loop_once_for_posts_that_arrive_together() -> None:
    async def main() -> tuple[list[int], int, int]:
        loop = asyncio.get_running_loop()
        wakeups = 0
        hop = loop.call_soon_threadsafe

        def counting(*args: Any) -> Any:
            nonlocal wakeups
            wakeups += 1
            return hop(*args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        got: list[int] = []
        box = mailbox(loop)
        assert mailbox(loop) is box  # one per loop, so that all of its posts coalesce

        def fail() -> None:
            raise RuntimeError("a broken callback")

        def post_all() -> None:  # while the loop waits in join below, nothing drains
            for i in range(50):
                box.post(got.append, i)
            box.post(fail)
            for i in range(50, 100):
                box.post(got.append, i)

        thread = threading.Thread(target=post_all)
        thread.start()
        thread.join()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        first = wakeups
        box.post(got.append, 100)  # after a drain, the next post wakes the loop again
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return got, first, wakeups

    got, first, wakeups = asyncio.run(main())
    assert got == list(range(101))  # in order; the failing callback dropped nothing
    assert (first, wakeups) == (1, 2)


def test_mailbox_of_a_closed_loop_drops_posts_quietly() -> None:
    loop = asyncio.new_event_loop()
    box = mailbox(loop)
    loop.close()
    box.post(print, "never")  # no RuntimeError into the engine thread
    box.post(print, "never")

# -- metrics --------------------------------------------------------------------------------

def test_metric_names_render() -> None:
    m = Metrics()
    m.set_model_info("en-de", "fp32", "CPUExecutionProvider", "translate")
    with track(m, "Translate", "en-de") as t:
        t.ok()
    m.watch_queue("en-de", lambda: 3)
    text = m.render().decode()
    for name in ("seq2serve_requests_total", "seq2serve_request_duration_seconds_bucket",
                 "seq2serve_queue_duration_seconds", "seq2serve_time_to_first_token_seconds",
                 "seq2serve_batch_size", "seq2serve_batch_tokens",
                 "seq2serve_encoder_duration_seconds", "seq2serve_decoder_step_duration_seconds",
                 "seq2serve_generated_tokens_total", "seq2serve_input_tokens_total",
                 "seq2serve_queue_depth", "seq2serve_in_flight_requests",
                 "seq2serve_cancelled_total", "seq2serve_model_info",
                 "seq2serve_decoder_rows"):
        assert f"# TYPE {name.removesuffix('_bucket').removesuffix('_total')}" in text, name
    assert 'seq2serve_queue_depth{model="en-de"} 3.0' in text
    assert ('seq2serve_model_info{model="en-de",precision="fp32",'
            'provider="CPUExecutionProvider",task="translate"} 1.0') in text


def test_the_reason_labels_are_the_schedulers_reasons() -> None:
    """metrics.py imports no layer: its label lists are the scheduler's enums."""
    assert BATCH_REASONS == tuple(r.value for r in BatchReason)
    assert DROP_REASONS == tuple(r.value for r in DropReason)


def test_request_tracking_counts_codes_and_in_flight() -> None:
    m = Metrics()
    with track(m, "Translate", "a") as t:
        assert sample(m, "seq2serve_in_flight_requests", model="a") == 1
        t.ok()
    with pytest.raises(InvalidOptions), track(m, "Translate", "a"):
        raise InvalidOptions("beam_size", "beam_size must be in [1, 16], got 0")
    with pytest.raises(ValueError), track(m, "Translate", "a"):  # a bug, not the client's fault
        raise ValueError("math domain error")

    with pytest.raises(NotFound), track(m, "Summarize", "a"):
        raise NotFound("model 'x' is not served")
    assert sample(m, "seq2serve_in_flight_requests", model="a") == 0
    for method, code in (("Translate", "OK"), ("Translate", "INVALID_ARGUMENT"),
                         ("Translate", "INTERNAL"), ("Summarize", "NOT_FOUND")):
        assert sample(m, "seq2serve_requests_total", model="a", method=method, code=code) == 1
    assert sample(m, "seq2serve_request_duration_seconds_count", model="a",
                  method="Translate") == 3


def test_worker_observes_engine_timings_and_batches() -> None:
    s, w, m = served(FakeEngine(), delay=0.0)
    i = item(3)
    s.submit(i)
    i.deliver.get()
    assert w.stop(timeout=5)
    assert sample(m, "seq2serve_encoder_duration_seconds_count", model="m") == 1
    assert sample(m, "seq2serve_decoder_step_duration_seconds_count", model="m") == 1
    assert sample(m, "seq2serve_decoder_rows_count", model="m") == 1
    assert sample(m, "seq2serve_time_to_first_token_seconds_count", model="m") == 1
    assert sample(m, "seq2serve_batches_total", model="m", reason="delay") == 1
    assert sample(m, "seq2serve_batch_tokens_sum", model="m") == 3


def test_many_metrics_objects_and_the_http_endpoint() -> None:
    first, second = Metrics(), Metrics()  # own registries: no duplicate-name errors
    second.input_tokens.labels("x").inc(5)
    server = second.start_http(0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
    finally:
        server.stop()
    assert 'seq2serve_input_tokens_total{model="x"} 5.0' in body
    assert b"seq2serve_input_tokens_total{" not in first.render()


def test_iteration_level_worker_joins_work_mid_batch(marian_package: Any) -> None:
    """Texts queued while a batch runs join it at the next step (one batch in all),
    stream at once, and decode exactly as they do alone."""
    from seq2serve.server.core.options import DecodingOptions
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    engine = Engine(marian_package, RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    options = engine.resolve(DecodingOptions(beam_size=1, max_length=40))
    sources = [[5 + (i * 7 + j) % 90 for j in range(4 + 3 * i)] + [engine.eos_id]
               for i in range(6)]
    s = sched(size=8, delay=0.0, rows=64)
    m = Metrics()
    late: list[WorkItem] = []
    streamed: list[int] = []

    def make(i: int, on_token: Any = None) -> WorkItem:
        return WorkItem(source=sources[i], options=options, deliver=Box(), on_token=on_token)

    def first_token(token: int) -> None:  # runs on the worker thread, inside a step
        if not late:
            late.extend([make(3, streamed.append), make(4), make(5)])
            s.submit_many(late)

    first = [make(0, first_token), make(1), make(2)]
    w = ModelWorker("m", engine, s, m, poll_s=0.02)
    s.submit_many(first)
    w.start()
    results = [i.deliver.get(timeout=60) for i in first]
    results += [i.deliver.get(timeout=60) for i in late]
    assert w.stop(timeout=10)
    assert w.batches == 2  # one batch started, the late texts joined it
    alone = [engine.generate([src], options)[0] for src in sources]
    assert [[h.token_ids for h in r] for r in results] == [[h.token_ids for h in r]
                                                          for r in alone]
    assert [h.score for r in results for h in r] == [h.score for r in alone for h in r]
    assert streamed[:len(alone[3][0].token_ids)] == alone[3][0].token_ids
    assert sample(m, "seq2serve_time_to_first_token_seconds_count", model="m") == 6
