"""Shared pieces of the deployment tests (tests/test_deploy_*.py): real server
processes on loopback, a Docker engine of the tests' own, a Debian base image
made with debootstrap, and the tools' whereabouts. Everything started here is
stopped here, by its own process id."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import system_tools
from serving import free_port

from seq2serve.server.client import Seq2ServeClient

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
SHIPPED = ROOT / "models"
TEST_BASE_IMAGE = "seq2serve-test-base:bookworm"


def stop_process(process: subprocess.Popen, timeout: float,
                 sig: signal.Signals = signal.SIGTERM) -> int:
    """Ask a process to stop with `sig`; kill it if it is still there after `timeout`."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(10)


def models_dir(tmp: Path, names: Sequence[str] = ("en-de",)) -> Path:
    """A models folder holding only some of the shipped packages (links, no copies)."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name in names:
        (tmp / name).symlink_to(SHIPPED / name, target_is_directory=True)
    return tmp


@dataclass
class Replica:
    """One `seq2serve serve` process on 127.0.0.1."""

    port: int
    metrics_port: int
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    http_port: int = 0  # SEQ2SERVE_HTTP_PORT: a free port of its own, like the others

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def wait_serving(self, timeout: float = 120.0) -> None:
        with Seq2ServeClient(self.target, timeout=2) as client:
            try:
                client.wait_until_serving(timeout)
            except Exception:
                raise AssertionError(f"replica {self.target} not SERVING; log:\n"
                                     f"{self.log.read_text()[-3000:]}") from None

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> int:
        return stop_process(self.process, timeout)


def start_replica(tmp: Path, models: Path, **settings: str | int | float) -> Replica:
    """`seq2serve serve` configured through SEQ2SERVE_* variables, as a container is."""
    port, metrics_port, http_port = free_port(), free_port(), free_port()
    env = {**os.environ, "SEQ2SERVE_HOST": "127.0.0.1", "SEQ2SERVE_PORT": str(port),
           "SEQ2SERVE_METRICS_PORT": str(metrics_port), "SEQ2SERVE_HTTP_PORT": str(http_port),
           "SEQ2SERVE_MODELS_DIR": str(models),
           "SEQ2SERVE_THREADS": "1", "SEQ2SERVE_LOG_LEVEL": "WARNING",
           **{f"SEQ2SERVE_{k.upper()}": str(v) for k, v in settings.items()}}
    log = tmp / f"replica-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "seq2serve.server.cli.main", "serve"],
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
    return Replica(port, metrics_port, process, log, env, http_port)


@contextlib.contextmanager
def replicas(tmp: Path, count: int, **settings: str | int | float) -> Iterator[list[Replica]]:
    models = models_dir(tmp / "models")
    started = [start_replica(tmp, models, **settings) for _ in range(count)]
    try:
        for replica in started:
            replica.wait_serving()
        yield started
    finally:
        for replica in started:
            replica.terminate()
        for replica in started:
            replica.stop()


def record(name: str, value: float | str) -> None:
    """A measured figure (sizes, times), appended as a JSON line to the file named
    by SEQ2SERVE_FIGURES when set: the note's figures come from the tests' runs."""
    path = os.environ.get("SEQ2SERVE_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"figure": name, "value": value}) + "\n")


# --- Docker ---------------------------------------------------------------------

@dataclass
class Docker:
    """A Docker engine and the environment that reaches it."""

    env: dict[str, str]

    def run(self, *args: str, check: bool = True, timeout: float = 600,
            capture: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([system_tools.path("docker"), *args], env=self.env, text=True,
                                timeout=timeout, capture_output=capture)
        if check and result.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def has_image(self, name: str) -> bool:
        return self.run("image", "inspect", name, check=False).returncode == 0


def _engine_answers(env: dict[str, str]) -> bool:
    try:
        return subprocess.run([system_tools.path("docker"), "version"], env=env,
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def docker_engine(tmp: Path) -> Iterator[Docker]:
    """DOCKER_HOST's engine when one is set and answers; otherwise a dockerd of our
    own (vfs storage, no iptables, no bridge: containers use the host's loopback)."""
    system_tools.path("docker")
    # The classic builder: this machine has no buildx plugin for BuildKit.
    env = {**os.environ, "DOCKER_BUILDKIT": os.environ.get("DOCKER_BUILDKIT", "0")}
    if env.get("DOCKER_HOST"):
        if not _engine_answers(env):
            pytest.fail(f"DOCKER_HOST={env['DOCKER_HOST']} is set but no engine answers there")
        yield Docker(env)
        return
    dockerd = system_tools.path("dockerd")
    if os.geteuid() != 0:
        pytest.skip("starting a Docker engine needs root (or set DOCKER_HOST)")
    tmp.mkdir(parents=True, exist_ok=True)
    sock = tmp / "docker.sock"
    env["DOCKER_HOST"] = f"unix://{sock}"
    log = open(tmp / "dockerd.log", "wb")
    process = subprocess.Popen(
        [dockerd, "--iptables=false", "--ip6tables=false", "--bridge=none",
         "--storage-driver=vfs", f"--host=unix://{sock}", f"--data-root={tmp / 'data'}",
         f"--exec-root={tmp / 'exec'}", f"--pidfile={tmp / 'docker.pid'}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _engine_answers(env):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("dockerd did not start:\n"
                                     + (tmp / "dockerd.log").read_text()[-3000:])
            time.sleep(0.5)
        yield Docker(env)
    finally:
        stop_process(process, 60)
        log.close()
        # dockerd leaves its default network namespace mounted under exec-root.
        netns = tmp / "exec" / "netns" / "default"
        if os.path.ismount(netns):
            subprocess.run(["umount", str(netns)], check=False, timeout=30)
        shutil.rmtree(tmp / "data", ignore_errors=True)


def debian_base_image(docker: Docker, tmp: Path) -> str:
    """A Debian bookworm image with python3 and nothing else, from debootstrap (no
    registry can be reached here). SEQ2SERVE_TEST_BASE_IMAGE names another one."""
    named = os.environ.get("SEQ2SERVE_TEST_BASE_IMAGE")
    if named:
        return named
    if docker.has_image(TEST_BASE_IMAGE):
        return TEST_BASE_IMAGE
    debootstrap = system_tools.path("debootstrap")
    rootfs = tmp / "rootfs"
    subprocess.run([debootstrap, "--variant=minbase", "--include=python3", "bookworm",
                    str(rootfs)], check=True, capture_output=True, timeout=900)
    # Package caches, docs and locales are of no use in a base image.
    tar = subprocess.Popen(
        ["tar", "-C", str(rootfs), "--exclude=./var/cache/apt/archives/*.deb",
         "--exclude=./var/lib/apt/lists/*", "--exclude=./usr/share/doc/*",
         "--exclude=./usr/share/man/*", "--exclude=./usr/share/locale/*", "-c", "."],
        stdout=subprocess.PIPE)
    subprocess.run([system_tools.path("docker"), "import", "-", TEST_BASE_IMAGE], stdin=tar.stdout,
                   env=docker.env, check=True, capture_output=True, timeout=600)
    assert tar.wait(60) == 0
    shutil.rmtree(rootfs, ignore_errors=True)
    return TEST_BASE_IMAGE


def nginx_main_config(tmp: Path, site: str, log_format: str = "$upstream_addr $status") -> Path:
    """An nginx main config around `site` whose files all live in tmp, each call
    logged as `log_format` (named `calls`) to tmp/access.log."""
    (tmp / "site.conf").write_text(site)
    main = tmp / "nginx.conf"
    main.write_text(f"""
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format calls '{log_format}';
    access_log {tmp}/access.log calls;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/site.conf;
}}
""")
    return main
