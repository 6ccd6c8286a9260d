"""Ports on loopback, and a real `seq2serve serve` process there, for the server
benchmarks; `free_port` is also the tests' (tests/serving.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import grpc

from seq2serve.server.client import Seq2ServeClient

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on right now (the OS's pick for port 0), and none this
    process was given before: the OS may pick a port again as soon as its socket is
    closed, so two calls in a row (a server's port and its metrics port) could get
    the same one, and the server refuses that configuration."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


@contextmanager
def served(models_dir: Path | None, port: int | None = None,
           settings: Mapping[str, str] | None = None,
           wait_s: float = 180.0) -> Iterator[tuple[subprocess.Popen, str]]:
    """Start the server with `SEQ2SERVE_*` settings, wait until SERVING, yield
    (process, target); SIGTERM it on the way out (killed if it does not stop)."""
    port = port or free_port()
    env = {**os.environ, "SEQ2SERVE_PORT": str(port), "SEQ2SERVE_HOST": "127.0.0.1",
           "SEQ2SERVE_METRICS_PORT": "0", "SEQ2SERVE_HTTP_PORT": "0",
           "SEQ2SERVE_PROVIDER": "cpu",
           # nothing routes to a benchmark's server: no need to wait before closing
           "SEQ2SERVE_DRAIN_DELAY_S": "0"}
    env.update({f"SEQ2SERVE_{k.upper()}": str(v) for k, v in (settings or {}).items()})
    if models_dir is not None:
        env["SEQ2SERVE_MODELS_DIR"] = str(models_dir)
    proc = subprocess.Popen([sys.executable, "-m", "seq2serve.server.cli.main", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = f"127.0.0.1:{port}"
    try:
        _wait_until_serving(proc, target, wait_s)
        yield proc, target
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_until_serving(proc: subprocess.Popen, target: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    with Seq2ServeClient(target, timeout=5) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"seq2serve serve exited with status {proc.returncode} "
                                   "before it was SERVING")
            try:
                client.wait_until_serving(2.0)
                return
            except (TimeoutError, grpc.RpcError):
                if time.monotonic() > deadline:
                    raise
