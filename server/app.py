"""`seq2serve serve`: the gRPC server process.

Start-up order: the gRPC port opens first with health NOT_SERVING, models load
and warm up, then health turns SERVING.

SIGTERM/SIGINT drains in two phases, the way load balancers need it:
1. health turns NOT_SERVING for `drain_delay_s` while calls are still accepted
   and served, so Kubernetes' readiness probe and gRPC-aware balancers stop
   routing here before anything is refused;
2. the listener closes (new calls are refused, new connections too) and calls
   in flight get `grace_period_s` to finish; then the process exits 0.
A second signal during phase 1 skips the rest of the drain delay.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from seq2serve.export.package import PackageError
from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

from .config import ConfigError, ServerConfig, add_arguments, from_args
from .errors import ErrorInterceptor
from .metrics import Metrics
from .models import ModelRegistry
from .service import TranslatorService

log = logging.getLogger("seq2serve.server")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Translator"].full_name


class Server:
    """One server: gRPC + health + reflection + metrics over a model registry."""

    def __init__(self, config: ServerConfig, metrics: Metrics | None = None):
        self.config = config
        self.metrics = metrics or Metrics()
        self.registry = ModelRegistry()
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else \
            health.HealthServicer()
        limit = config.max_message_bytes
        self.grpc = grpc.aio.server(
            interceptors=[ErrorInterceptor()],
            options=[("grpc.max_receive_message_length", limit),
                     ("grpc.max_send_message_length", limit)])
        pb_grpc.add_TranslatorServicer_to_server(
            TranslatorService(self.registry, config, self.metrics), self.grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self.grpc)
        self.port = self.grpc.add_insecure_port(f"{config.host}:{config.port}")
        self.metrics_server = None
        self._signals = 0
        self._signalled = asyncio.Event()

    async def _set_health(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in ("", SERVICE_NAME):
            result = self.health.set(service, status)
            if asyncio.iscoroutine(result):
                await result

    async def start(self) -> None:
        await self._set_health(False)
        await self.grpc.start()
        if self.config.metrics_port:
            self.metrics_server = self.metrics.start_http(self.config.metrics_port,
                                                          self.config.host)
        log.info("listening on %s:%d (health NOT_SERVING while models load)",
                 self.config.host, self.port)
        # Loading and warm-up are blocking ONNX Runtime work: keep the loop answering
        # health checks meanwhile.
        await asyncio.get_running_loop().run_in_executor(
            None, self.registry.load, self.config, self.metrics)
        await self._set_health(True)
        log.info("SERVING %s", ", ".join(h.name for h in self.registry.handles()))

    async def stop(self, grace: float | None = None, drain_delay: float | None = None) -> None:
        """Drain: NOT_SERVING but still serving for the drain delay, then close the
        listener and let in-flight calls finish within the grace period."""
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
        end = time.monotonic() + grace  # one grace period for calls and workers together
        # grpc.aio refuses new calls at once and returns as soon as the last call ends.
        await self.grpc.stop(grace)
        left = max(0.0, end - time.monotonic())
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.registry.close(drain=False, timeout=left))
        if self.metrics_server is not None:
            self.metrics_server.stop()
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
        try:
            await self.start()
        except BaseException:
            await self.grpc.stop(0)
            raise
        await self._next_signal(0)
        await self.stop()


async def _serve(config: ServerConfig) -> None:
    # grpc.aio binds a server to the loop it is created in: create it inside.
    await Server(config).serve_until_signal()


def configure(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        config = from_args(args)
    except ConfigError as e:
        print(f"seq2serve serve: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve(config))
    except PackageError as e:
        print(f"seq2serve serve: error: {e}", file=sys.stderr)
        return 1
    return 0
