"""Whole files on the shipped en-de through both ways in: HTTP /translate_file
(LibreTranslate's contract: multipart in, a download URL out) and `seq2serve
translate-file` over gRPC, on catalogs cut from Debian packages
(tests/fixtures/catalogs/): the .po written passes `msgfmt --check`, re-reads,
keeps its translated entries byte for byte and marks the new ones fuzzy; a Word
document made with python-docx comes back a Word document, translated, its bold
words bold and its table and header kept (over HTTP and the CLI); .pptx, .odt,
.odp and .epub come back translated and open in their libraries; HTML (format=html and
.html files) is translated a sentence at a time, its bold and links on the translated
words; .xlsx and .ods come back translated, their numbers and formulas kept."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import docx
import httpx
import openpyxl
import pptx
import pytest
import system_tools
from conftest import msgfmt_check
from ebooklib import epub
from lxml import etree
from odf.opendocument import load
from office_files import (
    W,
    book_file,
    odp_file,
    odt_file,
    reviewed_word_file,
    slides_file,
    spreadsheet_file,
    workbook_file,
)
from serving import RunningServer, free_port, server_config
from translate.storage import pypo, xliff2

from seq2serve.server.client import Seq2ServeClient
from seq2serve.server.core.documents import DEFAULT_LIMITS, read_document

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "en-de"
CATALOGS = Path(__file__).resolve().parents[1] / "fixtures" / "catalogs"

pytestmark = pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped models/en-de")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("files")
    (root / "en-de").symlink_to(SHIPPED)
    # Fewer texts per request than the catalog has entries: a file is many requests.
    running = RunningServer(server_config(root, http_port=free_port(), threads=1,
                                          max_texts_per_request=16))
    yield running
    running.stop()


def upload(http: httpx.Client, name: str, **fields: str) -> httpx.Response:
    answer = http.post("/translate_file", data={"source": "en", "target": "de", **fields},
                       files={"file": (name, (CATALOGS / name).read_bytes())})
    assert answer.status_code == 200, answer.text
    return http.get(answer.json()["translatedFileUrl"])


@pytest.mark.needs("msgfmt")
def test_a_po_file_through_http(http: httpx.Client, tmp_path: Path) -> None:
    name = "gnome-power-manager.de.po"
    raw = (CATALOGS / name).read_bytes()
    download = upload(http, name)
    assert download.headers["content-type"].startswith("text/x-gettext-translation")
    assert download.headers["content-disposition"] == (
        f'attachment; filename="{name}"; filename*=UTF-8\'\'{name}')
    written = tmp_path / name
    written.write_bytes(download.content)
    msgfmt_check(written)
    before, after = pypo.pofile(raw).units, pypo.pofile(download.content).units
    assert len(before) == len(after)
    filled = 0
    for old, new in zip(before, after, strict=True):
        if old.isheader() or old.isobsolete() or old.istranslated() or old.isfuzzy():
            assert str(new) == str(old)  # byte for byte
            continue
        filled += 1
        assert new.isfuzzy() and new.target
        if new.hasplural():
            assert len(new.target.strings) == 2 and all(new.target.strings)
    assert filled == 21
    # The same translation /translate gives (one core, one cache-free answer).
    entry = next(u for u in after if str(u.source) == "Observe power management")
    same = http.post("/translate", json={"q": "Observe power management", "source": "en",
                                         "target": "de"}).json()["translatedText"]
    assert str(entry.target) == same


def test_xliff_and_subtitles_through_http(http: httpx.Client) -> None:
    store = xliff2.Xliff2File(upload(http, "ark.de.xlf").content)
    states = {u.getid(): (u.xmlelement.get("state"), u.target) for u in store.units}
    assert states["add"] == ("final", "Hinzufügen")
    assert states["remove-from-archive"][0] == "initial" and states["remove-from-archive"][1]
    srt = (b"1\n00:00:01,000 --> 00:00:03,500\nThe disk is almost full.\n\n"
           b"2\n00:00:04,000 --> 00:00:05,250\nOpen the file.\n")
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("film.srt", srt)})
    out = http.get(answer.json()["translatedFileUrl"]).content
    assert out.count(b"-->") == 2 and out.startswith(b"1\n00:00:01,000 --> 00:00:03,500\n")
    assert b"The disk" not in out
    settings = http.get("/frontend/settings").json()
    assert {".po", ".pot", ".xliff", ".xlf", ".srt", ".txt", ".html"} <= set(
        settings["supportedFilesFormat"])


@pytest.mark.needs("msgfmt")
def test_the_cli_translates_a_template(server: RunningServer, tmp_path: Path) -> None:
    out = tmp_path / "de.po"
    result = subprocess.run(
        [sys.executable, "-m", "seq2serve.server.cli.main", "translate-file",
         str(CATALOGS / "gnome-power-manager.pot"), "--to", "de", "--from", "en",
         "-o", str(out), "--server", server.target],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "38 of 38 entries translated" in result.stderr
    msgfmt_check(out)
    store = pypo.pofile(out.read_bytes())
    assert store.parseheader()["Language"] == "de"
    assert all(u.isfuzzy() and u.target for u in store.units if not u.isheader())
    missing = subprocess.run(
        [sys.executable, "-m", "seq2serve.server.cli.main", "translate-file",
         str(tmp_path / "nothing.po"), "--to", "de", "--server", server.target],
        capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "nothing.po" in missing.stderr


def test_the_cli_reads_a_book_past_a_default_limit_with_the_limit_raised(
        server: RunningServer, tmp_path: Path) -> None:
    # A book laid out with a blank line per line of print: past the default
    # --max-document-elements (a line of a .txt counts as one), refused naming it,
    # translated on the shipped model with the limit raised.
    book = tmp_path / "book.txt"
    book.write_bytes(b"The disk is almost full.\n" + b"\n" * DEFAULT_LIMITS.elements
                     + b"Open the file.\n")
    command = [sys.executable, "-m", "seq2serve.server.cli.main", "translate-file", str(book),
               "--to", "de", "--from", "en", "--server", server.target]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"(--max-document-elements {DEFAULT_LIMITS.elements}; raise it" in refused.stderr
    raised = subprocess.run(command + ["--max-document-elements",
                                       str(DEFAULT_LIMITS.elements + 2)],
                            capture_output=True, text=True, timeout=300)
    assert raised.returncode == 0, raised.stderr
    lines = (tmp_path / "book.de.txt").read_text().split("\n")
    assert len(lines) == DEFAULT_LIMITS.elements + 3 and not any(lines[1:-2])
    assert lines[0] and lines[-2] and not {"The disk is almost full.", "Open the file."} & {
        lines[0], lines[-2]}


def word_file() -> bytes:
    document = docx.Document()
    document.add_heading("Power management", 1)
    sentence = document.add_paragraph("Please ")
    sentence.add_run("open the file").bold = True
    sentence.add_run(" and save your changes.")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "The disk is almost full."
    table.cell(0, 1).text = "Open the file."
    document.sections[0].header.paragraphs[0].text = "The user guide"
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def check_word(raw: bytes, out: bytes) -> None:
    before, after = docx.Document(io.BytesIO(raw)), docx.Document(io.BytesIO(out))
    assert len(after.paragraphs) == len(before.paragraphs)
    assert [p.style.name for p in after.paragraphs] == [p.style.name for p in before.paragraphs]
    texts = [p.text for p in after.paragraphs] + [c.text for c in after.tables[0]._cells]
    texts.append(after.sections[0].header.paragraphs[0].text)
    assert all(texts) and not {"Power management", "The disk is almost full.",
                               "Open the file.", "The user guide"} & set(texts)
    sentence = after.paragraphs[1]
    assert "Please" not in sentence.text
    bold = [r.text for r in sentence.runs if r.bold]
    assert bold and all(t.strip() for t in bold)  # the bold span landed on words


def test_a_word_document_through_http(http: httpx.Client) -> None:
    raw = word_file()
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("guide.docx", raw)})
    assert answer.status_code == 200, answer.text
    download = http.get(answer.json()["translatedFileUrl"])
    assert download.headers["content-type"] == (
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document")
    assert download.headers["content-disposition"] == (
        'attachment; filename="guide.docx"; filename*=UTF-8\'\'guide.docx')
    check_word(raw, download.content)
    bad = http.post("/translate_file", data={"source": "en", "target": "de"},
                    files={"file": ("guide.docx", b"not a zip at all")})
    assert bad.status_code == 400 and "guide.docx is not a Word document" in bad.text
    settings = http.get("/frontend/settings").json()
    assert {".docx", ".pptx", ".odt", ".odp", ".epub", ".xlsx", ".ods"} <= set(
        settings["supportedFilesFormat"])


def test_the_cli_translates_a_word_document(server: RunningServer, tmp_path: Path) -> None:
    raw = word_file()
    (tmp_path / "guide.docx").write_bytes(raw)
    result = subprocess.run(
        [sys.executable, "-m", "seq2serve.server.cli.main", "translate-file",
         str(tmp_path / "guide.docx"), "--to", "de", "--from", "en", "--server", server.target],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "5 of 5 entries translated" in result.stderr
    check_word(raw, (tmp_path / "guide.de.docx").read_bytes())
    # The translation gets the mode a plain open() gives a new file (mkstemp's is 0600),
    # and a file it replaces keeps its own.
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert (tmp_path / "guide.de.docx").stat().st_mode == plain.stat().st_mode
    (tmp_path / "guide.de.docx").chmod(0o640)
    again = subprocess.run(
        [sys.executable, "-m", "seq2serve.server.cli.main", "translate-file",
         str(tmp_path / "guide.docx"), "--to", "de", "--from", "en", "--server", server.target],
        capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "guide.de.docx").stat().st_mode & 0o777 == 0o640


def test_a_reviewed_word_file_is_all_german_but_its_deletions(http: httpx.Client) -> None:
    """Insertions, moves, content controls and a link field come back translated by the
    shipped en-de inside their changes, controls and field; deletions as they were."""
    raw = reviewed_word_file()
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("review.docx", raw)})
    assert answer.status_code == 200, answer.text
    out = http.get(answer.json()["translatedFileUrl"]).content
    before, after = read_document("r.docx", raw, "de").texts, read_document("r.docx", out,
                                                                           "de").texts
    assert len(after) == len(before) == 6
    assert not set(before) & set(after), after
    root = etree.fromstring(zipfile.ZipFile(io.BytesIO(out)).read("word/document.xml"))
    shown = " ".join("".join(e.itertext()) for e in root.iter(W + "ins", W + "moveTo",
                                                                W + "sdtContent"))
    # ("the form" is "die Form": German spells the noun as English does.)
    assert not {"early", "morning", "whole", "moved", "summary", "the"} & set(
        re.findall(r"\w+", shown.lower())), shown
    assert ["".join(e.itertext()) for e in root.iter(W + "del", W + "moveFrom")] == [
        "at noon", "This part moved.", "Gone for good."]


@pytest.mark.parametrize(("name", "make"), [("talk.pptx", slides_file), ("guide.odt", odt_file),
                                            ("talk.odp", odp_file), ("book.epub", book_file),
                                            ("figures.xlsx", workbook_file),
                                            ("figures.ods", spreadsheet_file)])
def test_every_other_format_through_http(http: httpx.Client, tmp_path: Path, name: str,
                                         make: Callable[[], bytes]) -> None:
    raw = make()
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": (name, raw)})
    assert answer.status_code == 200, answer.text
    out = http.get(answer.json()["translatedFileUrl"]).content
    before, after = read_document(name, raw, "de").texts, read_document(name, out, "de").texts
    assert len(after) == len(before)
    changed = [b for b, a in zip(before, after, strict=True) if a != b]
    assert len(changed) >= len(before) // 2, after  # titles such as "A small book" may stay
    (tmp_path / name).write_bytes(out)
    opened = {".pptx": lambda p: len(pptx.Presentation(str(p)).slides),
              ".odt": lambda p: len(load(str(p)).text.childNodes),
              ".odp": lambda p: len(load(str(p)).presentation.childNodes),
              ".epub": lambda p: len(list(epub.read_epub(str(p)).get_items())),
              ".xlsx": lambda p: len(openpyxl.load_workbook(p).worksheets),
              ".ods": lambda p: len(load(str(p)).spreadsheet.childNodes)}
    suffix = Path(name).suffix
    (tmp_path / f"source{suffix}").write_bytes(raw)
    assert opened[suffix](tmp_path / name) == opened[suffix](tmp_path / f"source{suffix}")


@pytest.mark.needs("epubcheck", "java")
def test_a_translated_book_passes_the_epub_validator(http: httpx.Client, tmp_path: Path) -> None:
    """The W3C's EPUB validator (Debian's epubcheck, run by java: binfmt may be off)
    finds in the translated book no error or warning that it does not find in the
    book as ebooklib wrote it."""
    raw = book_file()
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("book.epub", raw)})
    assert answer.status_code == 200, answer.text
    (tmp_path / "book.de.epub").write_bytes(http.get(answer.json()["translatedFileUrl"]).content)
    (tmp_path / "book.epub").write_bytes(raw)

    def problems(name: str) -> list[str]:
        run = subprocess.run([system_tools.path("java"), "-jar", system_tools.path("epubcheck"),
                              str(tmp_path / name)],
                             capture_output=True, text=True, timeout=300)
        assert "EPUBCheck completed" in run.stdout + run.stderr, run.stdout + run.stderr
        return sorted(line.replace(str(tmp_path / name), "BOOK")
                      for line in (run.stdout + run.stderr).splitlines()
                      if line.startswith(("ERROR", "WARNING", "FATAL")))

    assert problems("book.de.epub") == problems("book.epub")


HTML_SENTENCES = ["Please open the file and save it.", "My name is Michael.",
                  "See the manual for details."]
HTML = ('<p>Please <b>open the file</b> and save it.</p><li>My name <b>is</b> Michael.</li>'
        '<p>See <a href="https://example.org/a?b=1&amp;c=2">the manual</a> for details.</p>')
HTML_PATTERN = re.compile(r"<p>(.*)<b>(.+)</b>(.*)</p><li>(.*)<b>(.+)</b>(.*)</li><p>(.*)"
                          r'<a href="https://example\.org/a\?b=1&amp;c=2">(.+)</a>(.*)</p>')


def test_html_is_translated_a_sentence_at_a_time(server: RunningServer,
                                                 http: httpx.Client) -> None:
    """"My name <b>is</b> Michael" was three texts, each translated alone; now it is one,
    whose words are the whole sentence's translation, and whose bold and link hold the
    words that translate theirs, the link's href as it was."""
    with Seq2ServeClient(server.target) as client:
        whole = [nbest[0].text for nbest in client.translate(
            HTML_SENTENCES, source_language="en", target_language="de")]
    body = http.post("/translate", json={"q": HTML, "source": "en", "target": "de",
                                         "format": "html"}).json()
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("page.html", HTML.encode())})
    assert answer.status_code == 200, answer.text
    page = http.get(answer.json()["translatedFileUrl"]).text
    assert page == body["translatedText"]  # the .html file the same way
    found = HTML_PATTERN.fullmatch(page)
    assert found is not None, page
    groups = found.groups()
    assert ["".join(groups[i:i + 3]) for i in (0, 3, 6)] == whole, page
    # "open the file", "is", "the manual" (shipped en-de: "öffnen Sie die Datei", "ist",
    # "das Handbuch").
    assert "Datei" in groups[1] and groups[4].strip() == "ist" and "Handbuch" in groups[7]
    assert "placeholdersRepaired" not in body
