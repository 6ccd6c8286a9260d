"""Software text through both front doors on the shipped en-de: placeholders,
inline tags and accelerators survive exactly, glossaries (per request, TSV and
TBX by name) substitute their terms, and bad input names its field."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from serving import RunningServer, free_port, server_config
from translate.filters import checks

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.core.placeholders import find, split_accelerator

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "en-de"
EXAMPLES = [
    "Hello {{name}}, you have {0} new messages",
    "<b>Warning:</b> the disk is almost full",
    "Save _As…",
    "&Open Recent",
    "Visit https://example.org/help for more information.",
    "Copied %1$s of %2$d files (%.1f%%) to %(dest)s",
    'Click <a href="https://x.org/?a=1&amp;b=2">here</a> or write to help@example.org today',
    "Set ${HOME} and $PATH, then open /etc/app.conf.\\n",
]
TBX = """<?xml version="1.0" encoding="UTF-8"?>
<martif type="TBX" xml:lang="en"><martifHeader><fileDesc><sourceDesc><p>t</p></sourceDesc>
</fileDesc></martifHeader><text><body>
<termEntry id="c1">
  <langSet xml:lang="en"><tig><term>folder</term></tig></langSet>
  <langSet xml:lang="de"><tig><term>Verzeichnis</term></tig></langSet>
</termEntry>
<termEntry id="c2"><langSet xml:lang="en"><tig><term>Seq2Serve</term></tig></langSet>
</termEntry>
</body></text></martif>
"""

pytestmark = pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped models/en-de")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("software")
    (root / "models").mkdir()
    (root / "models" / "en-de").symlink_to(SHIPPED)
    glossaries = root / "glossaries"
    glossaries.mkdir()
    (glossaries / "ui.en-de.tsv").write_text("# UI terms\nfile\tDatei\nWeblate\n")
    (glossaries / "terms.tbx").write_text(TBX)
    running = RunningServer(server_config(root / "models", http_port=free_port(),
                                          glossary_dir=glossaries, cache_mb=16.0, threads=1))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[pb_grpc.TranslatorStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield pb_grpc.TranslatorStub(channel)


def translate(stub: pb_grpc.TranslatorStub, texts: list[str],
              **fields: object) -> list[pb.Hypothesis]:
    request = pb.TranslateRequest(texts=texts, source_language="en", target_language="de",
                                  **fields)  # type: ignore[arg-type]
    return [t.hypotheses[0] for t in stub.Translate(request, timeout=120).translations]


def placeholders_intact(source: str, output: str) -> bool:
    bare, accelerator = split_accelerator(source)
    if accelerator is not None and output.count(accelerator.marker) != 1:
        return False
    return all(output.count(s.text) == bare.count(s.text) for s in find(bare))


def test_every_placeholder_survives_exactly_over_grpc(stub: pb_grpc.TranslatorStub) -> None:
    checker = checks.StandardChecker(checks.CheckerConfig(accelmarkers=["&", "_"]))
    for source, hypothesis in zip(EXAMPLES, translate(stub, EXAMPLES), strict=True):
        assert placeholders_intact(source, hypothesis.text), (source, hypothesis.text)
        for name in ("printf", "xmltags", "urls", "emails", "accelerators",
                     "pythonbraceformat"):
            assert getattr(checker, name)(source, hypothesis.text), (name, hypothesis.text)


def test_the_issue_examples_translate(stub: pb_grpc.TranslatorStub) -> None:
    out = [h.text for h in translate(stub, EXAMPLES[:5])]
    assert out[1].startswith("<b>") and "</b>" in out[1] and "Warning" not in out[1]
    assert out[2].count("_") == 1 and "As" not in out[2]
    assert out[3].count("&") == 1 and "Open" not in out[3]
    assert "https://example.org/help" in out[4] and out[4].split()[0] != "https://example.org/help"


def test_protection_can_be_turned_off(stub: pb_grpc.TranslatorStub) -> None:
    [raw] = translate(stub, ["Save _As…"], protect_placeholders=False)
    [masked] = translate(stub, ["Save _As…"])
    assert raw.text != masked.text and not raw.placeholders_repaired


def test_repair_is_flagged(stub: pb_grpc.TranslatorStub) -> None:
    # One new token cannot hold both placeholders: whatever the model writes, the
    # repair puts the missing one back, and says so.
    [cut] = translate(stub, [EXAMPLES[0]], options=pb.DecodingOptions(max_length=1))
    assert cut.finish_reason == pb.FINISH_REASON_LENGTH and cut.placeholders_repaired
    assert cut.text.count("{{name}}") == 1 and cut.text.count("{0}") == 1


def test_terms_and_do_not_translate(stub: pb_grpc.TranslatorStub) -> None:
    [hypothesis] = translate(stub, ["Seq2Serve cannot open the disk."],
                             terms=[pb.Term(source="disk", target="Datenträger")],
                             do_not_translate=["Seq2Serve"])
    assert "Datenträger" in hypothesis.text and "Seq2Serve" in hypothesis.text


def test_named_glossaries_tsv_and_tbx(stub: pb_grpc.TranslatorStub) -> None:
    [tsv] = translate(stub, ["Weblate cannot open the file."], glossary="ui")
    assert "Weblate" in tsv.text and "Datei" in tsv.text
    [tbx] = translate(stub, ["Seq2Serve cannot open the folder."], glossary="terms")
    assert "Seq2Serve" in tbx.text and "Verzeichnis" in tbx.text


def test_the_cache_key_holds_the_terms(stub: pb_grpc.TranslatorStub) -> None:
    text = "Open the folder."
    [plain] = translate(stub, [text])
    [with_term] = translate(stub, [text], terms=[pb.Term(source="folder", target="Ablage")])
    assert "Ablage" in with_term.text and "Ablage" not in plain.text


@pytest.mark.parametrize(("fields", "named"), [
    ({"glossary": "nope"}, "glossary"),
    ({"terms": [pb.Term(source="disk", target="")]}, "terms[0]"),
    ({"terms": [pb.Term(source="", target="x")]}, "terms[0]"),
    ({"do_not_translate": ["a\tb"]}, "do_not_translate[0]"),
])
def test_bad_input_is_invalid_argument(stub: pb_grpc.TranslatorStub, fields: dict[str, object],
                                       named: str) -> None:
    with pytest.raises(grpc.RpcError) as error:
        translate(stub, ["the disk"], **fields)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (error.value.details() or "")


def test_libretranslate_fields(http: httpx.Client, stub: pb_grpc.TranslatorStub) -> None:
    body = http.post("/translate", json={
        "q": EXAMPLES, "source": "en", "target": "de",
        "terms": {"disk": "Datenträger"}, "do_not_translate": ["Warning"]}).json()
    for source, output in zip(EXAMPLES, body["translatedText"], strict=True):
        assert placeholders_intact(source, output), (source, output)
    assert "Datenträger" in body["translatedText"][1] and "Warning" in body["translatedText"][1]
    # One flag per text, each what the gRPC API says for the same request.
    grpc_flags = [h.placeholders_repaired for h in translate(
        stub, EXAMPLES, terms=[pb.Term(source="disk", target="Datenträger")],
        do_not_translate=["Warning"])]
    assert body["placeholdersRepaired"] == grpc_flags
    form = http.post("/translate", data={"q": "Weblate cannot open the file.", "source": "en",
                                         "target": "de", "glossary": "ui"}).json()
    [alone] = translate(stub, ["Weblate cannot open the file."], glossary="ui")
    assert "Datei" in form["translatedText"] and form["translatedText"] == alone.text
    # A single text's flag is there only when a repair happened, as gRPC says it did.
    assert form.get("placeholdersRepaired", False) == alone.placeholders_repaired
    off = http.post("/translate", data={"q": "Save _As…", "source": "en", "target": "de",
                                        "protect_placeholders": "false"})
    assert off.status_code == 200


@pytest.mark.parametrize(("fields", "named"), [
    ({"glossary": "nope"}, "glossary"),
    ({"terms": ["disk"]}, "terms"),
    ({"terms": {"disk": ""}}, "terms[0]"),
    ({"do_not_translate": [1]}, "do_not_translate"),
    ({"protect_placeholders": "maybe"}, "protect_placeholders"),
])
def test_libretranslate_bad_input_is_400(http: httpx.Client, fields: dict[str, object],
                                         named: str) -> None:
    answer = http.post("/translate", json={"q": "the disk", "source": "en", "target": "de",
                                           **fields})
    assert answer.status_code == 400
    assert named in answer.json()["error"]


def test_proto_json_follows_the_proto(http: httpx.Client) -> None:
    answer = http.post("/v1/translate", content=json.dumps({
        "texts": ["Hello {{name}}, you have {0} new messages"], "targetLanguage": "de",
        "terms": [{"source": "messages", "target": "Mitteilungen"}]}))
    assert answer.status_code == 200
    hypothesis = answer.json()["translations"][0]["hypotheses"][0]
    assert "Mitteilungen" in hypothesis["text"]
    cut = http.post("/v1/translate", content=json.dumps({
        "texts": ["Hello {{name}}, you have {0} new messages"], "targetLanguage": "de",
        "options": {"maxLength": 1}})).json()["translations"][0]["hypotheses"][0]
    assert cut["placeholdersRepaired"] is True and cut["finishReason"] == "FINISH_REASON_LENGTH"
    bad = http.post("/v1/translate", content=json.dumps({
        "texts": ["x"], "targetLanguage": "de", "glossary": "nope"}))
    assert bad.status_code == 400 and "glossary" in bad.text


def test_a_stream_with_placeholders_comes_whole_at_the_end(
        stub: pb_grpc.TranslatorStub) -> None:
    request = pb.TranslateRequest(texts=["Copy %s to <b>%d</b> places. Then close it."],
                                  source_language="en", target_language="de",
                                  options=pb.DecodingOptions(beam_size=1))
    chunks = list(stub.TranslateStream(request, timeout=120))
    assert [c.final for c in chunks] == [True]
    text = chunks[-1].translation.hypotheses[0].text
    assert chunks[-1].text_delta == text
    assert placeholders_intact(request.texts[0], text)


def test_the_translate_command_sends_glossary_terms_and_protection(
        server: RunningServer, stub: pb_grpc.TranslatorStub,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`seq2serve translate` (the gRPC client) with --glossary, --term, --keep and
    --no-protect: the server applies each, as for a raw request."""
    from seq2serve.server.cli import translate as translate_cli

    def run(*flags: str) -> str:
        parser = argparse.ArgumentParser()
        translate_cli.configure(parser)
        args = parser.parse_args([*flags, "--from", "en", "--to", "de",
                                  "--server", server.target])
        assert translate_cli.run(args) == 0
        return capsys.readouterr().out.strip()

    out = run("Seq2Serve cannot open the disk.", "--term", "disk=Datenträger",
              "--keep", "Seq2Serve")
    assert "Datenträger" in out and "Seq2Serve" in out
    out = run("Weblate cannot open the file.", "--glossary", "ui")
    assert "Weblate" in out and "Datei" in out
    protected = run("Copied %1$s of %2$d files")
    assert placeholders_intact("Copied %1$s of %2$d files", protected)
    # Off, the text goes to the model as it is (here: the same answer as a raw
    # request with protect_placeholders false).
    [raw] = translate(stub, ["Hello {{name}}, you have {0} new messages"],
                      protect_placeholders=False)
    assert run("Hello {{name}}, you have {0} new messages", "--no-protect") == raw.text


def test_a_term_without_target_is_a_usage_error(server: RunningServer,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from seq2serve.server.cli import translate as translate_cli

    parser = argparse.ArgumentParser()
    translate_cli.configure(parser)
    args = parser.parse_args(["text", "--term", "disk", "--server", server.target])
    assert translate_cli.run(args) == 2
    assert "--term must be SOURCE=TARGET" in capsys.readouterr().err
