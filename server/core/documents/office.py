"""Office Open XML: Word (.docx) and PowerPoint (.pptx) files, edited in their XML.

Word: every paragraph (`w:p`) of the body (tables, lists, text boxes, headings and
block content controls hold paragraphs too), the headers and footers, the footnotes
and endnotes and the comments. PowerPoint: every paragraph (`a:p`) of the slides
(text boxes, shapes, tables) and of the speaker notes. Both: the charts
(charts.py: titles, axis titles, series names, category labels) and the title in
the core properties. A paragraph is one text (runs.py: tracked insertions and moves,
content controls, links and text fields translated with their sentence, deletions
kept as they are). The target language is marked where the file marks a language
(Word's `w:lang` in the styles and runs, DrawingML's `lang`, `dc:language`).
Everything else (styles but their language, numbering, images, relationships) is
copied byte for byte. A file with macros (a `vbaProject.bin`, a macro-enabled
content type) is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from lxml import etree

from seq2serve.server.core.documents import charts, runs
from seq2serve.server.core.documents.base import DocumentError
from seq2serve.server.core.documents.language import Target, target_language
from seq2serve.server.core.documents.package import (
    DEFAULT_LIMITS,
    Limits,
    Package,
    PackageDocument,
    Part,
)
from seq2serve.server.core.inline import Paragraph

DOCX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
_WORD_PARTS = re.compile(r"word/(document|header\d*|footer\d*|footnotes|endnotes|comments)"
                         r"\.xml")
_SLIDE_PARTS = re.compile(r"ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml")
# Where a slide's text gets its language from, when its runs do not say it: the text
# styles of the masters and layouts, and the presentation's default text style.
_STYLE_PARTS = re.compile(r"ppt/(presentation|slideMasters/slideMaster\d+|"
                          r"slideLayouts/slideLayout\d+|notesMasters/notesMaster\d+)\.xml")
_MACROS = re.compile(rb"macroEnabled|vbaProject", re.IGNORECASE)
_CHART_PARTS = re.compile(r"(word|ppt|xl)/charts/chart\d+\.xml")
CORE = "docProps/core.xml"
# The paragraph elements, counted while a part is read (package.py).
WORD_PARAGRAPHS = frozenset({runs.W + "p"})
_DRAWING_P = frozenset({runs.A + "p"})
Find = Callable[[etree._Element], list[Paragraph]]
Mark = Callable[[etree._Element, Target], bool]


def read_docx(name: str, data: bytes, target: str,
              limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    package = open_package(name, data, "a Word document (.docx)", "word/document.xml", limits)
    language = target_language(target)
    parts = [_part(package, m.filename, language, word_paragraphs, charts.mark_word,
                   WORD_PARAGRAPHS) for m in package.infos if _WORD_PARTS.fullmatch(m.filename)]
    if "word/styles.xml" in package.names:
        parts.append(_part(package, "word/styles.xml", language, lambda root: [],
                           charts.mark_word))
    return PackageDocument(name, DOCX_MEDIA_TYPE, package,
                           parts + shared_parts(package, language))


def read_pptx(name: str, data: bytes, target: str,
              limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    package = open_package(name, data, "a PowerPoint presentation (.pptx)",
                       "ppt/presentation.xml", limits)
    language = target_language(target)
    parts = [_part(package, m.filename, language, _drawing, charts.mark_drawing, _DRAWING_P)
             for m in package.infos if _SLIDE_PARTS.fullmatch(m.filename)]
    parts += [_part(package, m.filename, language, lambda root: [], charts.mark_drawing)
              for m in package.infos if _STYLE_PARTS.fullmatch(m.filename)]
    return PackageDocument(name, PPTX_MEDIA_TYPE, package,
                           parts + shared_parts(package, language))


def shared_parts(package: Package, language: Target) -> list[Part]:
    """What every Office Open XML package may have: charts and core properties."""
    parts = [_part(package, m.filename, language, charts.chart_paragraphs,
                   charts.mark_drawing, _DRAWING_P)
             for m in package.infos if _CHART_PARTS.fullmatch(m.filename)]
    if CORE in package.names:
        parts.append(_part(package, CORE, language, charts.title_paragraphs,
                           charts.mark_core, frozenset({charts.DC + "title"})))
    return parts


def word_paragraphs(root: etree._Element) -> list[Paragraph]:
    return runs.find(root, runs.WORD)


def _drawing(root: etree._Element) -> list[Paragraph]:
    return runs.find(root, runs.DRAWING)


def open_package(name: str, data: bytes, kind: str, main: str, limits: Limits) -> Package:
    """An Office Open XML package with `main`, checked: no macros."""
    package = Package(name, data, kind, limits)
    package.require("[Content_Types].xml")
    package.require(main)
    if (any(n.lower().endswith("vbaproject.bin") for n in package.names)
            or _MACROS.search(package.read("[Content_Types].xml"))):
        raise DocumentError(f"{name} contains macros, which are not accepted")
    return package


def _part(package: Package, member: str, language: Target, find: Find, mark: Mark,
          counted: frozenset[str] = frozenset()) -> Part:
    """A member read for `find`'s paragraphs (its `counted` elements counted as
    paragraphs while it is read), `mark`ed with the target language once translated."""
    part = package.part(member, find, counted)
    part.mark = lambda root: mark(root, language)
    return part
