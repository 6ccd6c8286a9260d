"""A server that holds fewer models than it serves (--lazy, --max-model-memory), on
the shipped en-de, de-en, en-fr and fr-en: every pair, direct and through English,
asked in random order, answers what a server holding everything answers; the
model-control calls (gRPC LoadModel / UnloadModel, HTTP /v1/models) behind an admin
key; a package added broken at run time fails alone; an unload waits for a stream."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from serving import RunningServer, free_port, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

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


def test_a_lazy_server_within_its_budget_answers_what_one_holding_everything_does(
        models: Path) -> None:
    full = RunningServer(server_config(models, threads=1))
    try:
        with grpc.insecure_channel(full.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            expected = {pair: translate(stub, *pair) for pair in every_pair()}
            costs = {m.name: m.memory_bytes for m in stub.ListModels(
                pb.ListModelsRequest()).models}
    finally:
        full.stop()
    # Room for a chain's two models, not for all four.
    budget = int(2.5 * max(costs.values()))
    assert budget < sum(costs.values())
    lazy = RunningServer(server_config(models, threads=1, lazy=True, max_model_memory=budget))
    try:
        registry = lazy.server.registry
        # The server's own base: started, and ONNX Runtime's one-time start paid (a
        # model loaded and unloaded).
        first = registry.find(name_of(models / "en-de"))
        registry.residency.load(first).result(120)
        registry.residency.unload(first).result(120)
        first.held_out = False  # unloaded as the budget unloads: served on request
        before = _rss()
        most = 0

        def watch(handle: object) -> None:
            nonlocal most
            most = max(most, registry.residency.resident())

        chained = registry.on_change
        registry.on_change = lambda h: (watch(h), chained(h))[1]
        with grpc.insecure_channel(lazy.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            states = {m.name: m.state for m in stub.ListModels(pb.ListModelsRequest()).models}
            assert set(states.values()) == {"available"}
            order = every_pair() * 3
            random.Random(54).shuffle(order)
            for pair in order:
                assert translate(stub, *pair) == expected[pair], pair
            states = {m.name: m.state for m in stub.ListModels(pb.ListModelsRequest()).models}
        assert 0 < most <= budget
        assert list(states.values()).count("ready") < len(PAIRS)  # some were unloaded
        assert _rss() - before <= budget, "the loaded models hold more than the budget"
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
