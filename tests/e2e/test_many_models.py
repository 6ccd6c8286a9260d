"""A server that holds fewer models than it serves (--lazy, --max-model-memory, and
--max-device-memory on the emulated device), on the shipped en-de, de-en, en-fr and
fr-en: every pair, direct and through English, asked in random order, answers what a
server holding everything answers; the model-control calls (gRPC LoadModel /
UnloadModel, HTTP /v1/models) behind an admin key, and under load with no request
lost; a package added broken at run time fails alone; an unload waits for a stream."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import RunningServer, free_port, server_config

from seq2serve.model.package.manifest import load_package
from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.assembly import device_cost
from seq2serve.server.core.registry import ModelHandle, ModelRegistry
from seq2serve.server.core.residency import Resource

MODELS = Path(__file__).resolve().parents[2] / "models"
PAIRS = ("en-de", "de-en", "en-fr", "fr-en")
TEXTS = {"en": "Open the file and save your changes.",
         "de": "Öffne die Datei und speichere deine Änderungen.",
         "fr": "Ouvrez le fichier et enregistrez vos modifications."}
ADMIN_KEY = "admin-secret"

pytestmark = pytest.mark.skipif(not all((MODELS / p).is_dir() for p in PAIRS),
                                reason="the shipped models/" + ", models/".join(PAIRS))


def name_of(folder: Path) -> str:
    return str(json.loads((folder / "manifest.json").read_text())["name"])


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status
                    if line.startswith("VmRSS:"))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many")
    for pair in PAIRS:  # copies: a test adds and removes packages here
        shutil.copytree(MODELS / pair, root / pair)
    return root


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "admin-keys"
    path.write_text(f"# operators\n{ADMIN_KEY}\n")
    return path


def translate(stub: pb_grpc.TranslatorStub, source: str, target: str) -> str:
    response = stub.Translate(pb.TranslateRequest(
        texts=[TEXTS[source]], source_language=source, target_language=target), timeout=120)
    return str(response.translations[0].hypotheses[0].text)


def every_pair() -> list[tuple[str, str]]:
    return [(a, b) for a in TEXTS for b in TEXTS if a != b]


@pytest.fixture(scope="module")
def reference(models: Path) -> tuple[dict[tuple[str, str], str], dict[str, int]]:
    """Each pair's answer from a server holding every model, and each model's cost."""
    full = RunningServer(server_config(models, threads=1))
    try:
        with grpc.insecure_channel(full.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            expected = {pair: translate(stub, *pair) for pair in every_pair()}
            listed = stub.ListModels(pb.ListModelsRequest()).models
            costs = {m.name: m.memory_bytes for m in listed}
            # On the CPU provider nothing is on a device: no device bytes listed.
            assert [m.device_memory_bytes for m in listed] == [0] * len(PAIRS)
            assert device_bytes(full) == dict.fromkeys(costs, 0)
    finally:
        full.stop()
    return expected, costs


def device_bytes(running: RunningServer) -> dict[str, int]:
    """seq2serve_model_device_memory_bytes per model, as Prometheus parses /metrics."""
    families = text_string_to_metric_families(running.server.metrics.render().decode())
    return {sample.labels["model"]: int(sample.value) for family in families
            if family.name == "seq2serve_model_device_memory_bytes"
            for sample in family.samples}


def watch(registry: ModelRegistry, seen: Callable[[], None]) -> None:
    """Call `seen` at every model's state change too (a load's end, an unload's)."""
    chained = registry.on_change

    def changed(handle: ModelHandle) -> None:
        seen()
        chained(handle)

    registry.on_change = changed


def test_a_lazy_server_within_its_budget_answers_what_one_holding_everything_does(
        models: Path, reference: tuple[dict[tuple[str, str], str], dict[str, int]]) -> None:
    expected, costs = reference
    # Room for a chain's two models, not for all four.
    budget = int(2.5 * max(costs.values()))
    assert budget < sum(costs.values())
    lazy = RunningServer(server_config(models, threads=1, lazy=True, max_model_memory=budget))
    try:
        registry = lazy.server.registry
        assert {h.device_cost for h in registry.handles()} == {0}  # on the host only
        # The server's own base: started, and ONNX Runtime's one-time start paid (a
        # model loaded and unloaded).
        first = registry.find(name_of(models / "en-de"))
        registry.residency.load(first).result(120)
        registry.residency.unload(first).result(120)
        first.held_out = False  # unloaded as the budget unloads: served on request
        before = _rss()
        most = peak = 0

        def sample() -> None:
            nonlocal most, peak
            most = max(most, registry.residency.resident())
            peak = max(peak, _rss())

        watch(registry, sample)
        with grpc.insecure_channel(lazy.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            states = {m.name: m.state for m in stub.ListModels(pb.ListModelsRequest()).models}
            assert set(states.values()) == {"available"}
            order = every_pair() * 3
            random.Random(54).shuffle(order)
            for pair in order:
                assert translate(stub, *pair) == expected[pair], pair
                sample()
            states = {m.name: m.state for m in stub.ListModels(pb.ListModelsRequest()).models}
        assert 0 < most <= budget
        assert list(states.values()).count("ready") < len(PAIRS)  # some were unloaded
        assert peak - before <= budget, "the loaded models held more than the budget"
    finally:
        lazy.stop()


def test_a_lazy_server_within_a_device_budget_answers_what_one_holding_everything_does(
        models: Path, reference: tuple[dict[tuple[str, str], str], dict[str, int]]) -> None:
    # The emulated device: the CPU takes the device's branches, and each model costs
    # its device cost (its graphs' weights and its engine's buffers) on the device.
    expected, _ = reference
    on_device = {name_of(models / p): device_cost(load_package(models / p), 1) for p in PAIRS}
    budget = int(2.5 * max(on_device.values()))
    assert budget < sum(on_device.values())
    lazy = RunningServer(server_config(models, threads=1, lazy=True, emulate_device=True,
                                       max_device_memory=budget))
    try:
        registry = lazy.server.registry
        assert {h.name: h.device_cost for h in registry.handles()} == on_device
        most = 0

        def sample() -> None:
            nonlocal most
            most = max(most, registry.residency.resident(Resource.DEVICE))

        watch(registry, sample)
        with grpc.insecure_channel(lazy.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            order = every_pair() * 2
            random.Random(55).shuffle(order)
            for pair in order:
                assert translate(stub, *pair) == expected[pair], pair
            listed = stub.ListModels(pb.ListModelsRequest()).models
            states = {m.name: m.state for m in listed}
            # ListModels lists each model's device cost, loaded or not; /metrics, the
            # loaded ones' (an unloaded model's series are cleared).
            assert {m.name: m.device_memory_bytes for m in listed} == on_device
            assert device_bytes(lazy) == {name: on_device[name]
                                          for name, state in states.items() if state == "ready"}
        assert 0 < most <= budget
        assert list(states.values()).count("ready") < len(PAIRS)  # some were unloaded
    finally:
        lazy.stop()


@pytest.fixture(scope="module")
def server(models: Path, keys: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models, threads=1, lazy=True, admin_keys=keys,
                                          http_port=free_port()))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[pb_grpc.TranslatorStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield pb_grpc.TranslatorStub(channel)


ADMIN = (("x-admin-key", ADMIN_KEY),)


def states(stub: pb_grpc.TranslatorStub) -> dict[str, tuple[str, str]]:
    return {m.name: (m.state, m.error) for m in stub.ListModels(pb.ListModelsRequest()).models}


def test_the_control_calls_need_an_admin_key(server: RunningServer,
                                             stub: pb_grpc.TranslatorStub) -> None:
    name = name_of(MODELS / "en-fr")
    for metadata in ((), (("x-admin-key", "wrong"),)):
        with pytest.raises(grpc.RpcError) as refused:
            stub.LoadModel(pb.ModelControlRequest(name=name), metadata=metadata, timeout=60)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    answer = httpx.post(f"{server.http_url}/v1/models/{name}/unload", timeout=60)
    assert answer.status_code == 403
    loaded = stub.LoadModel(pb.ModelControlRequest(name=name), metadata=ADMIN, timeout=120)
    assert (loaded.model.name, loaded.model.state) == (name, "ready")
    listed = httpx.get(f"{server.http_url}/v1/models", timeout=60).json()["models"]
    assert {m["name"]: m["state"] for m in listed}[name] == "ready"
    metrics = server.server.metrics.render().decode()
    assert f'seq2serve_model_state{{model="{name}",state="ready"}} 1.0' in metrics
    translate(stub, "en", "fr")
    assert f'seq2serve_generated_tokens_total{{model="{name}"}}' in \
        server.server.metrics.render().decode()
    answer = httpx.post(f"{server.http_url}/v1/models/{name}/unload", timeout=60,
                        headers={"X-Admin-Key": ADMIN_KEY})
    assert answer.status_code == 200 and answer.json()["model"]["state"] in (
        "unloading", "available")
    server.server.registry.residency.unload(server.server.registry.find(name)).result(60)
    assert states(stub)[name] == ("available", "")
    metrics = server.server.metrics.render().decode()
    assert f'seq2serve_generated_tokens_total{{model="{name}"}}' not in metrics  # cleared
    assert f'seq2serve_model_state{{model="{name}",state="available"}} 1.0' in metrics
    with pytest.raises(grpc.RpcError) as refused:  # held out until loaded again
        translate(stub, "en", "fr")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "LoadModel" in str(refused.value.details())
    stub.LoadModel(pb.ModelControlRequest(name=name), metadata=ADMIN, timeout=120)
    translate(stub, "en", "fr")


def test_languages_say_a_model_the_operator_unloaded_is_not_served(
        server: RunningServer, stub: pb_grpc.TranslatorStub) -> None:
    """Plain HTTP: after an operator's unload of en-fr, /languages lists en -> fr (and
    de -> fr through English) as unavailable, not as loading on a first request, and
    GET /v1/models says it is held out; a request is refused; once loaded again, the
    pair is listed loaded and answered."""
    name = name_of(MODELS / "en-fr")
    admin = {"X-Admin-Key": ADMIN_KEY}
    with httpx.Client(base_url=str(server.http_url), timeout=120) as http:

        def languages() -> dict[str, dict[str, Any]]:
            return {lang["code"]: lang for lang in http.get("/languages").json()}

        def model() -> dict[str, Any]:
            return {m["name"]: m for m in http.get("/v1/models").json()["models"]}[name]

        assert http.post(f"/v1/models/{name}/load", headers=admin).status_code == 200
        before = languages()
        assert "fr" in before["en"]["loadedTargets"]
        assert model().get("heldOut", False) is False
        answer = http.post(f"/v1/models/{name}/unload", headers=admin)
        assert answer.status_code == 200 and answer.json()["model"]["heldOut"] is True
        after = languages()
        for code in ("en", "de"):  # direct, and through English
            assert "fr" in after[code]["unavailableTargets"], after[code]
            assert "fr" not in after[code]["loadedTargets"]
            assert after[code]["loaded"] is False
            assert after[code]["targets"] == before[code]["targets"]  # still listed
        assert (model()["state"], model()["heldOut"]) in (("available", True),
                                                          ("unloading", True))
        listed = {m.name: m.held_out for m in stub.ListModels(pb.ListModelsRequest()).models}
        assert listed[name] and not any(held for other, held in listed.items()
                                        if other != name)
        refused = http.post("/translate", json={"q": TEXTS["en"], "source": "en",
                                                "target": "fr"})
        assert refused.status_code == 503
        assert "unloaded by the operator" in refused.json()["error"]
        assert http.post(f"/v1/models/{name}/load", headers=admin).status_code == 200
        again = languages()
        assert "fr" in again["en"]["loadedTargets"]
        assert all("fr" not in lang["unavailableTargets"] for lang in again.values())
        assert (model()["state"], model().get("heldOut", False)) == ("ready", False)
        served = http.post("/translate", json={"q": TEXTS["en"], "source": "en",
                                               "target": "fr"})
        assert served.status_code == 200, served.text
        assert served.json()["translatedText"]


def _broken_copy(source: Path, out: Path, name: str) -> None:
    """A package whose manifest and hashes are right but whose encoder is no graph:
    it passes the checks at the scan and fails when ONNX Runtime loads it."""
    shutil.copytree(source, out)
    (out / "encoder.onnx").write_bytes(b"not an ONNX graph")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["name"] = name
    manifest["files"]["encoder.onnx"] = hashlib.sha256(b"not an ONNX graph").hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))


def test_a_package_added_broken_fails_alone_and_a_removed_one_is_unserved(
        models: Path, stub: pb_grpc.TranslatorStub) -> None:
    _broken_copy(models / "en-de", models / "broken", "broken-en-de")
    answer = stub.LoadModel(pb.ModelControlRequest(name="broken-en-de"), metadata=ADMIN,
                            timeout=120)  # a name not served yet: the folder is rescanned
    assert answer.model.state == "failed"
    assert "encoder.onnx" in answer.model.error or "ONNX" in answer.model.error
    assert states(stub)["broken-en-de"] == (answer.model.state, answer.model.error)
    assert translate(stub, "en", "de")  # the rest keep serving, en-de too
    shutil.rmtree(models / "broken")
    with pytest.raises(grpc.RpcError) as missing:  # rescans, and no longer finds it
        stub.LoadModel(pb.ModelControlRequest(name="no-such-model"), metadata=ADMIN,
                       timeout=60)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert "broken-en-de" not in states(stub)


def test_an_unload_during_a_stream_finishes_the_stream_first(
        server: RunningServer, stub: pb_grpc.TranslatorStub) -> None:
    name = name_of(MODELS / "de-en")
    text = " ".join([TEXTS["de"]] * 24)
    chunks = stub.TranslateStream(pb.TranslateRequest(
        texts=[text], source_language="de", target_language="en",
        options=pb.DecodingOptions(beam_size=1)), timeout=300)
    first = next(chunks)
    assert first.text_delta
    told: list[str] = []
    unload = threading.Thread(target=lambda: told.append(stub.UnloadModel(
        pb.ModelControlRequest(name=name), metadata=ADMIN, timeout=60).model.state))
    unload.start()
    rest = list(chunks)
    unload.join(60)
    assert told == ["unloading"]  # the stream held it
    final = rest[-1]
    assert final.HasField("translation")
    assert final.translation.hypotheses[0].text.startswith(first.text_delta)
    registry = server.server.registry
    registry.residency.unload(registry.find(name)).result(60)
    assert states(stub)[name] == ("available", "")


CLIENTS = 3
CYCLES = 16  # unload-then-load cycles, over the four models in turn
MOST_REQUESTS = 400  # per client: a bound, in case the control calls hang


def test_the_control_calls_under_load_lose_no_request(
        models: Path, keys: Path,
        reference: tuple[dict[tuple[str, str], str], dict[str, int]]) -> None:
    """Clients ask every pair while an operator unloads and loads each model in turn:
    every request is answered with the text a server holding everything gives, or,
    while its model is held out, refused at admission (UNAVAILABLE naming LoadModel);
    none is lost or answered wrongly."""
    expected, _ = reference
    running = RunningServer(server_config(models, threads=1, lazy=True, admin_keys=keys))
    names = [name_of(models / p) for p in PAIRS]
    outcomes: list[tuple[tuple[str, str], str | tuple[grpc.StatusCode, str]]] = []
    in_flight = 0
    busy_at_control: list[int] = []
    told: list[str] = []
    lock = threading.Lock()
    done = threading.Event()
    try:
        with grpc.insecure_channel(running.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)

            def client(seed: int) -> None:
                nonlocal in_flight
                rng = random.Random(seed)
                for _ in range(MOST_REQUESTS):
                    if done.is_set():
                        return
                    pair = rng.choice(every_pair())
                    with lock:
                        in_flight += 1
                    try:
                        outcome: str | tuple[grpc.StatusCode, str] = translate(stub, *pair)
                    except grpc.RpcError as e:
                        outcome = (e.code(), str(e.details()))
                    with lock:
                        in_flight -= 1
                        outcomes.append((pair, outcome))

            def control() -> None:
                try:
                    for cycle in range(CYCLES):
                        name = names[cycle % len(names)]
                        with lock:
                            busy_at_control.append(in_flight)
                        told.append(stub.UnloadModel(pb.ModelControlRequest(name=name),
                                                     metadata=ADMIN, timeout=120).model.state)
                        loaded = stub.LoadModel(pb.ModelControlRequest(name=name),
                                                metadata=ADMIN, timeout=120)
                        assert loaded.model.state == "ready", loaded.model
                finally:
                    done.set()

            for pair in every_pair():  # every model loaded before the load starts
                assert translate(stub, *pair) == expected[pair]
            threads = [threading.Thread(target=client, args=(seed,))
                       for seed in range(CLIENTS)]
            threads.append(threading.Thread(target=control))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
            assert not any(thread.is_alive() for thread in threads)
            assert len(told) == CYCLES and set(told) <= {"unloading", "available"}
            assert sum(busy_at_control) > 0, "the control calls ran with no request in flight"
            wrong = [(pair, outcome) for pair, outcome in outcomes if outcome != expected[pair]
                     and not (isinstance(outcome, tuple)
                              and outcome[0] == grpc.StatusCode.UNAVAILABLE
                              and "unloaded by the operator" in outcome[1])]
            assert wrong == []
            answered = sum(isinstance(outcome, str) for _, outcome in outcomes)
            assert answered >= len(outcomes) // 2, (answered, len(outcomes))
            for pair in every_pair():  # all loaded again, all answering
                assert translate(stub, *pair) == expected[pair]
    finally:
        running.stop()
