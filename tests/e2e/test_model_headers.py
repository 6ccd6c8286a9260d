"""Routing by model for gateways (server/api/routing.py), on a real server of the
shipped en-de, en-fr, de-en and summarize-en: every answer names the model that
served it (gRPC trailing metadata `seq2serve-model`, HTTP header
`X-Seq2serve-Model`; a chain both legs, "de-en+en-fr"), read by grpcurl and
httpx as well as grpcio; a request may name its model or pair in a header
(`seq2serve-model` / `seq2serve-pair`, `X-Seq2serve-Model` / `X-Seq2serve-Pair`),
which fills the body's unset field and is refused, naming both, where it
disagrees with the body."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import system_tools
from serving import RunningServer, free_port, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

MODELS = Path(__file__).resolve().parents[2] / "models"
PACKAGES = ("en-de", "en-fr", "de-en", "summarize-en")
TEXT = "Open the file and save your changes."
GERMAN = "Öffne die Datei und speichere deine Änderungen."

pytestmark = pytest.mark.skipif(not all((MODELS / p).is_dir() for p in PACKAGES),
                                reason="the shipped models/" + ", models/".join(PACKAGES))


def name_of(package: str) -> str:
    return str(json.loads((MODELS / package / "manifest.json").read_text())["name"]) \
        if (MODELS / package).is_dir() else package


EN_DE, EN_FR, DE_EN, SUMMARIZE = map(name_of, PACKAGES)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("models")
    for package in PACKAGES:
        (root / package).symlink_to(MODELS / package)
    running = RunningServer(server_config(root, http_port=free_port(), threads=1))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[pb_grpc.TranslatorStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield pb_grpc.TranslatorStub(channel)


def served_by(call: grpc.Call) -> list[str]:
    return [value for key, value in call.trailing_metadata() if key == "seq2serve-model"]


def best(response: pb.TranslateResponse) -> str:
    return response.translations[0].hypotheses[0].text


# --- gRPC -------------------------------------------------------------------------

def test_grpc_answer_names_its_model_and_a_chain_both(stub: pb_grpc.TranslatorStub) -> None:
    response, call = stub.Translate.with_call(
        pb.TranslateRequest(texts=[TEXT], source_language="en", target_language="fr"),
        timeout=120)
    assert served_by(call) == [EN_FR] == [response.model]
    response, call = stub.Translate.with_call(
        pb.TranslateRequest(texts=[GERMAN], source_language="de", target_language="fr"),
        timeout=120)
    assert served_by(call) == [f"{DE_EN}+{EN_FR}"] == [response.model]
    stream = stub.TranslateStream(pb.TranslateRequest(texts=[TEXT], model=EN_DE), timeout=120)
    assert list(stream)[-1].final
    assert served_by(stream) == [EN_DE]
    summary, call = stub.Summarize.with_call(pb.SummarizeRequest(texts=[TEXT * 3]), timeout=120)
    assert served_by(call) == [SUMMARIZE] == [summary.model]
    # A request refused after its model was chosen says whose limits it broke.
    with pytest.raises(grpc.RpcError) as refused:
        stub.Translate(pb.TranslateRequest(texts=[TEXT], model=EN_DE, options=pb.DecodingOptions(
            beam_size=10_000)), timeout=120)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert served_by(refused.value) == [EN_DE]


def test_grpc_metadata_names_the_model_or_pair(stub: pb_grpc.TranslatorStub) -> None:
    by_body = stub.Translate(pb.TranslateRequest(texts=[TEXT], model=EN_FR), timeout=120)
    response, call = stub.Translate.with_call(pb.TranslateRequest(texts=[TEXT]), timeout=120,
                                              metadata=[("seq2serve-pair", "en-fr")])
    assert served_by(call) == [EN_FR] and best(response) == best(by_body)
    response, call = stub.Translate.with_call(pb.TranslateRequest(texts=[TEXT]), timeout=120,
                                              metadata=[("seq2serve-model", EN_FR)])
    assert served_by(call) == [EN_FR] and best(response) == best(by_body)
    # Header and body agreeing is no conflict.
    _, call = stub.Translate.with_call(pb.TranslateRequest(texts=[TEXT], model=EN_FR),
                                       timeout=120, metadata=[("seq2serve-model", EN_FR)])
    assert served_by(call) == [EN_FR]


@pytest.mark.parametrize(("request_", "metadata", "named"), [
    (pb.TranslateRequest(texts=[TEXT], model=EN_DE), [("seq2serve-model", EN_FR)],
     [EN_DE, EN_FR, "seq2serve-model", "model"]),
    (pb.TranslateRequest(texts=[TEXT], source_language="en", target_language="de"),
     [("seq2serve-pair", "en-fr")], ["'de'", "'fr'", "seq2serve-pair", "target_language"]),
    (pb.TranslateRequest(texts=[TEXT]), [("seq2serve-pair", "en")], ["seq2serve-pair",
                                                                     "SOURCE-TARGET"]),
])
def test_grpc_conflict_is_invalid_argument_naming_both(
        stub: pb_grpc.TranslatorStub, request_: pb.TranslateRequest,
        metadata: list[tuple[str, str]], named: list[str]) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Translate(request_, timeout=120, metadata=metadata)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for word in named:
        assert word in caught.value.details(), (word, caught.value.details())


@pytest.mark.needs("grpcurl")
def test_grpcurl_sends_the_pair_and_reads_the_trailer(server: RunningServer) -> None:
    """A client nobody here wrote: grpcurl (reflection), its -H metadata and -v trailers."""
    out = subprocess.run(
        [system_tools.path("grpcurl"), "-plaintext", "-v", "-H", "seq2serve-pair: en-de",
         "-d", json.dumps({"texts": [TEXT]}), server.target,
         "seq2serve.v1.Translator/Translate"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    trailers = out.stdout.split("Response trailers received:", 1)[1]
    assert f"seq2serve-model: {EN_DE}" in trailers.splitlines()


# --- HTTP -------------------------------------------------------------------------

def test_http_answers_name_their_model(http: httpx.Client) -> None:
    answer = http.post("/translate", json={"q": TEXT, "source": "en", "target": "de"})
    assert answer.status_code == 200 and answer.headers["X-Seq2serve-Model"] == EN_DE
    answer = http.post("/translate", json={"q": GERMAN, "source": "de", "target": "fr"})
    assert answer.headers["X-Seq2serve-Model"] == f"{DE_EN}+{EN_FR}"
    assert answer.json()["models"] == [DE_EN, EN_FR]
    answer = http.post("/v1/translate", json={"texts": [TEXT], "model": EN_FR})
    assert answer.headers["X-Seq2serve-Model"] == EN_FR == answer.json()["model"]
    with http.stream("POST", "/v1/translate:stream", json={"texts": [TEXT], "model": EN_DE}
                     ) as streamed:
        assert streamed.status_code == 200 and streamed.headers["X-Seq2serve-Model"] == EN_DE
        streamed.read()
    answer = http.post("/summarize", json={"q": TEXT * 3})
    assert answer.headers["X-Seq2serve-Model"] == SUMMARIZE
    # An answer no model served names none.
    answer = http.get("/languages")
    assert answer.status_code == 200 and "X-Seq2serve-Model" not in answer.headers


def test_http_headers_name_the_pair_or_model(http: httpx.Client) -> None:
    by_body = http.post("/translate", json={"q": TEXT, "source": "en", "target": "fr"}).json()
    answer = http.post("/translate", json={"q": TEXT}, headers={"X-Seq2serve-Pair": "en-fr"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == by_body and answer.headers["X-Seq2serve-Model"] == EN_FR
    # LibreTranslate's API names no model: the header must be the pair's model.
    answer = http.post("/translate", json={"q": TEXT, "source": "en", "target": "fr"},
                       headers={"X-Seq2serve-Model": EN_FR})
    assert answer.json() == by_body
    answer = http.post("/v1/translate", json={"texts": [TEXT]},
                       headers={"X-Seq2serve-Model": EN_FR})
    assert answer.status_code == 200 and answer.json()["model"] == EN_FR
    assert answer.json()["translations"][0]["hypotheses"][0]["text"] == by_body["translatedText"]
    answer = http.post("/summarize", json={"q": TEXT * 3},
                       headers={"X-Seq2serve-Model": SUMMARIZE})
    assert answer.status_code == 200 and answer.headers["X-Seq2serve-Model"] == SUMMARIZE


@pytest.mark.parametrize(("path", "body", "headers", "named"), [
    ("/translate", {"q": TEXT, "source": "en", "target": "de"}, {"X-Seq2serve-Pair": "en-fr"},
     ["target", "'de'", "'fr'", "X-Seq2serve-Pair"]),
    ("/translate", {"q": TEXT, "source": "en", "target": "de"},
     {"X-Seq2serve-Model": EN_FR}, [EN_DE, EN_FR, "X-Seq2serve-Model"]),
    ("/v1/translate", {"texts": [TEXT], "model": EN_DE}, {"X-Seq2serve-Model": EN_FR},
     [EN_DE, EN_FR, "X-Seq2serve-Model", "model"]),
    ("/summarize", {"q": TEXT, "model": SUMMARIZE}, {"X-Seq2serve-Model": EN_DE},
     [SUMMARIZE, EN_DE, "X-Seq2serve-Model"]),
    ("/v1/summarize", {"texts": [TEXT]}, {"X-Seq2serve-Pair": "en-de"},
     ["X-Seq2serve-Pair", "summary"]),
    ("/translate", {"q": TEXT}, {"X-Seq2serve-Pair": "pt-BR-en"},
     ["X-Seq2serve-Pair", "SOURCE:TARGET", "pt-BR-en"]),
])
def test_http_conflict_is_400_naming_both(http: httpx.Client, path: str, body: dict[str, object],
                                          headers: dict[str, str], named: list[str]) -> None:
    answer = http.post(path, json=body, headers=headers)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    for word in named:
        assert word in message, (word, message)


def test_cors_lets_a_browser_send_and_read_the_headers(server: RunningServer) -> None:
    """The preflight allows the request headers; the answer exposes X-Seq2serve-Model
    (the default --cors-origins is *)."""
    origin = {"Origin": "https://example.org"}
    preflight = httpx.options(f"{server.http_url}/translate", headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "x-seq2serve-pair,x-seq2serve-model"}, timeout=30)
    assert preflight.status_code == 200, preflight.text
    allowed = preflight.headers["access-control-allow-headers"].lower()
    assert "x-seq2serve-pair" in allowed and "x-seq2serve-model" in allowed
    answer = httpx.post(f"{server.http_url}/translate", headers=origin, timeout=120,
                        json={"q": TEXT, "source": "en", "target": "de"})
    assert "x-seq2serve-model" in answer.headers["access-control-expose-headers"].lower()


def _until_done(poll: Callable[[], httpx.Response], done: Callable[[dict], bool]
                ) -> httpx.Response:
    """`poll`'s answer once `done` says the job has ended (at most 600 polls)."""
    for _ in range(600):
        answer = poll()
        assert answer.status_code == 200, answer.text
        if done(answer.json()):
            return answer
        time.sleep(0.1)
    raise AssertionError("the document job did not end")


def test_document_answers_name_the_model_that_translated_the_file(http: httpx.Client) -> None:
    """A document job runs apart from its request; the answers that carry its file
    (/translate_file, the download, /v1/jobs once done, DeepL's result) name its model,
    which the job's state keeps."""
    def upload(path: str, source: str, target: str, text: str) -> httpx.Response:
        return http.post(path, data={"source": source, "target": target},
                         files={"file": ("notes.txt", text.encode())})

    answer = upload("/translate_file", "en", "de", TEXT)
    assert answer.status_code == 200 and answer.headers["X-Seq2serve-Model"] == EN_DE
    download = http.get(answer.json()["translatedFileUrl"])
    assert download.status_code == 200 and download.headers["X-Seq2serve-Model"] == EN_DE
    chained = upload("/translate_file", "de", "fr", GERMAN)
    assert chained.headers["X-Seq2serve-Model"] == f"{DE_EN}+{EN_FR}"
    submitted = upload("/v1/jobs", "en", "fr", TEXT)
    assert submitted.status_code == 202, submitted.text
    done = _until_done(lambda: http.get(f"/v1/jobs/{submitted.json()['id']}"),
                       lambda body: body["state"] in ("done", "error"))
    assert done.json()["state"] == "done" and done.headers["X-Seq2serve-Model"] == EN_FR
    auth = {"Authorization": "DeepL-Auth-Key any-key"}
    document = http.post("/v2/document", data={"source_lang": "EN", "target_lang": "DE"},
                         files={"file": ("notes.txt", TEXT.encode())}, headers=auth).json()
    handle = {"document_key": document["document_key"]}
    path = f"/v2/document/{document['document_id']}"
    _until_done(lambda: http.post(path, json=handle, headers=auth),
                lambda body: body["status"] in ("done", "error"))
    result = http.post(f"{path}/result", json=handle, headers=auth)
    assert result.status_code == 200 and result.headers["X-Seq2serve-Model"] == EN_DE
