"""`seq2serve health` against grpcio's own health servicer (the reference
implementation) on loopback: exit status and the one line it prints."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from serving import free_port

from seq2serve.server.cli.main import main
from seq2serve.server.client import default_target

SERVICE = "seq2serve.v1.Translator"


@pytest.fixture()
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


def _set(servicer: health.HealthServicer, service: str, serving: bool) -> None:
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING if serving
                 else health_pb2.HealthCheckResponse.NOT_SERVING)


def test_serving_exits_0_and_prints_the_status(health_server, capsys) -> None:
    target, servicer = health_server
    _set(servicer, "", True)
    assert main(["health", "--server", target]) == 0
    out, err = capsys.readouterr()
    assert out == "SERVING\n" and err == ""


def test_not_serving_exits_1_with_one_line_on_stderr(health_server, capsys) -> None:
    target, servicer = health_server
    _set(servicer, "", False)
    assert main(["health", "--server", target]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == f"seq2serve health: {target}: NOT_SERVING\n"


def test_a_service_is_checked_on_its_own(health_server, capsys) -> None:
    target, servicer = health_server
    _set(servicer, "", True)
    _set(servicer, SERVICE, False)
    assert main(["health", "--server", target, "--service", SERVICE]) == 1
    _set(servicer, SERVICE, True)
    assert main(["health", "--server", target, "--service", SERVICE]) == 0


def test_unknown_service_exits_1_naming_it(health_server, capsys) -> None:
    target, _ = health_server
    assert main(["health", "--server", target, "--service", "no.Such"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'no.Such'" in err and "NOT_FOUND" in err


def test_no_server_exits_1_with_unavailable(capsys) -> None:
    port = free_port()  # nobody listens there
    assert main(["health", "--server", f"127.0.0.1:{port}", "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("seq2serve health: ") and "UNAVAILABLE" in err
    assert err.count("\n") == 1


def test_bad_timeout_is_refused(capsys) -> None:
    assert main(["health", "--timeout", "0"]) == 1
    assert "--timeout must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["health", "translate", "translate_file", "summarize"])
def test_every_client_command_finds_the_server_by_the_server_variables(
        command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import importlib

    monkeypatch.setenv("SEQ2SERVE_HOST", "0.0.0.0")
    monkeypatch.setenv("SEQ2SERVE_PORT", "6000")
    parser = argparse.ArgumentParser()
    importlib.import_module(f"seq2serve.server.cli.{command}").configure(parser)
    assert parser.get_default("server") == "127.0.0.1:6000"


def test_default_target_follows_the_server_variables() -> None:
    target = default_target
    assert target({"SEQ2SERVE_PORT": "6000"}) == "127.0.0.1:6000"
    assert target({"SEQ2SERVE_PORT": " "}) == "127.0.0.1:50051"
    assert target({}) == "127.0.0.1:50051"
    assert target({"SEQ2SERVE_HOST": "0.0.0.0", "SEQ2SERVE_PORT": "7"}) == "127.0.0.1:7"
    assert target({"SEQ2SERVE_HOST": "10.1.2.3", "SEQ2SERVE_PORT": "7"}) == "10.1.2.3:7"
    assert target({"SEQ2SERVE_HOST": "10.1.2.3"}) == "10.1.2.3:50051"
    assert target({"SEQ2SERVE_HOST": "::1", "SEQ2SERVE_PORT": "7"}) == "[::1]:7"
    assert target({"SEQ2SERVE_HOST": "::", "SEQ2SERVE_PORT": "7"}) == "127.0.0.1:7"
