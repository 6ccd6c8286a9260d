"""Prometheus: promtool checks the scrape config and the rules and runs their unit
tests; then a real Prometheus scrapes 3 real server replicas on 127.0.0.1 under
a bounded load, through the committed scrape config's own relabelling, fed by
file-based discovery that carries the labels Kubernetes discovery would. The
autoscaler's queue-time series has data for every pod, the prometheus-adapter
query finds it, every recording rule and every dashboard panel's query returns
data (the load goes through both front doors: gRPC and HTTP), and killing a
replica fires the replica-down alert.

Test-only settings: 1 s scrape and rule intervals, and every alert's `for`
shortened to 2 s (promtool's unit tests check the real durations)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import system_tools
import yaml
from deploy_helpers import DEPLOY, Replica, free_port, record, replicas, stop_process
from served_series import http_front_door, reads_external, reads_front_door, reads_model_state

from seq2serve.server.client import Seq2ServeClient
from seq2serve.server.core.residency import ModelState

pytestmark = pytest.mark.slow
PROMETHEUS = DEPLOY / "prometheus"
NAMESPACE = "seq2serve-test"
REPLICAS = 3
# The load runs until LOAD_MIN_SECONDS have passed (so that the 1 s scrapes see the
# counters rise, however fast the machine), bounded by LOAD_CALLS and LOAD_SECONDS.
LOAD_MIN_SECONDS = 8.0
LOAD_CALLS = 5000
LOAD_SECONDS = 40.0


def promtool() -> str:
    return system_tools.path("promtool")


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120)


def file_sd_config(out: Path, targets: Path, fast: bool) -> Path:
    """prometheus.yml with kubernetes_sd swapped for file_sd (same relabelling).
    `fast`: the test-only intervals and a rules copy with short `for` clauses."""
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"seq2serve", "dcgm-exporter"}
    for job in jobs.values():
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
    # The GPUs' exporter keeps the labels of the pod holding each GPU.
    assert jobs["dcgm-exporter"]["honor_labels"] is True
    jobs["seq2serve"]["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "1s"}]
    # No GPU exporter runs here (the GPU panels are checked by promtool on sample series).
    jobs["dcgm-exporter"]["file_sd_configs"] = [{"files": [str(targets.with_name("none.json"))]}]
    targets.with_name("none.json").write_text("[]")
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    if fast:
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s",
                            "scrape_timeout": "1s"}
        for group in rules["groups"]:
            group["interval"] = "1s"
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = "2s"
    (out / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    config["rule_files"] = [str(out / "rules.yml")]
    path = out / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.needs("promtool")
def test_promtool_check_config(tmp_path: Path) -> None:
    committed = run_promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    if committed.returncode != 0:
        # Debian builds Prometheus without Kubernetes discovery; everything but
        # that block is still checked, and kubernetes_sd_configs is asserted to
        # be exactly `role: pod` by file_sd_config().
        assert "kubernetes_sd_configs not found" in committed.stdout + committed.stderr, \
            committed.stdout + committed.stderr
        targets = tmp_path / "targets.json"
        targets.write_text("[]")
        derived = run_promtool("check", "config", str(file_sd_config(tmp_path, targets, False)))
        assert derived.returncode == 0, derived.stdout + derived.stderr
        assert "SUCCESS" in derived.stdout + derived.stderr


@pytest.mark.needs("promtool")
def test_promtool_check_rules() -> None:
    out = run_promtool("check", "rules", str(PROMETHEUS / "rules.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    count = sum(len(g["rules"]) for g in rules["groups"])
    assert f"SUCCESS: {count} rules found" in out.stdout


@pytest.mark.needs("promtool")
def test_promtool_test_rules() -> None:
    out = run_promtool("test", "rules", str(PROMETHEUS / "rules_test.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


# --- the live fleet -----------------------------------------------------------------

def pod_labels(name: str, port_name: str = "metrics", app: str = "seq2serve",
               phase: str = "Running") -> dict[str, str]:
    """What Kubernetes pod discovery attaches to a target."""
    return {"__meta_kubernetes_namespace": NAMESPACE,
            "__meta_kubernetes_pod_name": name,
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": app,
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
            "__meta_kubernetes_pod_container_port_name": port_name,
            "__meta_kubernetes_pod_container_name": "server",
            "__meta_kubernetes_pod_node_name": "node-1",
            "__meta_kubernetes_pod_phase": phase}


class Prometheus:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.get("/api/v1/query", query=expr)["result"]

    def wait(self, expr: str, ready: Any, timeout: float, what: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if ready(result):
                return result
            assert time.monotonic() < deadline, f"{what}: {expr} gave {result}"
            time.sleep(0.5)


class Fleet:
    def __init__(self, prometheus: Prometheus, members: list[Replica], calls: dict[str, int]
                 ) -> None:
        self.prometheus, self.replicas, self.calls = prometheus, members, calls


TEXTS = ["Open the file and save your changes.",
         "The server could not be started because the port is in use.",
         "Tools to convert images between many formats."]


def http_json(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """(status, JSON body) of a GET, or of a POST of `body` as JSON."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _http_call(replica: Replica, i: int) -> str:
    """One request to the HTTP front door: mostly LibreTranslate translations of
    the same few texts (the response cache hits), some /languages and /health, and
    a few bad requests (400), so requests-by-status has more than one status."""
    if i % 40 == 3:
        status, body = http_json(f"{replica.http_url}/languages")
        assert status == 200 and body, body
    elif i % 40 == 7:
        assert http_json(f"{replica.http_url}/health") == (200, {"status": "ok"})
    elif i % 40 == 11:
        status, body = http_json(f"{replica.http_url}/translate", {"source": "en", "target": "de"})
        assert status == 400 and "q" in body["error"], body
        return "http-invalid"
    else:
        status, body = http_json(f"{replica.http_url}/translate",
                                 {"q": TEXTS[i % 3], "source": "en", "target": "de"})
        assert status == 200 and body["translatedText"], body
    return "http"


def _load(members: list[Replica]) -> dict[str, int]:
    """Bounded mixed traffic over every replica: translations (some streamed) and
    a few bad requests, so errors-by-code has a code to show; a quarter of it over
    HTTP once the server has its HTTP front door."""
    clients = [Seq2ServeClient(r.target, timeout=30) for r in members]
    http = http_front_door()
    start = time.monotonic()
    counts = {"ok": 0, "invalid": 0}

    def call(i: int) -> str:
        elapsed = time.monotonic() - start
        if elapsed > LOAD_SECONDS or (elapsed > LOAD_MIN_SECONDS and i > 50):
            return "late"
        if http and i % 4 == 3:
            return _http_call(members[i % len(members)], i)
        client = clients[i % len(clients)]
        if i % 50 == 0:
            try:
                client.translate(TEXTS[0], beam_size=10_000)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
                return "invalid"
        if i % 10 == 1:
            assert list(client.translate_stream(TEXTS[i % 3]))[-1].final
        else:
            [[best]] = client.translate([TEXTS[i % 3]], beam_size=1 + i % 4)
            assert best.text
        return "ok"

    try:
        with ThreadPoolExecutor(6) as pool:
            for outcome in pool.map(call, range(LOAD_CALLS)):
                counts[outcome] = counts.get(outcome, 0) + 1
    finally:
        for client in clients:
            client.close()
    return counts


@contextlib.contextmanager
def prometheus_process(tmp: Path, config: Path) -> Iterator[Prometheus]:
    binary = system_tools.path("prometheus")
    port = free_port()
    log = tmp / "prometheus.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        prometheus = Prometheus(port)
        deadline = time.monotonic() + 60
        while True:
            try:
                prometheus.get("/api/v1/status/buildinfo")
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, \
                    log.read_text()[-3000:]
                time.sleep(0.5)
        yield prometheus
    finally:
        stop_process(process, 30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    system_tools.path("prometheus")
    tmp = tmp_path_factory.mktemp("fleet")
    with replicas(tmp, REPLICAS) as members:
        targets = tmp / "targets.json"
        groups = [{"targets": [f"127.0.0.1:{r.metrics_port}"],
                   "labels": pod_labels(f"replica-{i}")} for i, r in enumerate(members)]
        # What the relabelling must drop: the gRPC and HTTP ports, another app, a
        # pending pod.
        groups += [
            {"targets": [f"127.0.0.1:{members[0].port}"],
             "labels": pod_labels("replica-0", port_name="grpc")},
            {"targets": [f"127.0.0.1:{members[0].http_port}"],
             "labels": pod_labels("replica-0", port_name="http")},
            {"targets": [f"127.0.0.1:{members[1].metrics_port}"],
             "labels": pod_labels("other-0", app="other")},
            {"targets": [f"127.0.0.1:{members[2].metrics_port}"],
             "labels": pod_labels("pending-0", phase="Pending")},
        ]
        targets.write_text(json.dumps(groups))
        with prometheus_process(tmp, file_sd_config(tmp, targets, True)) as prometheus:
            # Every replica scraped once before the load: each counter's rise is seen.
            prometheus.wait('up{job="seq2serve"} == 1', lambda r: len(r) == REPLICAS, 60,
                            "first scrape of every replica")
            start = time.monotonic()
            calls = _load(members)
            record("prometheus load calls", sum(n for k, n in calls.items() if k != "late"))
            record("prometheus load s", round(time.monotonic() - start, 1))
            yield Fleet(prometheus, members, calls)


@pytest.mark.needs("prometheus")
def test_scrape_config_keeps_exactly_the_replicas_metrics_ports(fleet: Fleet) -> None:
    assert fleet.calls["ok"] > 0 and fleet.calls["invalid"] > 0
    if http_front_door():
        assert fleet.calls["http"] > 0 and fleet.calls["http-invalid"] > 0
    up = fleet.prometheus.wait('up{job="seq2serve"}', lambda r: len(r) >= REPLICAS, 30,
                               "targets")
    got = {(s["metric"]["namespace"], s["metric"]["pod"], s["metric"]["instance"],
            s["value"][1]) for s in up}
    assert got == {(NAMESPACE, f"replica-{i}", f"127.0.0.1:{r.metrics_port}", "1")
                   for i, r in enumerate(fleet.replicas)}
    active = fleet.prometheus.get("/api/v1/targets")["activeTargets"]
    assert len(active) == REPLICAS


@pytest.mark.needs("prometheus")
def test_autoscaler_series_has_data_for_every_pod(fleet: Fleet) -> None:
    series = "namespace_pod:seq2serve_queue_duration_seconds:mean2m"
    result = fleet.prometheus.wait(
        f'{series}{{namespace="{NAMESPACE}"}}', lambda r: len(r) == REPLICAS, 30, "HPA series")
    for sample in result:
        assert float(sample["value"][1]) >= 0  # a number, not NaN
    # The query prometheus-adapter sends for the HPA, with its template filled in
    # as the adapter does for `kubectl get --raw .../pods/*/<metric>`.
    adapter = yaml.safe_load((DEPLOY / "prometheus-adapter" / "config.yaml").read_text())
    [rule] = adapter["rules"]
    pods = "|".join(f"replica-{i}" for i in range(REPLICAS))
    query = (rule["metricsQuery"].replace("<<.Series>>", rule["seriesQuery"].split("{")[0])
             .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"{pods}"')
             .replace("<<.GroupBy>>", "pod"))
    assert "<<" not in query
    answered = fleet.prometheus.query(query)
    assert sorted(s["metric"]["pod"] for s in answered) == pods.split("|")


@pytest.mark.needs("prometheus")
def test_recording_rules_have_data(fleet: Fleet) -> None:
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    records = [r["record"] for g in rules["groups"] for r in g["rules"]
               if "record" in r and (http_front_door() or not reads_front_door(r["expr"]))]
    for name in records:
        fleet.prometheus.wait(name, bool, 30, "recording rule")
    [rate] = fleet.prometheus.query('model:seq2serve_requests:rate2m{model="en-de"}')
    assert float(rate["value"][1]) > 0
    [ratio] = fleet.prometheus.query('model:seq2serve_request_errors:ratio_rate2m{model="en-de"}')
    assert float(ratio["value"][1]) == 0  # bad requests are not server errors


@pytest.mark.needs("prometheus")
def test_every_dashboard_panel_has_data(fleet: Fleet) -> None:
    """Each query of deploy/grafana/seq2serve.json, with the variables set to All
    as Grafana sends them, over the last two minutes. (Before the server has its
    HTTP front door, the queries of its series and the cache's are left out.)"""
    dashboard = json.loads((DEPLOY / "grafana" / "seq2serve.json").read_text())
    now = time.time()
    checked = skipped = 0
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            if (not http_front_door() and reads_front_door(target["expr"])) \
                    or reads_external(target["expr"]):
                skipped += 1  # test_deploy_dashboard.py evaluates these on sample series
                continue
            expr = (target["expr"].replace("$__rate_interval", "30s")
                    .replace("$namespace", ".*").replace("$model", ".*").replace("$pod", ".*"))
            assert "$" not in expr, expr
            result = fleet.prometheus.get("/api/v1/query_range", query=expr,
                                          start=str(now - 120), end=str(now), step="1")["result"]
            values = [float(v) for series in result for _, v in series["values"]]
            assert any(v == v for v in values), f"{panel['title']}: no data for {expr}"
            checked += 1
    assert checked + skipped >= len([p for p in dashboard["panels"] if p["type"] != "row"])


@pytest.mark.needs("prometheus")
def test_model_state_panels_count_what_each_replica_says(fleet: Fleet) -> None:
    """The model panels' queries (the pickers at All), on what the replicas export:
    each pod's loaded models and the fleet's count per state are what the replicas'
    own GET /v1/models lists."""
    dashboard = json.loads((DEPLOY / "grafana" / "seq2serve.json").read_text())
    queries = [target["expr"].replace("$namespace", ".*").replace("$model", ".*")
               .replace("$pod", ".*") for panel in dashboard["panels"]
               for target in panel.get("targets", []) if reads_model_state(target["expr"])]
    assert len(queries) == 2, queries
    states = {}  # pod -> each model's state, as the replica lists it
    for i, replica in enumerate(fleet.replicas):
        status, body = http_json(f"{replica.http_url}/v1/models")
        assert status == 200, body
        states[f"replica-{i}"] = [model["state"] for model in body["models"]]
    by_state = {state.value: float(sum(listed.count(state.value) for listed in states.values()))
                for state in ModelState}
    by_pod = {pod: float(listed.count("ready")) for pod, listed in states.items()}
    assert by_state["ready"] == len(fleet.replicas)  # en-de on each (deploy_helpers)
    for query in queries:
        [by] = re.findall(r"by \((\w+)\)", query)
        want = by_state if by == "state" else by_pod
        result = fleet.prometheus.wait(
            query, lambda r, want=want, by=by: {s["metric"][by]: float(s["value"][1])
                                                for s in r} == want, 30, "model states")
        assert len(result) == len(want)


@pytest.mark.needs("prometheus")
def test_killing_a_replica_fires_replica_down(fleet: Fleet) -> None:
    victim = fleet.replicas[1]
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(30)
    start = time.monotonic()
    alerts = fleet.prometheus.wait(
        'ALERTS{alertname="Seq2ServeReplicaDown",alertstate="firing"}', bool, 60,
        "replica-down alert")
    record("replica killed to alert firing s (scrape 1 s, for 2 s)",
           round(time.monotonic() - start, 1))
    assert [a["metric"]["pod"] for a in alerts] == ["replica-1"]
    assert alerts[0]["metric"]["severity"] == "warning"
