"""TranslateRequest.sentence_splitting over gRPC, TranslateStream and the .proto's JSON
(/v1): OFF reads each text whole, as Hugging Face generate() does; ON (unset) cuts at
sentence ends and line breaks; NO_NEWLINES at sentence ends only. And the Python
client's ModelInfo carries ListModels' state and memory fields."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from serving import RunningServer, free_port, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.client import Seq2ServeClient

TWO = "Open the file. Close it."
LINES = "Open the file\nthe house is small."
LONG = "the house is small. " * 90  # well past what the tiny model reads as one piece


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models_dir, http_port=free_port()))
    yield running
    running.stop()


def best(stub: pb_grpc.TranslatorStub, texts: list[str],
         splitting: int = pb.SENTENCE_SPLITTING_UNSPECIFIED) -> list[str]:
    answer = stub.Translate(pb.TranslateRequest(texts=texts, source_language="en",
                                                target_language="de",
                                                sentence_splitting=splitting))
    return [t.hypotheses[0].text for t in answer.translations]


def v1(server: RunningServer, text: str, splitting: str) -> httpx.Response:
    return httpx.post(f"{server.http_url}/v1/translate", timeout=60, json={
        "texts": [text], "sourceLanguage": "en", "targetLanguage": "de",
        "sentenceSplitting": splitting})


def test_off_reads_the_text_whole_and_on_per_sentence(
        stub: pb_grpc.TranslatorStub, hf_whole: Callable[[str], str]) -> None:
    first, second = best(stub, ["Open the file.", "Close it."])
    on = f"{first} {second}"
    assert best(stub, [TWO]) == best(stub, [TWO], pb.SENTENCE_SPLITTING_ON) == [on]
    [whole] = best(stub, [TWO], pb.SENTENCE_SPLITTING_OFF)
    assert whole == hf_whole(TWO)
    assert whole != on  # the model read one input, not two


def test_no_newlines_keeps_a_sentence_across_a_line_break(
        stub: pb_grpc.TranslatorStub, hf_whole: Callable[[str], str]) -> None:
    one, two = best(stub, ["Open the file", "the house is small."])
    assert best(stub, [LINES]) == [f"{one}\n{two}"]
    [kept] = best(stub, [LINES], pb.SENTENCE_SPLITTING_NO_NEWLINES)
    assert kept == hf_whole(LINES)
    first, second = best(stub, ["Open the file.", "Close it."])
    # sentence ends still split
    assert best(stub, [f"{LINES} {TWO}"], pb.SENTENCE_SPLITTING_NO_NEWLINES) == [
        f"{kept} {first} {second}"]


def test_an_unsplit_text_too_long_is_invalid_argument(stub: pb_grpc.TranslatorStub) -> None:
    assert best(stub, [LONG])[0]  # split, it is served
    with pytest.raises(grpc.RpcError) as refused:
        best(stub, ["the house", LONG], pb.SENTENCE_SPLITTING_OFF)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert "sentence_splitting" in details and "texts[1]" in details
    assert "at most" in details


def test_stream_honours_splitting(stub: pb_grpc.TranslatorStub,
                                  hf_whole: Callable[[str], str]) -> None:
    def final(text: str, splitting: int) -> str:
        chunks = list(stub.TranslateStream(pb.TranslateRequest(
            texts=[text], source_language="en", target_language="de",
            sentence_splitting=splitting)))
        return chunks[-1].translation.hypotheses[0].text

    assert final(TWO, pb.SENTENCE_SPLITTING_OFF) == hf_whole(TWO)
    assert final(TWO, pb.SENTENCE_SPLITTING_UNSPECIFIED) == best(stub, [TWO])[0]
    with pytest.raises(grpc.RpcError) as refused:
        final(LONG, pb.SENTENCE_SPLITTING_OFF)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sentence_splitting" in (refused.value.details() or "")


def test_v1_json_takes_the_field(server: RunningServer, stub: pb_grpc.TranslatorStub,
                                 hf_whole: Callable[[str], str]) -> None:
    def text(answer: httpx.Response) -> str:
        assert answer.status_code == 200, answer.text
        return str(answer.json()["translations"][0]["hypotheses"][0]["text"])

    assert text(v1(server, TWO, "SENTENCE_SPLITTING_OFF")) == hf_whole(TWO)
    assert text(v1(server, TWO, "SENTENCE_SPLITTING_ON")) == best(stub, [TWO])[0]
    assert text(v1(server, LINES, "SENTENCE_SPLITTING_NO_NEWLINES")) == hf_whole(LINES)
    refused = v1(server, LONG, "SENTENCE_SPLITTING_OFF")
    assert refused.status_code == 400
    assert "sentence_splitting" in refused.text and "at most" in refused.text
    bad = v1(server, TWO, "SENTENCE_SPLITTING_SOMETIMES")
    assert bad.status_code == 400 and "SENTENCE_SPLITTING_SOMETIMES" in bad.text


def test_client_translate_and_model_info(server: RunningServer,
                                         stub: pb_grpc.TranslatorStub) -> None:
    with Seq2ServeClient(server.target) as client:
        off = client.translate(TWO, source_language="en", target_language="de",
                               sentence_splitting="off")
        assert off[0][0].text == best(stub, [TWO], pb.SENTENCE_SPLITTING_OFF)[0]
        with pytest.raises(ValueError, match="sentence_splitting"):
            client.translate(TWO, source_language="en", target_language="de",
                             sentence_splitting="sometimes")
        client.translate("the house", source_language="en", target_language="de")
        infos = client.list_models()
    listed = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    assert [i.name for i in infos] == list(listed)
    for info in infos:
        raw = listed[info.name]
        assert (info.state, info.error, info.memory_bytes, info.device_memory_bytes,
                info.held_out) == (raw.state, raw.error, raw.memory_bytes,
                                   raw.device_memory_bytes, raw.held_out)
    [served] = infos  # the models folder's one package
    # it served a request just now: loaded, holding the package's memory, not held out
    assert served.state == "ready" and not served.error and not served.held_out
    assert served.memory_bytes > 0
