"""German in, French out through English (and French in, German out), on a real
server of the shipped en-de, en-fr, de-en and fr-en: through gRPC, LibreTranslate's
own Python client, /translate_file, `seq2serve translate-file` and the load
benchmark's --pairs; a chain's answer is the second model's answer to the first's."""

from __future__ import annotations

import json
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

from seq2serve.bench.server import load
from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

MODELS = Path(__file__).resolve().parents[2] / "models"
PAIRS = ("en-de", "en-fr", "de-en", "fr-en")
GERMAN = ["Öffne die Datei und speichere deine Änderungen.", "Der Server läuft nicht."]
FRENCH = ["Ouvrez le fichier et enregistrez vos modifications.", "Le serveur ne répond pas."]

pytestmark = pytest.mark.skipif(not all((MODELS / p).is_dir() for p in PAIRS),
                                reason="the shipped models/" + ", models/".join(PAIRS))


def name_of(pair: str) -> str:
    return str(json.loads((MODELS / pair / "manifest.json").read_text())["name"]) \
        if (MODELS / pair).is_dir() else pair


EN_DE, EN_FR, DE_EN, FR_EN = map(name_of, PAIRS)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chain")
    for pair in PAIRS:
        (root / pair).symlink_to(MODELS / pair)
    return root


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models, http_port=free_port(), threads=1))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[pb_grpc.TranslatorStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield pb_grpc.TranslatorStub(channel)


def leg_by_leg(stub: pb_grpc.TranslatorStub, first: str, second: str,
               texts: list[str]) -> list[str]:
    """What `second` makes of what `first` makes of `texts`: two requests."""
    middle = stub.Translate(pb.TranslateRequest(model=first, texts=texts), timeout=120)
    answer = stub.Translate(pb.TranslateRequest(
        model=second, texts=[t.hypotheses[0].text for t in middle.translations]), timeout=120)
    return [t.hypotheses[0].text for t in answer.translations]


@pytest.fixture(scope="module")
def french(stub: pb_grpc.TranslatorStub) -> list[str]:
    return leg_by_leg(stub, DE_EN, EN_FR, GERMAN)


def test_german_in_french_out_over_grpc(stub: pb_grpc.TranslatorStub,
                                        french: list[str]) -> None:
    answer = stub.Translate(pb.TranslateRequest(texts=GERMAN, source_language="de",
                                                target_language="fr"), timeout=120)
    assert list(answer.models) == [DE_EN, EN_FR] and answer.model == f"{DE_EN}+{EN_FR}"
    assert [t.hypotheses[0].text for t in answer.translations] == french
    assert "serveur" in french[1].lower()  # the shipped models' French is French
    chunks = list(stub.TranslateStream(pb.TranslateRequest(
        texts=GERMAN[:1], source_language="de", target_language="fr"), timeout=120))
    assert chunks[-1].final and list(chunks[-1].models) == [DE_EN, EN_FR]
    assert "".join(c.text_delta for c in chunks) == french[0]
    # A direct pair says its one model, and a direct model wins over a chain.
    for source, target, model in (("en", "fr", EN_FR), ("de", "en", DE_EN),
                                  ("fr", "en", FR_EN)):
        direct = stub.Translate(pb.TranslateRequest(texts=["Hallo"], source_language=source,
                                                    target_language=target), timeout=120)
        assert list(direct.models) == [model]


def test_french_in_german_out_over_grpc(stub: pb_grpc.TranslatorStub) -> None:
    german = leg_by_leg(stub, FR_EN, EN_DE, FRENCH)
    answer = stub.Translate(pb.TranslateRequest(texts=FRENCH, source_language="fr",
                                                target_language="de"), timeout=120)
    assert list(answer.models) == [FR_EN, EN_DE]
    assert [t.hypotheses[0].text for t in answer.translations] == german
    assert "datei" in german[0].lower()


def test_list_models_shows_every_reachable_pair(stub: pb_grpc.TranslatorStub) -> None:
    routes = {(r.source_language, r.target_language): list(r.models)
              for r in stub.ListModels(pb.ListModelsRequest(), timeout=30).routes}
    assert routes == {("en", "de"): [EN_DE], ("en", "fr"): [EN_FR], ("de", "en"): [DE_EN],
                      ("fr", "en"): [FR_EN], ("de", "fr"): [DE_EN, EN_FR],
                      ("fr", "de"): [FR_EN, EN_DE]}


def test_bad_pairs_over_grpc(stub: pb_grpc.TranslatorStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.Translate(pb.TranslateRequest(texts=["Hola"], source_language="es",
                                           target_language="de"), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    details = err.value.details() or ""
    assert "fr->de" in details and "de->fr" in details, details  # names what is served
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
    assert languages == {"de": ["en", "fr"], "en": ["de", "fr"], "fr": ["de", "en"]}
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
        bad = http.post("/translate", json={"q": "Hola", "source": "es", "target": "de"})
        assert bad.status_code == 400
        assert bad.json()["error"] == "es is not supported"  # as LibreTranslate says it


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


def test_the_load_benchmark_sets_a_chain_beside_a_direct_pair(models: Path,
                                                              tmp_path: Path) -> None:
    texts = tmp_path / "german.txt"
    texts.write_text("\n".join(GERMAN) + "\n", encoding="utf-8")
    out = tmp_path / "load.json"
    assert load.main(["--models-dir", str(models), "--pairs", "de-en,de-fr", "--texts",
                      str(texts), "--modes", "iteration", "--beams", "1", "--concurrency", "2",
                      "--rates", "", "--requests", "4", "--level-seconds", "60",
                      "--drain-seconds", "60", "--json", str(out), "--set", "threads=1"]) == 0
    records = json.loads(out.read_text())
    assert [r["target"] for r in records] == ["de-en", "de-fr"]
    assert all(r["completed"] == r["sent"] == 4 and r["errors"] == 0 for r in records)
