"""One pair rule for every door (issue 51 items 2-4): tiny NLLB-200 and M2M100 packages
(built and exported as tests/multilingual_folders.py builds them, different weights)
and a model of one pair, served together. The same requests through gRPC, the .proto's
JSON (/v1/translate), LibreTranslate's /translate and /translate_file, and the CLI's
translate and translate-file get the same model and the same text; a named model of
one pair refuses languages it does not have, naming the field; CLDR's aliases reach
their language; /languages names each language once."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from multilingual_folders import multilingual_package
from serving import RunningServer, free_port, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.assembly import ModelLoadError, load_models
from seq2serve.server.cli.main import main
from seq2serve.server.core.registry import ModelRegistry
from seq2serve.server.metrics import Metrics

NLLB, M2M100, ONE = "tiny-nllb", "tiny-m2m100", "tiny-en-de"
TEXT = "Save your changes before you close the window."
# (source, target) -> the model the rule chooses
CASES = {
    ("en", "de"): ONE,  # bilingual first
    ("en", "fr"): M2M100,  # both multilingual models have en and fr exactly: by name
    ("en", "zh-TW"): NLLB,  # M2M100's only Chinese is Simplified
    ("en", "fa-AF"): NLLB,  # NLLB has Dari exactly, M2M100 only Persian
    ("iw", "en"): M2M100,  # legacy Hebrew is he, which both have
    ("en", "nb"): NLLB,  # NLLB has Bokmål exactly, M2M100 its Norwegian
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pair-rule-models")
    for name, family, seed in [(NLLB, "nllb", 0), (M2M100, "m2m100", 1)]:
        shutil.copytree(multilingual_package(family, tmp_path_factory.mktemp(family), seed),
                        root / name)
    # A model of one pair, en -> de: the M2M100 package without its languages, every
    # text forced to start with German's token (as tests/e2e/test_multilingual_serving.py).
    manifest = json.loads((root / M2M100 / "manifest.json").read_text(encoding="utf-8"))
    german = manifest["languages"]["tokens"][manifest["languages"]["codes"]["de"]]
    shutil.copytree(root / M2M100, root / ONE)
    manifest.update(name=ONE, source_language="en", target_language="de", input_prefix="")
    del manifest["languages"]
    manifest["generation"]["forced_bos_token_id"] = german
    (root / ONE / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models, http_port=free_port()))
    yield running
    running.stop()


def grpc_translate(server: RunningServer, **fields: object) -> pb.TranslateResponse:
    with grpc.insecure_channel(server.target) as channel:
        return pb_grpc.TranslatorStub(channel).Translate(
            pb.TranslateRequest(texts=[TEXT], **fields), timeout=60)


def routed(server: RunningServer, model: str) -> float:
    """How many translation requests the core has routed to `model` alone."""
    value = server.server.metrics.registry.get_sample_value(
        "seq2serve_translate_routes_total", {"route": "direct", "models": model})
    return value or 0.0


def test_every_door_routes_a_pair_to_the_same_model(server: RunningServer, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Each door's request of a pair is routed by the core to the rule's model (its
    route counter moves by one, no other's does) and answers that model's text."""
    ids = pb.DecodingOptions(return_token_ids=True)
    for (source, target), model in CASES.items():
        counts = {name: routed(server, name) for name in (NLLB, M2M100, ONE)}
        reply = grpc_translate(server, source_language=source, target_language=target,
                               options=ids)
        assert list(reply.models) == [model], (source, target)
        [best] = reply.translations[0].hypotheses[:1]
        v1 = httpx.post(f"{server.http_url}/v1/translate", timeout=60, json={
            "texts": [TEXT], "sourceLanguage": source, "targetLanguage": target,
            "options": {"returnTokenIds": True}})
        assert v1.status_code == 200, v1.text
        assert v1.json()["models"] == [model]
        assert [int(i) for i in v1.json()["translations"][0]["hypotheses"][0]["tokenIds"]] \
            == list(best.token_ids)
        libre = httpx.post(f"{server.http_url}/translate", timeout=60, json={
            "q": TEXT, "source": source, "target": target})
        assert libre.status_code == 200, libre.text
        assert libre.json()["translatedText"] == best.text, (source, target)
        assert main(["translate", "--server", server.target, "--from", source, "--to", target,
                     TEXT]) == 0
        assert capsys.readouterr().out == best.text + "\n", (source, target)
        # whole files: LibreTranslate's /translate_file and the CLI's translate-file
        upload = httpx.post(f"{server.http_url}/translate_file", timeout=60,
                            data={"source": source, "target": target},
                            files={"file": ("text.txt", TEXT.encode(), "text/plain")})
        assert upload.status_code == 200, upload.text
        assert httpx.get(upload.json()["translatedFileUrl"], timeout=60).text == best.text
        document, out = tmp_path / "text.txt", tmp_path / "text.out.txt"
        document.write_text(TEXT, encoding="utf-8")
        assert main(["translate-file", str(document), "--server", server.target, "--from",
                     source, "--to", target, "-o", str(out), "--no-progress"]) == 0
        assert out.read_text(encoding="utf-8") == best.text, (source, target)
        capsys.readouterr()
        # six requests, each routed to the rule's model, none elsewhere
        assert {name: routed(server, name) - count for name, count in counts.items()} == {
            name: 6.0 if name == model else 0.0 for name in counts}, (source, target)
        # the model named gives the same tokens; the other multilingual model others
        other = {NLLB: M2M100, M2M100: NLLB}.get(model)
        named = grpc_translate(server, model=model, source_language=source,
                               target_language=target, options=ids)
        assert named.translations[0].hypotheses[0].token_ids == best.token_ids
        if other is not None and (source, target) in {("en", "fr"), ("iw", "en")}:
            assert grpc_translate(server, model=other, source_language=source,
                                  target_language=target, options=ids
                                  ).translations[0].hypotheses[0].token_ids != best.token_ids


def test_a_script_no_model_has_is_refused_by_every_door(server: RunningServer) -> None:
    with pytest.raises(grpc.RpcError) as err:
        grpc_translate(server, source_language="en", target_language="sr-Latn")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    v1 = httpx.post(f"{server.http_url}/v1/translate", timeout=60, json={
        "texts": [TEXT], "sourceLanguage": "en", "targetLanguage": "sr-Latn"})
    assert v1.status_code == 404
    libre = httpx.post(f"{server.http_url}/translate", timeout=60, json={
        "q": TEXT, "source": "en", "target": "sr-Latn"})
    assert libre.status_code == 400 and libre.json()["error"] == "sr-Latn is not supported"
    with pytest.raises(grpc.RpcError) as err:  # named: it says why
        grpc_translate(server, model=M2M100, source_language="en", target_language="zh-TW")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "target_language='zh-TW' is not a language of model 'tiny-m2m100' (written " \
        "in Hant, the model's zh in Hans; its languages: " in (err.value.details() or "")


def test_a_named_model_of_one_pair_takes_its_own_languages_only(server: RunningServer) -> None:
    with pytest.raises(grpc.RpcError) as err:
        grpc_translate(server, model=ONE, source_language="zh", target_language="xx")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(
        "source_language='zh' is not the source language of model 'tiny-en-de', which "
        "translates en->de: source_language must be 'en' or empty")
    v1 = httpx.post(f"{server.http_url}/v1/translate", timeout=60, json={
        "model": ONE, "texts": [TEXT], "sourceLanguage": "en", "targetLanguage": "fr"})
    assert v1.status_code == 400 and "target_language='fr'" in v1.text
    # empty languages are the model's own
    plain = grpc_translate(server, model=ONE)
    assert plain.translations[0].hypotheses[0].text == grpc_translate(
        server, source_language="en", target_language="de").translations[0].hypotheses[0].text


def test_m2m100_takes_bokmal_for_its_norwegian(server: RunningServer) -> None:
    nb = grpc_translate(server, model=M2M100, source_language="en", target_language="nb")
    no = grpc_translate(server, model=M2M100, source_language="en", target_language="no")
    assert nb.translations[0].hypotheses[0].text == no.translations[0].hypotheses[0].text


def test_languages_have_distinct_cldr_names(server: RunningServer) -> None:
    listed = httpx.get(f"{server.http_url}/languages", timeout=60).json()
    names = {entry["code"]: entry["name"] for entry in listed}
    assert len(set(names.values())) == len(names)
    assert names["zh"] == "Chinese" and names["zh-Hant"] == "Chinese (Traditional)"
    assert names["fa"] == "Persian" and names["fa-AF"] == "Persian (Afghanistan)"
    # the same pair's targets as the routes the rule lists
    targets = {entry["code"]: set(entry["targets"]) for entry in listed}
    assert "zh-Hant" in targets["en"] and "sr-Latn" not in names


def test_prefer_model_chooses_among_multilingual_models(models: Path) -> None:
    running = RunningServer(server_config(models, http_port=free_port(), prefer_model=NLLB))
    try:
        assert list(grpc_translate(running, source_language="en", target_language="fr").models) \
            == [NLLB]
        libre = httpx.post(f"{running.http_url}/translate", timeout=60, json={
            "q": TEXT, "source": "en", "target": "fr"}).json()["translatedText"]
        assert libre == grpc_translate(running, model=NLLB, source_language="en",
                                       target_language="fr").translations[0].hypotheses[0].text
    finally:
        running.stop()


def test_prefer_model_must_name_a_served_model(models: Path) -> None:
    with pytest.raises(ModelLoadError) as err:  # checked before any model loads
        load_models(ModelRegistry(), server_config(models, prefer_model=f"{NLLB},tiny-nlb"),
                    Metrics())
    assert str(err.value) == (
        f"--prefer-model names 'tiny-nlb', which no valid package in {models} is; the "
        f"models: {ONE}, {M2M100}, {NLLB}")
