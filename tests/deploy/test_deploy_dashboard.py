"""The Grafana dashboard: type-checked by TypeScript against Grafana's own schema
(@grafana/schema, from npm), and checked for what a schema cannot see: every
query reads series the server exports, through the dashboard's data source and
variables, the HTTP front door's and the response cache's included. (That
every panel's query returns data is proven on a live Prometheus in
test_deploy_prometheus.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import system_tools
import yaml
from deploy_helpers import DEPLOY
from served_series import (
    MODEL_STATE_SERIES,
    NOT_YET,
    exported_series,
    front_door_series,
    http_front_door,
    reads_external,
    reads_model_state,
    registered_series,
)

from seq2serve.server.core.residency import ModelState
from seq2serve.server.metrics import Metrics

DASHBOARD = DEPLOY / "grafana" / "seq2serve.json"
TYPECHECK = DEPLOY / "grafana" / "typecheck"


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The type-check project with its pinned packages installed (npm ci)."""
    npm = system_tools.path("npm")
    root = tmp_path_factory.mktemp("typecheck")
    for name in ("package.json", "package-lock.json", "tsconfig.json", "schema.ts",
                 "embed.mjs"):
        shutil.copyfile(TYPECHECK / name, root / name)
    out = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=root,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return root


def typecheck(project: Path, dashboard: Path) -> subprocess.CompletedProcess[str]:
    node = system_tools.path("node")
    subprocess.run([node, "embed.mjs", str(dashboard), "dashboard.gen.ts"], cwd=project,
                   check=True, timeout=60)
    return subprocess.run([node, "node_modules/typescript/bin/tsc", "-p", "."], cwd=project,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.needs("npm", "node")
def test_dashboard_type_checks_against_grafana_schema(project: Path) -> None:
    out = typecheck(project, DASHBOARD)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(("change", "error"), [
    (('"type": "timeseries"', '"type": "timeserie"'), "timeserie"),
    (('"mode": "absolute"', '"mode": "absolut"'), "absolut"),
    (('"legendFormat"', '"legendFromat"'), "legendFromat"),
])
@pytest.mark.needs("npm", "node")
def test_type_check_catches_mistakes(project: Path, tmp_path: Path, change: tuple[str, str],
                                     error: str) -> None:
    text = DASHBOARD.read_text()
    assert change[0] in text
    bad = tmp_path / "bad.json"
    bad.write_text(text.replace(change[0], change[1], 1))
    out = typecheck(project, bad)
    assert out.returncode != 0 and error in out.stdout


def test_every_query_reads_exported_series_through_the_variables() -> None:
    exported = exported_series()
    seen_panel_ids: set[int] = set()
    for panel in panels():
        assert panel["id"] not in seen_panel_ids
        seen_panel_ids.add(panel["id"])
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            names = set(re.findall(r"(?<![:\w])(seq2serve_[a-z_]+)", expr))
            assert names <= exported, (panel["title"], names - exported)
            external = reads_external(expr)
            assert names or "up{" in expr or external, (panel["title"], expr)
            # Every selector honours the namespace and pod pickers; another exporter's
            # (dcgm-exporter's, whose pod labels are the GPU's pod) keeps seq2serve's
            # container.
            own = 'container="server"' if external else 'job="seq2serve"'
            for selector in re.findall(r"\{([^}]*)\}", expr):
                if "$" not in selector and "job=" not in selector:
                    continue  # a legend template, not a selector
                assert own in selector and '$namespace' in selector \
                    and '$pod' in selector, (panel["title"], selector)


def test_panels_cover_what_the_operator_needs() -> None:
    queries = " ".join(t["expr"] for p in panels() for t in p["targets"])
    for series in ("seq2serve_requests_total", "seq2serve_request_duration_seconds_bucket",
                   "seq2serve_queue_duration_seconds_bucket",
                   "seq2serve_time_to_first_token_seconds_bucket", "seq2serve_batch_size_bucket",
                   "seq2serve_batch_tokens_bucket", "seq2serve_generated_tokens_total",
                   "seq2serve_in_flight_requests", "seq2serve_queue_depth"):
        assert series in queries, series
    assert 'code!="OK"' in queries and "by (model, code)" in queries
    assert "by (pod)" in queries and "by (model" in queries
    # The HTTP front door by route and status, its latency and 5xx ratio; the cache.
    for series in sorted(front_door_series() - {"seq2serve_http_request_duration_seconds_sum",
                                                "seq2serve_http_request_duration_seconds_count"}):
        assert series in queries, series
    assert "by (route, status)" in queries and "by (route, le)" in queries
    assert 'status=~"5.."' in queries
    # The GPUs (dcgm-exporter: utilisation, frame buffer used and free) and the models'
    # states (loaded per pod, every state's count).
    for series in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                   MODEL_STATE_SERIES):
        assert series in queries, series
    assert "by (state)" in queries and 'state="ready"' in queries
    # What the loaded models hold of each memory budget (host and device), per pod.
    for series in ("seq2serve_model_memory_bytes", "seq2serve_model_device_memory_bytes"):
        assert f"sum by (pod) ({series}{{" in queries, series


def test_front_door_series_are_registered() -> None:
    """The HTTP front door's and the response cache's series, which the dashboard
    and the rules read, are on the server's registry under these names and types."""
    if not http_front_door():
        pytest.skip(NOT_YET)
    missing = front_door_series() - registered_series()
    assert not missing, (f"not on the registry Metrics() makes (with HttpMetrics added): "
                         f"{sorted(missing)}; tests/deploy/served_series.py builds it")


def test_model_state_series_is_the_gauge_the_panels_read() -> None:
    """The model panels' series (evaluated on sample series below, and on a live
    Prometheus in test_deploy_prometheus.py) as the server registers and sets it: a
    gauge by model and state, 1 for the model's state and 0 for each other state."""
    metrics = Metrics()
    registered = {c.name: c.type for c in metrics.registry.collect()}
    assert registered[MODEL_STATE_SERIES] == "gauge"
    metrics.set_model_state("en-de", ModelState.LOADING.value)
    samples = {s.labels["state"]: s.value for c in metrics.registry.collect()
               if c.name == MODEL_STATE_SERIES for s in c.samples}
    assert samples == {state: float(state == "loading") for state in STATES}


# --- the GPU and model-state panels on sample series (promtool) ------------------------

NAMESPACE = "ml"
# What dcgm-exporter exposes for one GPU with its Kubernetes mapping on (labels as in
# its output: gpu, UUID, device, modelName, Hostname, and the pod holding the GPU).
GPUS = {  # pod -> (GPU_UTIL %, FB_USED MiB, FB_FREE MiB); "other-0" is not seq2serve's
    "seq2serve-6d9f-a": (40.0, 3000.0, 78000.0),
    "seq2serve-6d9f-b": (85.0, 60000.0, 21000.0),
    "other-0": (99.0, 80000.0, 1000.0),
}
MODEL_STATES = {  # (pod, model) -> its state
    ("seq2serve-6d9f-a", "en-de"): "ready", ("seq2serve-6d9f-a", "en-fr"): "ready",
    ("seq2serve-6d9f-b", "en-de"): "ready", ("seq2serve-6d9f-b", "en-fr"): "loading",
    ("seq2serve-6d9f-b", "nllb"): "failed",
}
STATES = tuple(state.value for state in ModelState)


def _sample_series() -> list[dict[str, str]]:
    series = []
    for i, (pod, (util, used, free)) in enumerate(GPUS.items()):
        labels = (f'gpu="0",UUID="GPU-{i:08d}",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",'
                  f'Hostname="node-{i}",namespace="{NAMESPACE}",pod="{pod}",'
                  f'container="{"server" if pod.startswith("seq2serve") else "trainer"}"')
        for name, value in (("GPU_UTIL", util), ("FB_USED", used), ("FB_FREE", free)):
            series.append({"series": f"DCGM_FI_DEV_{name}{{{labels}}}", "values": f"{value}x10"})
    for (pod, model), state in MODEL_STATES.items():
        for each in STATES:
            series.append({"series": f'seq2serve_model_state{{job="seq2serve",namespace='
                                     f'"{NAMESPACE}",pod="{pod}",model="{model}",'
                                     f'state="{each}"}}',
                           "values": f"{int(each == state)}x10"})
    return series


def _expected(expr: str) -> dict[str, float]:
    """What each panel query must give on the sample series, worked out from them here
    ({label value: value}, by the query's one `by` label)."""
    ours = {pod: v for pod, v in GPUS.items() if pod.startswith("seq2serve")}
    if "FB_FREE" in expr:
        return {pod: used / (used + free) for pod, (_, used, free) in ours.items()}
    if "FB_USED" in expr:
        return {pod: used for pod, (_, used, _) in ours.items()}
    if "GPU_UTIL" in expr:
        return {pod: util for pod, (util, _, _) in ours.items()}
    if "by (state)" in expr:
        return {state: float(sum(s == state for s in MODEL_STATES.values())) for state in STATES}
    assert 'state="ready"' in expr and "by (pod)" in expr, expr
    pods = {pod for pod, _ in MODEL_STATES}
    return {pod: float(sum(p == pod and s == "ready" for (p, _), s in MODEL_STATES.items()))
            for pod in pods}


@pytest.mark.needs("promtool")
def test_gpu_and_model_panels_evaluate_on_sample_series(tmp_path: Path) -> None:
    """Each GPU and model-state panel's query, with the pickers at All, on series
    shaped as dcgm-exporter and the server expose them: one value per pod (or state),
    other containers' GPUs left out, the ratios and sums as worked out here."""
    checked = 0
    tests = []
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"]
            if not (reads_external(expr) or reads_model_state(expr)):
                continue
            query = (expr.replace("$namespace", ".*").replace("$pod", ".*")
                     .replace("$model", ".*"))
            [by] = re.findall(r"by \((\w+)\)", query)[:1]
            tests.append({"expr": query, "eval_time": "5m", "exp_samples": [
                {"labels": f'{{{by}="{key}"}}', "value": value}
                for key, value in sorted(_expected(query).items())]})
            checked += 1
    assert checked == 5, checked
    (tmp_path / "panels_test.yml").write_text(yaml.safe_dump({
        "rule_files": [], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _sample_series(),
                   "promql_expr_test": tests}]}, sort_keys=False))
    out = subprocess.run([system_tools.path("promtool"), "test", "rules",
                          str(tmp_path / "panels_test.yml")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
