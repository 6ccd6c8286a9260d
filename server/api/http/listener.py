"""The HTTP listener: uvicorn serving the app inside the running event loop.

The socket is bound here, so that a busy port fails the start with one line
(uvicorn itself would exit the process). uvicorn's own signal handling is not
used: the process's lifecycle (server/app.py) decides when to stop, and stop()
closes the listener, then lets requests in flight finish within the grace period.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import socket
import ssl
from pathlib import Path

import uvicorn
from fastapi import FastAPI

log = logging.getLogger("seq2serve.server")


class ListenError(Exception):
    """The port cannot be bound; the message is one line naming it."""


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ListenError(f"cannot listen for HTTP on {host}:{port}: the host does not resolve "
                          f"({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        hint = (" (another process listens there; is a server already running?)"
                if e.errno == errno.EADDRINUSE else "")
        raise ListenError(f"cannot listen for HTTP on {host}:{port}: {e.strerror}{hint}") from None
    sock.setblocking(False)
    return sock


class HttpListener:
    def __init__(self, app: FastAPI, host: str, port: int, tls_cert: Path | None = None,
                 tls_key: Path | None = None, tls_client_ca: Path | None = None) -> None:
        self.socket = bind(host, port)
        self.host = host
        self.port: int = self.socket.getsockname()[1]
        self.tls = tls_cert is not None
        self.config = uvicorn.Config(
            app, lifespan="off", log_level="warning", access_log=False, server_header=False,
            http="httptools",  # the C parser; uvicorn falls back to pure-Python h11 unasked
            proxy_headers=False,  # X-Forwarded-For is read only from trusted proxies (access.py)
            ssl_certfile=str(tls_cert) if tls_cert else None,
            ssl_keyfile=str(tls_key) if tls_key else None,
            ssl_ca_certs=str(tls_client_ca) if tls_client_ca else None,
            ssl_cert_reqs=ssl.CERT_REQUIRED if tls_client_ca else ssl.CERT_NONE)
        self.server = uvicorn.Server(self.config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.config.load()
        self.server.lifespan = self.config.lifespan_class(self.config)
        await self.server.startup(sockets=[self.socket])
        log.info("HTTP on %s://%s:%d", "https" if self.tls else "http", self.host, self.port)
        self._task = asyncio.create_task(self.server.main_loop())

    async def stop(self, grace: float) -> None:
        """Close the listener; requests in flight get `grace` seconds, then are
        cancelled."""
        if self._task is None:
            self.socket.close()
            return
        self.server.should_exit = True
        await self._task
        self.config.timeout_graceful_shutdown = math.ceil(grace)  # read by shutdown()
        await self.server.shutdown(sockets=[self.socket])
        self._task = None
