"""Scale-out for real: nginx (deploy/nginx/seq2serve.conf) in front of 3 server
replicas on 127.0.0.1, one of them SIGTERMed a third of the way into a bounded
load. No call fails (drain delay + nginx's next-upstream, and for gRPC the
client's retry policy), the load is spread over every replica while all are up,
and the stopped replica drains and exits 0.

- gRPC (grpc_pass): a few thousand calls from the Python client through one
  HTTP/2 connection.
- HTTP (proxy_pass): LibreTranslate's POST /translate against
  `seq2serve serve --http-port` replicas. The HTTP block itself is also checked
  without the server, against stand-in replicas that echo what reached them:
  requests spread over all three, X-Forwarded-For ends with the client's
  address, Host is the client's, the file routes stick to one replica, and a
  replica answering 503 or gone is passed over.

The committed file passes `nginx -t` once rendered with this machine's ports."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
import system_tools
from deploy_helpers import (
    DEPLOY,
    Replica,
    free_port,
    nginx_main_config,
    record,
    replicas,
    stop_process,
)
from prometheus_client.parser import text_string_to_metric_families
from served_series import NOT_YET, http_front_door

from seq2serve.server.client import Seq2ServeClient

CALLS = 3000  # bounded by count and by CALL_SECONDS
HTTP_CALLS = 1500  # urllib opens a connection per request: half the calls, a run as long
CALL_SECONDS = 240.0
WORKERS = 8
DRAIN_DELAY_S = 2
GRACE_PERIOD_S = 10
TEXTS = ["Open the file and save your changes.",
         "A library for reading and writing compressed archives.",
         "Python bindings for the graphics library."]
# Each upstream of the committed file and which of a replica's ports it lists.
UPSTREAMS = {"seq2serve_grpc": "grpc", "seq2serve_http": "http", "seq2serve_http_files": "http"}
SERVER_LINE = r"^[ \t]*server 127\.0\.0\.1:\d+ (.*);$"


def _upstream(site: str, name: str, targets: list[str]) -> str:
    """`site` with upstream `name`'s server lines replaced by one per target, each
    with the committed parameters."""
    block = re.search(rf"^upstream {name} \{{\n(.*?)^\}}", site, re.M | re.S)
    assert block is not None, f"no upstream {name}"
    params = re.findall(SERVER_LINE, block.group(1), re.M)
    assert len(params) == 3 and len(set(params)) == 1, \
        f"the committed upstream {name} lists 3 replicas alike"
    lines = "".join(f"    server {target} {params[0]};\n" for target in targets)
    body = re.sub(rf"(?:{SERVER_LINE}\n)+", lambda _: lines, block.group(1), count=1,
                  flags=re.M)
    return site[:block.start(1)] + body + site[block.end(1):]


def render_config(tmp: Path, grpc_targets: list[str], http_targets: list[str], grpc_port: int,
                  http_port: int) -> Path:
    """The committed nginx config with this test's replicas and listen ports, inside
    a main config whose files all live in tmp."""
    site = (DEPLOY / "nginx" / "seq2serve.conf").read_text()
    assert set(re.findall(r"^upstream (\S+) \{", site, re.M)) == set(UPSTREAMS)
    for name, kind in UPSTREAMS.items():
        site = _upstream(site, name, grpc_targets if kind == "grpc" else http_targets)
    site, listens = re.subn(r"listen 127\.0\.0\.1:\d+ http2;",
                            f"listen 127.0.0.1:{grpc_port} http2;", site)
    assert listens == 1
    site, listens = re.subn(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{http_port};", site)
    assert listens == 1
    return nginx_main_config(tmp, site, log_format="$msec $upstream_addr $status")


@dataclass
class Front:
    """A running nginx: its gRPC and HTTP listen ports and its access log."""

    grpc_port: int
    http_port: int
    access_log: Path

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def nginx_check(tmp: Path, config: Path) -> None:
    check = subprocess.run([system_tools.path("nginx"), "-t", "-c", str(config),
                            "-p", str(tmp)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def nginx(tmp: Path, grpc_targets: list[str], http_targets: list[str]) -> Iterator[Front]:
    """nginx with the committed config in front of these replicas, until it listens."""
    binary = system_tools.path("nginx")
    front = Front(free_port(), free_port(), tmp / "access.log")
    config = render_config(tmp, grpc_targets, http_targets, front.grpc_port, front.http_port)
    nginx_check(tmp, config)
    process = subprocess.Popen([binary, "-c", str(config), "-p", str(tmp), "-g", "daemon off;"],
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not listening(front.http_port):
            assert process.poll() is None and time.monotonic() < deadline, \
                (tmp / "error.log").read_text()
            time.sleep(0.05)
        yield front
    finally:
        stop_process(process, 30, signal.SIGQUIT)  # nginx's graceful stop


@pytest.fixture()
def nginx_front(tmp_path: Path) -> Iterator[tuple[str, list[Replica], Path]]:
    system_tools.path("nginx")
    with replicas(tmp_path, 3, drain_delay_s=DRAIN_DELAY_S,
                  grace_period_s=GRACE_PERIOD_S) as members, \
            nginx(tmp_path, [r.target for r in members],
                  [f"127.0.0.1:{r.http_port}" for r in members]) as front:
        with Seq2ServeClient(front.grpc_target, timeout=10) as client:
            client.wait_until_serving(30)
        yield front.grpc_target, members, front.access_log


@pytest.mark.needs("nginx")
def test_committed_config_passes_nginx_t(tmp_path: Path) -> None:
    targets = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nginx_check(tmp_path, render_config(tmp_path, targets, targets, free_port(), free_port()))


def served(replica: Replica, name: str, **labels: str) -> float:
    """The sum of a counter's samples with these labels, from the replica's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{replica.metrics_port}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == name
               and all(sample.labels.get(k) == v for k, v in labels.items()))


def ok_calls(replica: Replica) -> float:
    """Translate calls the replica answered OK, from its own /metrics."""
    return served(replica, "seq2serve_requests_total", method="Translate", code="OK")


def ok_http_translations(replica: Replica) -> float:
    """POST /translate requests the replica answered 200, from its own /metrics."""
    return served(replica, "seq2serve_http_requests_total", route="/translate", status="200")


# --- the HTTP block against stand-in replicas -------------------------------------

class StandIn:
    """One replica's HTTP port, stood in for: every request is answered with what
    reached it (the stand-in's index, method, path, Host, X-Forwarded-For), with
    status 200, or 503 while `draining`. HTTP/1.0: one connection per request, so
    stop() leaves nothing open."""

    def __init__(self, index: int, address: str = "127.0.0.1", port: int = 0) -> None:
        self.index, self.draining = index, False
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stand_in.answer(self)

            do_POST = do_GET

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
                pass

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()
        self.stopped = False

    @property
    def target(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        seen = {"replica": self.index, "method": handler.command, "path": handler.path,
                "host": handler.headers.get("Host"),
                "forwarded_for": handler.headers.get("X-Forwarded-For")}
        body = json.dumps(seen).encode()
        handler.send_response(503 if self.draining else 200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.server.shutdown()
            self.server.server_close()


def fetch(url: str, body: dict[str, Any] | None = None, **headers: str) -> tuple[int, Any]:
    """(status, JSON body) of a GET, or of a POST of `body` as JSON."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.mark.needs("nginx")
def test_http_block_against_stand_in_replicas(tmp_path: Path) -> None:
    stand_ins = [StandIn(i) for i in range(3)]
    nowhere = [f"127.0.0.1:{free_port()}" for _ in range(3)]  # the gRPC upstreams: unused
    try:
        with nginx(tmp_path, nowhere, [s.target for s in stand_ins]) as front:
            url = front.http_url
            answers = [fetch(f"{url}/translate", {"q": "x", "source": "en", "target": "de"})
                       for _ in range(30)]
            assert {status for status, _ in answers} == {200}
            # Round robin, one request at a time: every replica gets its share.
            shares = Counter(seen["replica"] for _, seen in answers)
            assert sorted(shares) == [0, 1, 2] and min(shares.values()) >= 5, shares
            # The client's address, as nginx saw it, is the last hop; the Host is the
            # one the client asked for (download URLs point back at nginx).
            _, seen = answers[0]
            assert seen["forwarded_for"] == "127.0.0.1"
            assert seen["host"] == f"127.0.0.1:{front.http_port}"
            assert seen["method"] == "POST" and seen["path"] == "/translate"
            _, seen = fetch(f"{url}/languages", X_Forwarded_For="203.0.113.7")
            assert seen["forwarded_for"] == "203.0.113.7, 127.0.0.1"
            # One client's upload and downloads meet one replica.
            _, uploaded = fetch(f"{url}/translate_file", {"file": "x"})
            downloads = [fetch(f"{url}/download_file/{i}.txt")[1] for i in range(10)]
            assert {uploaded["replica"]} == {seen["replica"] for seen in downloads}
            assert downloads[0]["path"] == "/download_file/0.txt"
            # So do a document job's upload, status and result (/v1/jobs, DeepL's
            # /v2/document): the job lives in the jobs folder of the replica that took it.
            jobs = [fetch(f"{url}/v1/jobs", {"file": "x"})[1],
                    *(fetch(f"{url}/v1/jobs/{i}")[1] for i in range(5)),
                    fetch(f"{url}/v2/document", {"file": "x"})[1],
                    *(fetch(f"{url}/v2/document/{i}/result", {"document_key": "k"})[1]
                      for i in range(5))]
            assert {seen["replica"] for seen in jobs} == {uploaded["replica"]}
            # A draining replica's 503 and a stopped replica are passed over: POSTs too.
            stand_ins[0].draining = True
            stand_ins[1].stop()
            answers = [fetch(f"{url}/translate", {"q": "x", "source": "en", "target": "de"})
                       for _ in range(20)]
            assert answers == [(200, {**answers[0][1], "replica": 2})] * 20
    finally:
        for stand_in in stand_ins:
            stand_in.stop()


# --- the real thing ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.needs("nginx")
def test_sigterm_mid_run_fails_no_call_and_load_spreads(nginx_front) -> None:
    target, members, access_log = nginx_front
    victim = members[1]
    failures: list[str] = []
    latencies: list[float] = []
    done = 0
    lock = threading.Lock()
    shares_before: list[float] = []
    sigterm_at = CALLS // 3
    stopped = threading.Event()
    end = time.monotonic() + CALL_SECONDS

    with Seq2ServeClient(target, timeout=60) as client:
        def call(i: int) -> None:
            nonlocal done
            if time.monotonic() > end:
                return
            start = time.perf_counter()
            try:
                [[best]] = client.translate([TEXTS[i % len(TEXTS)]], model="en-de")
                assert best.text
            except grpc.RpcError as e:
                failures.append(f"{e.code().name}: {e.details()}")
            with lock:
                latencies.append(time.perf_counter() - start)
                done += 1
                if done == sigterm_at:
                    shares_before.extend(ok_calls(r) for r in members)
                    victim.terminate()
                    stopped.set()

        start = time.monotonic()
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(call, range(CALLS)))
        elapsed = time.monotonic() - start

    assert stopped.is_set() and len(latencies) == CALLS, "the run ended before its calls"
    assert failures == [], f"{len(failures)} failed calls, e.g. {failures[:3]}"
    # The SIGTERMed replica drained and exited 0 on its own.
    assert victim.process.wait(DRAIN_DELAY_S + GRACE_PERIOD_S + 30) == 0
    # While all 3 were up, each served a fair share (round-robin gives a third).
    total = sum(shares_before)
    assert total >= sigterm_at * 0.9
    assert all(share >= 0.2 * total for share in shares_before), shares_before
    # After the SIGTERM the victim still served calls for its drain delay, then
    # the other two carried the rest.
    others_before = sum(s for r, s in zip(members, shares_before, strict=True)
                        if r is not victim)
    others_after = sum(ok_calls(r) for r in members if r is not victim) - others_before
    assert others_after >= 0.5 * (CALLS - sigterm_at)
    record("nginx calls served by the SIGTERMed replica while draining (approx.)",
           CALLS - sigterm_at - others_after)
    retried = sum(", " in line for line in access_log.read_text().splitlines())

    latencies.sort()
    record("nginx calls", CALLS)
    record("nginx run s", round(elapsed, 1))
    record("nginx calls/s", round(CALLS / elapsed, 1))
    record("nginx p50 ms", round(1000 * latencies[len(latencies) // 2], 1))
    record("nginx p99 ms", round(1000 * latencies[int(len(latencies) * 0.99)], 1))
    record("nginx shares before SIGTERM", "/".join(str(int(s)) for s in shares_before))
    record("nginx calls passed to a next upstream", retried)


@pytest.mark.slow
@pytest.mark.needs("nginx")
def test_http_sigterm_mid_run_fails_no_request_and_load_spreads(tmp_path: Path) -> None:
    """The gRPC test's run over HTTP: LibreTranslate's POST /translate through
    nginx's proxy_pass to `seq2serve serve --http-port` replicas."""
    if not http_front_door():
        pytest.skip(NOT_YET)
    system_tools.path("nginx")
    with replicas(tmp_path, 3, drain_delay_s=DRAIN_DELAY_S,
                  grace_period_s=GRACE_PERIOD_S) as members, \
            nginx(tmp_path, [r.target for r in members],
                  [f"127.0.0.1:{r.http_port}" for r in members]) as front:
        deadline = time.monotonic() + 30
        while fetch(f"{front.http_url}/health") != (200, {"status": "ok"}):
            assert time.monotonic() < deadline, "nginx's /health never answered 200"
            time.sleep(0.2)
        victim = members[1]
        failures: list[str] = []
        latencies: list[float] = []
        done = 0
        lock = threading.Lock()
        shares_before: list[float] = []
        sigterm_at = HTTP_CALLS // 3
        stopped = threading.Event()
        end = time.monotonic() + CALL_SECONDS

        def call(i: int) -> None:
            nonlocal done
            if time.monotonic() > end:
                return
            start = time.perf_counter()
            try:
                status, body = fetch(f"{front.http_url}/translate",
                                     {"q": TEXTS[i % len(TEXTS)], "source": "en", "target": "de"})
                if status != 200 or not body.get("translatedText"):
                    failures.append(f"{status}: {body}")
            except (OSError, ValueError) as e:
                failures.append(repr(e))
            with lock:
                latencies.append(time.perf_counter() - start)
                done += 1
                if done == sigterm_at:
                    shares_before.extend(ok_http_translations(r) for r in members)
                    victim.terminate()
                    stopped.set()

        start = time.monotonic()
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(call, range(HTTP_CALLS)))
        elapsed = time.monotonic() - start

        assert stopped.is_set() and len(latencies) == HTTP_CALLS, "the run ended before its calls"
        assert failures == [], f"{len(failures)} failed requests, e.g. {failures[:3]}"
        assert victim.process.wait(DRAIN_DELAY_S + GRACE_PERIOD_S + 30) == 0
        total = sum(shares_before)
        assert total >= sigterm_at * 0.9
        assert all(share >= 0.2 * total for share in shares_before), shares_before
        others_before = sum(s for r, s in zip(members, shares_before, strict=True)
                            if r is not victim)
        others_after = sum(ok_http_translations(r) for r in members
                           if r is not victim) - others_before
        assert others_after >= 0.5 * (HTTP_CALLS - sigterm_at)
        retried = sum(", " in line for line in front.access_log.read_text().splitlines())

    latencies.sort()
    record("nginx HTTP requests", HTTP_CALLS)
    record("nginx HTTP requests/s", round(HTTP_CALLS / elapsed, 1))
    record("nginx HTTP p50 ms", round(1000 * latencies[len(latencies) // 2], 1))
    record("nginx HTTP p99 ms", round(1000 * latencies[int(len(latencies) * 0.99)], 1))
    record("nginx HTTP shares before SIGTERM", "/".join(str(int(s)) for s in shares_before))
    record("nginx HTTP requests passed to a next upstream", retried)
