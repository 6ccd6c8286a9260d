"""`seq2serve serve` as a process: drain for load balancers, ports, broken packages."""

from __future__ import annotations

import shutil
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import CORPUS
from serving import ServeProcess, free_port, health, serve_env, server_config, wait_serving

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

MODEL = "opus-mt-en-de"


@pytest.fixture
def processes() -> Iterator[list[ServeProcess]]:
    """Every server a test starts; killed at the end if still running."""
    started: list[ServeProcess] = []
    yield started
    for proc in started:
        proc.kill()


def in_flight(metrics_port: int) -> float:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    prefix = f'seq2serve_in_flight_requests{{model="{MODEL}"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines()
               if line.startswith(prefix))


def test_sigterm_drains_for_load_balancers_then_closes_and_finishes_in_flight(
        models_dir: Path, processes: list[ServeProcess]) -> None:
    port, metrics_port = free_port(), free_port()
    target = f"127.0.0.1:{port}"
    # A drain delay far longer than the test: the second signal ends it, so nothing
    # here depends on how fast this machine is.
    server = ServeProcess(serve_env(models_dir, port, metrics_port=metrics_port,
                                    drain_delay_s=600, grace_period_s=600))
    processes.append(server)
    wait_serving(target, server)
    server.signal(signal.SIGTERM)
    server.wait_for_line("draining: health NOT_SERVING")

    # Phase 1: health answers NOT_SERVING, and new connections and calls are still served.
    with grpc.insecure_channel(target) as channel:
        assert health(channel) == "NOT_SERVING"
        assert health(channel, "seq2serve.v1.Translator") == "NOT_SERVING"
        stub = pb_grpc.TranslatorStub(channel)
        during = stub.Translate(pb.TranslateRequest(texts=["Hello"]), timeout=120)
        assert len(during.translations) == 1
        # A long call (EOS is banned for 60 tokens) that will be in flight at the close.
        long_call = stub.Translate.future(pb.TranslateRequest(
            texts=CORPUS, options=pb.DecodingOptions(beam_size=8, min_length=60,
                                                     max_length=64)), timeout=600)
        end = time.monotonic() + 60
        while in_flight(metrics_port) < 1:
            assert time.monotonic() < end and not long_call.done()
            time.sleep(0.05)

        # Phase 2: the listener closes with the call in flight ...
        server.signal(signal.SIGTERM)
        closing = server.wait_for_line(r"closing the listener: (\d+) call\(s\) in flight")
        assert int(closing.group(1)) == 1
        end = time.monotonic() + 60
        while True:  # ... new connections are refused ...
            with grpc.insecure_channel(target) as fresh:
                try:
                    health(fresh, timeout=5)
                except grpc.RpcError as e:
                    # A connection accepted just before the close sees its call CANCELLED.
                    assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
                    if e.code() == grpc.StatusCode.UNAVAILABLE:
                        break
            assert time.monotonic() < end, "the listener did not close"
            time.sleep(0.05)
        # ... and the call in flight still finishes, after which the process exits 0
        # (long before the 600 s grace period).
        assert len(long_call.result().translations) == len(CORPUS)
    assert server.finish(timeout=120) == 0
    assert "stopped" in server.lines[-1]
    assert "Traceback" not in server.output


def error_lines(proc: ServeProcess) -> list[str]:
    return [line for line in proc.lines if "error" in line.lower()]


def test_a_second_server_on_a_busy_grpc_port_fails_naming_it(
        models_dir: Path, processes: list[ServeProcess]) -> None:
    port = free_port()
    first = ServeProcess(serve_env(models_dir, port))
    processes.append(first)
    wait_serving(f"127.0.0.1:{port}", first)
    second = ServeProcess(serve_env(models_dir, port))
    processes.append(second)
    assert second.finish() == 1
    assert second.lines == [f"seq2serve serve: error: cannot listen for gRPC on 127.0.0.1:{port}: "
                            "Address already in use (another process listens there; is a server "
                            "already running?)"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # the first one is unharmed
        assert health(channel) == "SERVING"


def test_grpc_port_is_not_shared_with_a_reuseport_listener(models_dir: Path) -> None:
    """gRPC sets SO_REUSEPORT unless told not to; two such listeners split the
    connections between them. Ours does not set it, so nobody can join it."""
    import asyncio

    from seq2serve.server.app import Server

    async def bind_twice() -> None:
        ours = Server(server_config(models_dir))  # every port a free one: none is a default
        await ours.grpc.start()
        other = grpc.aio.server()  # default options: SO_REUSEPORT on
        try:
            with pytest.raises(RuntimeError, match="Failed to bind"):
                other.add_insecure_port(f"127.0.0.1:{ours.port}")
        finally:
            await other.stop(0)
            await ours.grpc.stop(0)

    asyncio.run(bind_twice())


@pytest.mark.parametrize(("setting", "what"), [("metrics_port", "/metrics"),
                                               ("http_port", "HTTP")])
def test_a_busy_port_fails_naming_it_and_the_process_ends_cleanly(
        models_dir: Path, setting: str, what: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        proc = ServeProcess(serve_env(models_dir, free_port(), **{setting: taken}))
        try:
            assert proc.finish() == 1
        finally:
            proc.kill()
    # One line, and nothing after it: what the failed start made (the gRPC server
    # among it) is released, so the interpreter's exit prints no "Error in sys.excepthook".
    assert proc.lines == [
        f"seq2serve serve: error: cannot listen for {what} on 127.0.0.1:{taken}: "
        "Address already in use (another process listens there; is a server already running?)"]


def test_a_missing_models_dir_fails_in_one_message(tmp_path: Path) -> None:
    proc = ServeProcess(serve_env(tmp_path / "nowhere", free_port()))
    assert proc.finish() == 2
    assert proc.lines == ["seq2serve serve: error: invalid server configuration:",
                          f"  models_dir must be an existing directory, got "
                          f"{str(tmp_path / 'nowhere')!r} (from SEQ2SERVE_MODELS_DIR)"]


@pytest.fixture(scope="module")
def mixed_models(marian_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One valid package, two broken ones, and what is not a package at all."""
    root = tmp_path_factory.mktemp("mixed")
    shutil.copytree(marian_package, root / "good")
    shutil.copytree(marian_package, root / "tampered")
    with open(root / "tampered" / "encoder.onnx", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    (root / "no-manifest").mkdir()
    (root / "no-manifest" / "encoder.onnx").write_bytes(b"\0")
    (root / ".cache" / "x").mkdir(parents=True)  # hidden: ignored
    (root / ".cache" / "x" / "junk").write_text("junk")
    (root / "empty" / "sub").mkdir(parents=True)  # holds no file: ignored
    (root / "checkpoints" / "en-de").mkdir(parents=True)  # no manifest, no graph: ignored
    (root / "checkpoints" / "en-de" / "model.safetensors").write_bytes(b"\0")
    (root / "README.txt").write_text("models live here")  # a file, not a directory
    return root


def test_every_broken_package_is_reported_and_nothing_is_served(
        mixed_models: Path) -> None:
    proc = ServeProcess(serve_env(mixed_models, free_port()))
    assert proc.finish() == 1
    errors = [line for line in proc.lines if not line.startswith("20")]  # not log lines
    assert errors[0] == (f"seq2serve serve: error: 2 of the 3 model package directories in "
                         f"{mixed_models} cannot be served; fix or remove them, or pass "
                         "--serve-valid-models to serve the others:")
    assert errors[1] == f"  {mixed_models / 'no-manifest'}: manifest.json: missing"
    assert errors[2].startswith(f"  {mixed_models / 'tampered'}: encoder.onnx")
    assert len(errors) == 3 and "Traceback" not in proc.output
    assert not any("loaded" in line for line in proc.lines)  # no model was loaded


def test_serve_valid_models_serves_the_rest_and_logs_each_broken_one(
        mixed_models: Path, processes: list[ServeProcess]) -> None:
    port = free_port()
    proc = ServeProcess(serve_env(mixed_models, port, serve_valid_models="true"))
    processes.append(proc)
    wait_serving(f"127.0.0.1:{port}", proc)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        models = pb_grpc.TranslatorStub(channel).ListModels(pb.ListModelsRequest(), timeout=30)
    assert [m.name for m in models.models] == [MODEL]
    logged = [line for line in proc.lines if " ERROR " in line]
    assert len(logged) == 2
    assert f"model package {mixed_models / 'no-manifest'} is broken and not served: " \
           "manifest.json: missing" in logged[0]
    assert f"model package {mixed_models / 'tampered'} is broken" in logged[1]
    proc.signal(signal.SIGTERM)
    assert proc.finish() == 0


def test_serve_valid_models_with_nothing_valid_does_not_start(tmp_path: Path) -> None:
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "manifest.json").write_text("{not json")
    proc = ServeProcess(serve_env(tmp_path, free_port(), serve_valid_models="1"))
    assert proc.finish() == 1
    assert proc.lines[-2].endswith("cannot be served; none is left to serve:")
    assert proc.lines[-1].startswith(f"  {tmp_path / 'junk'}: manifest.json: not valid JSON")
