"""A multilingual package (a tiny M2M100 built in the test, as the parity tests build
it) served beside a bilingual one, through both doors (issue 46 item 4-5): every pair
of its languages is listed (ListModels, ListRoutes, /languages, the page's lists) and
served; a pair the bilingual model serves goes to it (or, with
--prefer-multilingual, to the multilingual one); requests of different pairs,
batched together by the server, each get exactly the engine's tokens for that pair
alone; codes in every form a request uses reach the same language; a language the
model lacks is refused, naming it."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from browser import CHROMIUM_ARGS, chromium
from multilingual_folders import multilingual_package
from serving import RunningServer, free_port, server_config

from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import package_tokenizer
from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.detect import Detector
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import RunnerConfig

MANY = "tiny-m2m100"
ONE = "tiny-en-de"  # the bilingual model: the M2M100 package relabelled en -> de
TEXTS = ["Open the file.", "Save your changes before you close the window.",
         "The server is not running.", "Delete the old backups."]
MAX_NEW = 12


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("multilingual-models")
    package = multilingual_package("m2m100", tmp_path_factory.mktemp("m2m100"))
    shutil.copytree(package, root / MANY)
    # A model of one pair, en -> de: the multilingual package without its languages
    # whose every text is forced to start with German's token, as a bilingual model
    # trained on en -> de would start it.
    manifest = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
    german = manifest["languages"]["tokens"][manifest["languages"]["codes"]["de"]]
    shutil.copytree(package, root / ONE)
    manifest.update(name=ONE, source_language="en", target_language="de")
    del manifest["languages"]
    manifest["generation"]["forced_bos_token_id"] = german
    manifest["input_prefix"] = ""
    (root / ONE / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models, http_port=free_port(), max_queue_delay_ms=50.0))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def engine(models: Path) -> Engine:
    return Engine(models / MANY, RunnerConfig(provider="cpu", intra_op_threads=1),
                  default_limits())


def alone(engine: Engine, text: str, source: str, target: str) -> list[int]:
    """The engine's best tokens for one text of one pair, decoded alone (beam 2)."""
    package = load_package(engine.package.path)
    languages = package.manifest.languages
    assert languages is not None
    tokenizer = package_tokenizer(package)
    ids = tokenizer.encode(text, languages.token(source))
    [best, *_] = engine.generate([ids], DecodingOptions(beam_size=2, max_length=MAX_NEW),
                                 forced_bos=[languages.token(target)])[0]
    return best.token_ids


def test_every_pair_is_listed(server: RunningServer, engine: Engine) -> None:
    languages = engine.package.manifest.languages
    assert languages is not None
    codes = sorted(languages.listed())
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        listing = stub.ListModels(pb.ListModelsRequest(), timeout=30)
    models = {m.name: m for m in listing.models}
    routes = {(r.source_language, r.target_language): tuple(r.models) for r in listing.routes}
    assert sorted(models[MANY].languages) == codes and not models[ONE].languages
    assert (models[MANY].source_language, models[MANY].target_language) == ("mul", "mul")
    # every ordered pair; en -> de to the bilingual model, which wins
    assert set(routes) == {(a, b) for a in codes for b in codes if a != b}
    assert routes[("en", "de")] == (ONE,) and routes[("de", "en")] == (MANY,)
    listed = httpx.get(f"{server.http_url}/languages", timeout=30).json()
    assert {entry["code"]: sorted(entry["targets"]) for entry in listed} == \
        {a: sorted(b for b in codes if b != a) for a in codes}
    # each language by the English name the package carries (CLDR's, written at
    # export), also those the language identifier does not know (Asturian)
    names = {entry["code"]: entry["name"] for entry in listed}
    assert names == languages.names and names["en"] == "English"
    assert names["ast"] == "Asturian" and not Detector.can_identify("ast")


def test_pairs_batched_together_each_as_alone(server: RunningServer, engine: Engine) -> None:
    """Concurrent requests of different pairs (batched together by the server: the
    queue waits 50 ms for more) get the engine's tokens for their own pair alone."""
    pairs = [("en", "fr"), ("fr", "de"), ("de", "en"), ("en", "zh"), ("zh", "fr"),
             ("de", "fr")]
    asks = [(text, s, t) for text in TEXTS for s, t in pairs]

    async def ask_all() -> list[list[int]]:
        async with grpc.aio.insecure_channel(server.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            replies = await asyncio.gather(*[stub.Translate(pb.TranslateRequest(
                model=MANY, texts=[text], source_language=s, target_language=t,
                options=pb.DecodingOptions(beam_size=2, max_length=MAX_NEW,
                                           return_token_ids=True)), timeout=120)
                for text, s, t in asks])
        return [list(r.translations[0].hypotheses[0].token_ids) for r in replies]

    got = asyncio.run(ask_all())
    want = [alone(engine, text, s, t) for text, s, t in asks]
    assert got == want
    # the pair decides the output: a text's translations into two languages differ
    assert want[0] != want[3]


def test_codes_in_every_form_reach_the_language(server: RunningServer, engine: Engine) -> None:
    languages = engine.package.manifest.languages
    assert languages is not None
    want = alone(engine, TEXTS[0], "en", "zh")
    tokenizer = package_tokenizer(engine.package)
    text = tokenizer.decode(want)
    for source, target in [("en", "zh"), ("EN", "zh-Hans"), ("en-US", "zh-CN"),
                           ("en", languages.model_code("zh") or "")]:
        answer = httpx.post(f"{server.http_url}/translate", timeout=60, json={
            "q": TEXTS[0], "source": source, "target": target}).json()
        # /translate decodes with the package's defaults; gRPC below with beam 2
        assert "translatedText" in answer, (source, target, answer)
        with grpc.insecure_channel(server.target) as channel:
            reply = pb_grpc.TranslatorStub(channel).Translate(pb.TranslateRequest(
                model=MANY, texts=[TEXTS[0]], source_language=source, target_language=target,
                options=pb.DecodingOptions(beam_size=2, max_length=MAX_NEW)), timeout=60)
        assert reply.translations[0].hypotheses[0].text == text, (source, target)


def test_a_language_the_model_lacks_is_refused(server: RunningServer) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Translate(pb.TranslateRequest(model=MANY, texts=["Hello"], source_language="en",
                                               target_language="tlh"), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "target_language='tlh'" in (err.value.details() or "")
    assert "/languages" in (err.value.details() or "")
    answer = httpx.post(f"{server.http_url}/translate", timeout=30,
                        json={"q": "Hello", "source": "en", "target": "tlh"})
    assert answer.status_code == 400 and "tlh" in answer.json()["error"]


@pytest.mark.needs("chromium")
def test_the_page_lists_every_language(server: RunningServer, engine: Engine) -> None:
    from playwright.sync_api import expect, sync_playwright

    languages = engine.package.manifest.languages
    assert languages is not None
    codes = set(languages.listed())
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{server.http_url}/")
            expect(page.locator("#source-lang")).to_be_enabled(timeout=30_000)
            options = page.locator("#source-lang option")
            sources = {options.nth(i).get_attribute("value") for i in range(options.count())}
            page.select_option("#source-lang", "de")
            options = page.locator("#target-lang option")
            targets = {options.nth(i).get_attribute("value") for i in range(options.count())}
        finally:
            browser.close()
    assert codes <= sources and targets == codes - {"de"}


def test_prefer_multilingual_serves_the_shared_pair(models: Path, engine: Engine) -> None:
    running = RunningServer(server_config(models, http_port=free_port(), prefer_multilingual=True))
    try:
        answer: Any = httpx.post(f"{running.http_url}/translate", timeout=60, json={
            "q": TEXTS[1], "source": "en", "target": "de"}).json()
        with grpc.insecure_channel(running.target) as channel:
            routes = {(r.source_language, r.target_language): tuple(r.models) for r in
                      pb_grpc.TranslatorStub(channel).ListModels(pb.ListModelsRequest(),
                                                                 timeout=30).routes}
    finally:
        running.stop()
    assert routes[("en", "de")] == (MANY,)
    assert "translatedText" in answer
