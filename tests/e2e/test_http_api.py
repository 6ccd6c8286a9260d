"""The HTTP front door on loopback: LibreTranslate's API (checked with
LibreTranslate's own Python client too), the .proto's JSON against the gRPC
answers, the exact cache, keys and limits, bad input, the drain."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf import json_format
from libretranslatepy import LibreTranslateAPI
from serving import RunningServer, free_port, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.client import Seq2ServeClient
from seq2serve.server.core.markup import extract

TEXTS = ["the house is small", "Open the file. Close it.", "a b c d"]


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models_dir, http_port=free_port(),
                                          max_texts_per_request=16, max_text_chars=2000,
                                          max_message_bytes=1 << 20, cache_mb=16.0,
                                          max_document_characters=5000,
                                          max_document_unpacked_bytes=200_000))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def grpc_client(server: RunningServer) -> Iterator[Seq2ServeClient]:
    with Seq2ServeClient(server.target) as client:
        yield client


def grpc_best(client: Seq2ServeClient, texts: list[str], **options: object) -> list[list[str]]:
    return [[h.text for h in nbest] for nbest in
            client.translate(texts, source_language="en", target_language="de", **options)]


def test_languages_come_from_the_served_models(http: httpx.Client) -> None:
    languages = http.get("/languages").json()
    # LibreTranslate's fields, and ours: every model is loaded (no --lazy), none held out.
    assert {"code": "en", "name": "English", "targets": ["de"], "loaded": True,
            "loadedTargets": ["de"], "unavailableTargets": []} in languages
    assert {lang["code"] for lang in languages} == {"en", "de"}


def test_translate_equals_grpc_for_a_text_and_a_list(http: httpx.Client,
                                                      grpc_client: Seq2ServeClient) -> None:
    expected = [best[0] for best in grpc_best(grpc_client, TEXTS)]
    one = http.post("/translate", json={"q": TEXTS[0], "source": "en", "target": "de"})
    assert one.status_code == 200 and one.json() == {"translatedText": expected[0]}
    many = http.post("/translate", json={"q": TEXTS, "source": "en", "target": "de"})
    assert many.json() == {"translatedText": expected}
    form = http.post("/translate", data={"q": TEXTS[1], "source": "en", "target": "de"})
    assert form.json() == {"translatedText": expected[1]}


def test_alternatives_are_the_nbest_beyond_the_best(http: httpx.Client,
                                                    grpc_client: Seq2ServeClient) -> None:
    [nbest] = grpc_best(grpc_client, [TEXTS[0]], beam_size=4, num_hypotheses=3)
    body = http.post("/translate", json={"q": TEXTS[0], "source": "en", "target": "de",
                                         "alternatives": 2}).json()
    assert body["translatedText"] == nbest[0]
    assert body["alternatives"] == [t for t in nbest[1:] if t != nbest[0]]


def test_auto_detection_reports_each_text(http: httpx.Client) -> None:
    body = http.post("/translate", json={"q": ["the house is small"], "source": "auto",
                                         "target": "de"}).json()
    [found] = body["detectedLanguage"]
    assert found["language"] == "en" and 0 <= found["confidence"] <= 100


def test_html_keeps_markup_and_leaves_code_alone(http: httpx.Client,
                                                 grpc_client: Seq2ServeClient) -> None:
    # One text for the paragraph (no longer one per run between tags): the code rides in
    # it as an empty tag, the bold as a tag pair, both masked by the core as any request's.
    html = '<p class="x">the house is small <code>rm -rf</code> <b>a b c d</b></p>'
    [text] = extract(html).texts
    assert text == "the house is small <x1/> <g2>a b c d</g2>"
    body = http.post("/translate", json={"q": html, "source": "en", "target": "de",
                                         "format": "html"}).json()
    [[tagged]] = grpc_best(grpc_client, [text])
    assert body["translatedText"] == extract(html).render([tagged])
    out = body["translatedText"]
    assert out.startswith('<p class="x">') and out.endswith("</p>")
    assert out.count("<code>rm -rf</code>") == 1 and out.count("<b>") == 1
    assert "<g" not in out and "<x" not in out


def test_libretranslate_python_client(server: RunningServer,
                                      grpc_client: Seq2ServeClient) -> None:
    lt = LibreTranslateAPI(server.http_url + "/")
    assert lt.translate(TEXTS[0], "en", "de") == grpc_best(grpc_client, [TEXTS[0]])[0][0]
    assert {lang["code"] for lang in lt.languages()} == {"en", "de"}
    assert lt.detect("the house is small")[0]["language"] == "en"


def test_proto_json_equals_the_grpc_answer(http: httpx.Client,
                                           grpc_client: Seq2ServeClient) -> None:
    request = pb.TranslateRequest(texts=TEXTS, source_language="en", target_language="de",
                                  options=pb.DecodingOptions(beam_size=3, num_hypotheses=2,
                                                             return_scores=True,
                                                             return_token_ids=True,
                                                             return_alignment=True))

    with grpc.insecure_channel(grpc_client.target) as channel:
        expected = pb_grpc.TranslatorStub(channel).Translate(request)
    answer = http.post("/v1/translate", content=json_format.MessageToJson(request))
    assert answer.status_code == 200
    assert answer.json() == json.loads(json_format.MessageToJson(expected, indent=None))
    models = http.get("/v1/models").json()
    assert [m["targetLanguage"] for m in models["models"]] == ["de"]


def test_stream_as_server_sent_events(http: httpx.Client) -> None:
    request = {"texts": ["Open the file. Close it."], "targetLanguage": "de",
               "options": {"beamSize": 1}}
    with http.stream("POST", "/v1/translate:stream", json=request) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines()
                  if line.startswith("data: ")]
    final = events[-1]
    assert final["final"] is True
    text = "".join(e.get("textDelta", "") for e in events)
    assert text == final["translation"]["hypotheses"][0]["text"]
    bad = http.post("/v1/translate:stream", json={"texts": [], "targetLanguage": "de"})
    assert bad.status_code == 400 and "texts" in bad.json()["error"]


def test_a_cached_answer_equals_a_fresh_one_bit_for_bit(server: RunningServer,
                                                        http: httpx.Client) -> None:
    request = {"texts": ["the small house is open"], "targetLanguage": "de",
               "options": {"beamSize": 2, "numHypotheses": 2, "returnScores": True,
                           "returnTokenIds": True, "returnAlignment": True}}
    cache = server.server.translator.cache
    before = cache.stats()
    fresh = http.post("/v1/translate", json=request).content
    batches = sum(h.batches for h in server.server.registry.handles())
    cached = http.post("/v1/translate", json=request).content
    after = cache.stats()
    assert cached == fresh
    assert after.hits == before.hits + 1 and after.misses == before.misses + 1
    # A hit never reaches the queue: no batch ran for it.
    assert sum(h.batches for h in server.server.registry.handles()) == batches


def test_both_front_doors_share_the_cache(server: RunningServer, http: httpx.Client,
                                          grpc_client: Seq2ServeClient) -> None:
    """The same request (same text, same options) through HTTP then gRPC: one miss,
    then a hit, the same answer."""
    cache = server.server.translator.cache
    request = pb.TranslateRequest(texts=["the open house is small"], source_language="en",
                                  target_language="de",
                                  options=pb.DecodingOptions(return_scores=True))
    via_http = http.post("/v1/translate", content=json_format.MessageToJson(request))
    hits = cache.stats().hits
    with grpc.insecure_channel(grpc_client.target) as channel:
        via_grpc = pb_grpc.TranslatorStub(channel).Translate(request)
    assert cache.stats().hits == hits + 1
    assert json.loads(json_format.MessageToJson(via_grpc, indent=None)) == via_http.json()


@pytest.mark.parametrize(("body", "headers", "status", "message"), [
    (b"{not json", {"content-type": "application/json"}, 400, "Invalid JSON format"),
    (b"\xff\xfe\x00", {"content-type": "application/json"}, 400, "Invalid JSON format"),
    (b'[1, 2]', {"content-type": "application/json"}, 400, "Invalid JSON format"),
    (json.dumps({"q": 5, "source": "en", "target": "de"}).encode(),
     {"content-type": "application/json"}, 400, "q must be a string or a list of strings"),
    (json.dumps({"q": ["x"] * 10_000, "source": "en", "target": "de"}).encode(),
     {"content-type": "application/json"}, 400, "request (10000) exceeds text limit (16); "
     "the limit is the server's --max-texts-per-request (SEQ2SERVE_MAX_TEXTS_PER_REQUEST)"),
    (json.dumps({"q": "x" * 2001, "source": "en", "target": "de"}).encode(),
     {"content-type": "application/json"}, 400, "exceeds character limit (2000); the limit "
     "is the server's --max-text-chars (SEQ2SERVE_MAX_TEXT_CHARS)"),
    (json.dumps({"q": "x", "source": "en", "target": "xx"}).encode(),
     {"content-type": "application/json"}, 400, "xx is not supported"),
    (json.dumps({"q": "x", "source": "en"}).encode(),
     {"content-type": "application/json"}, 400, "Invalid request: missing target parameter"),
    (json.dumps({"q": "x", "source": "en", "target": "de", "alternatives": "two"}).encode(),
     {"content-type": "application/json"}, 400, "alternatives parameter is not a number"),
    (json.dumps({"q": "x", "source": "en", "target": "de", "format": "pdf"}).encode(),
     {"content-type": "application/json"}, 400, "pdf format is not supported"),
    (b"x" * (10 << 20), {"content-type": "application/json"}, 413, "Request body too large"),
    (b"q=x", {"content-type": "text/csv"}, 400, "content type 'text/csv' is not supported"),
])
def test_bad_input_gets_a_clear_4xx_and_the_server_stays_up(
        http: httpx.Client, body: bytes, headers: dict[str, str], status: int,
        message: str) -> None:
    response = http.post("/translate", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    assert len(response.json()["error"]) < 300
    ok = http.post("/translate", json={"q": "a b c d", "source": "en", "target": "de"})
    assert ok.status_code == 200


def test_a_chunked_body_over_the_limit_is_refused_too(http: httpx.Client) -> None:
    def chunks():  # no Content-Length: the limit must hold while reading
        for _ in range(40):
            yield b"x" * 65536

    response = http.post("/translate", content=chunks(),
                         headers={"content-type": "application/json"})
    assert response.status_code == 413 and "Request body too large" in response.json()["error"]
    assert http.get("/health").status_code == 200


def test_deeply_nested_html_is_translated_not_crashed(http: httpx.Client) -> None:
    html = "<div>" * 5000 + "a b c d" + "</div>" * 5000
    response = http.post("/translate", json={"q": html, "source": "en", "target": "de",
                                             "format": "html"})
    assert response.status_code == 400  # over the character limit, refused in words
    small = "<span>" * 100 + "a b c d" + "</span>" * 100
    response = http.post("/translate", json={"q": small, "source": "en", "target": "de",
                                             "format": "html"})
    assert response.status_code == 200
    assert response.json()["translatedText"].startswith("<span>" * 100)


def test_files_translate_and_download(http: httpx.Client, grpc_client: Seq2ServeClient) -> None:
    expected = grpc_best(grpc_client, ["the house is small", "a b c d"])
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("notes.txt", b"the house is small\n\na b c d\n")})
    assert answer.status_code == 200, answer.text
    url = answer.json()["translatedFileUrl"]
    assert url.endswith("notes.txt")
    download = http.get(url)
    assert download.text == f"{expected[0][0]}\n\n{expected[1][0]}\n"
    bad = http.post("/translate_file", data={"source": "en", "target": "de"},
                    files={"file": ("x.pdf", b"%PDF-1.7")})
    assert bad.status_code == 400 and "file format not supported" in bad.json()["error"]
    bad = http.post("/translate_file", data={"source": "en", "target": "de"},
                    files={"file": ("x.docx", b"PK")})
    assert bad.status_code == 400 and "x.docx is not a Word document" in bad.json()["error"]


def test_a_file_past_the_document_limits_is_413_naming_the_limit(http: httpx.Client) -> None:
    many = b"the house is small\n" * 300  # 5,400 characters: past the 5,000 of the fixture
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("notes.txt", many)})
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"] == ("notes.txt has 5400 characters of text to translate; "
                                      "the limit is 5000")
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/media/zeros.bin", bytes(1 << 20))  # 1 MiB, about 1 KB packed
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("bomb.docx", packed.getvalue())})
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"] == ("bomb.docx unpacks to 1048576 bytes; the limit is "
                                      "200000 bytes")
    assert http.get("/health").status_code == 200


def test_summarize_without_a_summarizer_names_the_problem(http: httpx.Client) -> None:
    response = http.post("/summarize", json={"q": "some text"})
    assert response.status_code == 400 and "summarize" in response.json()["error"]


def test_settings_health_headers_and_metrics(server: RunningServer, http: httpx.Client) -> None:
    settings = http.get("/frontend/settings").json()
    assert settings["charLimit"] == 2000 and settings["keyRequired"] is False
    assert http.get("/health").json() == {"status": "ok"}
    page = http.get("/", headers={"Origin": "https://example.org"})
    assert page.status_code == 200 and "default-src 'self'" in \
        page.headers["content-security-policy"]
    assert page.headers["access-control-allow-origin"] == "*"
    docs = http.get("/docs")
    assert docs.status_code == 200 and "/swagger/swagger-ui-bundle.js" in docs.text
    assert http.get("/swagger/swagger-ui-bundle.js").status_code == 200
    assert "/translate" in http.get("/openapi.json").json()["paths"]
    assert http.post("/suggest", data={"q": "a"}).json() == {
        "error": "Suggestions are disabled on this server."}
    http.post("/translate", json={"q": "a b c d", "source": "en", "target": "de"})
    exposition = server.server.metrics.render().decode()
    assert 'seq2serve_http_requests_total{route="/translate",status="200"}' in exposition
    assert "seq2serve_cache_hits_total" in exposition


def test_keys_and_rate_limits(models_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("good-key\n")
    running = RunningServer(server_config(models_dir, http_port=free_port(), api_keys=keys,
                                          require_api_key=True, rate_limit=5))
    try:
        assert running.http_url is not None
        with httpx.Client(base_url=running.http_url, timeout=60) as client:
            body = {"q": "a b c d", "source": "en", "target": "de"}
            missing = client.post("/translate", json=body)
            # LibreTranslate's status for a missing key where one is required (access_check)
            assert missing.status_code == 400 and "API key" in missing.json()["error"]
            wrong = client.post("/translate", json={**body, "api_key": "bad"})
            assert wrong.json() == {"error": "Invalid API key"} and wrong.status_code == 403
            assert client.post("/translate", json={**body, "api_key": "good-key"}).is_success
            burst = client.post("/translate", json={**body, "q": ["a"] * 5,
                                                    "api_key": "good-key"})
            assert burst.status_code == 429
            assert burst.json() == {"error": "Slowdown: 5 per 1 minute"}
            assert client.get("/languages").is_success  # listing is never limited
    finally:
        running.stop()


def dropped_texts(running: RunningServer, expected: int = 2) -> float | None:
    """The texts the queue dropped as cancelled, once `expected` (or after 10 s)."""
    for _ in range(100):
        dropped = running.server.metrics.registry.get_sample_value(
            "seq2serve_cancelled_total", {"model": "opus-mt-en-de", "reason": "cancelled"})
        if dropped == expected:
            break
        time.sleep(0.1)
    return dropped


def test_a_client_that_leaves_takes_its_texts_out_of_the_queue(models_dir: Path) -> None:
    """The texts wait 5 s for company in the queue; their client leaves after 0.5 s:
    they are dropped as cancelled, never run, and the server goes on serving."""
    running = RunningServer(server_config(models_dir, http_port=free_port(),
                                          max_queue_delay_ms=5000.0))
    try:
        body = json.dumps({"q": ["a b c d", "the house"], "source": "en",
                           "target": "de"}).encode()
        with socket.create_connection(("127.0.0.1", running.http_port)) as client:
            client.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Type: application/json\r\n"
                           + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(0.5)
        assert dropped_texts(running) == 2
        assert sum(h.batches for h in running.server.registry.handles()) == 0
        assert running.http_url is not None
        assert httpx.get(running.http_url + "/health", timeout=10).status_code == 200
    finally:
        running.stop()


def test_a_request_over_the_time_limit_gets_504_and_leaves_the_queue(models_dir: Path) -> None:
    """The texts wait 5 s for company in the queue; the HTTP limit is 0.5 s: the client
    gets 504 with LibreTranslate's error body, the texts are dropped, never run, and
    the same server answers the next request (over gRPC, which has no such limit)."""
    running = RunningServer(server_config(models_dir, http_port=free_port(),
                                          max_queue_delay_ms=5000.0, http_timeout_s=0.5))
    try:
        assert running.http_url is not None
        late = httpx.post(running.http_url + "/translate", timeout=30, json={
            "q": ["a b c d", "the house"], "source": "en", "target": "de"})
        assert late.status_code == 504
        assert late.json() == {"error": "the request took longer than this server's limit "
                                        "of 0.5 s (--http-timeout-s)"}
        assert dropped_texts(running) == 2
        assert sum(h.batches for h in running.server.registry.handles()) == 0
        with Seq2ServeClient(running.target) as client:
            assert grpc_best(client, ["the house"])[0][0]
    finally:
        running.stop()


def test_health_is_503_while_draining(models_dir: Path) -> None:
    running = RunningServer(server_config(models_dir, http_port=free_port(),
                                          drain_delay_s=30.0))
    assert running.http_url is not None
    stopping = asyncio.run_coroutine_threadsafe(running.server.stop(grace=1.0, drain_delay=3.0),
                                                running.loop)
    with httpx.Client(base_url=running.http_url, timeout=10) as client:
        for _ in range(50):
            health = client.get("/health")
            if health.status_code == 503:
                break
        assert health.status_code == 503
        # Still serving during the drain delay, so that balancers move away first.
        assert client.post("/translate", json={"q": "a b c d", "source": "en",
                                               "target": "de"}).is_success
    stopping.result(30)
    running.loop.call_soon_threadsafe(running.loop.stop)
    running.thread.join(10)
    with pytest.raises(httpx.ConnectError):
        httpx.get(running.http_url + "/health", timeout=2)
