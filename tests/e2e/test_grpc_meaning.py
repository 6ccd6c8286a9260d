"""gRPC reaches the core's request meaning: source_language "auto" (the detected
language in each Translation) and HTML/XML formats, with the same answers as
LibreTranslate's door gives (one meaning, several dialects)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from serving import RunningServer, free_port, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

TEXTS = ["the house is small", "Open the file. Close it."]


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models_dir, http_port=free_port()))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[pb_grpc.TranslatorStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield pb_grpc.TranslatorStub(channel)


def lt(server: RunningServer, **fields: object) -> dict[str, object]:
    answer = httpx.post(f"{server.http_url}/translate", json=fields, timeout=60)
    assert answer.status_code == 200, answer.text
    body: dict[str, object] = answer.json()
    return body


def test_auto_detects_each_text_and_says_so(stub: pb_grpc.TranslatorStub,
                                            server: RunningServer) -> None:
    given = stub.Translate(pb.TranslateRequest(texts=TEXTS, source_language="en",
                                               target_language="de"))
    auto = stub.Translate(pb.TranslateRequest(texts=TEXTS, source_language="auto",
                                              target_language="de"))
    assert [t.hypotheses[0].text for t in auto.translations] == [
        t.hypotheses[0].text for t in given.translations]
    assert [t.detected_language for t in auto.translations] == ["en", "en"]
    assert list(auto.models) == list(given.models) and auto.model == given.model
    body = lt(server, q=TEXTS, source="auto", target="de")
    assert [d["confidence"] for d in body["detectedLanguage"]] == pytest.approx(  # type: ignore[index, union-attr]
        [t.detected_confidence for t in auto.translations], abs=0.01)
    # Without auto, nothing of it is set: the answer is as before.
    assert not any(t.detected_language for t in given.translations)


@pytest.mark.parametrize("text_format", [pb.TEXT_FORMAT_HTML, pb.TEXT_FORMAT_XML])
def test_markup_over_grpc_is_libretranslate_s_html(stub: pb_grpc.TranslatorStub,
                                                  server: RunningServer,
                                                  text_format: int) -> None:
    html = "<p>the house is <b>small</b></p><p>Open the file.</p>"
    answer = stub.Translate(pb.TranslateRequest(texts=[html], source_language="en",
                                                target_language="de", format=text_format))
    assert answer.translations[0].hypotheses[0].text == lt(
        server, q=html, source="en", target="de", format="html")["translatedText"]


def test_xml_ignore_tags_and_stream_refusal(stub: pb_grpc.TranslatorStub) -> None:
    xml = "<doc><p>the house is small</p><skip>the house is small</skip></doc>"
    answer = stub.Translate(pb.TranslateRequest(
        texts=[xml], source_language="en", target_language="de", format=pb.TEXT_FORMAT_XML,
        xml_tags=pb.XmlTags(ignore_tags=["skip"])))
    text = answer.translations[0].hypotheses[0].text
    assert text.endswith("<skip>the house is small</skip></doc>")
    with pytest.raises(grpc.RpcError) as error:
        list(stub.TranslateStream(pb.TranslateRequest(texts=["x"], source_language="auto",
                                                      target_language="de")))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
