"""Office documents and e-books (server/core/documents/: office.py, opendocument.py,
epub.py over package.py, inline.py, mixed.py) on files made with the libraries people
make them with (python-docx, python-pptx, odfpy, ebooklib; tests/office_files.py), translated
through a stand-in model behind the core's own tag masking (core/placeholders.py)
and read back with those libraries: texts translated, structure kept, bold and
links on the translated words, members not translated byte for byte, bad files
refused in words."""

from __future__ import annotations

import asyncio
import io
import re
import struct
import subprocess
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import docx
import pptx
import pytest
import system_tools
from ebooklib import epub
from lxml import etree
from odf import draw, presentation, style, teletype, text
from odf.opendocument import load
from office_files import W, book_file, odp_file, odt_file, saved, slides_file, word_file

from seq2serve.server.core.documents import (
    SUFFIXES,
    DocumentError,
    DocumentTooLarge,
    Limits,
    media_type,
    read_document,
)
from seq2serve.server.core.documents.queueing import translate_document
from seq2serve.server.core.errors import ErrorKind
from seq2serve.server.core.inline import Paragraph, Piece
from seq2serve.server.core.placeholders import SENTINEL, mask, restore

_WORDS = re.compile(r"\{\d+\}|[^\W\d_]+")


def model(masked: str) -> str:
    """A stand-in model: every word upper-cased, sentinels copied where they are."""
    return _WORDS.sub(lambda m: m.group(0) if SENTINEL.fullmatch(m.group(0))
                      else m.group(0).upper(), masked)


def through_core(texts: Sequence[str], model: Callable[[str], str] = model) -> list[str]:
    """The texts as the core translates them: masked, translated, restored."""
    out = []
    for t in texts:
        masked = mask(t)
        out.append(restore(masked, model(masked.text)).text)
    return out


def translate(name: str, data: bytes, model: Callable[[str], str] = model,
              **limits: int) -> tuple[bytes, str]:
    document = read_document(name, data, "de", limits=Limits(**limits))

    async def run(texts: Sequence[str]) -> list[str]:
        return through_core(texts, model)

    out = asyncio.run(translate_document(document, run, chunk_size=3))
    return out, document.tally.describe()


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {i.filename: archive.read(i) for i in archive.infolist()}


# -- Word ------------------------------------------------------------------------------



def test_a_word_document_is_translated_with_its_structure_and_formatting_kept() -> None:
    raw = word_file()
    out, tally = translate("guide.docx", raw)
    before, after = docx.Document(io.BytesIO(raw)), docx.Document(io.BytesIO(out))
    assert len(after.paragraphs) == len(before.paragraphs)
    assert [p.style.name for p in after.paragraphs] == [p.style.name for p in before.paragraphs]
    assert [p.text for p in after.paragraphs if p.text] == [
        p.text.upper() for p in before.paragraphs if p.text]
    sentence = after.paragraphs[1]
    assert [(r.text, r.bold) for r in sentence.runs] == [
        ("PLEASE ", None), ("OPEN THE FILE", True), (" AND SAVE IT.", None)]
    tabbed = after.paragraphs[2]._p
    assert len(tabbed.findall(f".//{W}tab")) == 1 and after.paragraphs[2].text == "NAME\tVALUE"
    assert [c.text for c in after.tables[0]._cells] == [f"CELL NUMBER {i}" for i in range(4)]
    assert after.sections[0].header.paragraphs[0].text == "COMPANY HEADER"
    assert after.sections[0].footer.paragraphs[0].text == "CONFIDENTIAL FOOTER"
    [comment] = after.comments
    assert comment.text == "CHECK THIS SENTENCE"
    linked = after.paragraphs[-1]
    [link] = linked.hyperlinks
    assert link.text == "THE WEBSITE" and link.url == "https://example.org/"
    assert linked.text == "SEE THE WEBSITE FOR MORE."
    # What is not text is copied byte for byte; the styles but for their language.
    old, new = members(raw), members(out)
    assert list(new) == list(old)
    for name in ("word/numbering.xml", "[Content_Types].xml",
                 "word/_rels/document.xml.rels", "docProps/core.xml"):
        assert new[name] == old[name]
    assert new["word/styles.xml"] == old["word/styles.xml"].replace(
        b'<w:lang w:val="en-US"', b'<w:lang w:val="de-DE"')
    assert "14 of 14 entries translated" in tally


V = "urn:schemas-microsoft-com:vml"
FOOTNOTES = (b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
             b'<w:footnotes xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/'
             b'main"><w:footnote w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r>'
             b'</w:p></w:footnote><w:footnote w:id="1"><w:p><w:r><w:t xml:space="preserve">'
             b'A footnote text</w:t></w:r></w:p></w:footnote></w:footnotes>')


def test_text_boxes_and_footnotes_are_translated_inside_their_paragraphs() -> None:
    d = docx.Document()
    p = d.add_paragraph("Before the box ")
    box = etree.SubElement(p._p, W + "r")
    shape = etree.SubElement(etree.SubElement(box, W + "pict"), f"{{{V}}}shape")
    content = etree.SubElement(etree.SubElement(shape, f"{{{V}}}textbox"), W + "txbxContent")
    inner = etree.SubElement(etree.SubElement(content, W + "p"), W + "r")
    etree.SubElement(inner, W + "t").text = "Text in a box"
    p.add_run(" and after it.")
    out, tally = translate("a.docx", rezip(saved(d), {"word/footnotes.xml": FOOTNOTES}))
    root = etree.fromstring(members(out)["word/document.xml"])
    [outer] = [e for e in root.iter(W + "p") if e.getparent().tag == W + "body"][:1]
    assert "".join(outer.itertext()) == "BEFORE THE BOX TEXT IN A BOX AND AFTER IT."
    [boxed] = outer.iter(W + "txbxContent")
    assert "".join(boxed.itertext()) == "TEXT IN A BOX"
    notes = etree.fromstring(members(out)["word/footnotes.xml"])
    assert "".join(notes.itertext()) == "A FOOTNOTE TEXT"
    assert len(notes.findall(f".//{W}separator")) == 1
    assert "3 of 3 entries translated" in tally


def test_a_field_in_a_hyperlink_stays_whole_and_in_the_link() -> None:
    d = docx.Document()
    entry = d.add_paragraph()
    link = etree.SubElement(entry._p, W + "hyperlink", {W + "anchor": "_Toc1"})
    parts: list[tuple[str, dict[str, str], str | None]] = [
        ("t", {}, "Getting started"), ("tab", {}, None),
        ("fldChar", {W + "fldCharType": "begin"}, None),
        ("instrText", {}, " PAGEREF _Toc1 \\h "),
        ("fldChar", {W + "fldCharType": "separate"}, None), ("t", {}, "3"),
        ("fldChar", {W + "fldCharType": "end"}, None)]
    for tag, attributes, content in parts:
        child = etree.SubElement(etree.SubElement(link, W + "r"), W + tag, attributes)
        child.text = content
    document = read_document("toc.docx", saved(d), "de")
    assert document.texts == ["Getting started"]  # the tab and the field: at its end
    out, _ = translate("toc.docx", saved(d))
    [p] = etree.fromstring(members(out)["word/document.xml"]).iter(W + "p")
    [written] = p.findall(W + "hyperlink")
    assert written.get(W + "anchor") == "_Toc1" and len(p) == 1  # nothing outside it
    assert "".join(written.itertext()) == "GETTING STARTED PAGEREF _Toc1 \\h 3"
    assert [e.get(W + "fldCharType") for e in written.iter(W + "fldChar")] == [
        "begin", "separate", "end"]
    assert len(written.findall(f".//{W}tab")) == 1


def test_a_span_the_translation_moves_takes_the_words_it_moved_with() -> None:
    def reorder(masked: str) -> str:  # Please {0} open the file {1} and save it.
        assert masked == "Please {0} open the file {1} and save it."
        return "Bitte speichern und {0} die Datei öffnen {1}."

    d = docx.Document()
    p = d.add_paragraph("Please ")
    p.add_run("open the file").bold = True
    p.add_run(" and save it.")
    out, _ = translate("a.docx", saved(d), reorder)
    runs = docx.Document(io.BytesIO(out)).paragraphs[0].runs
    assert [(r.text, r.bold) for r in runs] == [
        ("Bitte speichern und ", None), ("die Datei öffnen", True), (".", None)]


def test_a_span_the_translation_loses_goes_to_the_nearest_word_never_dropped() -> None:
    d = docx.Document()
    p = d.add_paragraph("Please ")
    p.add_run("open").bold = True
    p.add_run(" the file and save it.")
    out, tally = translate("a.docx", saved(d), lambda masked: "Bitte die Datei speichern.")
    runs = docx.Document(io.BytesIO(out)).paragraphs[0].runs
    # The core's repair puts the lost pair back at the end, before the full stop, and
    # an empty pair's style goes to the word beside it.
    assert "".join(r.text for r in runs) == "Bitte die Datei speichern ."
    assert [r.text for r in runs if r.bold] == ["speichern"]
    assert "1 formatting spans not found in their translation" in tally


def test_paragraph_tags_read_back_whatever_the_model_did() -> None:
    pieces = [Piece("a b ", "plain"), Piece("c", "bold"), Piece(None, content=("tab",)),
              Piece(" d e f", "plain")]
    out: list[list[Piece]] = []
    paragraph = Paragraph(pieces, out.append)
    assert paragraph.text == "a b <g1>c</g1><x2/> d e f"
    paragraph.fill("<x2/>A <g1></g1>B C D &amp; E")  # empty span, opaque moved
    assert out[-1] == [Piece(None, content=("tab",)), Piece("A ", "plain"),
                       Piece("B", "bold"), Piece(" C D & E", "plain")]
    paragraph.fill("X <g1>Y</g1> Z <g1>W</g1>")  # repeated: the first counts
    # The lost opaque piece goes to the word boundary at its place in the source.
    assert out[-1] == [Piece("X ", "plain"), Piece("Y", "bold"), Piece(None, content=("tab",)),
                       Piece(" Z W", "plain")]


# -- PowerPoint ------------------------------------------------------------------------


def test_a_presentation_is_translated_slide_text_tables_and_notes() -> None:
    raw = slides_file()
    out, tally = translate("talk.pptx", raw)
    before, after = pptx.Presentation(io.BytesIO(raw)), pptx.Presentation(io.BytesIO(out))
    assert len(after.slides) == len(before.slides) == 2
    for n, (old, new) in enumerate(zip(before.slides, after.slides, strict=True)):
        assert len(new.shapes) == len(old.shapes)
        assert new.shapes.title.text == f"SLIDE TITLE {n}"
        body = new.placeholders[1].text_frame.paragraphs
        assert [p.text for p in body] == ["FIRST POINT", "BOLD WORDS AND PLAIN WORDS"]
        assert [(r.text, r.font.bold) for r in body[1].runs] == [
            ("BOLD WORDS", True), (" AND PLAIN WORDS", None)]
        assert new.notes_slide.notes_text_frame.text == f"SPEAKER NOTES {n}"
    table = next(s for s in after.slides[1].shapes if s.has_table).table
    assert [c.text for row in table.rows for c in row.cells] == [f"CELL {i} TEXT"
                                                                  for i in range(4)]
    old, new = members(raw), members(out)
    assert list(new) == list(old)
    # A layout is copied but for the language its text styles mark (the target's now).
    assert new["ppt/slideLayouts/slideLayout1.xml"] == old[
        "ppt/slideLayouts/slideLayout1.xml"].replace(b'lang="en-US"', b'lang="de-DE"')
    assert new["ppt/slideLayouts/slideLayout1.xml"] != old["ppt/slideLayouts/slideLayout1.xml"]
    assert "12 of 12 entries translated" in tally  # 2 x (title, 2 points, notes), 4 cells


def test_runs_split_by_what_does_not_show_are_one_text_without_tags() -> None:
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    para = slide.placeholders[1].text_frame.paragraphs[0]
    for words, lang in (("Open the ", "en-US"), ("fiel", "en-GB"), (" now", "en-US")):
        run = para.add_run()
        run.text = words
        run._r.get_or_add_rPr().set("lang", lang)
    para.runs[1]._r.get_or_add_rPr().set("err", "1")  # PowerPoint's spelling mark
    para.runs[2].font.bold = True
    assert read_document("a.pptx", saved(deck), "de").texts == ["Open the fiel<g1> now</g1>"]


# -- OpenDocument ----------------------------------------------------------------------


def test_an_opendocument_text_is_translated_notes_lists_and_headers_included() -> None:
    raw = odt_file()
    out, tally = translate("guide.odt", raw)
    after = load(io.BytesIO(out))
    paragraphs = after.text.getElementsByType(text.P)
    assert [teletype.extractText(p) for p in after.text.getElementsByType(text.H)] == [
        "THE USER GUIDE"]
    texts = [teletype.extractText(p) for p in paragraphs]
    assert "A FOOTNOTE TEXT" in texts and "FIRST ITEM" in texts and "SECOND ITEM" in texts
    sentence = next(p for p in paragraphs if "PLEASE" in teletype.extractText(p))
    [span] = sentence.getElementsByType(text.Span)
    assert teletype.extractText(span) == "OPEN THE FILE"
    assert span.getAttribute("stylename") == "Bold"
    assert len(sentence.getElementsByType(text.Note)) == 1
    header = after.masterstyles.getElementsByType(style.Header)[0]
    assert teletype.extractText(header) == "COMPANY HEADER"
    infos = zipfile.ZipFile(io.BytesIO(out)).infolist()
    assert infos[0].filename == "mimetype" and infos[0].compress_type == zipfile.ZIP_STORED
    assert members(out)["META-INF/manifest.xml"] == members(raw)["META-INF/manifest.xml"]
    assert "6 of 6 entries translated" in tally


def test_an_opendocument_presentation_is_translated_slides_and_notes() -> None:
    out, _ = translate("talk.odp", odp_file())
    pages = load(io.BytesIO(out)).presentation.getElementsByType(draw.Page)
    assert len(pages) == 3
    for n, page in enumerate(pages):
        [notes] = page.getElementsByType(presentation.Notes)
        assert teletype.extractText(notes.getElementsByType(text.P)[0]) == f"SPEAKER NOTES {n}"
        assert teletype.extractText(page.getElementsByType(text.P)[0]) == f"SLIDE TEXT {n}"


@pytest.mark.needs("soffice")
def test_libreoffice_opens_every_office_file_written(tmp_path: Path) -> None:
    soffice = system_tools.path("soffice")
    written = []
    for name, make in (("guide.docx", word_file), ("talk.pptx", slides_file),
                       ("guide.odt", odt_file), ("talk.odp", odp_file)):
        path = tmp_path / name.replace(".", "_") / name  # one folder each: one PDF name
        path.parent.mkdir()
        path.write_bytes(translate(name, make())[0])
        written.append(path)

    def convert(to: str, *paths: Path) -> None:
        for path in paths:
            result = subprocess.run(
                [soffice, f"-env:UserInstallation=file://{tmp_path}/profile", "--headless",
                 "--convert-to", to, "--outdir", str(path.parent), str(path)],
                capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, result.stderr

    convert("pdf", *written)
    for path in written:
        assert path.with_suffix(".pdf").read_bytes().startswith(b"%PDF"), path.name
    # What LibreOffice reads in the Word and OpenDocument texts is the translation.
    convert("txt:Text (encoded):UTF8", written[0], written[2])
    for path in (written[0], written[2]):
        shown = path.with_suffix(".txt").read_text(encoding="utf-8-sig")
        assert "PLEASE OPEN THE FILE AND SAVE IT." in shown and "Please" not in shown


# -- EPUB ------------------------------------------------------------------------------


def test_an_ebook_is_translated_chapters_and_table_of_contents(tmp_path: Path) -> None:
    raw = book_file()
    out, _ = translate("book.epub", raw)
    path = tmp_path / "book.epub"
    path.write_bytes(out)
    book = epub.read_epub(str(path))  # the library reads what was written
    chapters = [i for i in book.get_items() if i.get_name() in ("c0.xhtml", "c1.xhtml")]
    assert len(chapters) == 2
    for n, chapter in enumerate(chapters):
        root = etree.fromstring(members(out)[f"EPUB/{chapter.get_name()}"])
        body = "".join(root.itertext())
        assert f"CHAPTER TITLE {n}" in body and "keep this code" in body
        assert "Keep this too" in body
        html = members(out)[f"EPUB/{chapter.get_name()}"]
        assert b"PLEASE <b>OPEN THE FILE</b> AND <a href=\"c0.xhtml\">READ ON</a>." in html
    ncx = members(out)["EPUB/toc.ncx"]
    assert b"<text>CHAPTER TITLE 0</text>" in ncx and b"<text>CHAPTER TITLE 1</text>" in ncx
    assert b">CHAPTER TITLE 1</a>" in members(out)["EPUB/nav.xhtml"]
    old, new = members(raw), members(out)
    # The OPF's title translated and its language the target; the rest as it was.
    assert list(new) == list(old) and new["EPUB/content.opf"] == old["EPUB/content.opf"].replace(
        b"A small book", b"A SMALL BOOK").replace(b">en</dc:language>",
                                                  b">de</dc:language>").rstrip(b"\n")
    assert b'lang="de" xml:lang="de"' in new["EPUB/c0.xhtml"] and b'"en"' not in new[
        "EPUB/c0.xhtml"]
    infos = zipfile.ZipFile(io.BytesIO(out)).infolist()
    assert infos[0].filename == "mimetype" and infos[0].compress_type == zipfile.ZIP_STORED


def epub2_file(chapter: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("mimetype", "application/epub+zip", zipfile.ZIP_STORED)
        archive.writestr("META-INF/container.xml", (
            '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:'
            'opendocument:xmlns:container"><rootfiles><rootfile full-path="OEBPS/book.opf" '
            'media-type="application/oebps-package+xml"/></rootfiles></container>'))
        archive.writestr("OEBPS/book.opf", (
            '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="2.0">'
            '<manifest><item id="c" href="Text/chapter%201.xhtml" media-type="application/'
            'xhtml+xml"/><item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>'
            '</manifest><spine toc="ncx"><itemref idref="c"/></spine></package>'))
        archive.writestr("OEBPS/toc.ncx", (
            '<?xml version="1.0"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/"><navMap>'
            '<navPoint id="p"><navLabel><text>The first chapter</text></navLabel>'
            '<content src="Text/chapter%201.xhtml"/></navPoint></navMap></ncx>'))
        archive.writestr("OEBPS/Text/chapter 1.xhtml", chapter)
    return buffer.getvalue()


def test_an_epub_2_with_the_xhtml_1_1_doctype_and_its_entities() -> None:
    chapter = (b'<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD '
               b'XHTML 1.1//EN" "http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">\n<html xmlns='
               b'"http://www.w3.org/1999/xhtml"><head><title>A title</title></head><body>'
               b'<div><p>Open&nbsp;the <i>file</i> &amp; save.</p><p><img src="a.png"/></p>'
               b'</div></body></html>')
    out, tally = translate("old.epub", epub2_file(chapter))
    written = members(out)
    assert written["OEBPS/Text/chapter 1.xhtml"] == chapter.replace(
        b"A title", b"A TITLE").replace(b"Open&nbsp;the <i>file</i> &amp; save.",
                                        "OPEN\u00a0THE <i>FILE</i> &amp; SAVE.".encode())
    assert b"<text>THE FIRST CHAPTER</text>" in written["OEBPS/toc.ncx"]
    assert "3 of 3 entries translated" in tally


def test_an_image_in_a_link_stays_in_the_link_with_its_words() -> None:
    chapter = (b'<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/'
               b'xhtml"><body><p>See <a href="x.xhtml"><img src="i.png" alt="i"/>the picture'
               b'</a> here.</p><ul><li>Part one<ol><li>Section one</li></ol></li></ul>'
               b'</body></html>')
    out, _ = translate("old.epub", epub2_file(chapter))
    assert members(out)["OEBPS/Text/chapter 1.xhtml"] == chapter.replace(
        b'alt="i"', b'alt="I"').replace(b"See", b"SEE").replace(
        b"the picture", b"THE PICTURE").replace(b"here", b"HERE").replace(
        b"Part one", b"PART ONE").replace(b"Section one", b"SECTION ONE")


# -- what the door serves --------------------------------------------------------------


def test_the_formats_are_listed_with_their_media_types() -> None:
    assert {".docx", ".pptx", ".odt", ".odp", ".epub"} <= set(SUFFIXES)
    assert media_type("a.docx") == ("application/vnd.openxmlformats-officedocument."
                                    "wordprocessingml.document")
    assert media_type("a.PPTX").endswith("presentationml.presentation")
    assert media_type("a.odt") == "application/vnd.oasis.opendocument.text"
    assert media_type("a.odp") == "application/vnd.oasis.opendocument.presentation"
    assert media_type("a.epub") == "application/epub+zip"


# -- bad files -------------------------------------------------------------------------


def rezip(data: bytes, replace: dict[str, bytes] | None = None,
          drop: tuple[str, ...] = ()) -> bytes:
    old = members(data)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in {**old, **(replace or {})}.items():
            if name not in drop:
                archive.writestr(name, content)
    return buffer.getvalue()


def twice(data: bytes, name: str) -> bytes:
    buffer = io.BytesIO(data)
    with pytest.warns(UserWarning), zipfile.ZipFile(buffer, "a") as archive:
        archive.writestr(name, b"<x/>")
    return buffer.getvalue()


BILLION_LAUGHS = (b'<?xml version="1.0"?><!DOCTYPE w [<!ENTITY a "aaaaaaaaaa">'
                  b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
                  b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/'
                  b'2006/main"><w:body><w:p><w:r><w:t>&b;</w:t></w:r></w:p></w:body>'
                  b'</w:document>')
EXTERNAL = (b'<?xml version="1.0"?><!DOCTYPE w [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/'
            b'2006/main"><w:body><w:p><w:r><w:t>&x;</w:t></w:r></w:p></w:body>'
            b'</w:document>')


@pytest.mark.parametrize(("name", "make", "message"), [
    ("a.docx", lambda: b"just text, not a zip", "a.docx is not a Word document .* not a zip"),
    ("a.pptx", lambda: word_file(), "a.pptx is not a PowerPoint .* no ppt/presentation.xml"),
    ("a.docx", lambda: rezip(word_file(), drop=("word/document.xml",)),
     "no word/document.xml"),
    ("a.odt", lambda: rezip(odt_file(), drop=("content.xml",)), "no content.xml"),
    ("a.odp", lambda: odt_file(), "a.odp is not an OpenDocument presentation .* mimetype"),
    ("a.epub", lambda: word_file(), "no META-INF/container.xml"),
    ("a.docx", lambda: rezip(word_file(), {"word/document.xml": BILLION_LAUGHS}),
     "word/document.xml declares a DTD subset or entities"),
    ("a.docx", lambda: rezip(word_file(), {"word/document.xml": EXTERNAL}),
     "word/document.xml declares a DTD subset or entities"),
    ("a.docx", lambda: rezip(word_file(), {"word/document.xml": BILLION_LAUGHS.replace(
        b'version="1.0"', b'version="1.0" encoding="UTF-16"').decode().encode("utf-16")}),
     "word/document.xml declares a DTD subset or entities"),
    ("a.docx", lambda: rezip(word_file(), {"word/document.xml": b"<w:document"}),
     "word/document.xml is not well-formed XML"),
    ("a.docx", lambda: rezip(word_file(), {"word/vbaProject.bin": b"\0"}), "macros"),
    ("a.docx", lambda: rezip(word_file(), {"[Content_Types].xml": members(word_file())[
        "[Content_Types].xml"].replace(b"wordprocessingml.document.main",
                                       b"ms-word.document.macroEnabled.main")}), "macros"),
    ("a.odt", lambda: rezip(odt_file(), {"Basic/Standard/Module1.xml": b"<x/>"}), "macros"),
    ("a.docx", lambda: twice(word_file(), "word/document.xml"), "two files of one name"),
])
def test_a_bad_file_is_refused_in_words(name: str, make: Callable[[], bytes],
                                        message: str) -> None:
    with pytest.raises(DocumentError, match=message):
        read_document(name, make(), "de")


def test_a_zip_bomb_is_refused_before_it_is_inflated() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members(word_file()).items():
            archive.writestr(name, content)
        with archive.open("word/media/bomb.bin", "w") as bomb:
            zeros = bytes(1 << 20)
            for _ in range(80):  # 80 MiB of zeros: about 80 KB packed
                bomb.write(zeros)
    data = buffer.getvalue()
    assert len(data) < 1_000_000
    with pytest.raises(DocumentError, match=r"a.docx unpacks to 8\d{7} bytes; the limit is "
                                            r"67108864 bytes"):
        read_document("a.docx", data, "de")


def test_a_member_that_inflates_past_what_its_header_says_is_refused() -> None:
    data = bytearray(rezip(word_file()))
    # The central directory's uncompressed size of word/document.xml, made small.
    name = b"word/document.xml"
    at = data.rindex(b"PK\x01\x02", 0, data.rindex(name))
    struct.pack_into("<I", data, at + 24, 10)
    with pytest.raises(DocumentError, match="word/document.xml cannot be unpacked"):
        read_document("a.docx", bytes(data), "de")


def test_the_limits_bound_members_bytes_and_characters() -> None:
    # Each a DocumentTooLarge: of the kind TOO_LARGE (HTTP 413), still a DocumentError.
    raw = word_file()
    with pytest.raises(DocumentTooLarge, match="files in its archive; the limit is 3") as e:
        translate("a.docx", raw, members=3)
    assert e.value.kind is ErrorKind.TOO_LARGE and isinstance(e.value, DocumentError)
    with pytest.raises(DocumentTooLarge, match="the limit is 4000 bytes"):
        translate("a.docx", raw, unpacked_bytes=4000)
    with pytest.raises(DocumentTooLarge,
                       match="more than 50 characters of text .*; the limit is 50"):
        translate("a.docx", raw, characters=50)
    with pytest.raises(DocumentTooLarge, match="more than 5 paragraphs .*; the limit is 5"):
        translate("a.docx", raw, paragraphs=5)
    # A file that is not what it says stays a 400.
    with pytest.raises(DocumentError) as e:
        read_document("a.docx", b"PK", "de")
    assert e.value.kind is ErrorKind.INVALID_ARGUMENT


def test_the_text_limits_bound_every_format() -> None:
    page = b"<p>one</p><p>two</p><p>three</p>"
    assert read_document("a.html", page, "de", limits=Limits(paragraphs=3)).texts
    with pytest.raises(DocumentTooLarge, match="a.html has 3 texts to translate; the limit "
                                               "is 2"):
        read_document("a.html", page, "de", limits=Limits(paragraphs=2))
    with pytest.raises(DocumentTooLarge, match="a.txt has 11 characters of text to "
                                               "translate; the limit is 10"):
        read_document("a.txt", b"hello\nworld!\n", "de", limits=Limits(characters=10))
