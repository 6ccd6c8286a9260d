"""The engine loop of one model: a daemon thread that takes the scheduler's
work, runs it on the engine and delivers each text's result.

Iteration-level batching (`max_running_rows` > 0, for beam widths up to
`max_running_beam`: by default greedy and sampling; docs/benchmarks.md says
why): the worker keeps one RunningBatch; at every step boundary it asks the
scheduler which queued texts join (plain data), admits them (encoded once,
written into free cross K/V slots), runs one decoder step and delivers every
text that finished, was cancelled or passed its deadline at once. Other batches
(wider beams, or every batch with `max_running_rows` 0) run request-level:
each scheduler batch to its end.

ONNX Runtime releases the GIL while it computes, so a plain thread keeps the
asyncio gRPC loop responsive; one thread per model because an Engine is not
thread-safe (its buffers belong to one batch at a time).
"""

from __future__ import annotations

import logging
import threading
import time

from seq2serve.server.batching.protocol import BatchEngine, RunningRows
from seq2serve.server.batching.scheduler import (
    Batch,
    Draining,
    DropReason,
    ItemDropped,
    Running,
    Scheduler,
    WorkItem,
)
from seq2serve.server.engine.engine import GenerateStats, Request, Result, StepStats
from seq2serve.server.metrics import Metrics

log = logging.getLogger(__name__)

class ModelWorker:
    def __init__(self, name: str, engine: BatchEngine, scheduler: Scheduler,
                 metrics: Metrics | None = None, poll_s: float = 0.1, index: int = 0) -> None:
        self.name = name
        self.index = index  # among the model's workers, which share its scheduler
        self.engine = engine
        self.scheduler = scheduler
        self.metrics = metrics
        self.poll_s = poll_s  # how soon a stop() without drain is noticed when idle
        self.batches = 0
        self._running: RunningRows | None = None
        self._live: dict[int, _FirstToken] = {}  # the running batch's items, by id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if metrics is not None:
            metrics.watch_queue(name, lambda: scheduler.depth)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> ModelWorker:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name=f"seq2serve-{self.name}-{self.index}", daemon=True)
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, drain: bool = True, timeout: float | None = None) -> bool:
        """Stop the loop. drain: close the scheduler and serve everything queued
        first; otherwise fail the queued items with `Draining` now and finish only
        the work in flight. True when the thread has ended within `timeout`;
        `terminate()` ends what is still running."""
        if not drain:
            self._stop.set()  # before close(): a closed queue hands out batches at once
        self.scheduler.close()
        if not drain:
            self._abort_queued()
        ended = self._join(timeout)
        if ended and not drain:
            self._abort_queued()  # what a racing next_batch() left behind
        return ended

    def terminate(self, timeout: float | None = None) -> bool:
        """Stop without waiting for the work in flight: the queued items fail with
        `Draining`, the engine's ONNX Runtime runs in progress end (their items
        fail, or were cancelled already), and the thread is joined. True when it
        has ended within `timeout`. The engine cannot run again."""
        self._stop.set()
        self.scheduler.close()
        self._abort_queued()
        self.engine.terminate()
        return self._join(timeout)

    def _abort_queued(self) -> None:
        self.scheduler.abort(Draining("the server stopped before this text was run"))

    def _join(self, timeout: float | None) -> bool:
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    # -- the loop ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set() or self._live:
            try:
                if self._live:
                    if not self._stop.is_set():
                        self._admit(self.scheduler.joining(self._running_shape()))
                    self._step()
                    continue
                batch = self.scheduler.next_batch(timeout=self.poll_s)
                if batch is None:
                    if self.scheduler.closed and self.scheduler.depth == 0:
                        return  # drained
                    continue
                if batch.shape is not None and self.scheduler.limits.iterates(batch.shape):
                    self._start(batch)
                else:
                    self.run_batch(batch)
            except Exception:  # a bug here must not leave every later request hanging
                log.exception("model %s: the engine loop failed; it keeps serving", self.name)
                self._stop.wait(self.poll_s)  # no hot spin if it keeps failing

    # -- iteration-level ---------------------------------------------------------------

    def _running_shape(self) -> Running:
        batch = self._running
        assert batch is not None
        return Running(shape=batch.beams, sources=batch.sources, rows=batch.rows,
                       reach=batch.longest_reach, shortlist=batch.shortlist)

    def _start(self, batch: Batch) -> None:
        for dropped in batch.dropped:
            self._count_cancel(dropped.reason)
        if not batch.items or batch.shape is None:
            return
        self.batches += 1
        self._observe_batch(batch)
        self._running = self.engine.start_batch(batch.shape, batch.shortlist)
        self._admit(batch, observed=True)
        if self._live:
            self._step()

    def _admit(self, batch: Batch | None, observed: bool = False) -> None:
        """Encode the joining items once and append their rows to the running batch."""
        if batch is None:
            return
        for dropped in batch.dropped:
            self._count_cancel(dropped.reason)
        if not batch.items or self._running is None:
            return
        if not observed:  # a join is a scheduler batch too
            self.batches += 1
            self._observe_batch(batch)
        requests: list[Request] = []
        streams: dict[int, _FirstToken] = {}
        for item in batch.items:
            stream = _FirstToken(item)
            try:
                requests.append(self.engine.request(
                    item.id, item.source, item.options, cancelled=item.should_stop,
                    on_token=stream if item.on_token is not None else None,
                    forced_bos=item.forced_bos))
            except Exception as error:  # noqa: BLE001 - a bad source fails alone
                self._fail(item, error)
                continue
            streams[item.id] = stream
        try:
            seconds = self._running.admit(requests)
        except Exception as error:  # noqa: BLE001 - the running rows are untouched
            self._on_failure([s.item for s in streams.values()], list(streams.values()), error)
            return
        self._live.update(streams)
        if self.metrics is not None and requests:
            self.metrics.encoder_duration.labels(self.name).observe(seconds)

    def _step(self) -> None:
        running = self._running
        assert running is not None
        try:
            outcome = running.step()
        except Exception as error:  # noqa: BLE001 - delivered to the items, never raised
            live, self._live, self._running = self._live, {}, None
            self._on_failure([s.item for s in live.values()], list(live.values()), error)
            return
        if outcome.stats is not None:
            self._observe_steps([outcome.stats])
        for key, result in outcome.finished:
            stream = self._live.pop(key, None)
            if stream is not None:
                self._deliver(stream.item, stream, result)
        if not running.rows:
            self._live, self._running = {}, None

    # -- request-level -----------------------------------------------------------------

    def run_batch(self, batch: Batch) -> None:
        """Run one batch and deliver every item's result (public for tests and
        benchmarks that drive a worker without its thread)."""
        for dropped in batch.dropped:
            self._count_cancel(dropped.reason)
        if not batch.items:
            return
        self.batches += 1
        self._observe_batch(batch)
        streams = [_FirstToken(item) for item in batch.items]
        try:
            results = self._generate(list(batch.items), streams)
        except Exception as error:  # noqa: BLE001 - delivered to the items, never raised
            self._on_failure(list(batch.items), streams, error)
            return
        for item, stream, result in zip(batch.items, streams, results, strict=True):
            self._deliver(item, stream, result)

    def _observe_batch(self, batch: Batch) -> None:
        m = self.metrics
        if m is None:
            return
        started = time.monotonic()
        m.batch_size.labels(self.name).observe(len(batch.items))
        m.batch_tokens.labels(self.name).observe(batch.tokens)
        m.batches.labels(self.name, batch.reason.value).inc()
        m.input_tokens.labels(self.name).inc(batch.source_tokens)
        for item in batch.items:
            m.queue_duration.labels(self.name).observe(max(0.0, started - item.enqueued_at))

    def _generate(self, items: list[WorkItem], streams: list[_FirstToken]) -> list[Result]:
        results = self.engine.generate(
            [item.source for item in items], [item.options for item in items],
            cancelled=[item.should_stop for item in items],
            on_token=[s if item.on_token is not None else None
                      for item, s in zip(items, streams, strict=True)],
            forced_bos=[item.forced_bos for item in items])
        if len(results.results) != len(items):
            raise RuntimeError(f"the engine returned {len(results.results)} results for "
                               f"{len(items)} sources")
        self._observe_engine(results.stats)
        return list(results.results)

    def _on_failure(self, items: list[WorkItem], streams: list[_FirstToken],
                    error: Exception) -> None:
        """One bad source must not fail its neighbours: the items that streamed
        nothing yet are retried one by one, so only the culprit gets the error."""
        if self.metrics is not None:
            self.metrics.engine_errors.labels(self.name).inc()
        if len(items) == 1 and not streams[0].seen:
            log.warning("model %s: engine failed on item %s: %r", self.name, items[0].id, error)
            items[0].resolve(error)
            return
        log.warning("model %s: a batch of %d failed (%r); retrying its items one by one",
                    self.name, len(items), error)
        for item, stream in zip(items, streams, strict=True):
            reason = item.drop_reason()
            if stream.seen or reason is not None:
                # Re-running a streamed item would send its first tokens twice.
                if reason is not None:
                    self._count_cancel(reason)
                item.resolve(ItemDropped(reason, item.id) if reason is not None else error)
                continue
            single = _FirstToken(item)
            try:
                result = self._generate([item], [single])[0]
            except Exception as item_error:  # noqa: BLE001
                if self.metrics is not None:
                    self.metrics.engine_errors.labels(self.name).inc()
                item.resolve(item_error)
                continue
            self._deliver(item, single, result)

    def _fail(self, item: WorkItem, error: Exception) -> None:
        if self.metrics is not None:
            self.metrics.engine_errors.labels(self.name).inc()
        item.resolve(error)

    def _deliver(self, item: WorkItem, stream: _FirstToken, result: Result) -> None:
        if result.cancelled:
            reason = item.drop_reason() or DropReason.CANCELLED
            self._count_cancel(reason)
            item.resolve(ItemDropped(reason, item.id))
            return
        if self.metrics is not None:
            if result.hypotheses:
                self.metrics.generated_tokens.labels(self.name).inc(
                    len(result.hypotheses[0].token_ids))
            if not stream.seen:  # not streamed: the first token arrives with the result
                self.metrics.time_to_first_token.labels(self.name).observe(
                    time.monotonic() - item.enqueued_at)
            else:
                self.metrics.time_to_first_token.labels(self.name).observe(
                    stream.first_at - item.enqueued_at)
        item.resolve(result)

    def _observe_engine(self, stats: GenerateStats) -> None:
        if self.metrics is None:
            return
        if stats.encode_seconds:
            self.metrics.encoder_duration.labels(self.name).observe(stats.encode_seconds)
        self._observe_steps(stats.steps)

    def _observe_steps(self, steps: list[StepStats]) -> None:
        if self.metrics is None:
            return
        step_hist = self.metrics.decoder_step_duration.labels(self.name)
        rows_hist = self.metrics.decoder_rows.labels(self.name)
        for step in steps:
            step_hist.observe(step.ort_seconds + step.host_seconds)
            rows_hist.observe(step.rows)

    def _count_cancel(self, reason: DropReason) -> None:
        if self.metrics is not None:
            self.metrics.cancelled.labels(self.name, reason.value).inc()


class _FirstToken:
    """The on_token passed to the engine: notes when the first token came (time
    to first token) and whether any did (a streamed item cannot be retried)."""

    def __init__(self, item: WorkItem) -> None:
        self.item = item
        self.seen = False
        self.first_at = 0.0

    def __call__(self, token: int) -> None:
        if not self.seen:
            self.seen = True
            self.first_at = time.monotonic()
        callback = self.item.on_token
        if callback is not None:
            callback(token)
