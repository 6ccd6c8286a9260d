"""Named glossaries from --glossary-dir (TSV and TBX) and a request's own terms
(server/core/glossary.py), and the configuration that loads them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from seq2serve.server.app import load_glossaries
from seq2serve.server.config import ConfigError, ServerConfig
from seq2serve.server.core.errors import InvalidArgument
from seq2serve.server.core.glossary import Glossaries, GlossaryError, request_terms
from seq2serve.server.core.placeholders import Terms

TBX = """<?xml version="1.0" encoding="UTF-8"?>
<martif type="TBX" xml:lang="en"><martifHeader><fileDesc><sourceDesc><p>t</p></sourceDesc>
</fileDesc></martifHeader><text><body>
<termEntry id="c1">
  <langSet xml:lang="en"><tig><term>folder</term></tig></langSet>
  <langSet xml:lang="de"><tig><term>Verzeichnis</term></tig></langSet>
  <langSet xml:lang="fr"><tig><term>répertoire</term></tig></langSet>
</termEntry>
<termEntry id="c2"><langSet xml:lang="en"><tig><term>Seq2Serve</term></tig></langSet>
</termEntry>
<termEntry id="c3">
  <descrip type="Translation needed">no</descrip>
  <langSet xml:lang="en"><tig><term>GitHub</term></tig></langSet>
  <langSet xml:lang="de"><tig><term>GitHub</term></tig></langSet>
</termEntry>
</body></text></martif>
"""


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    (tmp_path / "ui.en-de.tsv").write_text("# comment\nfile\tDatei\n\nWeblate\nsame\tsame\n")
    (tmp_path / "ui.tbx").write_text(TBX)
    (tmp_path / "README.txt").write_text("not a glossary")
    return tmp_path


def test_tsv_and_tbx_by_name_and_pair(directory: Path) -> None:
    glossaries = Glossaries.load(directory)
    assert glossaries.names() == ["ui"]
    ui = glossaries.get("ui")
    assert ui is not None
    assert ui.terms("en", "de") == Terms(pairs=(("file", "Datei"), ("folder", "Verzeichnis")),
                                         keep=("Weblate", "same", "Seq2Serve", "GitHub"))
    # The TSV is for en-de only; the TBX has every language.
    assert ui.terms("en", "fr") == Terms(pairs=(("folder", "répertoire"),),
                                         keep=("Seq2Serve", "GitHub"))


@pytest.mark.parametrize(("name", "content", "message"), [
    ("bad.tsv", "a\tb\tc\n", "bad.tsv:1: expected source<TAB>target"),
    ("bad.tsv", "ok\tgut\n\tleer\n", "bad.tsv:2: a term's source is empty"),
    ("bad.en_de.tsv", "a\tb\n", "NAME.SRC-TGT.tsv"),
    ("bad.tbx", "<martif><unclosed>", "not a readable TBX file"),
])
def test_a_broken_file_is_named(tmp_path: Path, name: str, content: str, message: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(GlossaryError, match=message):
        Glossaries.load(tmp_path)
    # The server reads them once, at start-up: a broken one is a configuration error.
    with pytest.raises(ConfigError) as refused:
        load_glossaries(ServerConfig(models_dir=tmp_path, glossary_dir=tmp_path))
    assert any(p.field == "glossary_dir" and message.split(":")[-1].strip() in p.message
               for p in refused.value.problems)


def test_glossary_dir_must_exist(tmp_path: Path) -> None:
    problems = ServerConfig(models_dir=tmp_path, glossary_dir=tmp_path / "none").problems()
    assert [p.field for p in problems] == ["glossary_dir"]


def test_request_terms_merge_and_win(directory: Path) -> None:
    glossaries = Glossaries.load(directory)
    terms = request_terms(glossaries, "ui", [("file", "Akte")], ["Datei"], "en", "de")
    assert terms.pairs == (("file", "Akte"), ("folder", "Verzeichnis"))
    assert terms.keep[0] == "Datei"


@pytest.mark.parametrize(("name", "pairs", "keep", "field"), [
    ("nope", [], [], "glossary: this server has no glossary named 'nope'; glossaries: ui"),
    ("", [("disk", " ")], [], "terms[0]"),
    ("", [("", "x")], [], "terms[0]: a term's source is empty"),
    ("", [], ["ok", "two\nlines"], "do_not_translate[1]"),
    ("", [], ["x" * 201], "do_not_translate[0]: a term's source must be at most 200"),
    ("", [("disk", "Daten\udc00")], [], "terms[0]: a term's target must be valid Unicode"),
    ("", [], ["ok", "\ud800"], "do_not_translate[1]: a term's source must be valid Unicode"),
])
def test_request_terms_name_the_field(directory: Path, name: str,
                                      pairs: list[tuple[str, str]], keep: list[str],
                                      field: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        request_terms(Glossaries.load(directory), name, pairs, keep, "en", "de")
    assert field in str(error.value)


def test_no_glossary_dir_says_so() -> None:
    with pytest.raises(InvalidArgument, match="none \\(no --glossary-dir\\)"):
        request_terms(Glossaries.load(None), "ui", [], [], "en", "de")


def test_stored_glossaries_survive_a_restart_and_serve_by_id(tmp_path: Path) -> None:
    from seq2serve.server.core.glossary import (
        Dictionary,
        Glossaries,
        GlossaryStore,
        parse_entries,
    )

    entries = parse_entries('"file, old",Datei\nclose,schließen\n', "csv")
    assert entries == [("file, old", "Datei"), ("close", "schließen")]
    store = GlossaryStore(tmp_path, Glossaries())
    made = store.create("mine", [Dictionary("en", "de", tuple(entries))])
    again = GlossaryStore(tmp_path, Glossaries())  # a restart
    assert again.get(made.glossary_id) == made
    served = again.glossaries.get(made.glossary_id)
    assert served is not None and served.terms("en", "de").pairs == tuple(entries)
    assert again.delete(made.glossary_id) and again.get(made.glossary_id) is None
    assert GlossaryStore(tmp_path, Glossaries()).list() == []


@pytest.mark.parametrize(("text", "entries_format", "message"), [
    ("a\tb\na\tc", "tsv", "line 2: 'a' is given twice"),
    ("a,b,c", "csv", "line 1: expected source and target columns, got 3"),
    ("a\t", "tsv", "line 1: the target of 'a' is empty"),
    ("", "tsv", "at least one"),
    ("a\tb", "xlsx", "entries_format must be tsv or csv"),
])
def test_glossary_entries_that_cannot_be_used_are_refused(text: str, entries_format: str,
                                                          message: str) -> None:
    from seq2serve.server.core.errors import InvalidArgument
    from seq2serve.server.core.glossary import parse_entries

    with pytest.raises(InvalidArgument, match=re.escape(message)):
        parse_entries(text, entries_format)
