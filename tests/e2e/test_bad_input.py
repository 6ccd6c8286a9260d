"""What an independent prober found: inputs that broke the server or its answers."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import CORPUS
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serving import RunningServer, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.core.translator import Translator

TWO_SENTENCES = f"{CORPUS[0]} {CORPUS[1]}"


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[RunningServer]:
    # The default request limits: 64 texts of 10,000 characters.
    running = RunningServer(server_config(models_dir, max_length_cap=64))
    yield running
    running.stop()


def requests_total(server: RunningServer, method: str, code: str, model: str = "(none)") -> float:
    value = server.server.metrics.registry.get_sample_value(
        "seq2serve_requests_total", {"model": model, "method": method, "code": code})
    return value or 0.0


@pytest.mark.parametrize("length_penalty", [-1.0, 10.0])
def test_length_penalty_at_the_ends_of_its_range_returns_every_hypothesis(
        stub: pb_grpc.TranslatorStub, length_penalty: float) -> None:
    """-6 used to fail INTERNAL on a two-sentence text, -20 to answer OK with no
    hypotheses; the ends of the valid range answer in full."""
    options = pb.DecodingOptions(beam_size=4, num_hypotheses=4, length_penalty=length_penalty,
                                 max_length=40, return_scores=True)
    request = pb.TranslateRequest(texts=[TWO_SENTENCES, CORPUS[2]], options=options)
    response = stub.Translate(request, timeout=120)
    assert [len(t.hypotheses) for t in response.translations] == [4, 4]
    [*_, final] = stub.TranslateStream(pb.TranslateRequest(texts=[TWO_SENTENCES],
                                                           options=options), timeout=120)
    assert final.final and len(final.translation.hypotheses) == 4
    assert final.translation == response.translations[0]


def test_empty_text_gets_as_many_hypotheses_as_asked(stub: pb_grpc.TranslatorStub) -> None:
    response = stub.Translate(pb.TranslateRequest(
        texts=["", " "], options=pb.DecodingOptions(beam_size=3, num_hypotheses=3)), timeout=60)
    assert [[h.text for h in t.hypotheses] for t in response.translations] == [
        [""] * 3, [" "] * 3]


@pytest.mark.parametrize("field", ["model", "source_language", "target_language"])
def test_a_huge_echoed_value_gives_the_same_status_every_time(
        stub: pb_grpc.TranslatorStub, field: str) -> None:
    request = pb.TranslateRequest(texts=["Hello"], **{field: "m" * 65536})
    for _ in range(10):
        with pytest.raises(grpc.RpcError) as err:
            stub.Translate(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "... (65536 characters)" in err.value.details()
        assert len(err.value.details()) < 1000


def test_an_answer_above_the_message_limit_is_refused_cleanly(
        models_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    running = RunningServer(server_config(models_dir, max_message_bytes=1024,
                                          max_length_cap=64))
    try:
        options = pb.DecodingOptions(beam_size=16, num_hypotheses=16, min_length=30,
                                     max_length=40, return_token_ids=True,
                                     return_alignment=True, return_scores=True)
        request = pb.TranslateRequest(texts=[CORPUS[0]], options=options)
        assert request.ByteSize() < 1024
        with grpc.insecure_channel(running.target) as channel, caplog.at_level(logging.INFO):
            stub = pb_grpc.TranslatorStub(channel)
            for call in (stub.Translate, lambda r, timeout: list(stub.TranslateStream(
                    r, timeout=timeout))):
                with pytest.raises(grpc.RpcError) as err:
                    call(request, timeout=120)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "above this server's limit of 1024 (--max-message-bytes)" in \
                    err.value.details()
            small = stub.Translate(pb.TranslateRequest(texts=["Hello"]), timeout=60)
            assert len(small.translations) == 1
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    finally:
        running.stop()


def test_a_stray_value_error_is_internal_and_logged_with_the_method(
        server: RunningServer, stub: pb_grpc.TranslatorStub, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: Any) -> Any:
        raise ValueError("a bug, not the client's fault")

    monkeypatch.setattr(Translator, "_prepare", broken)
    with pytest.raises(grpc.RpcError) as err, caplog.at_level(logging.ERROR):
        stub.Translate(pb.TranslateRequest(texts=["Hello"]), timeout=30)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "a bug" not in err.value.details()  # internals stay on the server
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage() == "unhandled error in /seq2serve.v1.Translator/Translate"
    assert record.exc_info is not None and "a bug" in str(record.exc_info[1])
    assert requests_total(server, "Translate", "INTERNAL", "opus-mt-en-de") >= 1


def test_an_undecodable_request_is_counted(server: RunningServer) -> None:
    before = requests_total(server, "Translate", "INVALID_ARGUMENT")
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_unary("/seq2serve.v1.Translator/Translate",
                                   request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as err:
            call(b"\x12\x02\xff\xfe", timeout=30)  # texts: invalid UTF-8
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert requests_total(server, "Translate", "INVALID_ARGUMENT") == before + 1


def test_a_cancelled_stream_logs_no_error(server: RunningServer, stub: pb_grpc.TranslatorStub,
                                          caplog: pytest.LogCaptureFixture) -> None:
    unretrieved: list[dict[str, Any]] = []
    server.loop.set_exception_handler(lambda loop, context: unretrieved.append(context))
    before = requests_total(server, "TranslateStream", "CANCELLED", "opus-mt-en-de")
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(3):
                stream = stub.TranslateStream(pb.TranslateRequest(
                    texts=[TWO_SENTENCES], options=pb.DecodingOptions(
                        beam_size=1, min_length=60, max_length=64)), timeout=120)
                next(stream)  # the first token is out: the call is mid-stream
                stream.cancel()
            # Wait until the server has seen every cancellation, then collect the futures
            # that asyncio would complain about.
            while requests_total(server, "TranslateStream", "CANCELLED",
                                 "opus-mt-en-de") < before + 3:
                server.call(asyncio.sleep(0.05))
            server.call(_collect())
        assert unretrieved == []
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        server.loop.set_exception_handler(None)


async def _collect() -> None:
    await asyncio.sleep(0.2)  # let the engine deliver the cancelled items
    gc.collect()


class BlockingTokenizer:
    """The model's tokenizer, held at its first encode until released."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.started, self.release = threading.Event(), threading.Event()

    def encode(self, text: str, language: int | None = None) -> list[int]:
        self.started.set()
        self.release.wait(120)
        return self.inner.encode(text, language)

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids)


def test_health_answers_while_a_huge_request_is_prepared(server: RunningServer) -> None:
    [handle] = server.server.registry.handles()
    blocking = BlockingTokenizer(handle.tokenizer)
    handle.tokenizer = blocking
    text = " ".join(CORPUS * 200)[:10_000]
    request = pb.TranslateRequest(texts=[text] * 64)
    try:
        with grpc.insecure_channel(server.target) as channel, ThreadPoolExecutor(1) as pool:
            big = pool.submit(pb_grpc.TranslatorStub(channel).Translate, request, timeout=300)
            assert blocking.started.wait(120)
            # The big request is being segmented and tokenized right now ...
            check = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=60)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            assert not big.done()  # ... and still is, while health has answered
            blocking.release.set()
            with pytest.raises(grpc.RpcError) as err:
                big.result()
        # 64 x 10,000 characters make more sentence pieces than the queue holds.
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "(the queue size)" in err.value.details()
    finally:
        blocking.release.set()
        handle.tokenizer = blocking.inner
