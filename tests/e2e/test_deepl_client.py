"""DeepL's API v2 against DeepL's own Python client (`deepl`, unmodified, pointed at
this server with `server_url`): every answer is the one the client parses, every
refusal the exception class it raises for DeepL's own. The translations are checked
against the same texts over gRPC (the core's answer through another door)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import deepl
import httpx
import pytest
from deepl import http_client, util
from deepl.api_data import MultilingualGlossaryDictionaryEntries
from serving import RunningServer, ServeProcess, free_port, serve_env, server_config

from seq2serve.server.client import Seq2ServeClient, SoftwareText

KEY = "good-key"
SMALL = "small-key"  # a limit of 40 characters (the key file's second column)
TEXTS = ["the house is small", "Open the file. Close it."]


@pytest.fixture(autouse=True)
def few_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client retries 429 and 5xx with backoff (up to 5 times): once is enough here."""
    monkeypatch.setattr(http_client, "max_network_retries", 0)


@pytest.fixture(scope="module")
def server(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("deepl")
    keys = folder / "keys"
    keys.write_text(f"{KEY}\n{SMALL} 40  # a trial key\n", encoding="utf-8")
    running = RunningServer(server_config(models_dir, http_port=free_port(), api_keys=keys,
                                          require_api_key=True, max_text_chars=2000,
                                          max_message_bytes=1 << 20,
                                          glossary_store=folder / "glossaries"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def translator(server: RunningServer) -> Iterator[deepl.DeepLClient]:
    client = deepl.DeepLClient(KEY, server_url=server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server: RunningServer) -> Iterator[Seq2ServeClient]:
    with Seq2ServeClient(server.target) as client:
        yield client


def grpc_best(client: Seq2ServeClient, texts: list[str], **software: object) -> list[str]:
    return [nbest[0].text for nbest in client.translate(
        texts, source_language="en", target_language="de",
        software=SoftwareText(**software) if software else None)]  # type: ignore[arg-type]


def test_translate_text_with_and_without_source(translator: deepl.DeepLClient,
                                                grpc_client: Seq2ServeClient) -> None:
    expected = grpc_best(grpc_client, TEXTS)
    one = translator.translate_text(TEXTS[0], source_lang="EN", target_lang="DE")
    assert isinstance(one, deepl.TextResult)
    assert one.text == expected[0] and one.detected_source_lang == "EN"
    assert one.billed_characters == len(TEXTS[0])
    many = translator.translate_text(TEXTS, target_lang="de")  # no source: detected
    assert [r.text for r in many] == expected
    assert [r.detected_source_lang for r in many] == ["EN", "EN"]


def test_html_and_xml_keep_their_markup(translator: deepl.DeepLClient,
                                        grpc_client: Seq2ServeClient, server: RunningServer
                                        ) -> None:
    html = "<p>the house is small</p><p>Open the file.</p>"
    got = translator.translate_text(html, source_lang="EN", target_lang="DE",
                                    tag_handling="html")
    # LibreTranslate's format=html is the same core meaning through another door.
    lt = httpx.post(f"{server.http_url}/translate", timeout=60, json={
        "q": html, "source": "en", "target": "de", "format": "html", "api_key": KEY})
    assert got.text == lt.json()["translatedText"]
    first, second = grpc_best(grpc_client, ["the house is small", "Open the file."])
    assert got.text == f"<p>{first}</p><p>{second}</p>"
    xml = ("<doc><title>the house is small</title><code>keep me</code>"
           "<para>Open the file.</para></doc>")
    got = translator.translate_text(xml, source_lang="EN", target_lang="DE",
                                    tag_handling="xml", ignore_tags=["code"])
    assert got.text == (f"<doc><title>{first}</title><code>keep me</code>"
                        f"<para>{second}</para></doc>")


def test_glossaries_created_listed_used_and_deleted(translator: deepl.DeepLClient,
                                                    grpc_client: Seq2ServeClient) -> None:
    pairs = translator.get_glossary_languages()
    assert [(p.source_lang, p.target_lang) for p in pairs] == [("en", "de")]
    glossary = translator.create_glossary("houses", "EN", "DE", {"house": "Gebäude"})
    assert (glossary.source_lang, glossary.target_lang, glossary.entry_count) == ("EN", "DE", 1)
    assert glossary.ready and glossary.name == "houses"
    assert translator.get_glossary(glossary.glossary_id).glossary_id == glossary.glossary_id
    assert glossary.glossary_id in [g.glossary_id for g in translator.list_glossaries()]
    assert translator.get_glossary_entries(glossary) == {"house": "Gebäude"}
    used = translator.translate_text(TEXTS[0], source_lang="EN", target_lang="DE",
                                     glossary=glossary)
    [expected] = grpc_best(grpc_client, [TEXTS[0]], terms=(("house", "Gebäude"),))
    assert used.text == expected and "Gebäude" in used.text
    from_csv = translator.create_glossary_from_csv("csv", "EN", "DE",
                                                   '"file","Datei"\nclose,schließen\n')
    assert translator.get_glossary_entries(from_csv) == {"file": "Datei",
                                                         "close": "schließen"}
    translator.delete_glossary(glossary)
    translator.delete_glossary(from_csv)
    with pytest.raises(deepl.GlossaryNotFoundException):
        translator.get_glossary(glossary.glossary_id)
    with pytest.raises(deepl.GlossaryNotFoundException):
        translator.delete_glossary(glossary.glossary_id)


def test_v3_glossaries_of_the_current_client(translator: deepl.DeepLClient) -> None:
    made = translator.create_multilingual_glossary(
        "v3", [MultilingualGlossaryDictionaryEntries("EN", "DE", {"file": "Datei"})])
    assert [(d.source_lang, d.target_lang, d.entry_count) for d in made.dictionaries] == [
        ("EN", "DE", 1)]
    assert translator.get_multilingual_glossary(made.glossary_id).name == "v3"
    assert made.glossary_id in [g.glossary_id for g in
                                translator.list_multilingual_glossaries()]
    entries = translator.get_multilingual_glossary_entries(made, "EN", "DE")
    # DeepL's v3 answer carries the entries as TSV text, which the client passes on.
    assert util.convert_tsv_to_dict(entries.dictionaries[0].entries) == {"file": "Datei"}
    translator.delete_multilingual_glossary(made)
    with pytest.raises(deepl.GlossaryNotFoundException):
        translator.get_multilingual_glossary(made.glossary_id)


def test_languages_as_deepl_lists_them(translator: deepl.DeepLClient) -> None:
    assert [(lang.code, lang.name) for lang in translator.get_source_languages()] == [
        ("EN", "English")]
    targets = translator.get_target_languages()
    assert [(lang.code, lang.name, lang.supports_formality) for lang in targets] == [
        ("DE", "German", False)]


def test_usage_and_quota(server: RunningServer) -> None:
    small = deepl.Translator(SMALL, server_url=server.http_url)
    try:
        before = small.get_usage()
        assert (before.character.count, before.character.limit) == (0, 40)
        small.translate_text(TEXTS[0], source_lang="EN", target_lang="DE")
        after = small.get_usage()
        assert after.character.count == len(TEXTS[0]) and not after.any_limit_reached
        with pytest.raises(deepl.QuotaExceededException):  # 18 + 24 > 40
            small.translate_text(TEXTS[1], source_lang="EN", target_lang="DE")
        assert small.get_usage().character.count == len(TEXTS[0])  # a refusal costs nothing
    finally:
        small.close()


def test_refusals_raise_the_client_s_exceptions(server: RunningServer,
                                                translator: deepl.DeepLClient) -> None:
    wrong = deepl.Translator("not-a-key", server_url=server.http_url)
    try:
        with pytest.raises(deepl.AuthorizationException):
            wrong.translate_text(TEXTS[0], target_lang="DE")
    finally:
        wrong.close()
    with pytest.raises(deepl.DeepLException, match="target_lang.*not supported") as error:
        translator.translate_text(TEXTS[0], source_lang="EN", target_lang="FR")
    assert error.value.http_status_code == 400
    with pytest.raises(deepl.DeepLException, match="source_lang.*not supported"):
        translator.translate_text(TEXTS[0], source_lang="FR", target_lang="DE")
    with pytest.raises(deepl.DeepLException, match="Glossary not found") as error:
        translator.translate_text(TEXTS[0], source_lang="EN", target_lang="DE",
                                  glossary="no-such-glossary")
    assert error.value.http_status_code == 404
    # The legacy auth_key field, and DeepL's error body.
    raw = httpx.post(f"{server.http_url}/v2/translate", timeout=60,
                     data={"auth_key": "wrong", "text": "x", "target_lang": "DE"})
    assert raw.status_code == 403 and set(raw.json()) == {"message"}
    ok = httpx.post(f"{server.http_url}/v2/translate", timeout=60,
                    data={"auth_key": KEY, "text": ["a b", "c d"], "target_lang": "DE"})
    assert ok.status_code == 200 and len(ok.json()["translations"]) == 2


def test_a_body_over_the_limit_is_413_with_deepl_s_body(server: RunningServer,
                                                         translator: deepl.DeepLClient
                                                         ) -> None:
    with pytest.raises(deepl.DeepLException, match="413") as error:
        translator.translate_text("x" * (2 << 20), source_lang="EN", target_lang="DE")
    assert error.value.http_status_code == 413
    raw = httpx.post(f"{server.http_url}/v2/translate", timeout=60,
                     json={"text": ["x" * (2 << 20)], "target_lang": "DE"},
                     headers={"Authorization": f"DeepL-Auth-Key {KEY}"})
    assert raw.status_code == 413 and "max_message_bytes" in raw.json()["message"]


def test_too_many_requests(models_dir: Path) -> None:
    running = RunningServer(server_config(models_dir, http_port=free_port(), rate_limit=2))
    client = deepl.Translator("any", server_url=running.http_url)
    try:
        client.translate_text(["a", "b"], source_lang="EN", target_lang="DE")
        with pytest.raises(deepl.TooManyRequestsException):
            client.translate_text("c", source_lang="EN", target_lang="DE")
        raw = httpx.post(f"{running.http_url}/v2/translate", timeout=60,
                         json={"text": ["d"], "target_lang": "DE"})
        assert raw.status_code == 429 and int(raw.headers["Retry-After"]) >= 1
    finally:
        client.close()
        running.stop()


def test_split_sentences_cuts_where_deepl_s_values_say(translator: deepl.DeepLClient,
                                                       grpc_client: Seq2ServeClient,
                                                       hf_whole) -> None:  # noqa: ANN001
    """1 (the default): each sentence and each line alone, as gRPC translates them;
    0: the text as one piece, as generate() translates it whole; nonewlines: a sentence
    across a line break is one piece, while sentence ends still split."""
    def deepl_text(text: str, splitting: str | None = None) -> str:
        return str(translator.translate_text(text, source_lang="EN", target_lang="DE",
                                             split_sentences=splitting).text)

    text = TEXTS[1]  # "Open the file. Close it."
    first, second = grpc_best(grpc_client, ["Open the file.", "Close it."])
    assert deepl_text(text) == deepl_text(text, "1") == f"{first} {second}"
    whole = deepl_text(text, "0")
    assert whole == hf_whole(text)
    assert whole != f"{first} {second}"  # the model read one input, not two
    lines = "Open the file\nthe house is small."
    one, two = grpc_best(grpc_client, ["Open the file", "the house is small."])
    assert deepl_text(lines) == f"{one}\n{two}"
    assert deepl_text(lines, "nonewlines") == deepl_text(lines, "0")
    assert deepl_text(f"{lines} {text}", "nonewlines") == \
        f"{deepl_text(lines, '0')} {first} {second}"


def test_an_unsplit_text_longer_than_the_model_reads_is_refused(
        translator: deepl.DeepLClient) -> None:
    """split_sentences=0 asks for the text as one piece: one longer than the model
    reads whole is refused naming the field, never cut nor split against the request."""
    long = "the house is small. " * 90
    assert translator.translate_text(long, source_lang="EN", target_lang="DE").text
    with pytest.raises(deepl.DeepLException, match="split_sentences") as refused:
        translator.translate_text(["the house", long], source_lang="EN", target_lang="DE",
                                  split_sentences="0")
    assert refused.value.http_status_code == 400
    assert "text[1]" in str(refused.value)


def test_usage_and_a_reached_quota_survive_a_restart(models_dir: Path, tmp_path: Path) -> None:
    """--usage-file: a server started again on the same file reports the same counts
    to DeepL's client, a refunded request stays uncounted, and a key that reached its
    limit before the restart still gets 456 (QuotaExceededException) after it."""
    tiny = "tiny-key"
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n{tiny} {len(TEXTS[0])}\n", encoding="utf-8")
    usage_file = tmp_path / "usage.json"

    def start() -> RunningServer:
        return RunningServer(server_config(models_dir, http_port=free_port(), api_keys=keys,
                                           require_api_key=True, usage_file=usage_file))

    def counts(running: RunningServer) -> list[tuple[int | None, int | None, bool]]:
        out = []
        for key in (KEY, tiny):
            client = deepl.Translator(key, server_url=running.http_url)
            try:
                usage = client.get_usage()
            finally:
                client.close()
            out.append((usage.character.count, usage.character.limit,
                        usage.any_limit_reached))
        return out

    first = start()
    try:
        big = deepl.Translator(KEY, server_url=first.http_url)
        small = deepl.Translator(tiny, server_url=first.http_url)
        try:
            big.translate_text(TEXTS, source_lang="EN", target_lang="DE")
            with pytest.raises(deepl.DeepLException, match="target_lang"):  # refunded
                big.translate_text(TEXTS[0], source_lang="EN", target_lang="FR")
            small.translate_text(TEXTS[0], source_lang="EN", target_lang="DE")
        finally:
            big.close()
            small.close()
        before = counts(first)
    finally:
        first.stop()
    assert before[0][0] == sum(len(t) for t in TEXTS)
    assert before[1] == (len(TEXTS[0]), len(TEXTS[0]), True)

    second = start()
    try:
        assert counts(second) == before
        small = deepl.Translator(tiny, server_url=second.http_url)
        try:
            with pytest.raises(deepl.QuotaExceededException):
                small.translate_text("a", source_lang="EN", target_lang="DE")
        finally:
            small.close()
    finally:
        second.stop()


def test_a_broken_usage_file_stops_the_start_naming_it(models_dir: Path, tmp_path: Path
                                                       ) -> None:
    usage_file = tmp_path / "usage.json"
    usage_file.write_text('{"format": "seq2serve-usage", "version": 1, "counts": {"k": ',
                          encoding="utf-8")
    proc = ServeProcess(serve_env(models_dir, free_port(), http_port=free_port(),
                                  usage_file=usage_file))
    try:
        assert proc.finish() == 1
    finally:
        proc.kill()
    assert "--usage-file" in proc.output and "SEQ2SERVE_USAGE_FILE" in proc.output
    assert str(usage_file) in proc.output and "Traceback" not in proc.output
    assert usage_file.read_text("utf-8").endswith('"k": ')  # left for the operator to see
