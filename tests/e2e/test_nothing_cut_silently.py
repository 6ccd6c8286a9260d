"""Nothing is cut without the answer saying so (issue 51, item 5). Summarize through
every door on one served summarizer (the tiny package reading at most 12 tokens):
HTTP /summarize refuses a text the model cannot read whole, as gRPC, /v1 and the CLI
do, unless `truncate` is set, and then says what it cut. A translation whose piece
stopped at its length limit says so in LibreTranslate's answer as gRPC's does."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from conftest import CORPUS
from serving import RunningServer, free_port, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.client import Seq2ServeClient

LIMIT = 12  # the summarizer's max_source_length
LONG = " ".join(CORPUS[:3])
SHORT = "Open it."


@pytest.fixture(scope="module")
def server(marian_package: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("summarizer")
    shutil.copytree(marian_package, root / "tiny-summarize")
    manifest = json.loads((root / "tiny-summarize" / "manifest.json").read_text())
    manifest.update(name="tiny-summarize", task="summarize", target_language="en",
                    max_source_length=LIMIT)
    (root / "tiny-summarize" / "manifest.json").write_text(json.dumps(manifest))
    running = RunningServer(server_config(root, http_port=free_port(), max_length_cap=16))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[Seq2ServeClient]:
    with Seq2ServeClient(server.target, timeout=60) as c:
        yield c


def _tokens(server: RunningServer, text: str) -> int:
    [handle] = server.server.registry.handles()
    return len(handle.encode(text))


def test_an_over_long_text_is_refused_naming_the_field_and_the_limit(
        server: RunningServer, http: httpx.Client, client: Seq2ServeClient) -> None:
    tokens = _tokens(server, LONG)
    assert tokens > LIMIT
    one = http.post("/summarize", json={"q": LONG})
    assert one.status_code == 400, one.text
    assert one.json()["error"] == (f"q is {tokens} tokens; this model reads at most {LIMIT} "
                                   "(set truncate to cut it)")
    many = http.post("/summarize", json={"q": [SHORT, LONG]})
    assert many.status_code == 400 and many.json()["error"].startswith(f"q[1] is {tokens} ")
    # As gRPC refuses it (and /v1, and the CLI, which call the same operation).
    with pytest.raises(grpc.RpcError) as err:
        client.summarize([LONG])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {LIMIT}" in (err.value.details() or "")


def test_truncate_cuts_and_the_answer_says_what_it_cut(
        server: RunningServer, http: httpx.Client, client: Seq2ServeClient) -> None:
    tokens = _tokens(server, LONG)
    answer = http.post("/summarize", json={"q": LONG, "truncate": True})
    assert answer.status_code == 200, answer.text
    [expected] = client.summarize([LONG], truncate=True)
    assert expected.truncated
    assert answer.json() == {"summary": expected.hypotheses[0].text, "truncated": True,
                             "tokensKept": LIMIT, "tokensDropped": tokens - LIMIT}
    assert answer.headers["X-Seq2serve-Truncated"] == "1"
    # A list: one value per text; the header counts the texts cut. Form fields too.
    both = http.post("/summarize", data={"q": [LONG, SHORT, LONG], "truncate": "true"})
    assert both.status_code == 200, both.text
    body = both.json()
    assert body["truncated"] == [True, False, True]
    assert body["tokensKept"] == [LIMIT, _tokens(server, SHORT), LIMIT]
    assert body["tokensDropped"] == [tokens - LIMIT, 0, tokens - LIMIT]
    assert both.headers["X-Seq2serve-Truncated"] == "2"


def test_a_text_read_whole_says_so_and_has_no_header(server: RunningServer,
                                                     http: httpx.Client,
                                                     client: Seq2ServeClient) -> None:
    answer = http.post("/summarize", json={"q": SHORT})
    [expected] = client.summarize([SHORT])
    assert answer.json() == {"summary": expected.hypotheses[0].text, "truncated": False,
                             "tokensKept": _tokens(server, SHORT), "tokensDropped": 0}
    assert "X-Seq2serve-Truncated" not in answer.headers


@pytest.fixture(scope="module")
def cut_server(marian_package: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[RunningServer]:
    """The tiny translator made to stop at its length limit: its package's min_length is
    the server's cap, so no hypothesis ends before it."""
    root = tmp_path_factory.mktemp("cut")
    shutil.copytree(marian_package, root / "tiny-en-de")
    path = root / "tiny-en-de" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["generation"]["min_length"] = 16
    path.write_text(json.dumps(manifest))
    running = RunningServer(server_config(root, http_port=free_port(), max_length_cap=16))
    yield running
    running.stop()


def test_a_translation_cut_at_its_length_limit_says_so_on_every_door(
        cut_server: RunningServer) -> None:
    texts = [SHORT, CORPUS[1]]
    with grpc.insecure_channel(cut_server.target) as channel:
        answer = pb_grpc.TranslatorStub(channel).Translate(pb.TranslateRequest(
            texts=texts, source_language="en", target_language="de"), timeout=60)
    bests = [t.hypotheses[0] for t in answer.translations]
    assert [b.finish_reason for b in bests] == [pb.FINISH_REASON_LENGTH] * 2
    assert cut_server.http_url is not None
    with httpx.Client(base_url=cut_server.http_url, timeout=60) as http:
        one = http.post("/translate", json={"q": SHORT, "source": "en", "target": "de"})
        many = http.post("/translate", json={"q": texts, "source": "en", "target": "de"})
    assert one.json() == {"translatedText": bests[0].text, "finishReason": "length"}
    assert many.json() == {"translatedText": [b.text for b in bests],
                           "finishReason": ["length", "length"]}
