"""German in, French out through English, on a real server: the shipped en-de and
en-fr beside a de-en (the tiny test package, relabelled: the shipped de-en comes
later), through gRPC, LibreTranslate's own Python client, /translate_file and
`seq2serve translate-file`; the chain's answer is en-fr's answer to de-en's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from libretranslatepy import LibreTranslateAPI
from serving import RunningServer, free_port, server_config
from translate.storage import pypo

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

MODELS = Path(__file__).resolve().parents[2] / "models"
GERMAN = ["Öffne die Datei und speichere deine Änderungen.", "Der Server läuft nicht."]
DE_EN = "tiny-de-en"

pytestmark = pytest.mark.skipif(
    not all((MODELS / name).is_dir() for name in ("en-de", "en-fr")),
    reason="the shipped models/en-de and models/en-fr")


def name_of(package: Path) -> str:
    return str(json.loads((package / "manifest.json").read_text())["name"])


EN_FR = name_of(MODELS / "en-fr") if (MODELS / "en-fr").is_dir() else "en-fr"


@pytest.fixture(scope="module")
def server(marian_package: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("chain")
    for name in ("en-de", "en-fr"):
        (root / name).symlink_to(MODELS / name)
    shutil.copytree(marian_package, root / DE_EN)
    manifest = json.loads((root / DE_EN / "manifest.json").read_text())
    manifest.update(name=DE_EN, source_language="de", target_language="en")
    (root / DE_EN / "manifest.json").write_text(json.dumps(manifest))
    running = RunningServer(server_config(root, http_port=free_port(), threads=1))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[pb_grpc.TranslatorStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield pb_grpc.TranslatorStub(channel)


@pytest.fixture(scope="module")
def french(stub: pb_grpc.TranslatorStub) -> list[str]:
    """What en-fr makes of what de-en makes of GERMAN: two requests, leg by leg."""
    english = stub.Translate(pb.TranslateRequest(model=DE_EN, texts=GERMAN), timeout=120)
    middle = [t.hypotheses[0].text for t in english.translations]
    answer = stub.Translate(pb.TranslateRequest(model=EN_FR, texts=middle), timeout=120)
    return [t.hypotheses[0].text for t in answer.translations]


def test_german_in_french_out_over_grpc(stub: pb_grpc.TranslatorStub,
                                        french: list[str]) -> None:
    answer = stub.Translate(pb.TranslateRequest(texts=GERMAN, source_language="de",
                                                target_language="fr"), timeout=120)
    assert list(answer.models) == [DE_EN, EN_FR] and answer.model == f"{DE_EN}+{EN_FR}"
    assert [t.hypotheses[0].text for t in answer.translations] == french
    chunks = list(stub.TranslateStream(pb.TranslateRequest(
        texts=GERMAN[:1], source_language="de", target_language="fr"), timeout=120))
    assert chunks[-1].final and list(chunks[-1].models) == [DE_EN, EN_FR]
    assert "".join(c.text_delta for c in chunks) == french[0]
    # A direct pair says its one model.
    direct = stub.Translate(pb.TranslateRequest(texts=["Hello"], source_language="en",
                                                target_language="fr"), timeout=120)
    assert list(direct.models) == [EN_FR]


def test_list_models_shows_every_reachable_pair(stub: pb_grpc.TranslatorStub) -> None:
    routes = {(r.source_language, r.target_language): list(r.models)
              for r in stub.ListModels(pb.ListModelsRequest(), timeout=30).routes}
    assert routes[("de", "fr")] == [DE_EN, EN_FR]
    assert routes[("de", "en")] == [DE_EN] and len(routes[("en", "de")]) == 1
    assert not any(s == "fr" for s, _ in routes)  # nothing reads French yet


def test_bad_pairs_over_grpc(stub: pb_grpc.TranslatorStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.Translate(pb.TranslateRequest(texts=["Bonjour"], source_language="fr",
                                           target_language="de"), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "through en: de->fr" in (err.value.details() or "")
    same = stub.Translate(pb.TranslateRequest(texts=GERMAN, source_language="de",
                                              target_language="de"), timeout=30)
    assert [t.hypotheses[0].text for t in same.translations] == GERMAN
    assert list(same.models) == [] and same.model == ""


def test_german_in_french_out_through_libretranslatepy(server: RunningServer,
                                                       french: list[str]) -> None:
    assert server.http_url is not None
    client = LibreTranslateAPI(server.http_url)
    assert client.translate(GERMAN[0], "de", "fr") == french[0]
    languages = {lang["code"]: lang["targets"] for lang in client.languages()}
    assert languages == {"de": ["en", "fr"], "en": ["de", "fr"], "fr": []}
    with httpx.Client(base_url=server.http_url, timeout=120) as http:
        body = http.post("/translate", json={"q": GERMAN, "source": "auto",
                                             "target": "fr"}).json()
        assert body["translatedText"] == french
        assert [d["language"] for d in body["detectedLanguage"]] == ["de", "de"]
        assert body["models"] == [[DE_EN, EN_FR]] * 2
        direct = http.post("/translate", json={"q": "Hello", "source": "en",
                                               "target": "fr"}).json()
        assert set(direct) == {"translatedText"}  # LibreTranslate's answer, field for field
        same = http.post("/translate", json={"q": GERMAN[0], "source": "de", "target": "de"})
        assert same.status_code == 200 and same.json() == {"translatedText": GERMAN[0]}
        bad = http.post("/translate", json={"q": "Bonjour", "source": "fr", "target": "de"})
        assert bad.status_code == 400
        assert bad.json()["error"] == "fr is not supported"  # as LibreTranslate says it


def test_a_german_po_file_into_french(server: RunningServer, french: list[str],
                                      tmp_path: Path) -> None:
    source = tmp_path / "app.po"
    source.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n'
                      '"Language: fr\\n"\n\n'
                      + "".join(f'msgid "{text}"\nmsgstr ""\n\n' for text in GERMAN),
                      encoding="utf-8")
    out = tmp_path / "app.fr.po"
    result = subprocess.run(
        [sys.executable, "-m", "seq2serve.server.cli.main", "translate-file", str(source),
         "--from", "de", "--to", "fr", "-o", str(out), "--server", server.target],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    units = [u for u in pypo.pofile(out.read_bytes()).units if not u.isheader()]
    assert [str(u.target) for u in units] == french
    assert server.http_url is not None
    with httpx.Client(base_url=server.http_url, timeout=120) as http:
        answer = http.post("/translate_file", data={"source": "auto", "target": "fr"},
                           files={"file": ("app.po", source.read_bytes())})
        assert answer.status_code == 200, answer.text
        download = http.get(answer.json()["translatedFileUrl"]).content
    units = [u for u in pypo.pofile(download).units if not u.isheader()]
    assert [str(u.target) for u in units] == french
