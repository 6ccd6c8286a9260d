"""The DeepL door's conversions without a model: regional targets listed as DeepL
lists them (EN-GB/EN-US, PT-BR/PT-PT, ZH-HANS/ZH-HANT for what the served models
have), codes upper case, formality never offered."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.testclient import TestClient

from seq2serve.server.api.http.access import Access
from seq2serve.server.api.http.deepl import DeepLApi
from seq2serve.server.api.http.deepl_auth import DeepLAccess
from seq2serve.server.core.catalog import Listing, Pair
from seq2serve.server.core.glossary import Glossaries, GlossaryStore
from seq2serve.server.core.pieces import Joined, TooLongForOnePiece
from seq2serve.server.core.texts import AUTO, Splitting, TextAnswer, TextsRequest

# What langcodes' matching (CodeTable.find) answers for these codes on such models.
CODES = {"en-gb": "en", "en-us": "en", "pt-br": "pt", "pt-pt": "pt", "zh-hans": "zh-Hans",
         "zh-hant": "zh-Hant", "de": "de", "en": "en", "pt": "pt"}
NAMES = {"de": "German", "en": "English", "pt": "Portuguese",
         "zh-Hant": "Chinese (Traditional)"}


class FakeCatalog:
    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._listing = Listing(1, [], {p: Pair(*p, ("m",)) for p in pairs}, NAMES)

    def listing(self) -> Listing:
        return self._listing

    def code(self, code: str) -> str:
        return CODES.get(code.lower(), code)

    def name(self, code: str) -> str:
        return NAMES[code]


class FakeTexts:
    def __init__(self, catalog: FakeCatalog) -> None:
        self.catalog = catalog
        self.requests: list[TextsRequest] = []

    async def translate(self, request: TextsRequest, call: object = None) -> list[TextAnswer]:
        """Each text as its own translation, its source as given (German if auto)."""
        self.requests.append(request)
        source = "de" if request.source_language == AUTO else request.source_language
        return [TextAnswer((Joined(t, None, None, None, "eos", False),), ("m",), source, 100.0)
                for t in request.texts]


@pytest.fixture
def texts() -> FakeTexts:
    return FakeTexts(FakeCatalog([("de", "en"), ("de", "pt"), ("de", "zh-Hant"),
                                  ("en", "de")]))


@pytest.fixture
def client(tmp_path: Path, texts: FakeTexts) -> Iterator[TestClient]:
    api = DeepLApi(texts, DeepLAccess(Access()),  # type: ignore[arg-type]
                   GlossaryStore(tmp_path, Glossaries()))
    app = Starlette()

    def route(path: str, handler: Callable[[Request], object], methods: list[str],
              name: str, doc: str, encode: Callable[[BaseException], Response]) -> None:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)  # type: ignore[no-any-return, misc]
            except Exception as error:  # noqa: BLE001
                return encode(error)
        app.add_route(path, endpoint, methods=methods, name=name)

    api.register(route)
    with TestClient(app) as test_client:
        yield test_client


def test_targets_are_listed_with_deepl_s_regional_variants(client: TestClient) -> None:
    targets = client.get("/v2/languages", params={"type": "target"}).json()
    assert [(t["language"], t["name"]) for t in targets] == [
        ("DE", "German"), ("EN-GB", "English (British)"), ("EN-US", "English (American)"),
        ("PT-BR", "Portuguese (Brazilian)"), ("PT-PT", "Portuguese (European)"),
        ("ZH-HANT", "Chinese (traditional)")]
    assert not any(t["supports_formality"] for t in targets)
    # requests' GET with a form body (as the deepl client sends type=target) reads the same.
    form = client.request("GET", "/v2/languages", data={"type": "target"}).json()
    assert form == targets
    sources = client.get("/v2/languages").json()
    assert sources == [{"language": "DE", "name": "German"},
                       {"language": "EN", "name": "English"}]


def test_bad_values_are_deepl_s_400_with_a_message(client: TestClient) -> None:
    answer = client.get("/v2/languages", params={"type": "both"})
    assert answer.status_code == 400 and "type" in answer.json()["message"]
    answer = client.post("/v2/translate", json={"text": ["x"], "target_lang": "DE",
                                                 "tag_handling": "markdown"})
    assert answer.status_code == 400 and "tag_handling" in answer.json()["message"]
    answer = client.post("/v2/translate", json={"text": ["x"]})
    assert answer.json() == {"message": "Parameter 'target_lang' not specified."}
    answer = client.post("/v2/glossaries", json={"name": "g", "source_lang": "en",
                                                  "target_lang": "fr", "entries": "a\tb"})
    assert answer.status_code == 400 and "EN->FR" in answer.json()["message"]


def test_fields_nothing_acts_on_are_said_in_the_answer(client: TestClient) -> None:
    """formality and context are accepted as DeepL accepts them; the answer's
    X-Seq2serve-Ignored names those it was given (split_sentences is acted on)."""
    plain = client.post("/v2/translate", json={"text": ["Hallo"], "target_lang": "EN-GB"})
    assert plain.status_code == 200 and "X-Seq2serve-Ignored" not in plain.headers
    answer = client.post("/v2/translate", json={
        "text": ["Hallo"], "target_lang": "EN-GB", "split_sentences": "0",
        "formality": "more", "context": "a greeting"})
    assert answer.status_code == 200
    assert answer.headers["X-Seq2serve-Ignored"] == "formality, context"


@pytest.mark.parametrize(("given", "tags", "splitting"), [
    (None, None, Splitting.ON), (None, "html", Splitting.NO_NEWLINES),
    (None, "xml", Splitting.NO_NEWLINES), ("0", None, Splitting.OFF), (0, None, Splitting.OFF),
    ("1", "html", Splitting.ON), ("nonewlines", None, Splitting.NO_NEWLINES)])
def test_split_sentences_reaches_the_core_with_deepl_s_defaults(
        client: TestClient, texts: FakeTexts, given: str | int | None, tags: str | None,
        splitting: Splitting) -> None:
    """1 by default, nonewlines by default with tag_handling (DeepL's API reference)."""
    body: dict[str, object] = {"text": ["Hallo"], "target_lang": "EN-GB"}
    if given is not None:
        body["split_sentences"] = given
    if tags:
        body["tag_handling"] = tags
    answer = client.post("/v2/translate", json=body)
    assert answer.status_code == 200 and "X-Seq2serve-Ignored" not in answer.headers
    assert texts.requests[-1].splitting is splitting
    bad = client.post("/v2/translate", json={**body, "split_sentences": "2"})
    assert bad.status_code == 400 and "split_sentences" in bad.json()["message"]
    assert answer.json()["translations"][0]["text"] == "Hallo"


@pytest.mark.parametrize("pivot", ["", "en"])
def test_an_unsplit_text_refused_is_named_with_deepl_s_field(
        client: TestClient, texts: FakeTexts, monkeypatch: pytest.MonkeyPatch,
        pivot: str) -> None:
    """The core's refusal (splitting off, past one piece's limit) in DeepL's words: the
    client's text[i], and for a chain the intermediate translation that passed it."""
    async def refuse(request: TextsRequest, call: object = None) -> list[TextAnswer]:
        raise TooLongForOnePiece(99, 7, 1, pivot)

    monkeypatch.setattr(texts, "translate", refuse)
    answer = client.post("/v2/translate", json={
        "text": ["Hallo", "Welt"], "target_lang": "FR", "split_sentences": "0"})
    message = answer.json()["message"]
    assert answer.status_code == 400
    assert message.startswith("Value for 'split_sentences' 0 cannot be kept for text[1]: ")
    assert "99 tokens and one piece may have at most 7" in message
    assert ("its intermediate translation into en (the second leg's input) is 99" in
            message) is bool(pivot)
