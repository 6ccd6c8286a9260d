"""What a reader reads in a document is translated, and the document says it is in the
target language (issue 53, items 4-7 and 9; server/core/documents/): Word's tracked
changes and content controls, charts, language marks and titles, the attributes meant
for people, EPUB 2's named entities, and spreadsheets. Files are made with the
libraries people make them with (python-docx, python-pptx, openpyxl, odfpy, ebooklib)
and edited with lxml where those have no call for it; read back with the same
libraries, and opened by LibreOffice where it is installed."""

from __future__ import annotations

import io
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import docx
import pptx
import pytest
import system_tools
from lxml import etree
from odf import chart, dc, draw, style, table, text
from odf.opendocument import OpenDocumentChart, OpenDocumentPresentation, OpenDocumentText
from office_files import W, element, reviewed_word_file, run, saved, word_file
from pptx.chart.data import CategoryChartData
from pptx.enum.chart import XL_CHART_TYPE
from test_office_documents import epub2_file, members, rezip, translate

from seq2serve.server.core.documents import DocumentError, read_document

TEXT_NS = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
CHART_NS = "urn:oasis:names:tc:opendocument:xmlns:chart:1.0"
STYLE_NS = "urn:oasis:names:tc:opendocument:xmlns:style:1.0"
FO_NS = "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"
DC_NS = "http://purl.org/dc/elements/1.1/"


def libreoffice_text(path: Path, tmp_path: Path, to: str = "txt:Text (encoded):UTF8",
                     suffix: str = ".txt") -> str:
    """What LibreOffice reads in `path` (it opens it, or the test fails): for a test
    marked `needs("soffice")`."""
    result = subprocess.run(
        [system_tools.path("soffice"), f"-env:UserInstallation=file://{tmp_path}/profile",
         "--headless", "--convert-to", to, "--outdir", str(path.parent), str(path)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    written = path.with_suffix(suffix)
    assert written.exists(), f"LibreOffice did not open {path.name}: {result.stderr}"
    return written.read_text(encoding="utf-8-sig", errors="replace")


# -- Word: tracked changes, content controls, fields ----------------------------------


def test_a_reviewed_word_file_is_translated_as_a_reader_reads_it() -> None:
    raw = reviewed_word_file()
    texts = read_document("review.docx", raw, "de").texts
    assert texts == ["Write the summary here.",
                     "The meeting starts <x1/><g2>early in the morning</g2> on Monday.",
                     "A whole new paragraph.", "Please sign <g1>the form</g1> before Friday.",
                     "Read <g1>the guide</g1> first.", "This part moved."]
    out, tally = translate("review.docx", raw)
    assert "6 of 6 entries translated" in tally  # every paragraph with text a reader reads
    root = etree.fromstring(members(out)["word/document.xml"])
    shown = ["".join(t.text or "" for t in p.iter(W + "t", W + "delText"))
             for p in root.iter(W + "p")]
    assert shown == ["WRITE THE SUMMARY HERE.", "THE MEETING STARTS at noonEARLY IN THE MORNING "
                     "ON MONDAY.", "A WHOLE NEW PARAGRAPH.", "This part moved.",
                     "PLEASE SIGN THE FORM BEFORE FRIDAY.", "READ THE GUIDE FIRST.",
                     "THIS PART MOVED.", "Gone for good."]
    body = root.find(W + "body")
    assert body is not None
    paragraphs = list(root.iter(W + "p"))
    # Each change, control and field is where it was, around its translated words.
    [deletion] = paragraphs[1].findall(W + "del")
    [insertion] = paragraphs[1].findall(W + "ins")
    assert "".join(insertion.itertext()) == "EARLY IN THE MORNING"
    assert insertion.get(W + "id") == "2" and "".join(deletion.itertext()) == "at noon"
    assert paragraphs[2].find(f"{W}pPr/{W}rPr/{W}ins") is not None
    assert "".join(paragraphs[2].find(W + "ins").itertext()) == "A WHOLE NEW PARAGRAPH."
    assert "".join(paragraphs[3].find(W + "moveFrom").itertext()) == "This part moved."
    assert "".join(paragraphs[6].find(W + "moveTo").itertext()) == "THIS PART MOVED."
    assert [e.tag for e in paragraphs[6]] == [W + "moveToRangeStart", W + "moveTo",
                                              W + "moveToRangeEnd"]
    [control] = paragraphs[4].findall(W + "sdt")
    assert control.find(f"{W}sdtPr/{W}tag").get(W + "val") == "signer"
    assert "".join(control.find(W + "sdtContent").itertext()) == "THE FORM"
    fields = [e.get(W + "fldCharType") or e.text for e in paragraphs[5].iter(
        W + "fldChar", W + "instrText", W + "t")]
    assert fields == ["READ ", "begin", ' HYPERLINK "https://example.org/" ', "separate",
                      "THE GUIDE", "end", " FIRST."]
    assert docx.Document(io.BytesIO(out)).paragraphs  # python-docx reads it


def test_a_simple_field_is_translated_when_it_shows_words() -> None:
    d = docx.Document()
    p = d.add_paragraph("Visit ")
    run(element(p._p, "fldSimple", instr=' HYPERLINK "https://example.org/" '), "the site")
    run(p._p, " from page ")
    run(element(p._p, "fldSimple", instr=" PAGE "), "3")
    run(p._p, " or ask ")
    run(element(p._p, "fldSimple", instr=" MERGEFIELD Name "), "«Name»")
    assert read_document("a.docx", saved(d), "de").texts == [
        "Visit <g1>the site</g1> from page <x2/> or ask"]  # the last field: at the edge
    out, _ = translate("a.docx", saved(d))
    [p] = etree.fromstring(members(out)["word/document.xml"]).iter(W + "p")
    assert [("".join(f.itertext()), f.get(W + "instr")) for f in p.iter(W + "fldSimple")] == [
        ("THE SITE", ' HYPERLINK "https://example.org/" '), ("3", " PAGE "),
        ("«Name»", " MERGEFIELD Name ")]


@pytest.mark.needs("soffice")
def test_libreoffice_reads_the_translated_review(tmp_path: Path) -> None:
    path = tmp_path / "review.docx"
    path.write_bytes(translate("review.docx", reviewed_word_file())[0])
    shown = libreoffice_text(path, tmp_path)
    for words in ("EARLY IN THE MORNING", "A WHOLE NEW PARAGRAPH.", "WRITE THE SUMMARY HERE.",
                  "PLEASE SIGN THE FORM BEFORE FRIDAY.", "READ THE GUIDE FIRST."):
        assert words in shown, shown
    assert "early in" not in shown and "Write the" not in shown


# -- charts ----------------------------------------------------------------------------


def slides_with_chart() -> bytes:
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])
    slide.shapes.title.text = "Results"
    data = CategoryChartData()
    data.categories = ["North region", "South region"]
    data.add_series("Revenue", (1500, 2500.5))
    chart = slide.shapes.add_chart(XL_CHART_TYPE.COLUMN_CLUSTERED, 0, 0, 6000000, 4000000,
                                   data).chart
    chart.has_title = True
    chart.chart_title.text_frame.text = "Revenue by region"
    chart.value_axis.has_title = True
    chart.value_axis.axis_title.text_frame.text = "Euros"
    return saved(deck)


def test_a_presentation_chart_is_translated_titles_series_and_categories() -> None:
    raw = slides_with_chart()
    out, tally = translate("chart.pptx", raw)
    chart = next(s for s in pptx.Presentation(io.BytesIO(out)).slides[0].shapes
                 if s.has_chart).chart
    assert chart.chart_title.text_frame.text == "REVENUE BY REGION"
    assert chart.value_axis.axis_title.text_frame.text == "EUROS"
    assert list(chart.plots[0].categories) == ["NORTH REGION", "SOUTH REGION"]
    [series] = chart.plots[0].series
    assert series.name == "REVENUE" and list(series.values) == [1500, 2500.5]
    old, new = members(raw), members(out)
    formulas = [re.findall(rb"<c:f>[^<]*</c:f>", m["ppt/charts/chart1.xml"]) for m in (old, new)]
    assert formulas[0] and formulas[0] == formulas[1]  # where the data is, as it was
    embedded = [n for n in old if n.startswith("ppt/embeddings/")]
    assert embedded and all(new[n] == old[n] for n in embedded)
    assert "6 of 6 entries translated" in tally  # slide title, 2 chart titles, 3 strings


def chart_object() -> OpenDocumentChart:
    """An OpenDocument chart: its title, an axis title, and its own data table whose
    header holds the series name and whose first column the category labels."""
    document = OpenDocumentChart()
    diagram = chart.Chart(attributes={"class": "chart:bar"}, width="16cm", height="9cm")
    title = chart.Title()
    title.addElement(text.P(text="Revenue by region"))
    diagram.addElement(title)
    plot = chart.PlotArea()
    axis = chart.Axis(dimension="x", name="primary-x")
    axis_title = chart.Title()
    axis_title.addElement(text.P(text="Region"))
    axis.addElement(axis_title)
    axis.addElement(chart.Categories(cellrangeaddress="local-table.A2:.A3"))
    plot.addElement(axis)
    plot.addElement(chart.Axis(dimension="y", name="primary-y"))
    plot.addElement(chart.Series(valuescellrangeaddress="local-table.B2:.B3",
                                 labelcelladdress="local-table.B1",
                                 attributes={"class": "chart:bar"}))
    diagram.addElement(plot)
    data = table.Table(name="local-table")
    header = table.TableHeaderRows()
    rows = table.TableRows()
    data.addElement(table.TableColumns())
    for holder, cells in ((header, [("", None), ("Revenue", None)]),
                          (rows, [("North region", None), ("1500", "1500")]),
                          (rows, [("South region", None), ("2500.5", "2500.5")])):
        row = table.TableRow()
        for words, value in cells:
            cell = (table.TableCell(valuetype="float", value=value) if value
                    else table.TableCell(valuetype="string"))
            cell.addElement(text.P(text=words))
            row.addElement(cell)
        holder.addElement(row)
    data.addElement(header)
    data.addElement(rows)
    diagram.addElement(data)
    document.chart.addElement(diagram)
    return document


def with_chart(document: OpenDocumentText | OpenDocumentPresentation,
               holder: object) -> bytes:
    frame = draw.Frame(width="16cm", height="9cm", x="1cm", y="1cm", anchortype="paragraph")
    frame.addElement(draw.Object(href=document.addObject(chart_object())))
    holder.addElement(frame)  # type: ignore[attr-defined]
    return saved(document)


def odt_with_chart() -> bytes:
    document = OpenDocumentText()
    p = text.P(text="The chart below")
    document.text.addElement(p)
    return with_chart(document, p)


def odp_with_chart() -> bytes:
    document = OpenDocumentPresentation()
    layout = style.PageLayout(name="Layout")
    document.automaticstyles.addElement(layout)
    master = style.MasterPage(name="Master", pagelayoutname=layout)
    document.masterstyles.addElement(master)
    page = draw.Page(masterpagename=master)
    document.presentation.addElement(page)
    return with_chart(document, page)


@pytest.mark.parametrize(("name", "make"), [("chart.odt", odt_with_chart),
                                            ("chart.odp", odp_with_chart)])
def test_an_opendocument_chart_is_translated_titles_series_and_categories(
        name: str, make: Callable[[], bytes]) -> None:
    raw = make()
    out, _ = translate(name, raw)
    [member] = [m for m in members(out) if m.endswith("/content.xml")]
    root = etree.fromstring(members(out)[member])
    paragraphs = ["".join(p.itertext()) for p in root.iter(f"{{{TEXT_NS}}}p")]
    assert paragraphs == ["REVENUE BY REGION", "REGION", "", "REVENUE", "NORTH REGION", "1500",
                          "SOUTH REGION", "2500.5"]
    old = etree.fromstring(members(raw)[member])
    for attribute in ("values-cell-range-address", "label-cell-address"):
        key = f"{{{CHART_NS}}}{attribute}"
        assert [e.get(key) for e in root.iter(f"{{{CHART_NS}}}series")] == [
            e.get(key) for e in old.iter(f"{{{CHART_NS}}}series")]


def word_with_chart() -> bytes:
    """A Word file holding the chart of `slides_with_chart` as its own part (what the
    reader looks at: the part, whoever refers to it)."""
    chart_xml = members(slides_with_chart())["ppt/charts/chart1.xml"]
    return rezip(word_file(), {"word/charts/chart1.xml": chart_xml})


def test_a_word_chart_is_translated() -> None:
    out, _ = translate("chart.docx", word_with_chart())
    chart_xml = members(out)["word/charts/chart1.xml"]
    for words in (b"REVENUE BY REGION", b"<c:v>NORTH REGION</c:v>", b"<c:v>REVENUE</c:v>",
                  b"<c:v>2500.5</c:v>"):
        assert words in chart_xml


@pytest.mark.needs("soffice")
def test_libreoffice_opens_the_translated_charts(tmp_path: Path) -> None:
    for name, make in (("chart.pptx", slides_with_chart), ("chart.odp", odp_with_chart),
                       ("chart.odt", odt_with_chart)):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        path = folder / name
        path.write_bytes(translate(name, make())[0])
        assert libreoffice_text(path, tmp_path, to="pdf", suffix=".pdf").startswith("%PDF")


# -- the target language marked; titles and attributes for people ----------------------


def test_a_word_file_says_it_is_in_the_target_language() -> None:
    d = docx.Document()
    d.core_properties.title = "The user guide"
    d.core_properties.language = "en-US"
    p = d.add_paragraph("Open the file")
    lang = etree.SubElement(p.runs[0]._r.get_or_add_rPr(), W + "lang")
    lang.set(W + "val", "en-GB")
    out, _ = translate("guide.docx", saved(d))
    after = docx.Document(io.BytesIO(out))
    assert after.core_properties.title == "THE USER GUIDE"
    assert after.core_properties.language == "de-DE"
    assert [e.get(W + "val") for e in after.paragraphs[0]._p.iter(W + "lang")] == ["de-DE"]
    styles = members(out)["word/styles.xml"]
    assert b'w:val="de-DE"' in styles and b'w:val="en-US"' not in styles


def test_an_opendocument_says_it_is_in_the_target_language() -> None:
    document = OpenDocumentText()
    document.meta.addElement(dc.Title(text="The user guide"))
    document.meta.addElement(dc.Language(text="en-US"))
    default = style.DefaultStyle(family="paragraph")
    default.addElement(style.TextProperties(language="en", country="US", languageasian="zh",
                                            countryasian="CN"))
    document.styles.addElement(default)
    code = style.Style(name="Code", family="text")
    code.addElement(style.TextProperties(language="zxx", country="none"))
    document.automaticstyles.addElement(code)
    p = text.P(text="Open the file and run ")
    p.addElement(text.Span(stylename=code, text="make"))
    document.text.addElement(p)
    out, _ = translate("guide.odt", saved(document))
    styles, content = (etree.fromstring(members(out)[m]) for m in ("styles.xml", "content.xml"))
    marks = [(e.get(f"{{{FO_NS}}}language"), e.get(f"{{{FO_NS}}}country"),
              e.get(f"{{{STYLE_NS}}}language-asian"))
             for root in (styles, content) for e in root.iter(f"{{{STYLE_NS}}}text-properties")
             if e.get(f"{{{FO_NS}}}language")]
    assert marks == [("de", "DE", "zh"), ("zxx", "none", None)]  # "no language" stays
    meta = etree.fromstring(members(out)["meta.xml"])
    assert [e.text for e in meta.iter(f"{{{DC_NS}}}title", f"{{{DC_NS}}}language")] == [
        "THE USER GUIDE", "de-DE"]


def test_a_presentation_says_it_is_in_the_target_language() -> None:
    out, _ = translate("chart.pptx", slides_with_chart())
    # The slide's text takes its language from the master's text styles and the
    # presentation's default style (python-pptx's slide runs say none themselves).
    marked = {m: set(re.findall(rb' lang="([^"]*)"', data))
              for m, data in members(out).items() if m.endswith(".xml")}
    assert {m for m, found in marked.items() if found} >= {
        "ppt/presentation.xml", "ppt/slideMasters/slideMaster1.xml", "ppt/charts/chart1.xml"}
    assert set().union(*marked.values()) == {b"de-DE"}


def test_an_html_file_marks_its_language_and_translates_attributes_for_people() -> None:
    page = ('<html lang="en"><head><title>The guide</title><meta name="description" '
            'content="A short guide &amp; more"><meta charset="utf-8"></head><body>'
            '<p title="Hover text">Open <img alt="A cat" src="c.png"> now</p>'
            '<input placeholder="Your name" type="text"><button aria-label=\'Close it\'>&times;'
            '</button><code title="kept title">x</code><p translate="no" alt="Kept alt">'
            'Kept</p><span lang="zxx">Code words</span></body></html>')
    document = read_document("page.html", page.encode(), "de")
    assert document.texts == ("The guide", "Open <x1/> now", "Code words",
                              "A short guide & more", "Hover text", "A cat", "Your name",
                              "Close it")
    out, tally = translate("page.html", page.encode())
    assert out.decode() == page.replace('lang="en"', 'lang="de"').replace(
        "The guide", "THE GUIDE").replace('"A short guide &amp; more"',
                                          '"A SHORT GUIDE &amp; MORE"').replace(
        '"Hover text"', '"HOVER TEXT"').replace("Open", "OPEN").replace(
        '"A cat"', '"A CAT"').replace("now", "NOW").replace(
        '"Your name"', '"YOUR NAME"').replace("'Close it'", '"CLOSE IT"').replace(
        "Code words", "CODE WORDS")
    assert "8 of 8 entries translated" in tally


def test_an_ebook_marks_its_language_in_every_chapter_and_the_table_of_contents() -> None:
    chapter = (b'<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/'
               b'xhtml" xml:lang="en" lang="en"><head><title>A title</title></head><body>'
               b'<p>See <img src="a.png" alt="A map of the town"/> here.</p>'
               b'<pre lang="en">keep</pre></body></html>')
    out, _ = translate("book.epub", epub2_file(chapter))
    written = members(out)["OEBPS/Text/chapter 1.xhtml"]
    assert b'xml:lang="de" lang="de"' in written and b'alt="A MAP OF THE TOWN"' in written
    assert b'<pre lang="en">keep</pre>' in written  # not translated: not marked


# -- EPUB 2's named entities ---------------------------------------------------------


XHTML11 = (b'<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML '
           b'1.1//EN" "http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">\n<html xmlns="http://'
           b'www.w3.org/1999/xhtml"><head><title>Notes</title></head><body>%s</body></html>')


def test_xhtml_named_entities_are_the_characters_they_stand_for() -> None:
    chapter = XHTML11 % (b"<p>It&rsquo;s important&nbsp;&mdash; really&hellip;</p>"
                         b"<p>An &unknown; entity stays</p>")
    document = read_document("old.epub", epub2_file(chapter), "de")
    assert document.texts[1:3] == ["It\u2019s important\u00a0\u2014 really\u2026",
                                  "An <x1/> entity stays"]
    out, _ = translate("old.epub", epub2_file(chapter))
    written = members(out)["OEBPS/Text/chapter 1.xhtml"]
    assert "<p>IT\u2019S IMPORTANT\u00a0\u2014 REALLY\u2026</p>".encode() in written
    assert b"AN &unknown; ENTITY STAYS" in written


def test_entities_declared_in_a_chapter_are_still_refused() -> None:
    chapter = (b'<?xml version="1.0"?><!DOCTYPE html [<!ENTITY a "aaaaaaaaaa">'
               b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><html xmlns="http://www.w3.org/'
               b'1999/xhtml"><body><p>&b;</p></body></html>')
    with pytest.raises(DocumentError, match="declares a DTD subset or entities"):
        read_document("old.epub", epub2_file(chapter), "de")
