"""Office documents, spreadsheets and e-books made on the spot with the libraries people
make them with (python-docx, python-pptx, openpyxl, odfpy, ebooklib), for the whole-file
tests."""

from __future__ import annotations

import datetime
import io

import docx
import openpyxl
import pptx
from ebooklib import epub
from lxml import etree
from odf import draw, office, presentation, style, table, text
from odf.opendocument import OpenDocumentPresentation, OpenDocumentSpreadsheet, OpenDocumentText
from openpyxl.cell.rich_text import CellRichText, TextBlock
from openpyxl.cell.text import InlineFont
from openpyxl.chart import BarChart, Reference
from openpyxl.comments import Comment

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def saved(document: object) -> bytes:
    buffer = io.BytesIO()
    document.save(buffer)  # type: ignore[attr-defined]
    return buffer.getvalue()


def word_file() -> bytes:
    d = docx.Document()
    d.add_heading("The user guide", 1)
    p = d.add_paragraph("Please ")
    p.add_run("open the file").bold = True
    p.add_run(" and save it.")
    tabbed = d.add_paragraph("Name")
    tabbed.add_run().add_tab()
    tabbed.add_run("Value")
    d.add_paragraph("First item", style="List Bullet")
    d.add_paragraph("Second item", style="List Bullet")
    table = d.add_table(rows=2, cols=2)
    for i, cell in enumerate(table._cells):
        cell.text = f"Cell number {i}"
    d.sections[0].header.paragraphs[0].text = "Company header"
    d.sections[0].footer.paragraphs[0].text = "Confidential footer"
    noted = d.add_paragraph()
    d.add_comment(noted.add_run("Read the notes"), text="Check this sentence", author="A")
    linked = d.add_paragraph("See ")
    part = d.part
    rid = part.relate_to("https://example.org/", docx.opc.constants.RELATIONSHIP_TYPE.HYPERLINK,
                         is_external=True)
    link = etree.SubElement(linked._p, W + "hyperlink")
    link.set("{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id", rid)
    run = etree.SubElement(link, W + "r")
    etree.SubElement(run, W + "t").text = "the website"
    linked.add_run(" for more.")
    return saved(d)


def slides_file() -> bytes:
    deck = pptx.Presentation()
    for n in range(2):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = f"Slide title {n}"
        frame = slide.placeholders[1].text_frame
        frame.text = "First point"
        para = frame.add_paragraph()
        bold = para.add_run()
        bold.text = "Bold words"
        bold.font.bold = True
        para.add_run().text = " and plain words"
        slide.notes_slide.notes_text_frame.text = f"Speaker notes {n}"
    table = deck.slides[1].shapes.add_table(2, 2, 0, 0, 914400, 914400).table
    for i, cell in enumerate(c for row in table.rows for c in row.cells):
        cell.text = f"Cell {i} text"
    return saved(deck)


def odt_file() -> bytes:
    document = OpenDocumentText()
    bold = style.Style(name="Bold", family="text")
    bold.addElement(style.TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    layout = style.PageLayout(name="Layout")
    document.automaticstyles.addElement(layout)
    master = style.MasterPage(name="Standard", pagelayoutname=layout)
    header = style.Header()
    header.addElement(text.P(text="Company header"))
    master.addElement(header)
    document.masterstyles.addElement(master)
    document.text.addElement(text.H(outlinelevel=1, text="The user guide"))
    p = text.P(text="Please ")
    p.addElement(text.Span(stylename=bold, text="open the file"))
    p.addText(" and save it.")
    note = text.Note(id="n1", noteclass="footnote")
    note.addElement(text.NoteCitation(text="1"))
    body = text.NoteBody()
    body.addElement(text.P(text="A footnote text"))
    note.addElement(body)
    p.addElement(note)
    document.text.addElement(p)
    items = text.List()
    for word in ("First item", "Second item"):
        item = text.ListItem()
        item.addElement(text.P(text=word))
        items.addElement(item)
    document.text.addElement(items)
    return saved(document)


def odp_file() -> bytes:
    document = OpenDocumentPresentation()
    layout = style.PageLayout(name="Layout")
    document.automaticstyles.addElement(layout)
    master = style.MasterPage(name="Master", pagelayoutname=layout)
    document.masterstyles.addElement(master)
    for n in range(3):
        page = draw.Page(masterpagename=master)
        frame = draw.Frame(width="20cm", height="3cm", x="1cm", y="1cm")
        box = draw.TextBox()
        box.addElement(text.P(text=f"Slide text {n}"))
        frame.addElement(box)
        page.addElement(frame)
        notes = presentation.Notes()
        notes_frame = draw.Frame(width="20cm", height="3cm", x="1cm", y="1cm")
        notes_box = draw.TextBox()
        notes_box.addElement(text.P(text=f"Speaker notes {n}"))
        notes_frame.addElement(notes_box)
        notes.addElement(notes_frame)
        page.addElement(notes)
        document.presentation.addElement(page)
    return saved(document)


def book_file() -> bytes:
    book = epub.EpubBook()
    book.set_identifier("book-1")
    book.set_title("A small book")
    book.set_language("en")
    chapters = []
    for n in range(2):
        chapter = epub.EpubHtml(title=f"Chapter {n}", file_name=f"c{n}.xhtml", lang="en")
        chapter.content = (f"<h1>Chapter title {n}</h1><p>Please <b>open the file</b> and "
                           f"<a href='c0.xhtml'>read on</a>.</p><pre>keep this code</pre>"
                           f"<p class='notranslate'>Keep this too</p>")
        book.add_item(chapter)
        chapters.append(chapter)
    book.toc = [epub.Link(f"c{n}.xhtml", f"Chapter title {n}", f"c{n}") for n in range(2)]
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *chapters]
    buffer = io.BytesIO()
    epub.write_epub(buffer, book)
    return buffer.getvalue()


WHEN = datetime.datetime(2026, 1, 15, 9, 30)


def workbook_file() -> bytes:
    book = openpyxl.Workbook()
    sales = book.active
    sales.title = "Sales"
    for row in (("Region", "Revenue", "Since", "Label"), ("North", 1500, WHEN, '=A2&" office"'),
                ("South", 2500.5, WHEN.date(), '=A3&" office"'), ("Total", "=SUM(B2:B3)")):
        sales.append(row)
    sales["A2"].comment = Comment("Check this figure", "Ann")
    chart = BarChart()
    chart.title = "Revenue by region"
    chart.x_axis.title = "Region"
    chart.y_axis.title = "Revenue in euros"
    chart.add_data(Reference(sales, min_col=2, min_row=1, max_row=3), titles_from_data=True)
    chart.set_categories(Reference(sales, min_col=1, min_row=2, max_row=3))
    sales.add_chart(chart, "F2")
    summary = book.create_sheet("Summary")
    summary.append(("Total revenue", "=Sales!B4"))
    notes = book.create_sheet("Notes")
    notes["A1"] = CellRichText("Read ", TextBlock(InlineFont(b=True), "this first"), " please.")
    notes["A2"] = "12:30"
    book.properties.title = "Quarterly figures"
    return saved(book)


def spreadsheet_file() -> bytes:
    document = OpenDocumentSpreadsheet()
    sales = table.Table(name="Sales")
    rows: list[list[table.TableCell]] = []
    header = [table.TableCell(valuetype="string") for _ in range(3)]
    for cell, words in zip(header, ("Region", "Revenue", "Since"), strict=True):
        cell.addElement(text.P(text=words))
    rows.append(header)
    for region, value in (("North", "1500"), ("South", "2500.5")):
        name = table.TableCell(valuetype="string")
        name.addElement(text.P(text=region))
        number = table.TableCell(valuetype="float", value=value)
        number.addElement(text.P(text=value))
        date = table.TableCell(valuetype="date", datevalue="2026-01-15")
        date.addElement(text.P(text="Jan 15, 2026"))
        rows.append([name, number, date])
    note = office.Annotation()
    note.addElement(text.P(text="Check this figure"))
    rows[1][0].addElement(note)
    total = table.TableCell(valuetype="float", value="4000.5", formula="of:=[.B2]+[.B3]")
    total.addElement(text.P(text="4000.5"))
    flag = table.TableCell(valuetype="boolean", booleanvalue="true")
    flag.addElement(text.P(text="TRUE"))
    rows.append([table.TableCell(), total, flag])
    for cells in rows:
        row = table.TableRow()
        for cell in cells:
            row.addElement(cell)
        sales.addElement(row)
    document.spreadsheet.addElement(sales)
    for name, words, formula in (("Summary", "Total revenue", "of:=[Sales.B4]"),
                                 ("Notes", "Read this first", None)):
        sheet = table.Table(name=name)
        row = table.TableRow()
        cell = table.TableCell(valuetype="string")
        cell.addElement(text.P(text=words))
        row.addElement(cell)
        if formula:
            row.addElement(table.TableCell(valuetype="float", value="4000.5", formula=formula))
        sheet.addElement(row)
        document.spreadsheet.addElement(sheet)
    return saved(document)


DATE = "2026-01-01T00:00:00Z"


def element(parent: etree._Element, tag: str, text: str | None = None,
        **attributes: str) -> etree._Element:
    made = etree.SubElement(parent, W + tag, {W + k: v for k, v in attributes.items()})
    if text is not None:
        made.text = text
    return made


def run(parent: etree._Element, words: str, tag: str = "t") -> etree._Element:
    made = element(parent, "r")
    element(made, tag, words)
    return made


def reviewed_word_file() -> bytes:
    """A reviewed document: an insertion and a deletion mid-sentence, a whole inserted
    paragraph, a moved paragraph, a content-control paragraph, an inline content
    control, a link field, and a paragraph deleted whole."""
    d = docx.Document()
    p = d.add_paragraph("The meeting starts ")
    run(element(p._p, "del", id="1", author="A", date=DATE), "at noon", "delText")
    run(element(p._p, "ins", id="2", author="A", date=DATE), "early in the morning")
    run(p._p, " on Monday.")
    inserted = d.add_paragraph()
    element(element(element(inserted._p, "pPr"), "rPr"), "ins", id="3", author="A", date=DATE)
    run(element(inserted._p, "ins", id="4", author="A", date=DATE), "A whole new paragraph.")
    moved_from = d.add_paragraph()
    element(moved_from._p, "moveFromRangeStart", id="5", author="A", date=DATE, name="move1")
    run(element(moved_from._p, "moveFrom", id="6", author="A", date=DATE), "This part moved.")
    element(moved_from._p, "moveFromRangeEnd", id="5")
    control = element(d.element.body, "sdt")
    element(element(control, "sdtPr"), "alias", val="Summary")
    block = element(element(control, "sdtContent"), "p")
    run(block, "Write the summary here.")
    d.element.body.remove(control)
    d.element.body.insert(0, control)
    inline = d.add_paragraph("Please sign ")
    sdt = element(inline._p, "sdt")
    element(element(sdt, "sdtPr"), "tag", val="signer")
    run(element(sdt, "sdtContent"), "the form")
    inline.add_run(" before Friday.")
    linked = d.add_paragraph("Read ")
    for kind, code in (("begin", None), (None, ' HYPERLINK "https://example.org/" '),
                       ("separate", None), (None, None), ("end", None)):
        field_run = element(linked._p, "r")
        if kind is not None:
            element(field_run, "fldChar", fldCharType=kind)
        elif code is not None:
            element(field_run, "instrText", code)
        else:
            element(field_run, "t", "the guide")
    linked.add_run(" first.")
    moved_to = d.add_paragraph()
    element(moved_to._p, "moveToRangeStart", id="7", author="A", date=DATE, name="move1")
    run(element(moved_to._p, "moveTo", id="8", author="A", date=DATE), "This part moved.")
    element(moved_to._p, "moveToRangeEnd", id="7")
    deleted = d.add_paragraph()
    run(element(deleted._p, "del", id="9", author="A", date=DATE), "Gone for good.", "delText")
    return saved(d)
