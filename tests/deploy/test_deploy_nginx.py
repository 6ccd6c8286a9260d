"""Scale-out for real: nginx (deploy/nginx/seq2serve.conf, grpc_pass) in front of
3 server replicas on 127.0.0.1, a bounded load of a few thousand calls from the
Python client through one HTTP/2 connection, and one replica SIGTERMed mid-run.
No call fails (drain delay + nginx's next-upstream + the client's retry policy),
the load is spread over every replica while all are up, and the stopped replica
drains and exits 0."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from deploy_helpers import DEPLOY, Replica, free_port, record, replicas, stop_process, tool
from prometheus_client.parser import text_string_to_metric_families

from seq2serve.server.client import Seq2ServeClient

pytestmark = pytest.mark.slow
CALLS = 3000  # bounded by count and by CALL_SECONDS
CALL_SECONDS = 240.0
WORKERS = 8
DRAIN_DELAY_S = 2
GRACE_PERIOD_S = 10
TEXTS = ["Open the file and save your changes.",
         "A library for reading and writing compressed archives.",
         "Python bindings for the graphics library."]


def render_config(tmp: Path, upstreams: list[Replica], port: int) -> Path:
    """The committed nginx config with this test's replicas and listen port, inside
    a main config whose files all live in tmp."""
    site = (DEPLOY / "nginx" / "seq2serve.conf").read_text()
    servers = re.findall(r"^\s*server 127\.0\.0\.1:\d+ (.*);$", site, re.M)
    assert len(servers) == 3, "the committed upstream block lists 3 replicas"
    lines = "\n".join(f"    server {r.target} {servers[0]};" for r in upstreams)
    site = re.sub(r"(?:^\s*server 127\.0\.0\.1:\d+ .*;\n)+", lines + "\n", site, flags=re.M)
    site, listens = re.subn(r"listen 127\.0\.0\.1:\d+ http2;", f"listen 127.0.0.1:{port} http2;",
                            site)
    assert listens == 1
    (tmp / "seq2serve.conf").write_text(site)
    main = tmp / "nginx.conf"
    main.write_text(f"""
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format calls '$msec $upstream_addr $status';
    access_log {tmp}/access.log calls;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/seq2serve.conf;
}}
""")
    return main


@pytest.fixture()
def nginx_front(tmp_path: Path) -> Iterator[tuple[str, list[Replica], Path]]:
    binary = tool("nginx", "Debian nginx-light")
    with replicas(tmp_path, 3, drain_delay_s=DRAIN_DELAY_S,
                  grace_period_s=GRACE_PERIOD_S) as members:
        port = free_port()
        config = render_config(tmp_path, members, port)
        check = subprocess.run([binary, "-t", "-c", str(config), "-p", str(tmp_path)],
                               capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        process = subprocess.Popen([binary, "-c", str(config), "-p", str(tmp_path),
                                    "-g", "daemon off;"], stderr=subprocess.PIPE)
        try:
            with Seq2ServeClient(f"127.0.0.1:{port}", timeout=10) as client:
                client.wait_until_serving(30)
            yield f"127.0.0.1:{port}", members, tmp_path / "access.log"
        finally:
            stop_process(process, 30, signal.SIGQUIT)  # nginx's graceful stop


def ok_calls(replica: Replica) -> float:
    """Translate calls the replica answered OK, from its own /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{replica.metrics_port}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == "seq2serve_requests_total"
               and sample.labels.get("method") == "Translate"
               and sample.labels.get("code") == "OK")


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
