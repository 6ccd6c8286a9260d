"""The engine loop of one model: a daemon thread that takes the scheduler's
batches, runs them on the engine and delivers each text's result.

ONNX Runtime releases the GIL while it computes, so a plain thread keeps the
asyncio gRPC loop responsive; one thread per model because an Engine is not
thread-safe (its buffers and `last_stats` belong to one batch at a time).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .metrics import Metrics
from .scheduler import Batch, Cancelled, Draining, Scheduler, WorkItem

log = logging.getLogger(__name__)

CancelCheck = Callable[[], bool]
TokenCallback = Callable[[int], None]


class HypothesisLike(Protocol):
    token_ids: list[int]
    score: float | None


class EngineLike(Protocol):
    """What the worker needs of `seq2serve.server.engine.Engine`. A result is the
    n-best list of one source; a result with a true `cancelled` attribute means
    the source left the batch because its `cancelled()` turned true."""

    def generate(self, sources: Sequence[Sequence[int]], options: Sequence[Any], *,
                 cancelled: Sequence[CancelCheck | None] | None = None,
                 on_token: Sequence[TokenCallback | None] | None = None
                 ) -> Sequence[Sequence[HypothesisLike]]: ...


class ModelWorker:
    def __init__(self, name: str, engine: EngineLike, scheduler: Scheduler,
                 metrics: Metrics | None = None, poll_s: float = 0.1) -> None:
        self.name = name
        self.engine = engine
        self.scheduler = scheduler
        self.metrics = metrics
        self.poll_s = poll_s  # how soon a stop() without drain is noticed when idle
        self.batches = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if metrics is not None:
            metrics.watch_queue(name, lambda: scheduler.depth)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> ModelWorker:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"seq2serve-{self.name}",
                                            daemon=True)
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, drain: bool = True, timeout: float | None = None) -> bool:
        """Stop the loop. drain: close the scheduler and serve everything queued
        first; otherwise finish only the batch in flight and fail the queued items
        with `Draining`. True when the thread has ended within `timeout`."""
        if not drain:
            self._stop.set()  # before close(): a closed queue hands out batches at once
        self.scheduler.close()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return False
        if not drain:
            self.scheduler.abort(Draining("the server stopped before this text was run"))
        return True

    # -- the loop ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.scheduler.next_batch(timeout=self.poll_s)
                if batch is None:
                    if self.scheduler.closed and self.scheduler.depth == 0:
                        return  # drained
                    continue
                self.run_batch(batch)
            except Exception:  # a bug here must not leave every later request hanging
                log.exception("model %s: the engine loop failed; it keeps serving", self.name)
                self._stop.wait(self.poll_s)  # no hot spin if it keeps failing

    def run_batch(self, batch: Batch) -> None:
        """Run one batch and deliver every item's result (public for tests and
        benchmarks that drive a worker without its thread)."""
        for dropped in batch.dropped:
            self._count_cancel(dropped.reason)
        if not batch.items:
            return
        self.batches += 1
        started = time.monotonic()
        m = self.metrics
        if m is not None:
            m.batch_size.labels(self.name).observe(len(batch.items))
            m.batch_tokens.labels(self.name).observe(batch.tokens)
            m.batches.labels(self.name, batch.reason).inc()
            m.input_tokens.labels(self.name).inc(batch.source_tokens)
            for item in batch.items:
                m.queue_duration.labels(self.name).observe(max(0.0, started - item.enqueued_at))
        streams = [_FirstToken(item) for item in batch.items]
        try:
            results = self._generate(list(batch.items), streams)
        except Exception as error:  # noqa: BLE001 - delivered to the items, never raised
            self._on_failure(list(batch.items), streams, error)
            return
        for item, stream, result in zip(batch.items, streams, results, strict=True):
            self._deliver(item, stream, result)

    def _generate(self, items: list[WorkItem], streams: list[_FirstToken]) -> list[Any]:
        results = self.engine.generate(
            [item.source for item in items], [item.options for item in items],
            cancelled=[item.should_stop for item in items],
            on_token=[s if item.on_token is not None else None
                      for item, s in zip(items, streams, strict=True)])
        if len(results) != len(items):
            raise RuntimeError(f"the engine returned {len(results)} results for "
                               f"{len(items)} sources")
        self._observe_engine()
        return list(results)

    def _on_failure(self, items: list[WorkItem], streams: list[_FirstToken],
                    error: Exception) -> None:
        """One bad source must not fail its neighbours: the items that streamed
        nothing yet are retried one by one, so only the culprit gets the error."""
        if self.metrics is not None:
            self.metrics.engine_errors.labels(self.name).inc()
        if len(items) == 1:
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
                item.resolve(Cancelled(reason, item.id) if reason is not None else error)
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

    def _deliver(self, item: WorkItem, stream: _FirstToken, result: Any) -> None:
        if getattr(result, "cancelled", False):
            reason = item.drop_reason() or "cancelled"
            self._count_cancel(reason)
            item.resolve(Cancelled(reason, item.id))
            return
        if self.metrics is not None:
            if result:
                self.metrics.generated_tokens.labels(self.name).inc(len(result[0].token_ids))
            if not stream.seen:  # not streamed: the first token arrives with the result
                self.metrics.time_to_first_token.labels(self.name).observe(
                    time.monotonic() - item.enqueued_at)
            else:
                self.metrics.time_to_first_token.labels(self.name).observe(
                    stream.first_at - item.enqueued_at)
        item.resolve(result)

    def _observe_engine(self) -> None:
        """Encoder and step timings, when the engine keeps them (Engine.last_stats)."""
        stats = getattr(self.engine, "last_stats", None)
        if self.metrics is None or stats is None:
            return
        encode = getattr(stats, "encode_seconds", None)
        if encode:
            self.metrics.encoder_duration.labels(self.name).observe(encode)
        step_hist = self.metrics.decoder_step_duration.labels(self.name)
        for step in getattr(stats, "steps", ()):
            step_hist.observe(step.ort_seconds + step.host_seconds)

    def _count_cancel(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.cancelled.labels(self.name, reason).inc()


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


def deliver_to_future(loop: asyncio.AbstractEventLoop,
                      future: asyncio.Future[Any]) -> Callable[[Any], None]:
    """A `WorkItem.deliver` for an asyncio handler: hops from the worker thread to
    the handler's loop; an exception result becomes the future's exception."""

    def settle(result: Any) -> None:
        if future.done():  # the handler gave up (deadline, client gone)
            return
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    def deliver(result: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, result)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    return deliver
