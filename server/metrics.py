"""Prometheus metrics of the server, on their own registry and HTTP port.

Each `Metrics` owns a `CollectorRegistry` rather than using the global one, so a
test process can start many servers without "Duplicated timeseries" errors.
Names follow Prometheus conventions: base units (seconds), `_total` counters.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

NAMESPACE = "seq2serve"

# Whole requests: a few ms (one short text on a GPU) to a minute (a long
# summary with a wide beam on a busy CPU).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Queue waits sit around the batching delay (ms) unless the server is overloaded.
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                 2.5, 5.0, 10.0)
# One encoder run: sub-ms on a GPU, up to seconds for a big CPU batch.
ENCODER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0)
# One decoder step (all rows of a batch): 0.1 ms to a few hundred ms.
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 0.5, 1.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# Decoder rows (the graph's batch N) per step: a beam-4 request is 4 rows; the
# default --max-running-rows is 256.
DECODER_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
BATCH_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
# How often the /metrics thread checks for stop(): the bound on how long stopping
# it takes (the standard library's 0.5 s delayed every shutdown by that much).
HTTP_POLL_S = 0.05


UNRESOLVED = "(none)"  # model label of calls that failed before a model was chosen
# The `reason` labels' values, as the scheduler writes them (batching/scheduler.py's
# BatchReason and DropReason; tests/unit/test_scheduler.py holds the two the same).
# Metrics are read by every layer and import none.
BATCH_REASONS = ("full", "tokens", "delay", "drain", "dropped", "join")
DROP_REASONS = ("deadline", "cancelled")
# The states of a served model (core/residency.py ModelState; its test holds them equal).
MODEL_STATES = ("available", "loading", "ready", "unloading", "failed")


class CacheCounters(Protocol):
    """What the response cache reports (core/cache.py's CacheStats)."""

    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def capacity_bytes(self) -> int: ...


class TransferBytes(Protocol):
    """What an engine's device memory reports (engine/device.py's Transfers)."""

    @property
    def to_device_bytes(self) -> int: ...
    @property
    def to_host_bytes(self) -> int: ...


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            f"{NAMESPACE}_requests", "RPCs finished, by model, method and gRPC status code",
            ["model", "method", "code"], registry=r)
        self.request_duration = Histogram(
            f"{NAMESPACE}_request_duration_seconds", "RPC duration from arrival to answer",
            ["model", "method"], buckets=REQUEST_BUCKETS, registry=r)
        self.queue_duration = Histogram(
            f"{NAMESPACE}_queue_duration_seconds", "time a text waited in the queue "
            "before its batch started", ["model"], buckets=QUEUE_BUCKETS, registry=r)
        self.time_to_first_token = Histogram(
            f"{NAMESPACE}_time_to_first_token_seconds", "from queueing a text to its first "
            "output token (streamed), or to its whole result (not streamed)", ["model"],
            buckets=REQUEST_BUCKETS, registry=r)
        self.batch_size = Histogram(
            f"{NAMESPACE}_batch_size", "texts (sources) per batch", ["model"],
            buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram(
            f"{NAMESPACE}_batch_tokens", "tokens per batch as the scheduler counts them: "
            "longest source x texts x beam width", ["model"], buckets=BATCH_TOKEN_BUCKETS,
            registry=r)
        self.batches = Counter(
            f"{NAMESPACE}_batches", "batches run, by why the scheduler closed them "
            f"({', '.join(BATCH_REASONS)})", ["model", "reason"], registry=r)
        self.encoder_duration = Histogram(
            f"{NAMESPACE}_encoder_duration_seconds", "encoder run per batch", ["model"],
            buckets=ENCODER_BUCKETS, registry=r)
        self.decoder_step_duration = Histogram(
            f"{NAMESPACE}_decoder_step_duration_seconds", "one decoder step of a batch "
            "(ONNX Runtime and host work)", ["model"], buckets=STEP_BUCKETS, registry=r)
        self.decoder_rows = Histogram(
            f"{NAMESPACE}_decoder_rows", "rows per decoder step (occupancy: sources x "
            "beam width of the running batch)", ["model"], buckets=DECODER_ROWS_BUCKETS,
            registry=r)
        self.generated_tokens = Counter(
            f"{NAMESPACE}_generated_tokens", "tokens of the best hypothesis of each "
            "finished text", ["model"], registry=r)
        self.input_tokens = Counter(
            f"{NAMESPACE}_input_tokens", "source tokens of the texts that ran", ["model"],
            registry=r)
        self.queue_depth = Gauge(
            f"{NAMESPACE}_queue_depth", "texts waiting in the queue", ["model"], registry=r)
        self.in_flight = Gauge(
            f"{NAMESPACE}_in_flight_requests", "RPCs being handled", ["model"], registry=r)
        self.cancelled = Counter(
            f"{NAMESPACE}_cancelled", "texts dropped before finishing, by reason "
            f"({', '.join(DROP_REASONS)})", ["model", "reason"], registry=r)
        self.engine_errors = Counter(
            f"{NAMESPACE}_engine_errors", "engine calls that raised", ["model"], registry=r)
        self.routes = Counter(
            f"{NAMESPACE}_translate_routes", "translation requests by the route that serves "
            "them (direct: one model; chained: two through English; same_language: the "
            "text back unchanged) and its models (a chain's joined by '+')",
            ["route", "models"], registry=r)
        self.model_info = Gauge(
            f"{NAMESPACE}_model_info", "served models (always 1)",
            ["model", "precision", "provider", "task"], registry=r)
        self.model_state = Gauge(
            f"{NAMESPACE}_model_state", "each served model's state (1 for the one it is "
            f"in: {', '.join(MODEL_STATES)})", ["model", "state"], registry=r)
        self.model_bytes = Gauge(
            f"{NAMESPACE}_model_memory_bytes", "bytes of host memory a loaded model holds, "
            "by its package's cost (--max-model-memory counts these)", ["model"], registry=r)
        # A metric apart rather than a `resource` label: host and device memory are two
        # budgets, and a sum over the label would add bytes of different memories.
        self.model_device_bytes = Gauge(
            f"{NAMESPACE}_model_device_memory_bytes", "bytes of the device's memory a "
            "loaded model holds, by its cost there (--max-device-memory counts these; 0 on "
            "the CPU provider)", ["model"], registry=r)
        self.broken_packages = Gauge(
            f"{NAMESPACE}_broken_packages", "package directories refused at start-up and "
            "left out (only with --serve-valid-models; otherwise the server does not start)",
            registry=r)
        # Translator RPCs being handled, all models (the drain log reports it). Only the
        # event loop's thread changes it.
        self.active_requests = 0
        self._transfers: _TransferCollector | None = None  # watch_transfers

    # -- convenience -----------------------------------------------------------

    def set_model_info(self, model: str, precision: str, provider: str, task: str) -> None:
        self.model_info.labels(model, precision, provider, task).set(1)

    def set_model_state(self, model: str, state: str) -> None:
        """One model's state: 1 for `state`, 0 for the others."""
        for each in MODEL_STATES:
            self.model_state.labels(model, each).set(1 if each == state else 0)

    def clear_model(self, model: str, keep_state: bool = True) -> None:
        """Forget an unloaded model's series (its counters start again if it loads
        again); its state stays unless `keep_state` is false (a package removed)."""
        for metric in self._per_model():
            if keep_state and metric is self.model_state:
                continue
            names = metric._labelnames  # noqa: SLF001 - prometheus_client has no public getter
            for family in metric.collect():
                seen = {tuple(sample.labels[n] for n in names) for sample in family.samples
                        if sample.labels.get("model") == model and all(
                            n in sample.labels for n in names)}
                for values in seen:
                    metric.remove(*values)

    def _per_model(self) -> list[Counter | Gauge | Histogram]:
        return [m for m in vars(self).values() if isinstance(m, (Counter, Gauge, Histogram))
                and "model" in m._labelnames]  # noqa: SLF001

    def watch_queue(self, model: str, depth: Callable[[], float]) -> None:
        """Read the queue depth at scrape time, so the gauge is never stale."""
        self.queue_depth.labels(model).set_function(depth)

    def watch_transfers(self, model: str, reads: Sequence[Callable[[], TransferBytes]]
                        ) -> None:
        """The bytes a model's engines moved between host and device, read at
        scrape time (on the CPU provider nothing crosses: zero)."""
        if self._transfers is None:
            self._transfers = _TransferCollector()
            self.registry.register(self._transfers)
        self._transfers.models[model] = tuple(reads)

    def watch_cache(self, stats: Callable[[], CacheCounters]) -> None:
        """The exact response cache's counters, read at scrape time."""
        self.registry.register(_CacheCollector(stats))

    def count_route(self, route: str, models: str) -> None:
        """A translation request of any front door, by route ("direct", "chained",
        "same_language") and the models serving it: served names only, never a
        client's."""
        self.routes.labels(route, models or UNRESOLVED).inc()

    def render(self) -> bytes:
        """The exposition text, as /metrics serves it."""
        return generate_latest(self.registry)

    def start_http(self, port: int, host: str = "0.0.0.0") -> MetricsServer:
        """Serve /metrics on its own port (0 picks a free one, for tests). Raises
        OSError when the address cannot be bound (a port in use, say)."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
        server_class = type("_MetricsHTTPServer", (_ThreadingWSGIServer,),
                            {"address_family": family})
        httpd: WSGIServer = make_server(host, port, make_wsgi_app(self.registry), server_class,
                            handler_class=_QuietHandler)
        thread = threading.Thread(target=httpd.serve_forever, args=(HTTP_POLL_S,),
                                  name="seq2serve-metrics", daemon=True)
        thread.start()
        return MetricsServer(httpd, thread)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    # A slow scraper must not hold the process at exit. SO_REUSEADDR (inherited) only
    # lets a restart bind past TIME_WAIT; a port another process listens on still fails.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # one stderr line per scrape is noise


class MetricsServer:
    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _CacheCollector(Collector):
    def __init__(self, stats: Callable[[], CacheCounters]) -> None:
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        s = self.stats()
        for name, help_text, value in (
                ("hits", "answers served from the exact response cache", s.hits),
                ("misses", "texts looked up in the cache and not found", s.misses),
                ("evictions", "entries evicted to stay within --cache-mb", s.evictions)):
            yield CounterMetricFamily(f"{NAMESPACE}_cache_{name}", help_text, value=value)
        yield GaugeMetricFamily(f"{NAMESPACE}_cache_bytes", "bytes the response cache holds",
                                value=s.bytes)
        yield GaugeMetricFamily(f"{NAMESPACE}_cache_capacity_bytes", "the response cache's "
                                "budget (--cache-mb)", value=s.capacity_bytes)


class _TransferCollector(Collector):
    """seq2serve_host_device_bytes_total{model, direction}: every engine's bytes
    across the host<->device boundary (to_device, to_host)."""

    def __init__(self) -> None:
        self.models: dict[str, tuple[Callable[[], TransferBytes], ...]] = {}

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            f"{NAMESPACE}_host_device_bytes", "bytes copied between the host and the "
            "provider's device (inputs, candidates, admissions), by direction",
            labels=["model", "direction"])
        for model, reads in list(self.models.items()):
            counts = [read() for read in reads]
            family.add_metric([model, "to_device"], sum(c.to_device_bytes for c in counts))
            family.add_metric([model, "to_host"], sum(c.to_host_bytes for c in counts))
        yield family
