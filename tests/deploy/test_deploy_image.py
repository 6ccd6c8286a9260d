"""The container image, built for real by deploy/build-image.sh on a Docker engine
of the tests' own, from a Debian base made here by debootstrap (no registry is
reachable): it runs as non-root on a read-only root file system, turns healthy
through its HEALTHCHECK, translates over the Python client and grpcurl (server
reflection) and over HTTP, and `docker stop` drains an in-flight call and exits 0.

Containers use the host's network namespace (this engine has no bridge) and
bind 127.0.0.1 on free ports."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import system_tools
from deploy_helpers import (
    ROOT,
    SHIPPED,
    Docker,
    debian_base_image,
    docker_engine,
    free_port,
    record,
)
from served_series import http_front_door

from seq2serve.server.client import Seq2ServeClient
from seq2serve.server.config import ServerConfig

pytestmark = [pytest.mark.slow, pytest.mark.needs("docker", "dockerd", "debootstrap")]
IMAGE = "seq2serve:deploy-test"
UID = "10001"


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Docker]:
    with docker_engine(tmp_path_factory.mktemp("docker")) as engine:
        yield engine


@pytest.fixture(scope="module")
def image(docker: Docker, tmp_path_factory: pytest.TempPathFactory) -> str:
    start = time.monotonic()
    base = debian_base_image(docker, tmp_path_factory.mktemp("base"))
    record("base image (debootstrap + import) s", round(time.monotonic() - start, 1))
    start = time.monotonic()
    build = subprocess.run([str(ROOT / "deploy" / "build-image.sh"), "-t", IMAGE,
                            "--build-arg", f"BASE_IMAGE={base}"],
                           env=docker.env, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, f"{build.stdout[-4000:]}\n{build.stderr[-4000:]}"
    record("cpu image build s", round(time.monotonic() - start, 1))
    size = int(docker.run("image", "inspect", "-f", "{{.Size}}", IMAGE).stdout)
    base_size = int(docker.run("image", "inspect", "-f", "{{.Size}}", base).stdout)
    record("cpu image MB", round(size / 1e6))
    record("cpu image MB above base", round((size - base_size) / 1e6))
    return IMAGE


def _inspect(docker: Docker, name: str) -> dict:
    return json.loads(docker.run("inspect", name).stdout)[0]


class Container:
    def __init__(self, docker: Docker, name: str, port: int, metrics_port: int,
                 http_port: int) -> None:
        self.docker, self.name, self.port, self.metrics_port = docker, name, port, metrics_port
        self.http_port = http_port

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def logs(self) -> str:
        result = self.docker.run("logs", self.name, check=False)
        return result.stdout + result.stderr

    def state(self) -> dict:
        return _inspect(self.docker, self.name)["State"]


@pytest.fixture()
def run_container(docker: Docker, image: str) -> Iterator:
    started: list[str] = []

    def run(*extra: str, **settings: str) -> Container:
        port, metrics_port, http_port = free_port(), free_port(), free_port()
        name = f"seq2serve-test-{port}"
        # The host's network: every port is a free one of the host's.
        env = {"SEQ2SERVE_HOST": "127.0.0.1", "SEQ2SERVE_PORT": str(port),
               "SEQ2SERVE_METRICS_PORT": str(metrics_port),
               "SEQ2SERVE_HTTP_PORT": str(http_port), "SEQ2SERVE_THREADS": "1", **settings}
        args = ["run", "--detach", "--name", name, "--network", "host", "--read-only",
                "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                *[f"--env={k}={v}" for k, v in env.items()], *extra, image]
        docker.run(*args)
        started.append(name)
        return Container(docker, name, port, metrics_port, http_port)

    yield run
    for name in started:
        docker.run("rm", "--force", name, check=False)


def _wait_health(container: Container, want: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (status := container.state().get("Health", {}).get("Status")) != want:
        assert time.monotonic() < deadline, f"health {status!r}, want {want!r}:\n" \
            f"{container.logs()[-3000:]}"
        time.sleep(0.5)


def _wait_serving(client: Seq2ServeClient, container: Container) -> None:
    """Until SERVING; a container that never gets there fails with its own log."""
    try:
        client.wait_until_serving(120)
    except (TimeoutError, grpc.RpcError) as e:
        raise AssertionError(f"not SERVING ({e}); container log:\n"
                             f"{container.logs()[-3000:]}") from None


def test_image_metadata(docker: Docker, image: str) -> None:
    config = _inspect(docker, image)["Config"]
    defaults = ServerConfig()
    assert config["User"] == f"{UID}:{UID}"
    exposed = set(config["ExposedPorts"])
    assert {f"{defaults.port}/tcp", f"{defaults.metrics_port}/tcp"} < exposed
    assert len(exposed) == 3  # and the HTTP API's
    if http_front_door():
        assert f"{defaults.http_port}/tcp" in exposed
    assert config["StopSignal"] == "SIGTERM"
    assert config["Entrypoint"] == ["seq2serve"] and config["Cmd"] == ["serve"]
    assert config["Healthcheck"]["Test"][:3] == ["CMD", "seq2serve", "health"]
    labels = config["Labels"]
    version = importlib.metadata.version("seq2serve")
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.revision"] == (revision or "unknown")
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                        labels["org.opencontainers.image.created"])
    # No torch, no training extras: serving needs only the runtime dependencies.
    installed = docker.run("run", "--rm", "--network", "none", "--entrypoint", "cat", image,
                           "/opt/seq2serve/installed.txt").stdout.lower()
    assert "onnxruntime==" in installed and "grpcio==" in installed
    assert "torch" not in installed and "onnxruntime-gpu" not in installed


@pytest.mark.needs("grpcurl")
def test_runs_healthy_non_root_read_only_and_translates(docker: Docker, run_container) -> None:
    grpcurl = system_tools.path("grpcurl")
    start = time.monotonic()
    container = run_container()
    with Seq2ServeClient(container.target, timeout=30) as client:
        _wait_serving(client, container)
        record("container start to SERVING s", round(time.monotonic() - start, 1))
        models = {m.name: m for m in client.list_models()}
        assert set(models) == {p.name for p in SHIPPED.iterdir() if (p / "manifest.json").is_file()}
        assert models["en-de"].provider == "CPUExecutionProvider"
        text = "Open the file and save your changes."
        [[best]] = client.translate([text], model="en-de")
    assert best.text.strip()
    # The image's own HEALTHCHECK (seq2serve health) turns the container healthy.
    _wait_health(container, "healthy", 60)
    # grpcurl knows nothing of the contract: it learns it through server reflection.
    listed = subprocess.run([grpcurl, "-plaintext", container.target, "list"],
                            capture_output=True, text=True, timeout=30, check=True).stdout
    assert "seq2serve.v1.Translator" in listed.split()
    answer = subprocess.run(
        [grpcurl, "-plaintext", "-d", json.dumps({"model": "en-de", "texts": [text]}),
         container.target, "seq2serve.v1.Translator/Translate"],
        capture_output=True, text=True, timeout=30, check=True).stdout
    assert json.loads(answer)["translations"][0]["hypotheses"][0]["text"] == best.text
    # Non-root, and nothing below / can be written; /tmp is the tmpfs.
    assert docker.run("exec", container.name, "id", "-u").stdout.strip() == UID
    denied = docker.run("exec", container.name, "touch", "/opt/seq2serve/x", check=False)
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr
    assert docker.run("exec", container.name, "touch", "/tmp/x", check=False).returncode == 0
    with urllib.request.urlopen(f"http://127.0.0.1:{container.metrics_port}/metrics",
                                timeout=10) as response:
        assert 'seq2serve_model_info{model="en-de"' in response.read().decode()
    if http_front_door():
        # The HTTP front door: health, and LibreTranslate's /translate.
        url = f"http://127.0.0.1:{container.http_port}"
        with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
            assert json.loads(response.read()) == {"status": "ok"}
        request = urllib.request.Request(
            f"{url}/translate", headers={"Content-Type": "application/json"},
            data=json.dumps({"q": text, "source": "en", "target": "de"}).encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["translatedText"].strip()


def test_mounted_models_dir_replaces_the_shipped_one(run_container, tmp_path: Path) -> None:
    # A copy, not links: the container sees only what is mounted.
    mounted = tmp_path / "models"
    shutil.copytree(SHIPPED / "summarize-en", mounted / "summarize-en")
    container = run_container("--volume", f"{mounted}:/models:ro")
    with Seq2ServeClient(container.target, timeout=30) as client:
        _wait_serving(client, container)
        assert [m.name for m in client.list_models()] == ["summarize-en"]


def test_docker_stop_drains_an_in_flight_call_and_exits_0(docker: Docker, run_container
                                                          ) -> None:
    grace = 20
    container = run_container(SEQ2SERVE_GRACE_PERIOD_S=str(grace), SEQ2SERVE_DRAIN_DELAY_S="1")
    # A call with a fixed, sizeable amount of work: every text decodes exactly
    # 200 tokens with a beam of 4.
    texts = [f"Tools to convert images between many formats, part {i}." for i in range(16)]
    options = {"beam_size": 4, "min_length": 200, "max_length": 200, "max_length_ratio": 100.0}
    with Seq2ServeClient(container.target, timeout=120) as client, \
            ThreadPoolExecutor(1) as pool:
        _wait_serving(client, container)
        call = pool.submit(client.translate, texts, "en-de", **options)
        deadline = time.monotonic() + 30
        while b"seq2serve_in_flight_requests{model=\"en-de\"} 1.0" not in _metrics(container):
            assert not call.done() and time.monotonic() < deadline, "the call never ran"
            time.sleep(0.02)
        assert not call.done(), "the call finished before the stop: give it more work"
        start = time.monotonic()
        docker.run("stop", "--time", str(grace + 10), container.name, timeout=grace + 60)
        stop_s = time.monotonic() - start
        results = call.result(timeout=10)
    record("docker stop with one call in flight s", round(stop_s, 1))
    assert len(results) == len(texts) and all(hyps[0].text for hyps in results)
    state = container.state()
    assert state["ExitCode"] == 0 and not state["OOMKilled"], container.logs()[-3000:]
    assert "draining" in container.logs()


def _metrics(container: Container) -> bytes:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{container.metrics_port}/metrics",
                                    timeout=5) as response:
            return response.read()
    except OSError:
        return b""
