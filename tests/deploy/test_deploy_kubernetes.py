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
    # One pod at a time whatever the fleet's size (minAvailable: 1 would let ten drain
    # to one), and never the whole fleet at its floor.
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"] \
        <= hpa["spec"]["maxReplicas"]
    assert deployment["spec"]["replicas"] == hpa["spec"]["minReplicas"]


@pytest.mark.needs("kubectl")
def test_rollout_never_waits_for_a_spare_gpu(overlay) -> None:
    """CPU: one surge pod first, capacity never drops. GPU: no spare GPU to surge
    on (a surge pod would stay Pending and stall the rollout): one pod replaced at a
    time, which the disruption budget's one-at-a-time matches."""
    name, docs = overlay
    rolling = one(docs, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert rolling == ({"maxSurge": 1, "maxUnavailable": 0} if name == "cpu"
                       else {"maxSurge": 0, "maxUnavailable": 1})


def _recorded_rules() -> dict[str, str]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())["groups"]
    return {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}


@pytest.mark.needs("kubectl")
def test_autoscaler_metric_exists_down_to_the_server(overlay) -> None:
    _, docs = overlay
    hpa = one(docs, "HorizontalPodAutoscaler")
    kinds = [m["type"] for m in hpa["spec"]["metrics"]]
    # Queue time alone: beside a second metric, a missing one blocks scale-down for good.
    assert kinds == ["Pods"]
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


# --- components: autoscaling on CPU, model packages apart from the image -------------

def with_components(tmp: Path, overlay_name: str, *components: str) -> list[dict[str, Any]]:
    """An overlay with components added, as an operator's own kustomization would."""
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(KUSTOMIZE / "overlays" / overlay_name, tmp)],
        "components": [os.path.relpath(KUSTOMIZE / "components" / c, tmp)
                       for c in components]}))
    return render(tmp)


def validate_strictly(docs: list[dict[str, Any]], tmp: Path) -> None:
    validate = system_tools.path("kubernetes-validate")
    rendered = tmp / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    for version in K8S_VERSIONS:
        out = subprocess.run([validate, "--strict", "--kubernetes-version", version,
                              str(rendered)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.count(" passed for resource ") == len(docs), out.stdout


def image_models_dir() -> str:
    found = re.search(r"SEQ2SERVE_MODELS_DIR=(\S+)", (ROOT / "Dockerfile").read_text())
    assert found is not None
    return found.group(1)


@pytest.mark.parametrize("component", ["models-volume", "models-from-object-storage"])
@pytest.mark.needs("kubectl", "kubernetes-validate")
def test_models_apart_from_the_image(component: str, tmp_path: Path) -> None:
    """The packages come from a volume the server mounts read-only at its models
    folder (the image's, which the mount hides): a claim every replica shares, or a
    pod-local copy an init container fetches from object storage."""
    docs = with_components(tmp_path, "gpu", component)
    validate_strictly(docs, tmp_path)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = server(docs)
    folder = env_of(container)[env_name("models_dir")]
    assert folder == image_models_dir()
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    if component == "models-volume":
        claim = one(docs, "PersistentVolumeClaim")
        assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"],
                                                   "readOnly": True}
        # Every replica, on any node, mounts it at once.
        assert set(claim["spec"]["accessModes"]) & {"ReadWriteMany", "ReadOnlyMany"}
    else:
        [fetch] = pod["initContainers"]
        [target] = [m for m in fetch["volumeMounts"] if m["name"] == mount["name"]]
        assert target.get("readOnly") is not True and target["mountPath"] == fetch["args"][-1]
        assert "emptyDir" in volume
        assert fetch["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.needs("kubectl", "kubernetes-validate")
def test_cpu_autoscaling_replaces_the_queue_metric(tmp_path: Path) -> None:
    docs = with_components(tmp_path, "cpu", "cpu-autoscaling")
    validate_strictly(docs, tmp_path)
    [metric] = one(docs, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    # Utilization is of the request: the container has one.
    assert "cpu" in server(docs)["resources"]["requests"]


# --- by model: two deployments with different model sets behind nginx ----------------

BY_MODEL = KUSTOMIZE / "overlays" / "by-model"
SET_LABEL = "seq2serve.io/model-set"


@pytest.fixture(scope="module")
def by_model() -> list[dict[str, Any]]:
    return render(BY_MODEL)


def model_sets(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The server Deployments by their model set."""
    return {d["spec"]["template"]["metadata"]["labels"][SET_LABEL]: d
            for d in by_kind(docs, "Deployment")
            if SET_LABEL in d["spec"]["template"]["metadata"]["labels"]}


@pytest.mark.needs("kubectl", "kubernetes-validate")
def test_by_model_validates_strictly(by_model: list[dict[str, Any]], tmp_path: Path) -> None:
    assert {d["kind"] for d in by_model} == {"ServiceAccount", "ConfigMap", "Service",
                                             "Deployment", "PodDisruptionBudget",
                                             "HorizontalPodAutoscaler"}
    validate_strictly(by_model, tmp_path)


@pytest.mark.needs("kubectl")
def test_by_model_sets_count_only_their_own_pods(by_model: list[dict[str, Any]]) -> None:
    sets = model_sets(by_model)
    assert sorted(sets) == ["en-de", "en-fr"]
    for name, deployment in sets.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        others = [d["spec"]["template"]["metadata"]["labels"] for n, d in sets.items()
                  if n != name]

        def only_this_set(selector: dict[str, str], labels: dict[str, str] = labels,
                          others: list[dict[str, str]] = others) -> bool:
            return selector.items() <= labels.items() and not any(
                selector.items() <= other.items() for other in others)

        assert only_this_set(deployment["spec"]["selector"]["matchLabels"])
        mine = [d for d in by_model if d["metadata"].get("labels", {}).get(SET_LABEL) == name]
        for service in by_kind(mine, "Service"):
            assert only_this_set(service["spec"]["selector"]), service["metadata"]["name"]
        [pdb] = by_kind(mine, "PodDisruptionBudget")
        assert only_this_set(pdb["spec"]["selector"]["matchLabels"])
        [hpa] = by_kind(mine, "HorizontalPodAutoscaler")
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        # Each set loads its own models (the server's --load-only), and every variable
        # is a server setting (--load-only until the server has it: issue 54 item 2).
        assert env_of(container)[env_name("load_only")] == name
        fields = {env_name(f) for f in ServerConfig.__dataclass_fields__}
        fields.add(env_name("load_only"))
        assert set(env_of(container)) <= fields, sorted(set(env_of(container)) - fields)


def nginx_conf() -> str:
    return (BY_MODEL / "nginx.conf").read_text()


@pytest.mark.needs("kubectl")
def test_by_model_proxy_reaches_every_set(by_model: list[dict[str, Any]]) -> None:
    """nginx.conf's names are the overlay's headless Services in its namespace, on
    their ports; its maps send each set's model and pair to that set; the proxy
    mounts it and listens where its container ports say."""
    conf = nginx_conf()
    namespace = yaml.safe_load((BY_MODEL / "kustomization.yaml").read_text())["namespace"]
    services = {s["metadata"]["name"]: {p["name"]: p["port"] for p in s["spec"]["ports"]}
                for s in by_kind(by_model, "Service")}
    sets = model_sets(by_model)
    targets = re.findall(r"(grpc_pass grpc|proxy_pass http)://([^;]+);", conf)
    set_by_map = set(re.findall(r"^map \S+ \$(\S+) \{", conf, re.M))
    fixed = dict(re.findall(r"^ *set \$(\S+) (\S+);", conf, re.M))
    assert targets
    for kind, target in targets:
        host, port = target.rsplit(":", 1)
        service, _, rest = host.partition(".")
        assert rest == f"{namespace}.svc.cluster.local", target
        wanted = "grpc" if kind.startswith("grpc") else "http"
        # A variable in every name: nginx resolves it per request (a plain name: once).
        [variable] = re.findall(r"\$(\w+)", service) or [None]
        assert variable is not None, f"{target}: a name resolved once, at start"
        values = list(sets) if variable in set_by_map else [fixed[variable]]
        names = [service.replace(f"${variable}", value) for value in values]
        for name in names:
            assert services[name][wanted] == int(port), (target, name)
    # Every map value names a set, and each set's own model maps to it.
    for block in re.findall(r"^map \S+ \$(\S+) \{\n(.*?)^\}", conf, re.M | re.S):
        rows = dict(line.rstrip(";").split() for line in block[1].strip().splitlines())
        for key, value in rows.items():
            assert value in sets or value.startswith("$"), (block[0], key, value)
        for name in sets:
            assert rows[name] == name, (block[0], name)
    # The variable-resolved names need a resolver, re-resolving within seconds.
    resolver = re.search(r"^resolver \S+ valid=(\d+)s", conf, re.M)
    assert resolver is not None and int(resolver.group(1)) <= 10
    assert not re.search(r"^upstream ", conf, re.M)  # resolved once, at start, by 1.22
    proxy = next(d for d in by_kind(by_model, "Deployment") if d not in sets.values())
    [container] = proxy["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert re.findall(r"^ *listen (\d+) http2;", conf, re.M) == [str(ports["grpc"])]
    assert re.findall(r"^ *listen (\d+);", conf, re.M) == [str(ports["http"])]
    [config_map] = by_kind(by_model, "ConfigMap")
    assert config_map["data"]["seq2serve.conf"] == conf
    [volume] = [v for v in proxy["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["mountPath"] == "/etc/nginx/conf.d"
