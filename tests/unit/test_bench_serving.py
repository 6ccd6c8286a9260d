"""The one `free_port` of the repository (bench/server/serving.py, the tests' too)."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import serving as test_serving

from seq2serve.bench.server import serving


def test_free_port_never_gives_the_same_port_twice_in_a_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The OS may pick a port again as soon as its probe socket is closed: here it
    # picks 1 twice (a port it never gives for port 0, so no other test had it).
    picks = iter([1, 1, 2])

    class Socket:
        def __enter__(self) -> Socket:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            assert address == ("127.0.0.1", 0)

        def getsockname(self) -> tuple[str, int]:
            return "127.0.0.1", next(picks)

    monkeypatch.setattr(serving, "socket", SimpleNamespace(socket=Socket))
    first = serving.free_port()  # handed out, not listened on yet
    assert (first, serving.free_port()) == (1, 2)


def test_free_ports_are_distinct_and_free() -> None:
    ports = [serving.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # nothing listens there


def test_the_tests_free_port_is_the_benchmarks() -> None:
    assert test_serving.free_port is serving.free_port
