"""A clean stop, every time: SIGTERM while decoder batches run longer than the
grace period. The process ends their ONNX Runtime runs, joins its engine
threads and exits 0; every client sees OK or UNAVAILABLE."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from serving import ServeProcess, free_port, serve_env, wait_serving

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

SHIPPED = Path(__file__).resolve().parents[2] / "models"
CALLS, TEXTS = 64, 4
TEXT = ("The package provides tools to read, write and convert many archive formats with a "
        "command-line program and a library for other programs to use every day.")


@pytest.fixture
def shipped_en_de(tmp_path: Path) -> Path:
    """A models folder serving only the shipped en-de package (a real-size model:
    long batches on this machine's CPUs)."""
    (tmp_path / "en-de").symlink_to(SHIPPED / "en-de")
    return tmp_path


@pytest.fixture
def server(shipped_en_de: Path) -> Iterator[tuple[ServeProcess, int]]:
    # Batches of 128 texts x beam 4 on two engines; no /metrics listener, whose
    # stop would give the engine threads time to end on their own.
    port = free_port()
    proc = ServeProcess(serve_env(shipped_en_de, port, threads=2, grace_period_s=1,
                                  drain_delay_s=0, max_batch_size=128,
                                  max_batch_tokens=1_000_000))
    try:
        yield proc, port
    finally:
        proc.kill()


def test_sigterm_with_batches_longer_than_the_grace_period_exits_0(
        server: tuple[ServeProcess, int]) -> None:
    proc, port = server
    target = f"127.0.0.1:{port}"
    wait_serving(target, proc)
    # Beam 4 and at least 200 new tokens per text (no limit relative to its
    # length): the queue holds far more than the 1 s grace period's work.
    options = pb.DecodingOptions(beam_size=4, min_length=200, max_length=256,
                                 max_length_ratio=0)
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        calls = [stub.Translate.future(pb.TranslateRequest(texts=[TEXT] * TEXTS,
                                                           options=options), timeout=600)
                 for _ in range(CALLS)]
        time.sleep(3)  # the engines are inside their batches' ONNX Runtime runs
        stopped_at = time.monotonic()
        proc.signal(signal.SIGTERM)
        status = proc.finish(timeout=120)
        took = time.monotonic() - stopped_at
        codes = []
        for call in calls:
            try:
                call.result(timeout=60)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())
    assert "terminate called" not in proc.output
    assert status == 0, proc.output
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
    assert grpc.StatusCode.UNAVAILABLE in codes  # the batches were cut short ...
    assert took < 30, f"the stop took {took:.1f}s"  # ... not waited for
    assert "Traceback" not in proc.output
    assert proc.lines[-1].endswith("stopped")
