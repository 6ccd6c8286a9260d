"""Requests that arrive while `seq2serve serve` loads its models: every route that
depends on the models answers 503 with Retry-After (HTTP) or UNAVAILABLE (gRPC) until
all are loaded, never "not supported" for a pair still loading; afterwards every route
answers exactly as a server started in silence does. On the shipped models, held open
after the first has loaded (tests/held_serve.py), as the models folder is at a start,
after a restart with a package added, and with one package that fails to load."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from browser import CHROMIUM_ARGS, chromium
from google.protobuf.json_format import MessageToDict
from serving import ServeProcess, free_port, health, serve_env, wait_serving

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

MODELS = Path(__file__).resolve().parents[2] / "models"
BASE = ("en-de", "de-en", "en-fr")
ADDED = "fr-en"

pytestmark = pytest.mark.skipif(not all((MODELS / p).is_dir() for p in (*BASE, ADDED)),
                                reason="the shipped models/")

# One request of each route that depends on the served models (the page, /docs and
# /suggest do not), each a (method, path, JSON body or upload).
ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/languages", None),
    ("GET", "/frontend/settings", None),
    ("GET", "/health", None),
    ("GET", "/v1/models", None),
    ("POST", "/translate", {"q": "Open the file.", "source": "en", "target": "de"}),
    ("POST", "/translate", {"q": ["Der Server läuft nicht.", "Öffne die Datei."],
                            "source": "de", "target": "fr"}),
    ("POST", "/translate", {"q": "Ouvrez le fichier.", "source": "auto", "target": "en"}),
    ("POST", "/detect", {"q": "Ouvrez le fichier et enregistrez vos modifications."}),
    ("POST", "/summarize", {"q": "A library for reading archives."}),
    ("POST", "/v1/translate", {"texts": ["Save your changes."], "sourceLanguage": "en",
                               "targetLanguage": "fr"}),
    ("POST", "/v1/summarize", {"texts": ["A library for reading archives."]}),
    ("POST", "/translate_file", ("notes.txt", "Open the file.\nSave your changes.\n")),
    ("GET", "/v2/languages?type=target", None),
    ("POST", "/v2/translate", {"text": ["Open the file.", "Ouvrez le fichier."],
                               "target_lang": "EN-GB"}),
)


def ask(client: httpx.Client, method: str, path: str, body: Any) -> httpx.Response:
    if path == "/translate_file":
        name, text = body
        return client.post(path, data={"source": "en", "target": "de"},
                           files={"file": (name, text.encode())})
    return client.request(method, path, json=body)


def http_answers(url: str) -> list[tuple[str, int, Any]]:
    """Each route's status and body (a translated file: its content)."""
    out: list[tuple[str, int, Any]] = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for method, path, body in ROUTES:
            response = ask(client, method, path, body)
            answer = response.json()
            if path == "/translate_file" and response.status_code == 200:
                answer = client.get(answer["translatedFileUrl"]).text
            out.append((path, response.status_code, answer))
    return out


def grpc_answers(target: str) -> list[Any]:
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        models = stub.ListModels(pb.ListModelsRequest(), timeout=60)
        chained = stub.Translate(pb.TranslateRequest(
            texts=["Der Server läuft nicht."], source_language="de", target_language="fr"),
            timeout=120)
        return [MessageToDict(models), MessageToDict(chained)]


@pytest.fixture
def processes() -> Iterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    yield started
    for proc in started:
        proc.kill()


def models_folder(root: Path, case: str) -> Path:
    root.mkdir()
    for pair in BASE + ((ADDED,) if case == "added" else ()):
        (root / pair).symlink_to(MODELS / pair)
    if case == "broken":  # graphs without a manifest: reported, not served
        (root / "zz-broken").mkdir()
        shutil.copy(MODELS / "en-de" / "encoder.onnx", root / "zz-broken" / "encoder.onnx")
    return root


def start(models: Path, processes: list[ServeProcess], held: bool,
          release: Path) -> tuple[ServeProcess, str, str]:
    port, http_port = free_port(), free_port()
    env = serve_env(models, port, http_port=http_port, serve_valid_models=1)
    env["HELD_SERVE_RELEASE"] = str(release)
    proc = ServeProcess(env, held=held)
    processes.append(proc)
    return proc, f"127.0.0.1:{port}", f"http://127.0.0.1:{http_port}"


@pytest.mark.parametrize("case", ["start", "added", "broken"])
def test_requests_during_start_up_get_503_and_change_nothing_after(
        case: str, tmp_path: Path, processes: list[ServeProcess]) -> None:
    models = models_folder(tmp_path / "models", case)
    release = tmp_path / "release"
    held, target, url = start(models, processes, held=True, release=release)
    held.wait_for_line("holding the start-up")  # one model loaded, the others not yet

    early = http_answers(url)
    for path, status, body in early:
        assert status == 503, (path, body)
    with httpx.Client(base_url=url, timeout=60) as client:
        for method, path, body in ROUTES:
            response = ask(client, method, path, body)
            assert response.headers["retry-after"] == "2", path
            if path != "/health":
                # LibreTranslate's body says {"error"}, DeepL's {"message"}.
                key = "message" if path.startswith("/v2/") else "error"
                assert "still loading" in response.json()[key], path
    with grpc.insecure_channel(target) as channel:
        assert health(channel) == "NOT_SERVING"
        stub = pb_grpc.TranslatorStub(channel)
        for call in (lambda: stub.ListModels(pb.ListModelsRequest(), timeout=60),
                     lambda: stub.Translate(pb.TranslateRequest(
                         texts=["Open the file."], source_language="en",
                         target_language="de"), timeout=60)):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "still loading" in (refused.value.details() or "")

    release.touch()
    wait_serving(target, held)
    after = http_answers(url), grpc_answers(target)

    release.unlink()  # a server started in silence, on the same folder
    silent, silent_target, silent_url = start(models, processes, held=False, release=release)
    wait_serving(silent_target, silent)
    assert after == (http_answers(silent_url), grpc_answers(silent_target))
    # What was asked for is served: the pair of the bug, and every pair through English.
    [languages] = [body for path, _, body in after[0] if path == "/languages"]
    served = {code: set(entry["targets"]) for entry in languages
              for code in [entry["code"]]}
    assert served["en"] >= {"de", "fr"}
    assert served["de"] >= {"en", "fr"}
    assert ("fr" in served) and (("en" in served["fr"]) == (case == "added"))
    if case == "broken":
        assert "zz-broken" in held.output


@pytest.mark.needs("chromium")
def test_the_page_opened_during_start_up_waits_and_then_lists_every_language(
        tmp_path: Path, processes: list[ServeProcess]) -> None:
    from playwright.sync_api import expect, sync_playwright

    models = models_folder(tmp_path / "models", "added")
    release = tmp_path / "release"
    held, target, url = start(models, processes, held=True, release=release)
    held.wait_for_line("holding the start-up")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(url + "/")
            expect(page.locator("#error")).to_contain_text("still starting", timeout=30_000)
            release.touch()
            source = page.locator("#source-lang")
            expect(source).to_be_enabled(timeout=60_000)
            expect(page.locator("#error")).to_have_text("")
            codes = source.locator("option").evaluate_all("els => els.map(e => e.value)")
            assert {"en", "de", "fr"} <= set(codes)
        finally:
            browser.close()
    wait_serving(target, held)
