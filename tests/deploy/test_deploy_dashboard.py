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
from deploy_helpers import DEPLOY
from served_series import (
    NOT_YET,
    exported_series,
    front_door_series,
    http_front_door,
    registered_series,
)

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
            assert names or "up{" in expr, (panel["title"], expr)
            # Every selector honours the namespace and pod pickers.
            for selector in re.findall(r"\{([^}]*)\}", expr):
                if "$" not in selector and "job=" not in selector:
                    continue  # a legend template, not a selector
                assert 'job="seq2serve"' in selector and '$namespace' in selector \
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


def test_front_door_series_are_registered() -> None:
    """The HTTP front door's and the response cache's series, which the dashboard
    and the rules read, are on the server's registry under these names and types."""
    if not http_front_door():
        pytest.skip(NOT_YET)
    missing = front_door_series() - registered_series()
    assert not missing, (f"not on the registry Metrics() makes (with HttpMetrics added): "
                         f"{sorted(missing)}; tests/deploy/served_series.py builds it")
