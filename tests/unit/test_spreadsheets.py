"""Spreadsheets (server/core/documents/spreadsheet.py; issue 53 item 9): .xlsx made with
openpyxl and .ods made with odfpy, translated through the stand-in model of
test_office_documents.py and read back with those libraries: the text of cells,
comments, charts and sheet names translated, every number, date and formula exactly as
it was, sheet names that formulas name kept; bad files refused as the other packages
are; LibreOffice opens what was written, where it is installed."""

from __future__ import annotations

import io
from pathlib import Path

import openpyxl
import pytest
from lxml import etree
from odf import table, teletype, text
from odf.opendocument import load
from office_files import saved, spreadsheet_file, workbook_file
from test_document_content import libreoffice_text
from test_office_documents import BILLION_LAUGHS, members, rezip, translate

from seq2serve.server.core.documents import DocumentError, media_type, read_document

S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"


def shared_strings(data: bytes) -> bytes:
    """The workbook as Excel writes it: every cell's text in xl/sharedStrings.xml, the
    cell holding its index (openpyxl writes each text in its cell, `inlineStr`)."""
    old = members(data)
    strings = etree.Element(S + "sst", nsmap={None: S[1:-1]})
    replace = {}
    for name, content in old.items():
        if not name.startswith("xl/worksheets/sheet"):
            continue
        root = etree.fromstring(content)
        for cell in root.iter(S + "c"):
            inline = cell.find(S + "is")
            if cell.get("t") == "inlineStr" and inline is not None:
                cell.remove(inline)
                cell.set("t", "s")
                etree.SubElement(cell, S + "v").text = str(len(strings))
                strings.append(inline)
                inline.tag = S + "si"
        replace[name] = etree.tostring(root, xml_declaration=True, encoding="UTF-8",
                                       standalone=True)
    replace["xl/sharedStrings.xml"] = etree.tostring(strings, encoding="UTF-8")
    replace["[Content_Types].xml"] = old["[Content_Types].xml"].replace(
        b"</Types>", b'<Override PartName="/xl/sharedStrings.xml" ContentType="application/'
        b'vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>')
    replace["xl/_rels/workbook.xml.rels"] = old["xl/_rels/workbook.xml.rels"].replace(
        b"</Relationships>", b'<Relationship Id="rIdStrings" Type="http://schemas.openxml'
        b'formats.org/officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.'
        b'xml"/></Relationships>')
    return rezip(data, replace)


def _kept_cells(data: bytes) -> dict[str, list[bytes]]:
    """Each sheet's cells that hold no text (numbers, dates, formulas), canonical XML."""
    out = {}
    for name, content in members(data).items():
        if name.startswith("xl/worksheets/sheet"):
            out[name] = [etree.tostring(c, method="c14n") for c in etree.fromstring(
                content).iter(S + "c") if c.get("t") not in ("s", "inlineStr")]
    return out


@pytest.mark.parametrize("excel", [True, False], ids=["shared strings", "inline strings"])
def test_a_workbook_is_translated_and_its_numbers_and_formulas_kept(excel: bool) -> None:
    raw = shared_strings(workbook_file()) if excel else workbook_file()
    out, tally = translate("figures.xlsx", raw)
    before = openpyxl.load_workbook(io.BytesIO(raw))
    after = openpyxl.load_workbook(io.BytesIO(out))
    # "Sales" is named by a formula (=Sales!B4): kept; "Summary" and "Notes" are not.
    assert after.sheetnames == ["Sales", "SUMMARY", "NOTES"]
    assert "sheet names kept, formulas or references name them: 'Sales'" in tally
    for old, new in zip(before.worksheets, after.worksheets, strict=True):
        for old_row, new_row in zip(old.iter_rows(), new.iter_rows(), strict=True):
            for a, b in zip(old_row, new_row, strict=True):
                if a.data_type == "s" and isinstance(a.value, str):
                    assert b.value == (a.value.upper() if any(c.isalpha() for c in a.value)
                                       else a.value), a.coordinate
                else:  # numbers, dates, formulas: as they were
                    assert (b.value, b.data_type, b.number_format) == (
                        a.value, a.data_type, a.number_format), a.coordinate
    assert after["Sales"]["A2"].comment.text == "CHECK THIS FIGURE"
    assert after["Sales"]["B4"].value == "=SUM(B2:B3)"
    assert after["SUMMARY"]["B1"].value == "=Sales!B4"
    assert after.properties.title == "QUARTERLY FIGURES"
    # Every number, date and formula is what it was: the sheets byte for byte where
    # their texts are shared strings (Excel's way), each such cell where they are not.
    old, new = members(raw), members(out)
    assert list(new) == list(old)
    for name in old:
        if name.startswith("xl/worksheets/") and excel:
            assert new[name] == old[name], name
    assert _kept_cells(out) == _kept_cells(raw)
    strings = etree.fromstring(new["xl/sharedStrings.xml" if excel
                                   else "xl/worksheets/sheet3.xml"])
    rich = [si for si in strings.iter(S + "si", S + "is") if si.find(S + "r") is not None]
    assert ["".join(r.itertext()) for r in rich[0].iter(S + "r")] == [
        "READ ", "THIS FIRST", " PLEASE."]
    chart = new["xl/charts/chart1.xml"]
    for words in (b"REVENUE BY REGION", b"<a:t>REGION</a:t>", b"REVENUE IN EUROS"):
        assert words in chart
    assert b"<f>'Sales'!$A$2:$A$3</f>" in chart  # where the data is, as it was
    assert media_type("a.xlsx") == XLSX


XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def test_a_sheet_name_whose_translation_is_not_a_name_is_kept_and_said() -> None:
    book = openpyxl.Workbook()
    book.active.title = "Plan"
    book.active["A1"] = "Plan the work"
    book.create_sheet("Data")["A1"] = "Data of the plan"
    out, tally = translate("plan.xlsx", saved(book), lambda masked: masked.replace(
        "Plan", "Plan: a very long sheet name that Excel refuses").upper())
    assert openpyxl.load_workbook(io.BytesIO(out)).sheetnames == ["Plan", "DATA"]
    assert "sheet names kept, their translations are not valid names: 'Plan'" in tally
    assert "1 skipped" in tally


def _cells(data: bytes) -> list[tuple[str, ...]]:
    out = []
    for sheet in load(io.BytesIO(data)).spreadsheet.getElementsByType(table.Table):
        for cell in sheet.getElementsByType(table.TableCell):
            out.append(tuple(str(cell.getAttribute(a)) for a in (
                "valuetype", "value", "datevalue", "booleanvalue", "formula")))
    return out


def test_an_opendocument_spreadsheet_is_translated_and_its_values_kept() -> None:
    raw = spreadsheet_file()
    out, tally = translate("figures.ods", raw)
    after = load(io.BytesIO(out))
    sheets = after.spreadsheet.getElementsByType(table.Table)
    assert [s.getAttribute("name") for s in sheets] == ["Sales", "SUMMARY", "NOTES"]
    shown = [teletype.extractText(p) for p in sheets[0].getElementsByType(text.P)]
    assert shown == ["REGION", "REVENUE", "SINCE", "NORTH", "CHECK THIS FIGURE", "1500",
                     "Jan 15, 2026", "SOUTH", "2500.5", "Jan 15, 2026", "4000.5", "TRUE"]
    assert _cells(out) == _cells(raw)  # values, dates, truth values, formulas
    assert "sheet names kept, formulas or references name them: 'Sales'" in tally
    assert "10 of 10 entries translated" in tally  # 8 cells and notes, 2 sheet names


@pytest.mark.needs("soffice", "calc")
def test_libreoffice_opens_the_translated_spreadsheets(tmp_path: Path) -> None:
    for name, make in (("figures.xlsx", workbook_file), ("figures.ods", spreadsheet_file)):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        path = folder / name
        path.write_bytes(translate(name, make())[0])
        shown = libreoffice_text(path, tmp_path, to="csv", suffix=".csv")
        assert "NORTH" in shown and "1500" in shown and "North" not in shown, shown


@pytest.mark.parametrize(("name", "make", "message"), [
    ("a.xlsx", lambda: b"not a zip", "a.xlsx is not an Excel workbook .* not a zip"),
    ("a.xlsx", lambda: rezip(workbook_file(), drop=("xl/workbook.xml",)), "no xl/workbook.xml"),
    ("a.xlsx", lambda: rezip(workbook_file(), {"xl/vbaProject.bin": b"\0"}), "macros"),
    ("a.xlsx", lambda: rezip(workbook_file(), {"xl/sharedStrings.xml": BILLION_LAUGHS}),
     "xl/sharedStrings.xml declares a DTD subset or entities"),
    ("a.ods", lambda: rezip(spreadsheet_file(), {"content.xml": BILLION_LAUGHS}),
     "content.xml declares a DTD subset or entities"),
    ("a.ods", lambda: workbook_file(), "a.ods is not an OpenDocument spreadsheet"),
    ("a.ods", lambda: rezip(spreadsheet_file(), {"Basic/Standard/M.xml": b"<x/>"}), "macros"),
])
def test_a_bad_spreadsheet_is_refused_in_words(name: str, make: object, message: str) -> None:
    assert callable(make)
    with pytest.raises(DocumentError, match=message):
        read_document(name, make(), "de")
