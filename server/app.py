"""`seq2serve serve`: the gRPC server process.

Every listener and worker is a part of one lifecycle (lifecycle.py): a new
listener is one `self.lifecycle.add(Stage.FRONT, NAME, part)` in Server.

Start-up order: the ports are bound first (a busy one fails the start with one
line naming it), health says NOT_SERVING while the models load and warm up,
then SERVING. Every model package directory must load, or nothing is served
(unless `--serve-valid-models`; see assembly.py).

SIGTERM/SIGINT drains in two phases, the way load balancers need it:
1. health turns NOT_SERVING for `drain_delay_s` while calls are still accepted
   and served, so Kubernetes' readiness probe and gRPC-aware balancers stop
   routing here before anything is refused;
2. the listeners close (new calls are refused, new connections too) and calls
   in flight get `grace_period_s` to finish. When it ends, the calls still in
   flight are cancelled (UNAVAILABLE), queued work fails, the engines' ONNX
   Runtime runs are terminated and their threads joined; the process exits 0.
A second signal during phase 1 skips the rest of the drain delay.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import functools
import logging
import signal
import socket
import sys
import tempfile
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.api.admin import AdminKeys
from seq2serve.server.api.grpc_errors import ErrorInterceptor
from seq2serve.server.api.grpc_metrics import count_undecodable
from seq2serve.server.api.grpc_service import TranslatorService
from seq2serve.server.api.http.access import Access, KeyFileError, read_key_file
from seq2serve.server.api.http.app import HttpSettings, build_app
from seq2serve.server.api.http.libretranslate import LibreSettings
from seq2serve.server.api.http.listener import HttpListener, ListenError
from seq2serve.server.api.proto_api import ProtoApi
from seq2serve.server.api.tls import TLSError, server_credentials
from seq2serve.server.assembly import ModelLoadError, ModelWorkers
from seq2serve.server.config import (
    ConfigError,
    ServerConfig,
    add_arguments,
    env_name,
    flag_name,
    from_args,
)
from seq2serve.server.core.cache import ResponseCache
from seq2serve.server.core.documents import Limits
from seq2serve.server.core.documents.jobs import DocumentJobs
from seq2serve.server.core.glossary import Glossaries, GlossaryError, GlossaryStore
from seq2serve.server.core.registry import ModelRegistry
from seq2serve.server.core.requests import Translation
from seq2serve.server.core.translator import Translator
from seq2serve.server.core.usage import UsageFileError, UsageLedger
from seq2serve.server.lifecycle import Lifecycle, Stage
from seq2serve.server.metrics import Metrics, MetricsServer
from seq2serve.server.problems import Problem

log = logging.getLogger("seq2serve.server")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Translator"].full_name
HEALTH_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
BUSY_HINT = " (another process listens there; is a server already running?)"


class StartupError(Exception):
    """The server cannot start; the message is one line naming the port or file."""


def address(host: str, port: int) -> str:
    """host:port as gRPC and people write it ([::1]:50051 for IPv6)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def check_bindable(host: str, port: int, what: str) -> None:
    """Bind a probe socket first: a port in use then fails with the OS's reason in one
    line, rather than gRPC core's several lines ending in "Failed to bind"."""
    if port == 0:
        return  # any free port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise StartupError(f"cannot listen for {what} on {address(host, port)}: the host "
                           f"does not resolve ({e.strerror})") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
        try:
            probe.bind(sockaddr)
        except OSError as e:
            hint = BUSY_HINT if e.errno == errno.EADDRINUSE else ""
            raise StartupError(f"cannot listen for {what} on {address(host, port)}: "
                               f"{e.strerror}{hint}") from None


def document_limits(config: ServerConfig) -> Limits:
    """What one /translate_file upload may hold (HTTP 413 past it)."""
    return Limits.of(config.document_limits())


def open_jobs(config: ServerConfig) -> DocumentJobs:
    """The document jobs in `jobs_dir` (those it holds taken up again at start)."""
    try:
        return DocumentJobs(config.jobs_dir, max_bytes=config.jobs_max_bytes,
                            ttl_s=config.job_ttl_s, workers=config.max_documents_in_flight)
    except OSError as e:
        raise StartupError(f"cannot use the jobs folder (--jobs-dir): {e}") from None


def open_usage(config: ServerConfig) -> UsageLedger:
    """DeepL's usage counts: read from `usage_file` when it is given. A file that
    cannot be read stops the start (never a silent reset of every key's count)."""
    try:
        return UsageLedger(config.usage_file, config.usage_period, config.usage_reset_day)
    except UsageFileError as e:
        raise StartupError(
            f"cannot use the usage counts file ({flag_name('usage_file')} / "
            f"{env_name('usage_file')}): {e}; repair it, or move it away to start every "
            "count at 0") from None


def load_glossaries(config: ServerConfig) -> Glossaries:
    """The glossaries of `glossary_dir`, read once; a broken file is a configuration
    error (exit status 2) naming it."""
    try:
        return Glossaries.load(config.glossary_dir)
    except GlossaryError as e:
        raise ConfigError([Problem("glossary_dir",
                                   f"glossary_dir holds a broken glossary: {e}")]) from None


class GrpcListener:
    """The gRPC server as a lifecycle part (FRONT). Its port is bound before
    anything starts; stop() refuses new calls at once and cancels the calls still
    in flight when the grace period ends (their clients see UNAVAILABLE)."""

    def __init__(self, server: grpc.aio.Server, where: str, security: str) -> None:
        self.server, self.where, self.security = server, where, security

    async def start(self) -> None:
        await self.server.start()
        log.info("listening on %s (%s; health NOT_SERVING while models load)", self.where,
                 self.security)

    async def stop(self, grace: float) -> None:
        # grpc.aio returns as soon as the last call ends, or cancels them at `grace`.
        await self.server.stop(grace)


class MetricsListener:
    """The Prometheus /metrics endpoint as a lifecycle part (SIDE)."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self.metrics, self.host, self.port = metrics, host, port
        self.server: MetricsServer | None = None

    async def start(self) -> None:
        try:
            self.server = self.metrics.start_http(self.port, self.host)
        except OSError as e:
            hint = BUSY_HINT if e.errno == errno.EADDRINUSE else ""
            raise StartupError(f"cannot listen for /metrics on {address(self.host, self.port)}: "
                               f"{e.strerror}{hint}") from None
        log.info("metrics on http://%s/metrics", address(self.host, self.server.port))

    async def stop(self, grace: float) -> None:
        server, self.server = self.server, None
        if server is not None:
            await asyncio.get_running_loop().run_in_executor(None, server.stop)


class Server:
    """One server: gRPC + health + reflection + metrics over a model registry.
    Binds the gRPC port on creation; raises StartupError when it cannot. Every
    listener and worker is a part of one lifecycle (lifecycle.py)."""

    def __init__(self, config: ServerConfig, metrics: Metrics | None = None):
        self.config = config
        self.metrics = metrics or Metrics()
        self.registry = ModelRegistry(config.prefer_multilingual, config.preferred_models())
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else \
            health.HealthServicer()
        limit = config.max_message_bytes
        self.grpc = grpc.aio.server(
            interceptors=[ErrorInterceptor(functools.partial(count_undecodable, self.metrics))],
            options=[("grpc.max_receive_message_length", limit),
                     ("grpc.max_send_message_length", limit),
                     # gRPC sets SO_REUSEPORT by default: a second server on the same
                     # port would silently take half of the new connections.
                     ("grpc.so_reuseport", 0)])
        self.http: HttpListener | None = None
        self.jobs: DocumentJobs | None = None
        self.usage: UsageLedger | None = None
        try:
            self._assemble()
        except BaseException:
            self._release()
            raise
        self.serving = False
        self._signals = 0
        self._signalled = asyncio.Event()

    def _assemble(self) -> None:
        """Everything after the gRPC server's creation: a failure here (a port
        taken, a TLS file unreadable) is released by _release."""
        config = self.config
        cache: ResponseCache[Translation] = ResponseCache(int(config.cache_mb * 2**20))
        self.metrics.watch_cache(cache.stats)
        self.translator = Translator(self.registry,
                                     max_texts_per_request=config.max_texts_per_request,
                                     max_text_chars=config.max_text_chars, cache=cache,
                                     glossaries=load_glossaries(config),
                                     metrics=self.metrics)
        try:
            admin = AdminKeys(read_key_file(config.admin_keys).keys
                              if config.admin_keys is not None else None)
        except KeyFileError as e:
            raise StartupError(f"admin_keys: {e}") from None
        workers = ModelWorkers(self.registry, config, self.metrics)
        self.proto_api = ProtoApi(self.translator, config.max_message_bytes,
                                  admin=admin, rescan=workers.rescan)
        # DeepL's glossaries without --glossary-store: kept until the process ends.
        self._glossary_temp = tempfile.TemporaryDirectory(prefix="seq2serve-glossaries-")
        pb_grpc.add_TranslatorServicer_to_server(  # type: ignore[no-untyped-call]  # generated, unannotated
            TranslatorService(self.proto_api, self.metrics), self.grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        if config.reflection:
            reflection.enable_server_reflection(
                (SERVICE_NAME, HEALTH_NAME, reflection.SERVICE_NAME), self.grpc)
        self.port = self._bind()
        if config.http_port:  # documents come in over HTTP only
            self.jobs = open_jobs(config)
            self.usage = open_usage(config)
            self.http = self._http_listener()
        # Nothing below can fail: the lifecycle holds the gRPC server only once all is bound.
        self._metrics = MetricsListener(self.metrics, config.metrics_address,
                                        config.metrics_port)
        security = "mutual TLS" if config.tls_client_ca else "TLS" if config.tls else "plaintext"
        self.lifecycle = Lifecycle()
        if config.metrics_port:
            self.lifecycle.add(Stage.SIDE, "/metrics", self._metrics)
        self.lifecycle.add(Stage.FRONT, "gRPC", GrpcListener(
            self.grpc, address(config.host, self.port), security))
        if self.http is not None:
            self.lifecycle.add(Stage.FRONT, "HTTP", self.http)
        self.lifecycle.add(Stage.BACK, "models", workers)
        if self.jobs is not None:  # after the models: a job taken up again needs them
            self.lifecycle.add(Stage.BACK, "document jobs", self.jobs)
        if self.usage is not None:  # written last, once nothing counts any more
            self.lifecycle.add(Stage.SIDE, "usage counts", self.usage)

    def _release(self) -> None:
        """Undo a failed __init__ at once, inside the event loop: close the HTTP socket
        and drop the gRPC server (the traceback keeps this Server alive, and a gRPC aio
        server freed only at interpreter exit prints an empty "Error in sys.excepthook")."""
        if self.http is not None:
            self.http.socket.close()
        if self.jobs is not None:
            self.jobs.close()
        if self.usage is not None:
            self.usage.close()
        del self.grpc

    @property
    def metrics_server(self) -> MetricsServer | None:
        return self._metrics.server

    def _bind(self) -> int:
        config = self.config
        check_bindable(config.host, config.port, "gRPC")
        where = address(config.host, config.port)
        try:
            if config.tls_cert is not None and config.tls_key is not None:
                credentials = server_credentials(config.tls_cert, config.tls_key,
                                                 config.tls_client_ca)
                return int(self.grpc.add_secure_port(where, credentials))
            return int(self.grpc.add_insecure_port(where))
        except TLSError as e:
            raise StartupError(str(e)) from None
        except RuntimeError:  # taken between the probe and here, or refused by gRPC
            raise StartupError(f"cannot listen for gRPC on {where} (gRPC could not bind "
                               "it; GRPC_VERBOSITY=debug shows why)") from None

    def _http_listener(self) -> HttpListener:
        config = self.config
        try:
            keys = read_key_file(config.api_keys) if config.api_keys is not None else None
        except KeyFileError as e:
            raise StartupError(str(e)) from None
        access = Access(keys.keys if keys is not None else None,
                        require_key=config.require_api_key, per_minute=config.rate_limit,
                        trusted_proxies=config.trusted_networks(),
                        char_limits=keys.char_limits if keys is not None else None)
        settings = HttpSettings(
            libre=LibreSettings(char_limit=config.max_text_chars,
                                batch_limit=config.max_texts_per_request,
                                alternatives_limit=config.max_beam_size - 1,
                                document_limits=document_limits(config)),
            max_body_bytes=config.max_message_bytes,
            cors_origins=tuple(o.strip() for o in config.cors_origins.split(",") if o.strip()),
            timeout_s=config.http_timeout_s or None)
        try:
            store = GlossaryStore(config.glossary_store or Path(self._glossary_temp.name),
                                  self.translator.glossaries)
        except (GlossaryError, OSError) as e:
            raise StartupError(f"glossary_store: {e}") from None
        app = build_app(self.translator, self.proto_api, settings, self.metrics,
                        lambda: self.serving, access, store, self.jobs, self.usage)
        try:
            return HttpListener(app, config.host, config.http_port, config.tls_cert,
                                config.tls_key, config.tls_client_ca)
        except ListenError as e:
            raise StartupError(str(e)) from None

    async def _set_health(self, serving: bool) -> None:
        self.serving = serving
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in ("", SERVICE_NAME):
            result = self.health.set(service, status)
            if asyncio.iscoroutine(result):
                await result

    async def start(self) -> None:
        """Start every part; SERVING once the models are loaded. A part that fails
        stops the ones started before it."""
        await self._set_health(False)
        await self.lifecycle.start()
        await self._set_health(True)
        log.info("SERVING %s", ", ".join(h.name for h in self.registry.handles()))

    async def stop(self, grace: float | None = None, drain_delay: float | None = None) -> None:
        """Drain: NOT_SERVING but still serving for the drain delay, then close the
        listeners and let in-flight calls finish within the grace period; what still
        runs then is ended, and every worker thread joined."""
        grace = self.config.grace_period_s if grace is None else grace
        delay = self.config.drain_delay_s if drain_delay is None else drain_delay
        await self._set_health(False)
        if delay > 0:
            log.info("draining: health NOT_SERVING, still serving for %gs so load balancers "
                     "stop routing here (signal again to skip)", delay)
            seen = self._signals
            try:
                await asyncio.wait_for(self._next_signal(seen), delay)
                log.info("signal received again: drain delay skipped")
            except asyncio.TimeoutError:
                pass
        log.info("closing the listener: %d call(s) in flight get up to %gs to finish",
                 self.metrics.active_requests, grace)
        await self.lifecycle.stop(grace)
        log.info("stopped")

    def _on_signal(self) -> None:
        self._signals += 1
        self._signalled.set()

    async def _next_signal(self, seen: int) -> None:
        """Return once more than `seen` signals have arrived."""
        while self._signals <= seen:
            self._signalled.clear()
            await self._signalled.wait()

    async def serve_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        await self.start()
        await self._next_signal(0)
        await self.stop()


async def _serve(config: ServerConfig) -> None:
    # grpc.aio binds a server to the loop it is created in: create it inside.
    await Server(config).serve_until_signal()


def configure(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Exit status 0 after a drain; 2 for a bad configuration; 1 when the server
    cannot start. Failures are a line on stderr each, never a traceback."""
    try:
        config = from_args(args)
    except ConfigError as e:
        return _fail(str(e), 2)
    logging.basicConfig(level=config.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve(config))
    except ConfigError as e:
        return _fail(str(e), 2)
    except (StartupError, ModelLoadError) as e:
        return _fail(str(e), 1)
    except Exception as e:  # noqa: BLE001 - a start-up failure is a line, not a traceback
        log.debug("start-up failed", exc_info=e)
        return _fail(f"start-up failed: {type(e).__name__}: {e} (--log-level DEBUG logs "
                     "the traceback)", 1)
    return 0


def _fail(message: str, status: int) -> int:
    print(f"seq2serve serve: error: {message}", file=sys.stderr)
    return status
