"""Routing by model behind Debian's nginx, for real:

- deploy/nginx/seq2serve-by-model.conf in front of two `seq2serve serve`
  processes holding different models (one --models-dir with en-de, one with
  en-fr): each gRPC call and HTTP request naming its model or pair in a header
  reaches the replica that holds it (the replicas' own /metrics and nginx's
  access log say so), is answered by that model (the answer's trailing metadata
  / header) with the translation the replica gives directly, and one naming
  nothing goes to the default pool.
- The Kubernetes proxy's config (deploy/kustomize/overlays/by-model/nginx.conf:
  `resolver` and variables in proxy_pass / grpc_pass, because nginx 1.22 resolves
  an upstream's names once, at start) against dnsmasq standing in for cluster DNS
  and stand-in pods on 127.0.0.x: requests spread over a headless Service's
  addresses, and when the Service's addresses change (a pod gone, a pod added)
  nginx follows within the resolver's `valid` time, without a reload."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import system_tools
from deploy_helpers import (
    DEPLOY,
    Replica,
    free_port,
    models_dir,
    nginx_main_config,
    start_replica,
    stop_process,
)
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_nginx import StandIn, fetch

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

BY_MODEL = DEPLOY / "nginx" / "seq2serve-by-model.conf"
KUBERNETES = DEPLOY / "kustomize" / "overlays" / "by-model" / "nginx.conf"
TEXT = "Open the file and save your changes."
SERVER_LINE = r"^[ \t]*server (\S+) (.*);$"
CALLS = 24  # per front door: a bounded run, half per model


def render_upstreams(site: str, targets: dict[str, list[str]]) -> str:
    """`site` with each named upstream's server lines replaced by one per target, each
    with the committed parameters; every upstream of the file must be named."""
    assert set(re.findall(r"^upstream (\S+) \{", site, re.M)) == set(targets)
    for name, addresses in targets.items():
        block = re.search(rf"^upstream {name} \{{\n(.*?)^\}}", site, re.M | re.S)
        assert block is not None
        [params] = {p for _, p in re.findall(SERVER_LINE, block.group(1), re.M)}
        lines = "".join(f"    server {address} {params};\n" for address in addresses)
        body = re.sub(rf"(?:{SERVER_LINE}\n)+", lambda _, lines=lines: lines, block.group(1),
                      count=1, flags=re.M)
        site = site[:block.start(1)] + body + site[block.end(1):]
    return site


def listen_on(site: str, grpc_port: int, http_port: int) -> str:
    """The site listening on this test's ports, on 127.0.0.1 (whatever address it had)."""
    site, n = re.subn(r"^(\s*)listen (?:127\.0\.0\.1:)?\d+ http2;",
                      rf"\1listen 127.0.0.1:{grpc_port} http2;", site, flags=re.M)
    assert n == 1
    site, n = re.subn(r"^(\s*)listen (?:127\.0\.0\.1:)?\d+;",
                      rf"\1listen 127.0.0.1:{http_port};", site, flags=re.M)
    assert n == 1
    return site


def listening(address: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((address, port)) == 0


@contextlib.contextmanager
def nginx(tmp: Path, site: str, grpc_port: int, http_port: int) -> Iterator[Path]:
    """nginx with `site`, until it listens; yields its access log."""
    binary = system_tools.path("nginx")
    config = nginx_main_config(tmp, listen_on(site, grpc_port, http_port))
    check = subprocess.run([binary, "-t", "-c", str(config), "-p", str(tmp)],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    process = subprocess.Popen([binary, "-c", str(config), "-p", str(tmp), "-g", "daemon off;"],
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not listening("127.0.0.1", http_port):
            assert process.poll() is None and time.monotonic() < deadline, \
                (tmp / "error.log").read_text()
            time.sleep(0.05)
        yield tmp / "access.log"
    finally:
        stop_process(process, 30, signal.SIGQUIT)


def upstreams(access_log: Path, skip: int = 0) -> list[str]:
    """The upstream address of each logged request after the first `skip`."""
    return [line.split()[0] for line in access_log.read_text().splitlines()[skip:]]


def logged(access_log: Path, count: int, skip: int = 0) -> list[str]:
    """`upstreams` once nginx has logged `count` requests after the first `skip`: it
    writes a request's line when the request ends, which can be just after its client
    has the answer (a gRPC stream's end)."""
    deadline = time.monotonic() + 10
    while len(seen := upstreams(access_log, skip)) < count:
        assert time.monotonic() < deadline, f"nginx logged {len(seen)} of {count} requests"
        time.sleep(0.05)
    return seen


def served(replica: Replica, model: str) -> float:
    """Translate calls of `model` the replica answered OK, from its own /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{replica.metrics_port}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "seq2serve_requests_total" and s.labels.get("model") == model
               and s.labels.get("code") == "OK")


# --- by model: two real servers -------------------------------------------------------

@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Replica]]:
    system_tools.path("nginx")
    tmp = tmp_path_factory.mktemp("by-model")
    started = {model: start_replica(tmp, models_dir(tmp / f"models-{model}", [model]))
               for model in ("en-de", "en-fr")}
    try:
        for replica in started.values():
            replica.wait_serving()
        yield started
    finally:
        for replica in started.values():
            replica.terminate()
        for replica in started.values():
            replica.stop()


@pytest.mark.needs("nginx")
def test_committed_by_model_config_passes_nginx_t(tmp_path: Path) -> None:
    site = BY_MODEL.read_text()
    names = re.findall(r"^upstream (\S+) \{", site, re.M)
    targets = {name: [f"127.0.0.1:{free_port()}"] for name in names}
    config = nginx_main_config(tmp_path, listen_on(render_upstreams(site, targets), free_port(),
                                             free_port()))
    check = subprocess.run([system_tools.path("nginx"), "-t", "-c", str(config), "-p",
                            str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr


@pytest.mark.slow
@pytest.mark.needs("nginx")
def test_each_model_reaches_the_replicas_that_hold_it(pools: dict[str, Replica],
                                                       tmp_path: Path) -> None:
    de, fr = pools["en-de"], pools["en-fr"]
    grpc_of = {"en-de": de.target, "en-fr": fr.target}
    http_of = {"en-de": f"127.0.0.1:{de.http_port}", "en-fr": f"127.0.0.1:{fr.http_port}"}
    site = render_upstreams(BY_MODEL.read_text(), {
        "seq2serve_grpc_en_de": [grpc_of["en-de"]], "seq2serve_grpc_en_fr": [grpc_of["en-fr"]],
        "seq2serve_http_en_de": [http_of["en-de"]], "seq2serve_http_en_fr": [http_of["en-fr"]],
        "seq2serve_http_files": [http_of["en-de"]]})
    grpc_port, http_port = free_port(), free_port()
    # What each replica answers directly, by the body alone: the reference.
    direct = {}
    for model, replica in pools.items():
        with grpc.insecure_channel(replica.target) as channel:
            answer = pb_grpc.TranslatorStub(channel).Translate(
                pb.TranslateRequest(texts=[TEXT], model=model), timeout=120)
        direct[model] = answer.translations[0].hypotheses[0].text
    assert direct["en-de"] != direct["en-fr"]
    before = {model: served(replica, model) for model, replica in pools.items()}

    with nginx(tmp_path, site, grpc_port, http_port) as access_log, \
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.TranslatorStub(channel)
        for i in range(CALLS):
            model = ("en-de", "en-fr")[i % 2]
            key = ("seq2serve-model", "seq2serve-pair")[(i // 2) % 2]
            response, call = stub.Translate.with_call(pb.TranslateRequest(texts=[TEXT]),
                                                      timeout=120, metadata=[(key, model)])
            assert response.translations[0].hypotheses[0].text == direct[model]
            assert ("seq2serve-model", model) in call.trailing_metadata()
        grpc_seen = logged(access_log, CALLS)
        assert Counter(grpc_seen) == {grpc_of["en-de"]: CALLS // 2,
                                      grpc_of["en-fr"]: CALLS // 2}
        # Named nowhere but in the body: the default pool (en-de's), which has no en-fr.
        with pytest.raises(grpc.RpcError) as missing:
            stub.Translate(pb.TranslateRequest(texts=[TEXT], model="en-fr"), timeout=120)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND

        url = f"http://127.0.0.1:{http_port}/translate"
        skip = len(logged(access_log, CALLS + 1))  # the refused call's line too
        for i in range(CALLS):
            model = ("en-de", "en-fr")[i % 2]
            header = ("X_Seq2serve_Model", "X_Seq2serve_Pair")[(i // 2) % 2]
            status, body = fetch(url, {"q": TEXT, "source": "en", "target": model[3:]},
                                 **{header: model})
            assert (status, body["translatedText"]) == (200, direct[model]), body
        assert Counter(logged(access_log, CALLS, skip)) == {http_of["en-de"]: CALLS // 2,
                                                        http_of["en-fr"]: CALLS // 2}
        status, body = fetch(url, {"q": TEXT, "source": "en", "target": "fr"})
        assert status == 400 and "fr" in body["error"], body  # the default pool: en-de only
    # Each replica's own count: every call of its model, none of the other's.
    after = {model: served(replica, model) for model, replica in pools.items()}
    assert {m: after[m] - before[m] for m in after} == {"en-de": CALLS // 2,
                                                       "en-fr": CALLS // 2}
    assert served(de, "en-fr") == 0 and served(fr, "en-de") == 0


# --- Kubernetes: re-resolving a headless Service --------------------------------------

class Dns:
    """dnsmasq answering from a hosts file of our own (rewritten, then SIGHUP). The
    first names are written before it starts: a SIGHUP that reaches dnsmasq before it
    has set its handler ends it (then nginx answers 502)."""

    def __init__(self, tmp: Path, names: dict[str, list[str]]) -> None:
        self.hosts = tmp / "hosts"
        self._write(names)
        self.port = free_port()
        self.process = subprocess.Popen(
            [system_tools.path("dnsmasq"), "--keep-in-foreground", "--no-resolv",
             "--no-hosts", f"--addn-hosts={self.hosts}", f"--port={self.port}",
             "--listen-address=127.0.0.1", "--bind-interfaces", "--local-ttl=1",
             f"--pid-file={tmp / 'dnsmasq.pid'}", "--user=root", "--log-facility=-"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _write(self, names: dict[str, list[str]]) -> None:
        self.hosts.write_text("".join(f"{a} {n}\n" for n, addrs in names.items()
                                      for a in addrs))

    def serve(self, names: dict[str, list[str]]) -> None:
        self._write(names)
        self.process.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        stop_process(self.process, 10)


def kubernetes_site(dns_port: int, ports: dict[str, int]) -> str:
    """The overlay's nginx config with this test's resolver, valid time and the
    Services' ports (`ports`: the committed port -> this test's)."""
    site = KUBERNETES.read_text()
    site, n = re.subn(r"^(\s*)resolver \S+( valid=\S+)?(.*);$",
                      rf"\1resolver 127.0.0.1:{dns_port} valid=1s\3;", site, flags=re.M)
    assert n == 1
    for committed, port in ports.items():
        site, n = re.subn(rf"(\.svc\.cluster\.local):{committed};", rf"\1:{port};", site)
        assert n, committed
    assert not re.search(r"\.svc\.cluster\.local:(?!(?:{})\b)".format(
        "|".join(map(str, ports.values()))), site), "a Service port left unrendered"
    return site


def grpc_stand_in(address: str, port: int) -> grpc.Server:
    """A pod's gRPC port, stood in for by the health service (SERVING)."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(f"{address}:{port}")
    server.start()
    return server


@pytest.mark.slow
@pytest.mark.needs("nginx", "dnsmasq")
def test_kubernetes_proxy_follows_the_headless_service(tmp_path: Path) -> None:
    fqdn = "seq2serve-headless-en-de.seq2serve.svc.cluster.local"
    assert re.search(r"seq2serve-headless-\$seq2serve_(grpc|http)_set\.seq2serve\.svc",
                     KUBERNETES.read_text())
    addresses = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    grpc_port, http_port = free_port(), free_port()  # nginx's
    service = {"grpc": free_port(), "http": free_port()}  # each pod's (the Service's)
    http_stand_ins: list[StandIn] = []
    grpc_servers: list[grpc.Server] = []
    dns = Dns(tmp_path, {fqdn: addresses[:2]})
    try:
        for i, address in enumerate(addresses):
            # Each pod on its own address, all on the Service's port.
            http_stand_ins.append(StandIn(i, address, service["http"]))
            grpc_servers.append(grpc_stand_in(address, service["grpc"]))
        site = kubernetes_site(dns.port, {50051: service["grpc"], 5000: service["http"]})
        with nginx(tmp_path, site, grpc_port, http_port) as access_log:
            def spread(calls: int) -> Counter[str]:
                skip = len(upstreams(access_log)) if access_log.exists() else 0
                with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                    check = health_pb2_grpc.HealthStub(channel).Check
                    for _ in range(calls):
                        answer = check(health_pb2.HealthCheckRequest(), timeout=10,
                                       metadata=[("seq2serve-model", "en-de")])
                        assert answer.status == health_pb2.HealthCheckResponse.SERVING
                        status, _ = fetch(f"http://127.0.0.1:{http_port}/languages",
                                          X_Seq2serve_Model="en-de")
                        assert status == 200
                return Counter(a.rsplit(":", 1)[0] for a in upstreams(access_log, skip))

            # Both addresses of the Service get calls (each front door: 2 x 20).
            first = spread(20)
            assert set(first) == set(addresses[:2]) and min(first.values()) >= 5, first
            # A pod gone, one added: nginx follows the new answer without a reload.
            dns.serve({fqdn: addresses[1:]})
            deadline = time.monotonic() + 30  # the test render's valid=1s, many times over
            while addresses[2] not in spread(2):
                assert time.monotonic() < deadline, "nginx never resolved the name again"
            second = spread(20)
            assert set(second) == set(addresses[1:]) and min(second.values()) >= 5, second
    finally:
        for stand_in in http_stand_ins:
            stand_in.stop()
        for server in grpc_servers:
            server.stop(None)
        dns.stop()

