"""The Kubernetes manifests: rendered by kustomize (kubectl's), validated by
kubernetes-validate --strict against the oldest and newest Kubernetes claimed,
then checked for what schemas cannot see: selectors match the pod labels, ports
agree everywhere (probes, env, Services, the image's EXPOSE; gRPC, HTTP and
metrics), the commented HTTP readiness probe is a valid alternative, the
disruption budget leaves room for evictions, the autoscaler's metric exists all
the way down to server/metrics.py, and the grace periods fit the server's drain."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import system_tools
import yaml
from deploy_helpers import DEPLOY, ROOT
from served_series import exported_series, http_front_door

from seq2serve.server.config import ServerConfig, env_name

KUSTOMIZE = DEPLOY / "kustomize"
OVERLAYS = ("cpu", "gpu")
# Native gRPC probes are GA from 1.27; the newest is the newest schema we have.
K8S_VERSIONS = ("1.27.0", "1.37.0")
COMPONENT = KUSTOMIZE / "components" / "prometheus-operator"
CRD_KINDS = {"PodMonitor", "PrometheusRule"}


def render(directory: Path) -> list[dict[str, Any]]:
    binary = system_tools.path("kubectl")  # kustomize itself, else kubectl's
    command = ([binary, "build", str(directory)] if Path(binary).name == "kustomize"
               else [binary, "kustomize", str(directory)])
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[str, list[dict[str, Any]]]:
    """An overlay with the Prometheus Operator component added, as an operator would."""
    root = tmp_path_factory.mktemp(f"with-operator-{request.param}")
    (root / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        # kustomize takes relative paths only
        "resources": [os.path.relpath(KUSTOMIZE / "overlays" / request.param, root)],
        "components": [os.path.relpath(COMPONENT, root)]}))
    return request.param, render(root)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = by_kind(docs, kind)
    return doc


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def server(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def ports(docs: list[dict[str, Any]]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in server(docs)["ports"]}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", OVERLAYS)
@pytest.mark.needs("kubectl", "kubernetes-validate")
def test_overlays_validate_strictly(name: str, version: str, tmp_path: Path) -> None:
    validate = system_tools.path("kubernetes-validate")
    docs = render(KUSTOMIZE / "overlays" / name)
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Deployment", "Service",
                                         "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    rendered = tmp_path / f"{name}.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    out = subprocess.run([validate, "--strict", "--kubernetes-version", version,
                          str(rendered)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" passed for resource ") == len(docs), out.stdout
    # The validator is strict for real: one unknown field fails the Deployment.
    server(docs)["livenessProbe"]["grpcc"] = {"port": 1}
    rendered.write_text(yaml.safe_dump_all(docs))
    out = subprocess.run([validate, "--strict", "--kubernetes-version", version,
                          str(rendered)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "grpcc" in out.stdout + out.stderr


@pytest.mark.needs("kubectl")
def test_selectors_match_the_pod_labels(overlay) -> None:
    _, docs = overlay
    deployment = one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict[str, str]) -> bool:
        return bool(selector) and selector.items() <= labels.items()

    assert selects(deployment["spec"]["selector"]["matchLabels"])
    for service in by_kind(docs, "Service"):
        assert selects(service["spec"]["selector"]), service["metadata"]["name"]
    assert selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    assert selects(one(docs, "PodMonitor")["spec"]["selector"]["matchLabels"])
    for spread in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]:
        assert selects(spread["labelSelector"]["matchLabels"])
    # The PodMonitor names its job after this label: the rules select job="seq2serve".
    assert labels[one(docs, "PodMonitor")["spec"]["jobLabel"]] == "seq2serve"


@pytest.mark.needs("kubectl")
def test_ports_agree_everywhere(overlay) -> None:
    _, docs = overlay
    container, named = server(docs), ports(overlay[1])
    assert set(named) == {"grpc", "http", "metrics"}
    env = env_of(container)
    assert int(env[env_name("port")]) == named["grpc"]
    assert int(env[env_name("http_port")]) == named["http"]
    assert int(env[env_name("metrics_port")]) == named["metrics"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == named["grpc"], probe
    for service in by_kind(docs, "Service"):
        served = {port["name"]: port for port in service["spec"]["ports"]}
        for port in served.values():
            assert port["targetPort"] in named, (service["metadata"]["name"], port)
        # Both front doors through either Service, each on its own port number.
        for name in ("grpc", "http"):
            assert served[name]["targetPort"] == name, (service["metadata"]["name"], name)
            assert served[name]["port"] == named[name], (service["metadata"]["name"], name)
    assert one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] in named
    # The image's EXPOSE says the same, and so do the server's defaults.
    exposed = re.search(r"^EXPOSE (.+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert exposed is not None
    assert sorted(int(p) for p in exposed.group(1).split()) == sorted(named.values())
    defaults = ServerConfig()
    assert (defaults.port, defaults.metrics_port) == (named["grpc"], named["metrics"])
    if http_front_door():
        assert defaults.http_port == named["http"]


HTTP_PROBE = re.compile(r"^ *#   readinessProbe:\n(?: *#     .*\n)+", re.M)


def commented_http_probe() -> dict[str, Any]:
    """The HTTP readiness probe the base Deployment shows in a comment."""
    text = (KUSTOMIZE / "base" / "deployment.yaml").read_text()
    [block] = HTTP_PROBE.findall(text)
    uncommented = "\n".join(line.split("#", 1)[1][2:] for line in block.splitlines())
    return yaml.safe_load(uncommented)["readinessProbe"]


@pytest.mark.needs("kubectl", "kubernetes-validate")
def test_commented_http_probe_is_a_valid_alternative(tmp_path: Path) -> None:
    """Swapped in for the gRPC readiness probe, the commented one validates,
    asks /health on the http port and keeps the same timing."""
    validate = system_tools.path("kubernetes-validate")
    docs = render(KUSTOMIZE / "overlays" / "cpu")
    container = server(docs)
    probe = commented_http_probe()
    assert probe["httpGet"]["path"] == "/health"
    assert probe["httpGet"]["port"] == "http" and "http" in ports(docs)
    assert probe["httpGet"]["scheme"] == "HTTP"
    grpc_probe = container["readinessProbe"]
    assert {k: v for k, v in probe.items() if k != "httpGet"} == \
        {k: v for k, v in grpc_probe.items() if k != "grpc"}
    container["readinessProbe"] = probe
    rendered = tmp_path / "http-probe.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    out = subprocess.run([validate, "--strict", "--kubernetes-version", K8S_VERSIONS[0],
                          str(rendered)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.needs("kubectl")
def test_security_context_matches_the_image(overlay) -> None:
    _, docs = overlay
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    user = re.search(r"^USER (\d+):(\d+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert user is not None
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(user.group(1))
    assert pod["securityContext"]["runAsGroup"] == int(user.group(2))
    context = server(docs)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"] for m in server(docs)["volumeMounts"]}
    assert "/tmp" in mounts


@pytest.mark.needs("kubectl")
def test_settings_are_server_settings(overlay) -> None:
    name, docs = overlay
    env = env_of(server(docs))
    fields = {env_name(f) for f in ServerConfig.__dataclass_fields__}
    if not http_front_door():
        fields.add(env_name("http_port"))  # see served_series.NOT_YET
    assert set(env) <= fields, sorted(set(env) - fields)
    assert env[env_name("provider")] == {"cpu": "cpu", "gpu": "cuda"}[name]
    limits = server(docs)["resources"]["limits"]
    assert ("nvidia.com/gpu" in limits) == (name == "gpu")
    if name == "gpu":
        assert limits["nvidia.com/gpu"] == "1"


@pytest.mark.needs("kubectl")
def test_termination_grace_covers_drain_and_grace(overlay) -> None:
    _, docs = overlay
    env = env_of(server(docs))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    drain = float(env[env_name("drain_delay_s")])
    grace = float(env[env_name("grace_period_s")])
    assert drain > 0 and grace > 0
    assert pod["terminationGracePeriodSeconds"] > drain + grace
    # Readiness must notice NOT_SERVING within the drain delay, and liveness
    # must not restart a draining server.
    readiness, liveness = server(docs)["readinessProbe"], server(docs)["livenessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < drain
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > drain


@pytest.mark.needs("kubectl")
def test_disruption_budget_and_autoscaler_agree(overlay) -> None:
    _, docs = overlay
    hpa, pdb = one(docs, "HorizontalPodAutoscaler"), one(docs, "PodDisruptionBudget")
    deployment = one(docs, "Deployment")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert deployment["spec"]["replicas"] == hpa["spec"]["minReplicas"]


def _recorded_rules() -> dict[str, str]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())["groups"]
    return {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}


@pytest.mark.needs("kubectl")
def test_autoscaler_metric_exists_down_to_the_server(overlay) -> None:
    _, docs = overlay
    hpa = one(docs, "HorizontalPodAutoscaler")
    kinds = [m["type"] for m in hpa["spec"]["metrics"]]
    assert kinds == ["Pods", "Resource"]  # queue time first, CPU as the fallback
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    adapter = yaml.safe_load((DEPLOY / "prometheus-adapter" / "config.yaml").read_text())
    [rule] = [r for r in adapter["rules"] if r["name"]["as"] == metric]
    series = rule["seriesQuery"].split("{")[0]
    assert re.fullmatch(rule["name"]["matches"], series)
    recorded = _recorded_rules()
    assert series in recorded, f"{series} is not recorded by deploy/prometheus/rules.yml"
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert "by (namespace, pod)" in recorded[series]


def test_rules_use_only_exported_series() -> None:
    exported = exported_series()
    groups = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())["groups"]
    used = {name for g in groups for r in g["rules"]
            for name in re.findall(r"(?<![:\w])(seq2serve_[a-z_]+)(?![:\w])", r["expr"])}
    assert used and used <= exported, sorted(used - exported)


def test_prometheus_rule_is_the_rules_file() -> None:
    rule = yaml.safe_load((COMPONENT / "prometheusrule.yaml").read_text())
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    assert rule["spec"] == rules, (
        "deploy/kustomize/components/prometheus-operator/prometheusrule.yaml must carry "
        "deploy/prometheus/rules.yml's groups unchanged")
    assert {d["kind"] for d in yaml.safe_load_all(
        (COMPONENT / "podmonitor.yaml").read_text())} | {rule["kind"]} == CRD_KINDS
