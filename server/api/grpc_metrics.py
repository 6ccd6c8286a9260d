"""The gRPC door's request metrics: one tracker per RPC (in-flight gauge, duration
histogram, the request counter by status code), with the status named through the
door's one error table (grpc_errors.status_of)."""

from __future__ import annotations

import time
from types import TracebackType

from seq2serve.server.api.grpc_errors import status_of
from seq2serve.server.metrics import UNRESOLVED, Metrics


def track(metrics: Metrics, method: str, model: str = "") -> RequestTracker:
    """`with track(metrics, "Translate") as t: t.bind(model); ...; t.ok()`: in-flight
    gauge, duration histogram and the request counter with its status code."""
    tracker = RequestTracker(metrics, UNRESOLVED, method)
    if model:
        tracker.bind(model)
    return tracker


def count_undecodable(metrics: Metrics, method: str, error: BaseException) -> None:
    """A call whose request could not be decoded (its handler never ran)."""
    metrics.requests.labels(UNRESOLVED, method.rsplit("/", 1)[-1], status_name(error)).inc()


class RequestTracker:
    """One RPC's metrics. The model label starts as `UNRESOLVED` and becomes the
    served model's name once the handler has picked it (`bind`), so calls that fail
    before that (unknown model, bad message) are counted too, without letting
    client-chosen names into the label set."""

    def __init__(self, metrics: Metrics, model: str, method: str) -> None:
        self.metrics, self.model, self.method = metrics, model, method
        self.code: str | None = None
        self.start = 0.0
        self.deadline: float | None = None  # time.monotonic() at which the RPC expires
        self._in_flight: str | None = None

    def ok(self) -> None:
        self.code = "OK"

    def bind(self, model: str) -> None:
        self.model = model
        if self._in_flight is None:
            self._in_flight = model
            self.metrics.in_flight.labels(model).inc()

    def __enter__(self) -> RequestTracker:
        self.start = time.perf_counter()
        self.metrics.active_requests += 1
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        m = self.metrics
        m.active_requests -= 1
        if self._in_flight is not None:
            m.in_flight.labels(self._in_flight).dec()
        m.request_duration.labels(self.model, self.method).observe(
            time.perf_counter() - self.start)
        code = status_name(exc) if exc is not None else (self.code or "OK")
        if (code == "CANCELLED" and self.deadline is not None
                and time.monotonic() >= self.deadline):
            code = "DEADLINE_EXCEEDED"  # gRPC cancels the handler when the deadline passes
        m.requests.labels(self.model, self.method, code).inc()


def status_name(error: BaseException) -> str:
    """The gRPC status the error interceptor will answer with, by name (errors.py
    holds the one table)."""
    return str(status_of(error)[0].name)
