"""`seq2serve serve` as a real process on 127.0.0.1, for start-up, drain and TLS tests;
`free_port` is the benchmarks' (one for the whole repository)."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# The tests' free_port is the benchmarks': one home for the whole repository.
from seq2serve.bench.server.serving import free_port as free_port
from seq2serve.server.app import Server
from seq2serve.server.config import ServerConfig


def serve_env(models_dir: Path, port: int, **settings: object) -> dict[str, str]:
    """The environment of a test server: loopback only, CPU, no metrics port unless given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQ2SERVE_")}
    values: dict[str, object] = dict(models_dir=models_dir, port=port, host="127.0.0.1",
                                     metrics_port=0, http_port=0, provider="cpu",
                                     threads=1, drain_delay_s=0)
    values.update(settings)
    env.update({f"SEQ2SERVE_{k.upper()}": str(v) for k, v in values.items()})
    return env


class ServeProcess:
    """A `seq2serve serve` child process whose output lines are collected as they come."""

    def __init__(self, env: dict[str, str], *args: str, held: bool = False):
        """held: start-up held open after the first model until env's
        HELD_SERVE_RELEASE file exists (tests/held_serve.py)."""
        command = ([str(Path(__file__).with_name("held_serve.py"))] if held
                   else ["-m", "seq2serve.server.cli.main"])
        self.proc = subprocess.Popen(
            [sys.executable, *command, "serve", *args], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)
        self._new.put(None)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float = 120) -> re.Match[str]:
        """The first output line (seen before or after this call) matching `pattern`."""
        regex = re.compile(pattern)
        seen = 0
        end = time.monotonic() + timeout
        while True:
            for line in self.lines[seen:]:
                match = regex.search(line)
                if match:
                    return match
            seen = len(self.lines)
            try:
                if self._new.get(timeout=max(0.0, end - time.monotonic())) is None:
                    break
            except queue.Empty:
                break
        # One last look: the line may have arrived with the end of the output.
        for line in self.lines[seen:]:
            match = regex.search(line)
            if match:
                return match
        raise AssertionError(f"no line matching {pattern!r}; output:\n{self.output}")

    def finish(self, timeout: float = 120) -> int:
        """The exit status, once the process has ended and its output is read."""
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def health(channel: grpc.Channel, service: str = "", timeout: float = 10) -> str:
    stub = health_pb2_grpc.HealthStub(channel)
    response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def wait_serving(target: str, proc: ServeProcess, timeout: float = 120,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
    """Poll health until SERVING; fails at once if the process exits."""
    end = time.monotonic() + timeout
    while True:
        assert proc.proc.poll() is None, f"the server exited early:\n{proc.output}"
        channel = (grpc.secure_channel(target, credentials) if credentials is not None
                   else grpc.insecure_channel(target))
        with channel:
            try:
                if health(channel, timeout=5) == "SERVING":
                    return
            except grpc.RpcError:
                pass
        assert time.monotonic() < end, f"the server did not become SERVING:\n{proc.output}"
        time.sleep(0.2)


class RunningServer:
    """A Server on its own event loop thread, for synchronous test clients."""

    def __init__(self, config: ServerConfig):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: Server = self.call(self._create(config))
        self.call(self.server.start())
        self.target = f"127.0.0.1:{self.server.port}"
        http = self.server.http
        self.http_port = http.port if http is not None else None
        self.http_url = f"http://127.0.0.1:{http.port}" if http is not None else None

    @staticmethod
    async def _create(config: ServerConfig) -> Server:
        return Server(config)

    def call(self, coro, timeout: float = 120):  # noqa: ANN001, ANN201
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, grace: float = 5.0) -> None:
        self.call(self.server.stop(grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def server_config(models_dir: Path, **overrides: object) -> ServerConfig:
    values = dict(models_dir=models_dir, host="127.0.0.1", port=0, metrics_port=0,
                  http_port=0, provider="cpu", threads=1, max_queue_delay_ms=20.0,
                  grace_period_s=5.0, drain_delay_s=0.0,
                  # off unless a test is about it: the others count what the engine ran
                  cache_mb=0.0)
    values.update(overrides)
    return ServerConfig(**values)
