"""LibreTranslate's parameter sources and key modes on loopback, side by side with
what LibreTranslate does (libretranslate/app.py: `access_check`, `get_req_api_key`;
Werkzeug's `request.values`), and text that is not valid Unicode on every route
that takes text: always a 400 naming the field, never a 500."""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from libretranslatepy import LibreTranslateAPI
from serving import RunningServer, free_port, server_config

TEXT = "Open the file."
GOOD, BAD = "good-key", "some-other-key"
INVALID = {"error": "Invalid API key"}
NEEDED = {"error": "Please contact the server operator to get an API key"}


@pytest.fixture(scope="module")
def servers(models_dir: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, RunningServer]]:
    """One server per key mode: off (no --api-keys), on, required."""
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"{GOOD}\n")
    configs = {"off": {}, "on": {"api_keys": keys},
               "required": {"api_keys": keys, "require_api_key": True}}
    running: dict[str, RunningServer] = {}
    try:
        for mode, settings in configs.items():
            running[mode] = RunningServer(server_config(models_dir, http_port=free_port(),
                                                        **settings))
        yield running
    finally:
        for server in running.values():
            server.stop()


@pytest.fixture(scope="module")
def http(servers: dict[str, RunningServer]) -> Iterator[httpx.Client]:
    """A client of the server without keys."""
    with httpx.Client(base_url=servers["off"].http_url or "", timeout=60) as client:
        yield client


# -- keys ----------------------------------------------------------------------------------

# LibreTranslate's access_check: with --api-keys off it never reads the key; on, a key
# that is not in its database is 403 "Invalid API key"; in a required mode
# (--require-api-key-origin/-secret/-fingerprint, under attack) no key is 400.
STATUS = {("off", None): 200, ("off", GOOD): 200, ("off", BAD): 200,
          ("on", None): 200, ("on", GOOD): 200, ("on", BAD): 403,
          ("required", None): 400, ("required", GOOD): 200, ("required", BAD): 403}


def post(client: httpx.Client, source: str, key: str | None) -> httpx.Response:
    """/translate with the key where `source` puts it."""
    fields = {"q": TEXT, "source": "en", "target": "de"}
    keyed = {**fields, "api_key": key} if key is not None else fields
    if source == "json":
        return client.post("/translate", json=keyed)
    if source == "form":
        return client.post("/translate", data=keyed)
    if source == "query":
        return client.post("/translate", params=keyed)
    if source == "query+form":  # the key in the query string, the rest in the form
        return client.post("/translate", params={"api_key": key} if key else {}, data=fields)
    assert source == "query+json"
    return client.post("/translate", params={"api_key": key} if key else {}, json=fields)


@pytest.mark.parametrize("mode", ["off", "on", "required"])
@pytest.mark.parametrize("source", ["json", "form", "query", "query+form", "query+json"])
def test_key_modes_and_parameter_sources_as_libretranslate(
        servers: dict[str, RunningServer], mode: str, source: str) -> None:
    with httpx.Client(base_url=servers[mode].http_url or "", timeout=60) as client:
        for key in (None, GOOD, BAD):
            # A JSON body is read alone (LibreTranslate's is_json branch): a key in
            # the query string beside it is no key at all.
            counted = None if source == "query+json" else key
            answer = post(client, source, key)
            assert answer.status_code == STATUS[(mode, counted)], (key, answer.text)
            if answer.status_code == 200:
                assert answer.json()["translatedText"]
            else:
                assert answer.json() == (INVALID if answer.status_code == 403 else NEEDED)


def test_settings_say_which_mode(servers: dict[str, RunningServer]) -> None:
    for mode, (keys, required) in {"off": (False, False), "on": (True, False),
                                   "required": (True, True)}.items():
        settings = httpx.get(f"{servers[mode].http_url}/frontend/settings").json()
        assert (settings["apiKeys"], settings["keyRequired"]) == (keys, required), mode


def test_libretranslatepy_with_a_key_on_a_server_without_keys(
        servers: dict[str, RunningServer]) -> None:
    """The issue's case: a client that always sends a key (or an old one)."""
    plain = LibreTranslateAPI(f"{servers['off'].http_url}/")
    keyed = LibreTranslateAPI(f"{servers['off'].http_url}/", api_key="any-key")
    assert keyed.translate(TEXT, "en", "de") == plain.translate(TEXT, "en", "de")
    assert keyed.detect(TEXT)[0]["language"] == "en"


def test_libretranslatepy_on_servers_with_keys(servers: dict[str, RunningServer]) -> None:
    for mode in ("on", "required"):
        url = f"{servers[mode].http_url}/"
        assert LibreTranslateAPI(url, api_key=GOOD).translate(TEXT, "en", "de")
        with pytest.raises(urllib.error.HTTPError) as refused:
            LibreTranslateAPI(url, api_key=BAD).translate(TEXT, "en", "de")
        assert refused.value.code == 403 and json.loads(refused.value.read()) == INVALID
    assert LibreTranslateAPI(f"{servers['on'].http_url}/").translate(TEXT, "en", "de")
    with pytest.raises(urllib.error.HTTPError) as needed:
        LibreTranslateAPI(f"{servers['required'].http_url}/").translate(TEXT, "en", "de")
    assert needed.value.code == 400 and json.loads(needed.value.read()) == NEEDED


def test_a_key_of_any_json_type_is_ignored_without_keys(
        servers: dict[str, RunningServer]) -> None:
    for value in (123, True, ["a"], {"k": "v"}, None, ""):
        body = {"q": TEXT, "source": "en", "target": "de", "api_key": value}
        off = httpx.post(f"{servers['off'].http_url}/translate", json=body, timeout=60)
        assert off.status_code == 200, (value, off.text)
        on = httpx.post(f"{servers['on'].http_url}/translate", json=body, timeout=60)
        assert on.status_code == (200 if not value else 403), (value, on.text)


# -- the query string and the form together ----------------------------------------------


def test_a_form_request_reads_the_query_string(http: httpx.Client) -> None:
    """The issue's curl: the fields in the query string, a form content type, no body."""
    query = {"q": TEXT, "source": "en", "target": "de"}
    bare = http.post("/translate", params=query)
    formed = http.post("/translate", params=query, content=b"",
                       headers={"content-type": "application/x-www-form-urlencoded"})
    assert formed.status_code == 200, formed.text
    assert formed.json() == bare.json()
    detect = http.post("/detect", params={"q": TEXT}, data={})
    assert detect.status_code == 200 and detect.json()[0]["language"] == "en"
    summary = http.post("/summarize", params={"q": TEXT}, data={"x": "1"})
    assert summary.status_code == 400 and "summarize" in summary.json()["error"]


def test_the_query_string_wins_a_name_the_form_carries_too(http: httpx.Client) -> None:
    answer = http.post("/translate", params={"target": "xx"},
                       data={"q": TEXT, "source": "en", "target": "de"})
    assert answer.status_code == 400 and answer.json() == {"error": "xx is not supported"}


def test_a_json_body_is_read_alone(http: httpx.Client) -> None:
    answer = http.post("/translate", params={"q": TEXT}, json={"source": "en", "target": "de"})
    assert answer.json() == {"error": "Invalid request: missing q parameter"}


def test_a_file_with_its_languages_in_the_query_string(http: httpx.Client) -> None:
    answer = http.post("/translate_file", params={"source": "en", "target": "de"},
                       files={"file": ("notes.txt", f"{TEXT}\n".encode())})
    assert answer.status_code == 200, answer.text
    assert http.get(answer.json()["translatedFileUrl"]).status_code == 200


# -- text that is not valid Unicode --------------------------------------------------------


def raw_json(body: dict[str, object]) -> dict[str, object]:
    """httpx's keywords for a JSON body whose lone surrogates travel as \\uXXXX escapes
    (json.dumps writes ASCII; httpx's own json= cannot encode them)."""
    return {"content": json.dumps(body).encode(),
            "headers": {"content-type": "application/json"}}


LIBRE_CASES = [
    ("/translate", {"q": "\ud800", "source": "en", "target": "de"}, "q"),
    ("/translate", {"q": ["Open it.", "a \udfff"], "source": "en", "target": "de"}, "q[1]"),
    ("/translate", {"q": "\ud800", "source": "en", "target": "de", "format": "html"}, "q"),
    ("/translate", {"q": "x", "source": "\ud800", "target": "de"}, "source"),
    ("/translate", {"q": "x", "source": "en", "target": "de", "terms": {"disk": "\udc00"}},
     'terms["disk"]'),
    ("/translate", {"q": "x", "source": "en", "target": "de", "api_key": "\ud800"}, "api_key"),
    ("/detect", {"q": "\ud800"}, "q"),
    ("/summarize", {"q": "\ud800"}, "q"),
]


@pytest.mark.parametrize(("route", "body", "field"), LIBRE_CASES)
def test_libretranslate_routes_refuse_lone_surrogates_naming_the_field(
        http: httpx.Client, route: str, body: dict[str, object], field: str) -> None:
    answer = http.post(route, **raw_json(body))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith(f"{field} must be valid Unicode, got a lone "
                                             "surrogate U+D"), answer.text


@pytest.mark.parametrize("route", ["/v1/translate", "/v1/translate:stream", "/v1/summarize"])
def test_proto_json_routes_refuse_lone_surrogates_naming_the_field(http: httpx.Client,
                                                                   route: str) -> None:
    answer = http.post(route, **raw_json({"texts": ["ok", "\ud800"],
                                          "targetLanguage": "de"}))
    assert answer.status_code == 400, answer.text
    assert "Unpaired surrogate" in answer.json()["error"]
    assert "texts[1]" in answer.json()["error"]


@pytest.mark.parametrize(("name", "data"), [
    ("a.txt", b"Open \xed\xa0\x80 it\n"),  # U+D800 as UTF-8 would spell it
    ("a.srt", b"1\n00:00:01,000 --> 00:00:02,000\nOpen \xff\n\n"),
    ("a.html", b"<p>Open \xed\xa0\x80</p>"),
    ("a.po", b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
             b'msgid "Open \xed\xa0\x80"\nmsgstr ""\n'),
    ("a.xliff", b'<?xml version="1.0"?><xliff version="1.2" '
                b'xmlns="urn:oasis:names:tc:xliff:document:1.2"><file source-language="en" '
                b'target-language="de" datatype="plaintext" original="x"><body>'
                b'<trans-unit id="1"><source>Open &#xD800;</source></trans-unit></body></file>'
                b'</xliff>'),
])
def test_files_that_are_not_unicode_are_refused_naming_the_file(http: httpx.Client, name: str,
                                                                data: bytes) -> None:
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": (name, data)})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith(f"{name} is not"), answer.text


def test_a_multipart_field_decoded_into_a_lone_surrogate_is_refused(http: httpx.Client) -> None:
    body = (b'--b\r\nContent-Disposition: form-data; name="source"\r\n\r\n\\ud800\r\n'
            b'--b\r\nContent-Disposition: form-data; name="target"\r\n\r\nde\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\n'
            b'Open the file.\r\n--b--\r\n')
    answer = http.post("/translate_file", content=body, headers={
        "content-type": "multipart/form-data; boundary=b; charset=unicode_escape"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith("source must be valid Unicode")


def test_the_server_answers_after_every_refusal(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    ok = http.post("/translate", json={"q": TEXT, "source": "en", "target": "de"})
    assert ok.status_code == 200
