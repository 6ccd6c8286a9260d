"""`seq2serve serve` as a process: drain for load balancers, ports, broken packages."""

from __future__ import annotations

import shutil
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import CORPUS
from serving import ServeProcess, free_port, health, serve_env, wait_serving

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

MODEL = "opus-mt-en-de"


@pytest.fixture(scope="module")
def models_dir(marian_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(marian_package, root / "tiny-en-de")
    return root


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
                    assert e.code() == grpc.StatusCode.UNAVAILABLE
                    break
            assert time.monotonic() < end, "the listener did not close"
            time.sleep(0.05)
        # ... and the call in flight still finishes, after which the process exits 0
        # (long before the 600 s grace period).
        assert len(long_call.result().translations) == len(CORPUS)
    assert server.finish(timeout=120) == 0
    assert "stopped" in server.lines[-1]
    assert "Traceback" not in server.output
