"""Office Open XML: Word (.docx) and PowerPoint (.pptx) files, edited in their XML.

Word: every paragraph (`w:p`) of the body (tables, lists, text boxes and
headings are paragraphs too), the headers and footers, the footnotes and
endnotes and the comments. PowerPoint: every paragraph (`a:p`) of the slides
(text boxes, shapes, tables) and of the speaker notes. A paragraph is one text
(inline.py): runs (`w:r`, `a:r`) are styled by their run properties (bold,
italic, font, a DrawingML link) and, in Word, by the hyperlink they sit in;
tabs, breaks, drawings, footnote marks, bookmarks, comment marks, fields (their
code and their shown result both) and tracked changes (`w:ins`, `w:del`) are
opaque: kept as they are. Spelling marks (`w:proofErr`) and the last page break
Word drew (`w:lastRenderedPageBreak`), which Word recomputes, are dropped from
translated paragraphs. Everything else (styles, numbering, images, properties,
relationships) is copied byte for byte. A file with macros (a `vbaProject.bin`,
a macro-enabled content type) is refused.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Literal

from lxml import etree

from seq2serve.server.core.documents.base import DocumentError
from seq2serve.server.core.documents.package import (
    DEFAULT_LIMITS,
    Limits,
    Package,
    PackageDocument,
    Part,
)
from seq2serve.server.core.inline import Paragraph, Piece, has_letters

DOCX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_WORD_PARTS = re.compile(r"word/(document|header\d*|footer\d*|footnotes|endnotes|comments)"
                         r"\.xml")
_SLIDE_PARTS = re.compile(r"ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml")
_MACROS = re.compile(rb"macroEnabled|vbaProject", re.IGNORECASE)
_DROPPED = frozenset({W + "proofErr", W + "lastRenderedPageBreak"})
_INVISIBLE_ATTRIBUTES = frozenset({"lang", "altLang", "dirty", "err", "noProof", "smtClean",
                                   "smtId", "bmk"})
_INVISIBLE_PROPERTIES = frozenset({W + "lang", W + "noProof"})


@dataclass(frozen=True)
class RunStyle:
    """A run's formatting: its properties and the hyperlink around it (compared by
    their XML); `run` and `wrapper` are the first such run and link, copied from."""

    key: tuple[bytes, bytes]
    run: etree._Element = field(compare=False, hash=False)
    properties: etree._Element | None = field(compare=False, hash=False)
    wrapper: etree._Element | None = field(compare=False, hash=False)

    @property
    def plain(self) -> bool:
        return self.key == (b"", b"")


@dataclass(frozen=True)
class _Dialect:
    """What differs between WordprocessingML and DrawingML paragraphs."""

    ns: str
    kind: Literal["word", "drawing"]

    @property
    def run(self) -> str:
        return self.ns + "r"

    @property
    def properties(self) -> str:
        return self.ns + "rPr"

    @property
    def text(self) -> str:
        return self.ns + "t"


WORD = _Dialect(W, "word")
DRAWING = _Dialect(A, "drawing")


def read_docx(name: str, data: bytes, limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    package = _package(name, data, "a Word document (.docx)", "word/document.xml", limits)
    members = [m.filename for m in package.infos if _WORD_PARTS.fullmatch(m.filename)]
    return PackageDocument(name, DOCX_MEDIA_TYPE, package,
                           [_part(package, m, WORD) for m in members])


def read_pptx(name: str, data: bytes, limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    package = _package(name, data, "a PowerPoint presentation (.pptx)",
                       "ppt/presentation.xml", limits)
    members = [m.filename for m in package.infos if _SLIDE_PARTS.fullmatch(m.filename)]
    return PackageDocument(name, PPTX_MEDIA_TYPE, package,
                           [_part(package, m, DRAWING) for m in members])


def _package(name: str, data: bytes, kind: str, main: str, limits: Limits) -> Package:
    package = Package(name, data, kind, limits)
    package.require("[Content_Types].xml")
    package.require(main)
    if (any(n.lower().endswith("vbaproject.bin") for n in package.names)
            or _MACROS.search(package.read("[Content_Types].xml"))):
        raise DocumentError(f"{name} contains macros, which are not accepted")
    return package


def _part(package: Package, member: str, dialect: _Dialect) -> Part:
    def find(root: etree._Element) -> list[Paragraph]:
        found = (_paragraph(element, dialect) for element in root.iter(dialect.ns + "p"))
        return [p for p in found if p is not None]

    return package.part(member, find, frozenset({dialect.ns + "p"}))


def _paragraph(p: etree._Element, dialect: _Dialect) -> Paragraph | None:
    pieces: list[Piece] = []
    field_depth = [0]
    for child in p:
        tag = child.tag
        if tag in (dialect.ns + "pPr", A + "endParaRPr") or tag in _DROPPED:
            continue
        if tag == dialect.run:
            pieces.extend(_run(child, None, dialect, field_depth))
        elif (tag == W + "hyperlink"
              and all(c.tag in (dialect.run, *_DROPPED) for c in child)):
            for run in child:
                if run.tag == dialect.run:
                    pieces.extend(_run(run, child, dialect, field_depth))
        else:
            pieces.append(Piece(None, content=(child,)))
    if not has_letters(pieces):
        return None
    return Paragraph(pieces, lambda out: _write(p, out, dialect))


def _run(run: etree._Element, wrapper: etree._Element | None, dialect: _Dialect,
         field_depth: list[int]) -> list[Piece]:
    properties = run.find(dialect.properties)
    style = RunStyle((_visible(properties), b"" if wrapper is None else _open_tag(wrapper)),
                     run, properties, wrapper)
    pieces = []
    for child in run:
        if child.tag == dialect.properties or child.tag in _DROPPED:
            continue
        if child.tag == W + "fldChar":
            kind = child.get(W + "fldCharType")
            field_depth[0] += 1 if kind == "begin" else -1 if kind == "end" else 0
        if child.tag == dialect.text and not field_depth[0]:
            pieces.append(Piece(child.text or "", style))
        else:  # a field's code and shown result, tabs, breaks, drawings, marks
            pieces.append(Piece(None, content=(child,)))
    return pieces


def _visible(properties: etree._Element | None) -> bytes:
    """Run properties as compared: without what does not show (the proofing language,
    spelling marks, PowerPoint's edit flags), which splits runs of one look."""
    if properties is None:
        return b""
    shown = copy.deepcopy(properties)
    for name in list(shown.attrib):
        if etree.QName(name).localname in _INVISIBLE_ATTRIBUTES:
            del shown.attrib[name]
    for child in list(shown):
        if child.tag in _INVISIBLE_PROPERTIES:
            shown.remove(child)
    for fonts in shown.iter(W + "rFonts"):
        fonts.attrib.pop(W + "hint", None)
        if not fonts.attrib:
            shown.remove(fonts)
    return b"" if len(shown) == 0 and not shown.attrib else etree.tostring(shown)


def _open_tag(element: etree._Element) -> bytes:
    return repr((element.tag, sorted(element.attrib.items()))).encode()


def _write(p: etree._Element, pieces: list[Piece], dialect: _Dialect) -> None:
    # Where each opaque element sits now: one inside a run goes into a copy of that run,
    # inside a copy of its hyperlink if it was in one.
    parents = {id(e): e.getparent() for piece in pieces for e in piece.content
               if isinstance(e, etree._Element)}
    links = {id(r): r.getparent() for r in parents.values()
             if r is not None and r.getparent() is not None
             and r.getparent().tag == W + "hyperlink"}
    end = p.find(A + "endParaRPr") if dialect is DRAWING else None
    for child in list(p):
        if child.tag != dialect.ns + "pPr" and child is not end:
            p.remove(child)
    out = _Writer(p, end, dialect)
    for piece in pieces:
        if piece.text is not None:
            assert isinstance(piece.style, RunStyle)
            out.text(piece.text, piece.style)
            continue
        for element in piece.content:
            assert isinstance(element, etree._Element)
            parent = parents[id(element)]
            if parent is not None and parent.tag == dialect.run:
                out.in_run(element, parent, links.get(id(parent)))
            else:
                out.alone(element)


class _Writer:
    """Appends runs to a paragraph, in hyperlink copies where the source had them."""

    def __init__(self, p: etree._Element, end: etree._Element | None,
                 dialect: _Dialect) -> None:
        self.p, self.end, self.dialect = p, end, dialect
        self.link: tuple[etree._Element | None, etree._Element | None] = (None, None)
        self.run: tuple[etree._Element | None, etree._Element | None] = (None, None)

    def _holder(self, wrapper: etree._Element | None) -> etree._Element:
        if wrapper is None:
            self.link = (None, None)
            return self.p
        if self.link[0] is not wrapper or self.link[1] is None:
            self.link = (wrapper, _new(self.p, self.end, wrapper.tag, wrapper.attrib))
        assert self.link[1] is not None
        return self.link[1]

    def _run(self, like: etree._Element, properties: etree._Element | None,
             wrapper: etree._Element | None) -> etree._Element:
        holder = self._holder(wrapper)
        run = _new(holder, self.end if holder is self.p else None, self.dialect.run,
                   like.attrib)
        if properties is not None:
            run.append(copy.deepcopy(properties))
        return run

    def text(self, words: str, style: RunStyle) -> None:
        self.run = (None, None)
        run = self._run(style.run, style.properties, style.wrapper)
        text = etree.SubElement(run, self.dialect.text)
        text.text = words
        if self.dialect is WORD:
            text.set(XML_SPACE, "preserve")

    def in_run(self, element: etree._Element, parent: etree._Element,
               wrapper: etree._Element | None) -> None:
        if self.run[0] is not parent or self.run[1] is None or (
                wrapper is not None and self.link[0] is not wrapper):
            made = self._run(parent, parent.find(self.dialect.properties), wrapper)
            self.run = (parent, made)
        assert self.run[1] is not None
        self.run[1].append(element)

    def alone(self, element: etree._Element) -> None:
        self.run = (None, None)
        self.link = (None, None)
        _place(self.p, self.end, element)


def _new(parent: etree._Element, before: etree._Element | None, tag: str,
         attrib: etree._Attrib) -> etree._Element:
    """A new child of `parent` at the end (before `before`: a:endParaRPr stays last)."""
    element = parent.makeelement(tag, dict(attrib))
    _place(parent, before, element)
    return element


def _place(parent: etree._Element, before: etree._Element | None,
           element: etree._Element) -> None:
    if before is not None:
        before.addprevious(element)
    else:
        parent.append(element)
