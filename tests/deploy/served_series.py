"""What a seq2serve process serves, as the deployment files rely on it: the series
on /metrics (the gRPC side's, the HTTP front door's and the response cache's) and
whether `seq2serve serve` has the HTTP front door (`--http-port`).

The dashboard, the rules and the nginx config already cover the HTTP front door.
Until the server has it, its series count as exported here and the checks that
need it running skip, naming why; `test_front_door_series_are_registered` then
checks that every series named in FRONT_DOOR_SERIES is really on the registry."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from seq2serve.server.config import ServerConfig
from seq2serve.server.core.cache import ResponseCache
from seq2serve.server.metrics import Metrics

# Family name (as prometheus_client names it: counters without `_total`) -> type.
FRONT_DOOR_SERIES: dict[str, str] = {
    "seq2serve_http_requests": "counter",  # {route, status}
    "seq2serve_http_request_duration_seconds": "histogram",  # {route}
    "seq2serve_cache_hits": "counter",
    "seq2serve_cache_misses": "counter",
    "seq2serve_cache_evictions": "counter",
    "seq2serve_cache_bytes": "gauge",
}
# The models' states (issue 54): one gauge per model and state, 1 for the model's
# current state, 0 for the others (kube-state-metrics' style); the dashboard's model
# panels read it.
MODEL_STATE_SERIES = "seq2serve_model_state"
# Series of other exporters the dashboard reads (NVIDIA's dcgm-exporter, GPU pods).
EXTERNAL_PREFIXES = ("DCGM_FI_",)
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
NOT_YET = ("the server has no HTTP front door yet (ServerConfig has no http_port; "
           "server/api/http is not wired into `seq2serve serve`)")


def http_front_door() -> bool:
    """Whether `seq2serve serve` takes --http-port (SEQ2SERVE_HTTP_PORT)."""
    return "http_port" in ServerConfig.__dataclass_fields__


def series_of(families: Iterable[tuple[str, str]]) -> set[str]:
    """The series names PromQL sees for (family name, type) pairs."""
    return {name + suffix for name, kind in families for suffix in SUFFIXES[kind]}


def front_door_series() -> set[str]:
    return series_of(FRONT_DOOR_SERIES.items())


def registered_series() -> set[str]:
    """Every series name the server's registry can expose: Metrics' own, the
    HTTP app's and the response cache's, which the server adds to the same registry."""
    metrics = Metrics()
    if "seq2serve_http_requests" not in {c.name for c in metrics.registry.collect()}:
        with contextlib.suppress(ImportError):  # absent until the front door is wired in
            from seq2serve.server.api.http.app import HttpMetrics

            HttpMetrics(metrics)
    # The server's one response cache, as Server() registers it.
    metrics.watch_cache(ResponseCache[object](1).stats)
    return series_of((c.name, c.type) for c in metrics.registry.collect())


def exported_series() -> set[str]:
    """registered_series(), plus the front door's series while the server has no
    front door (test_front_door_series_are_registered holds them to it after)."""
    names = registered_series()
    if not http_front_door():
        names |= front_door_series()
    return names


def reads_external(expr: str) -> bool:
    """Whether a PromQL expression reads another exporter's series (no such exporter
    runs in the tests: the GPU panels are evaluated by promtool on sample series)."""
    return any(prefix in expr for prefix in EXTERNAL_PREFIXES)


def reads_model_state(expr: str) -> bool:
    """Whether a PromQL expression reads the models' states."""
    return MODEL_STATE_SERIES in expr


def reads_front_door(expr: str) -> bool:
    """Whether a PromQL expression reads one of the front door's series."""
    return any(name in expr for name in front_door_series())
