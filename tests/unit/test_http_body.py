"""Request fields as LibreTranslate reads them (a JSON body, else the query string
and the form together, the query string winning a name both carry), and text
that is not valid Unicode refused naming its field; in process, on a tiny app
that answers with the fields it read."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from seq2serve.server.api.http.body import Fields, check_fields_unicode, read_fields
from seq2serve.server.core.errors import InvalidArgument, check_unicode, lone_surrogate


async def echo(request: Request) -> Response:
    try:
        fields = await read_fields(request)
    except InvalidArgument as e:
        return JSONResponse({"error": e.message}, status_code=400)
    return JSONResponse({"values": fields.values, "files": sorted(fields.files),
                         "is_json": fields.is_json})


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(Starlette(routes=[Route("/echo", echo, methods=["POST"])]))


FORM = {"content-type": "application/x-www-form-urlencoded"}


def test_a_form_request_reads_the_query_string_too(client: TestClient) -> None:
    """The issue's case: the query string's fields with a form content type and an
    empty body (Flask's `request.values` is args and form together)."""
    answer = client.post("/echo?q=Open%20the%20file.&source=en&target=de", headers=FORM,
                         content=b"")
    assert answer.json()["values"] == {"q": "Open the file.", "source": "en", "target": "de"}
    mixed = client.post("/echo?source=en&target=de", data={"q": "Open the file."})
    assert mixed.json()["values"] == {"q": "Open the file.", "source": "en", "target": "de"}


def test_the_query_string_wins_a_name_both_carry(client: TestClient) -> None:
    """Werkzeug's CombinedMultiDict([args, form]).get returns the first dict's value."""
    answer = client.post("/echo?target=de&q=a&q=b", data={"target": "fr", "q": "c"})
    assert answer.json()["values"] == {"target": "de", "q": ["a", "b"]}


def test_multipart_reads_the_query_string_too(client: TestClient) -> None:
    answer = client.post("/echo?source=en&target=de", data={"target": "fr"},
                         files={"file": ("notes.txt", b"Open the file.\n")})
    assert answer.json() == {"values": {"source": "en", "target": "de"}, "files": ["file"],
                             "is_json": False}


def test_a_json_body_is_read_alone(client: TestClient) -> None:
    """LibreTranslate's `request.is_json` branch reads the body only: the query string's
    fields (an api_key too) are not looked at."""
    answer = client.post("/echo?q=ignored&api_key=ignored", json={"source": "en"})
    assert answer.json() == {"values": {"source": "en"}, "files": [], "is_json": True}


def test_without_a_body_the_query_string_is_read_and_repeats_are_lists(
        client: TestClient) -> None:
    answer = client.post("/echo?q=a&q=b&source=en")
    assert answer.json()["values"] == {"q": ["a", "b"], "source": "en"}


@pytest.mark.parametrize("body, field", [
    ({"q": "\ud800", "source": "en", "target": "de"}, "q"),
    ({"q": ["fine", "a \udfff b"]}, "q[1]"),
    ({"q": "x", "source": "\ud800"}, "source"),
    ({"q": "x", "api_key": "key\ud83d"}, "api_key"),
    ({"q": "x", "terms": {"disk": "Datentr\udc00ger"}}, 'terms["disk"]'),
    ({"q": "x", "terms": {"dis\ud800k": "Datenträger"}}, "a key of terms"),
    ({"q": "x", "terms": [{"source": "disk", "target": ["\ud800"]}]}, "terms[0][\"target\"][0]"),
    ({"q\ud800": "x"}, "a field name"),
])
def test_json_text_that_is_not_unicode_is_refused_naming_the_field(
        client: TestClient, body: dict[str, object], field: str) -> None:
    raw = json.dumps(body).encode()  # ASCII: the lone surrogates travel as \\uXXXX escapes
    answer = client.post("/echo", content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error.startswith(f"{field} must be valid Unicode, got a lone surrogate U+"), error


def test_a_surrogate_pair_is_valid_unicode(client: TestClient) -> None:
    raw = json.dumps({"q": "Save 💾"}).encode()  # "\ud83d\udcbe": one character
    answer = client.post("/echo", content=raw, headers={"content-type": "application/json"})
    assert answer.json()["values"] == {"q": "Save 💾"}


def test_a_multipart_charset_that_decodes_escapes_is_refused_too(client: TestClient) -> None:
    """Starlette decodes multipart fields in the charset the request names; one such as
    `unicode_escape` turns `\\ud800` into a lone surrogate."""
    body = (b'--b\r\nContent-Disposition: form-data; name="q"\r\n\r\nx \\ud800 y\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\n'
            b'text\r\n--b--\r\n')
    answer = client.post("/echo", content=body, headers={
        "content-type": "multipart/form-data; boundary=b; charset=unicode_escape"})
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("q must be valid Unicode"), answer.text


def test_a_file_name_that_is_not_unicode_is_refused(client: TestClient) -> None:
    body = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="a\\udfff.txt"'
            b'\r\n\r\ntext\r\n--b--\r\n')
    answer = client.post("/echo", content=body, headers={
        "content-type": "multipart/form-data; boundary=b; charset=unicode_escape"})
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("file (its file name) must be valid Unicode")


def test_the_walk_names_long_client_names_bounded() -> None:
    name = "n" * 500
    fields = Fields(values={name: ["ok", {"k": "\ud800"}]}, files={}, is_json=True)
    with pytest.raises(InvalidArgument) as caught:
        check_fields_unicode(fields)
    assert caught.value.message.startswith(f'{"n" * 32}...[1]["k"] must be valid Unicode')
    assert len(caught.value.message) < 200


def test_a_deep_json_value_is_walked_without_recursion() -> None:
    value: object = "\ud800"
    for _ in range(5000):
        value = [value]
    with pytest.raises(InvalidArgument, match=r"^q\[0\]\[0\]"):
        check_fields_unicode(Fields(values={"q": value}, files={}, is_json=True))


def test_the_core_rule() -> None:
    assert lone_surrogate("plain, accented é, emoji 💾") is None
    assert lone_surrogate("ab\udc80") == 2
    with pytest.raises(InvalidArgument, match=r"^texts\[3\] must be valid Unicode, got a lone "
                                              r"surrogate U\+D800 at character 1$"):
        check_unicode("texts[3]", "a\ud800")
