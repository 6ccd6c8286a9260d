"""The Python client's service config: a call that meets UNAVAILABLE (a draining
or restarting replica) or CANCELLED (gRPC's own shutdown, grpc/grpc#41785) is sent
again, any other status is final; a target with many addresses gets its calls
spread round-robin."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.client import CHANNEL_OPTIONS, RETRY_POLICY, Seq2ServeClient


class Flaky(pb_grpc.TranslatorServicer):
    """Answers the first `failures` calls with `code`, then echoes the texts."""

    def __init__(self, failures: int, code: grpc.StatusCode) -> None:
        self.failures, self.code, self.calls = failures, code, 0

    def Translate(self, request, context):
        self.calls += 1
        if self.calls <= self.failures:
            context.abort(self.code, f"attempt {self.calls} refused")
        return pb.TranslateResponse(model="m", translations=[
            pb.Translation(hypotheses=[pb.Hypothesis(text=t)]) for t in request.texts])


@pytest.fixture()
def serve() -> Iterator:
    servers: list[grpc.Server] = []

    def start(servicer: Flaky) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_TranslatorServicer_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(None)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED])
def test_a_closing_replicas_codes_are_retried_until_an_answer(serve, code) -> None:
    flaky = Flaky(failures=RETRY_POLICY["maxAttempts"] - 1, code=code)
    with Seq2ServeClient(serve(flaky), timeout=10) as client:
        [[hyp]] = client.translate(["hello"])
    assert hyp.text == "hello"
    assert flaky.calls == RETRY_POLICY["maxAttempts"]


def test_retries_stop_at_max_attempts(serve) -> None:
    flaky = Flaky(failures=100, code=grpc.StatusCode.UNAVAILABLE)
    with Seq2ServeClient(serve(flaky), timeout=10) as client:
        with pytest.raises(grpc.RpcError) as e:
            client.translate(["hello"])
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert flaky.calls == RETRY_POLICY["maxAttempts"]


def test_retries_are_throttled_when_most_calls_fail(serve) -> None:
    """gRPC's token bucket (maxTokens 10, each failure -1): the first call's five
    failures leave 5 tokens, at which retries stop; the next call is tried once."""
    flaky = Flaky(failures=100, code=grpc.StatusCode.UNAVAILABLE)
    with Seq2ServeClient(serve(flaky), timeout=10) as client:
        for _ in range(2):
            with pytest.raises(grpc.RpcError):
                client.translate(["hello"])
    assert flaky.calls == RETRY_POLICY["maxAttempts"] + 1


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  grpc.StatusCode.INTERNAL])
def test_other_codes_are_not_retried(serve, code) -> None:
    flaky = Flaky(failures=1, code=code)
    with Seq2ServeClient(serve(flaky), timeout=10) as client:
        with pytest.raises(grpc.RpcError) as e:
            client.translate(["hello"])
    assert e.value.code() == code and flaky.calls == 1


def test_service_config_names_the_real_service() -> None:
    config = json.loads(dict(CHANNEL_OPTIONS)["grpc.service_config"])
    [method] = config["methodConfig"]
    assert method["name"] == [{"service": pb.DESCRIPTOR.services_by_name["Translator"]
                               .full_name}]
    assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE", "CANCELLED"]
    assert config["retryThrottling"] == {"maxTokens": 10, "tokenRatio": 0.1}


def test_calls_spread_round_robin_over_a_multi_address_target(serve) -> None:
    servers = [Flaky(failures=0, code=grpc.StatusCode.OK) for _ in range(3)]
    addresses = [serve(s).removeprefix("127.0.0.1:") for s in servers]
    target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in addresses)
    with Seq2ServeClient(target, timeout=10) as client:
        # round_robin picks among connected servers: let all three connect first.
        deadline = time.monotonic() + 10
        while min(s.calls for s in servers) == 0 and time.monotonic() < deadline:
            client.translate(["warm-up"])
        before = [s.calls for s in servers]
        for _ in range(30):
            client.translate(["hello"])
    shares = [s.calls - b for s, b in zip(servers, before, strict=True)]
    assert sum(shares) == 30
    assert all(share >= 5 for share in shares), shares
