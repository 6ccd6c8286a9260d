"""Spreadsheets: Excel (.xlsx) and OpenDocument (.ods), edited in their XML.

Translated: the text of every cell that holds text (.xlsx: each shared string and
each inline string, rich text a string with its runs as inline.py's tags; .ods: a
string cell's paragraphs), comments (.xlsx: notes and threaded comments; .ods:
annotations), text boxes and shapes (.xlsx drawings), charts (charts.py; an .ods
chart object's own text as in opendocument.py), the title in the document
properties, and the sheet names. Kept as they are: every number, date, time,
percentage, currency and truth value, and every formula (.xlsx: the sheets' XML is
not written again unless it holds inline strings; .ods: a cell with a value or a
formula is not entered), so nothing a formula computes changes.

A sheet name that a formula, a defined name, a chart, a link, a data validation or a
pivot table refers to (found in the formulas and references of the file) is kept,
since renaming it would break them; so is a name whose translation is not a valid
sheet name (Excel: at most 31 characters, none of `[]:*?/\\`, not `History`; both:
unique, no `'` at either end). A text that is the name of an Excel table's column is
kept too (Excel requires the header cell and the table's column to match, and
structured references name the column). The summary says what was kept.

Refused as the other packages are (package.py's limits and safe parsing, macros:
`vbaProject.bin`, macro-enabled content types, OpenDocument `Basic/` and `Scripts/`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from lxml import etree

from seq2serve.server.core.documents import charts, office, opendocument, runs
from seq2serve.server.core.documents.attributes import value_paragraph
from seq2serve.server.core.documents.language import target_language
from seq2serve.server.core.documents.mixed import Rules, paragraphs
from seq2serve.server.core.documents.package import (
    DEFAULT_LIMITS,
    Limits,
    Package,
    PackageDocument,
    Part,
)
from seq2serve.server.core.inline import Paragraph

XLSX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
ODS_MEDIA_TYPE = "application/vnd.oasis.opendocument.spreadsheet"
S = runs.SHEET.ns
_THREADED = "{http://schemas.microsoft.com/office/spreadsheetml/2018/threadedcomments}"
_SHEETS = re.compile(r"xl/worksheets/sheet\d+\.xml")
_COMMENTS = re.compile(r"xl/comments(/comment)?\d*\.xml")  # Excel's, openpyxl's
_THREADED_PARTS = re.compile(r"xl/threadedComments/threadedComment\d+\.xml")
_DRAWINGS = re.compile(r"xl/drawings/drawing\d+\.xml")
_TABLES = re.compile(r"xl/tables/table\d+\.xml")
_PIVOT_CACHES = re.compile(r"xl/pivotCache/pivotCacheDefinition\d+\.xml")
# Where an .xlsx names a sheet: formulas and defined names (element text), links and
# pivot tables' sources (attributes).
_FORMULA_ELEMENTS = frozenset({"f", "formula", "formula1", "formula2", "definedName"})
_NAMING_ATTRIBUTES = frozenset({"location", "sheet"})
_NOT_IN_NAMES = re.compile(r"[\[\]:*?/\\]")
_OBJECT_PARTS = re.compile(r"[^/]+/(?:[^/]+/)*(content|styles)\.xml")
_THREADED_RULES = Rules(block=lambda e: e.tag == _THREADED + "text", inline=lambda e: False,
                        skip=lambda e: False)


class SpreadsheetDocument(PackageDocument):
    """A package whose sheet names are renamed as they are written (`Names`)."""

    def __init__(self, name: str, media_type: str, package: Package, parts: Sequence[Part],
                 names: Names, kept: Sequence[str]) -> None:
        super().__init__(name, media_type, package, parts)
        self.names = names
        self.tally.notes.extend(kept)

    def write(self, translations: Sequence[str | None]) -> bytes:
        data = super().write(translations)
        if self.names.refused:
            self.tally.filled -= len(self.names.refused)
            self.tally.skipped += len(self.names.refused)
            self.tally.notes.append("sheet names kept, their translations are not valid "
                                    "names: " + ", ".join(self.names.refused[:5]))
        return data


class Names:
    """The sheet names of one workbook, renamed one by one: each new name checked to be
    valid and unique, else the old one kept (and said)."""

    def __init__(self, names: Iterable[str], longest: int | None) -> None:
        self.taken = {n.casefold() for n in names}
        self.longest = longest
        self.refused: list[str] = []

    def valid(self, name: str) -> bool:
        return bool(name) and not _NOT_IN_NAMES.search(name) and not (
            name.startswith("'") or name.endswith("'")) and (
            self.longest is None or (len(name) <= self.longest
                                     and name.casefold() != "history"))

    def renamer(self, element: etree._Element, attribute: str) -> Callable[[str], None]:
        old = element.get(attribute, "")

        def rename(text: str) -> None:
            new = text.strip()
            if new == old:
                return
            if not self.valid(new) or new.casefold() in self.taken - {old.casefold()}:
                self.refused.append(f"{old!r} ({new[:40]!r})")
                return
            self.taken.discard(old.casefold())
            self.taken.add(new.casefold())
            element.set(attribute, new)

        return rename


def _referenced(name: str, references: str, separator: str) -> bool:
    """Whether a formula or reference in `references` (lines, case-folded) names the
    sheet `name` (`Sales!A1`, `'My sheet'!A1`, `Sales:Costs!A1`; .ods: `Sales.A1`)."""
    name = name.casefold()
    quoted = "'" + name.replace("'", "''") + "'"
    return any(n + s in references for n in (name, quoted) for s in (separator, ":")) or (
        f"\n{name}\n" in references)


def _sheet_names(elements: list[etree._Element], attribute: str, references: str,
                 separator: str, names: Names, kept: list[str]) -> list[Paragraph]:
    found = []
    named = []
    for element in elements:
        name = element.get(attribute, "")
        if _referenced(name, references, separator):
            named.append(name)
            continue
        paragraph = value_paragraph(name, names.renamer(element, attribute))
        if paragraph is not None:
            found.append(paragraph)
    if named:
        kept.append("sheet names kept, formulas or references name them: "
                    + ", ".join(repr(n) for n in named[:5]))
    return found


# -- .xlsx -----------------------------------------------------------------------------


def read_xlsx(name: str, data: bytes, target: str,
              limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    package = office.open_package(name, data, "an Excel workbook (.xlsx)", "xl/workbook.xml",
                                  limits)
    language = target_language(target)
    kept: list[str] = []
    columns = {str(c.get("name", "")) for m in package.infos if _TABLES.fullmatch(m.filename)
               for c in package.xml(m.filename).getroot().iter(S + "tableColumn")}
    skipped: list[str] = []

    def strings(member: str, tag: str) -> Part:
        # Each string element counted as a paragraph while the part is read.
        return package.part(member, lambda root: _strings(root, tag, columns, skipped),
                            frozenset({tag}))

    parts = []
    for info in package.infos:
        member = info.filename
        if member == "xl/sharedStrings.xml":
            parts.append(strings(member, S + "si"))
        elif _SHEETS.fullmatch(member):
            parts.append(strings(member, S + "is"))
        elif _COMMENTS.fullmatch(member):
            parts.append(strings(member, S + "text"))
        elif _THREADED_PARTS.fullmatch(member):
            parts.append(package.part(member, lambda root: paragraphs(root, _THREADED_RULES),
                                      frozenset({_THREADED + "text"})))
        elif _DRAWINGS.fullmatch(member):
            drawing = package.part(member, lambda root: runs.find(root, runs.DRAWING),
                                   frozenset({runs.A + "p"}))
            drawing.mark = lambda root: charts.mark_drawing(root, language)
            parts.append(drawing)
    shared = office.shared_parts(package, language)
    trees = [p.tree.getroot() for p in (*parts, *shared)]
    trees += [package.xml(m.filename).getroot() for m in package.infos
              if _PIVOT_CACHES.fullmatch(m.filename)]
    workbook_xml = package.xml("xl/workbook.xml").getroot()
    references = _xlsx_references([*trees, workbook_xml])
    sheets = list(workbook_xml.iter(S + "sheet"))
    names = Names((s.get("name", "") for s in sheets), longest=31)
    workbook = package.part("xl/workbook.xml", lambda root: _sheet_names(
        list(root.iter(S + "sheet")), "name", references, "!", names, kept),
        frozenset({S + "sheet"}))
    if skipped:
        kept.append(f"{len(skipped)} texts kept, they name table columns: "
                    + ", ".join(repr(s) for s in skipped[:5]))
    return SpreadsheetDocument(name, XLSX_MEDIA_TYPE, package, [*parts, workbook, *shared],
                               names, kept)


def _strings(root: etree._Element, tag: str, columns: set[str],
             skipped: list[str]) -> list[Paragraph]:
    """Each string element (`si`, `is`, a comment's `text`): plain (a `t`) or rich text
    (runs); one that names a table's column is left."""
    found = []
    for element in root.iter(tag):
        shown = "".join(t.text or "" for t in element.iter(S + "t")
                        if t.getparent() is element or t.getparent().tag == S + "r")
        if shown in columns:
            skipped.append(shown)
            continue
        plain = element.find(S + "t")
        paragraph = (value_paragraph(plain.text or "", _plain_writer(plain))
                     if plain is not None else runs.paragraph(element, runs.SHEET))
        if paragraph is not None:
            found.append(paragraph)
    return found


def _plain_writer(t: etree._Element) -> Callable[[str], None]:
    def write(text: str) -> None:
        t.text = text
        t.set(runs.XML_SPACE, "preserve")

    return write


def _xlsx_references(roots: Iterable[etree._Element]) -> str:
    lines = ["\n"]
    for root in roots:
        for element in root.iter():
            if not isinstance(element.tag, str):
                continue
            if etree.QName(element).localname in _FORMULA_ELEMENTS and element.text:
                lines.append(element.text)
            lines.extend(v for k, v in element.attrib.items()
                         if etree.QName(k).localname in _NAMING_ATTRIBUTES)
    return "\n".join(lines).casefold() + "\n"


# -- .ods ------------------------------------------------------------------------------


def read_ods(name: str, data: bytes, target: str,
             limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    package = opendocument.open_package(name, data, "an OpenDocument spreadsheet (.ods)",
                                        ODS_MEDIA_TYPE, limits)
    language = target_language(target)
    kept: list[str] = []
    objects = [opendocument.part(package, m.filename, language,
                                 lambda root: paragraphs(root, opendocument.RULES))
               for m in package.infos if _OBJECT_PARTS.fullmatch(m.filename)]
    names = Names((), longest=None)

    def content(root: etree._Element) -> list[Paragraph]:
        tables = list(root.iter(opendocument.TABLE + "table"))
        names.taken = {str(t.get(opendocument.TABLE + "name", "")).casefold() for t in tables}
        references = _ods_references([root, *(p.tree.getroot() for p in objects)])
        return paragraphs(root, opendocument.RULES) + _sheet_names(
            tables, opendocument.TABLE + "name", references, ".", names, kept)

    parts = [opendocument.part(package, member, language, find)
             for member, find in (("content.xml", content), ("styles.xml", lambda root:
                                                             paragraphs(root,
                                                                        opendocument.RULES)))
             if member in package.names]
    return SpreadsheetDocument(name, ODS_MEDIA_TYPE, package,
                               [*parts, *objects, *opendocument.meta_parts(package, language)],
                               names, kept)


def _ods_references(roots: Iterable[etree._Element]) -> str:
    """Every attribute but a table's own name: formulas, cell and range addresses."""
    name = opendocument.TABLE + "name"
    lines = ["\n"]
    for root in roots:
        for element in root.iter():
            if isinstance(element.tag, str):
                lines.extend(v for k, v in element.attrib.items()
                             if not (k == name and element.tag == opendocument.TABLE + "table"))
    return "\n".join(lines).casefold() + "\n"
