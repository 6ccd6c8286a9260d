"""Office Open XML paragraphs (Word's `w:p`, DrawingML's `a:p`, a spreadsheet's rich
text string) as one text each.

A paragraph's runs (`w:r`, `a:r`) are styled by their run properties (bold,
italic, font, a DrawingML link) and, in Word, by the wrappers they sit in: a
hyperlink, a tracked insertion or move (`w:ins`, `w:moveTo`), an inline content
control (`w:sdt`, its runs in `w:sdtContent`), a smart tag, a custom XML element,
a bidirectional embedding, and a field whose shown result is text (a `HYPERLINK`
or `REF` field: a `w:fldSimple`, or a complex field whose code, from `begin` to
`separate`, and `end` are kept around the translated result). What a reader
reads in the finished document is translated; a wrapper is written again around
the translated words of its runs, as many copies as the translation splits them
into. Deleted text (`w:del`, `w:moveFrom`), tabs, breaks, drawings, footnote
marks, bookmarks, comment marks and every other field (page numbers, dates, mail
merge fields: their code and result) are opaque: kept as they are, moved with
their words. Spelling marks (`w:proofErr`) and the last page break Word drew
(`w:lastRenderedPageBreak`), which Word recomputes, are dropped from translated
paragraphs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from lxml import etree

from seq2serve.server.core.inline import Paragraph, Piece, has_letters

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_DROPPED = frozenset({W + "proofErr", W + "lastRenderedPageBreak"})
_INVISIBLE_ATTRIBUTES = frozenset({"lang", "altLang", "dirty", "err", "noProof", "smtClean",
                                   "smtId", "bmk"})
_INVISIBLE_PROPERTIES = frozenset({W + "lang", W + "noProof"})
# Word's wrappers of runs, each with its property children (copied with it) and the child
# its runs sit in (None: the wrapper itself).
_WRAPPERS: dict[str, tuple[frozenset[str], str | None]] = {
    W + "hyperlink": (frozenset(), None),
    W + "ins": (frozenset(), None),
    W + "moveTo": (frozenset(), None),
    W + "fldSimple": (frozenset({W + "fldData"}), None),
    W + "smartTag": (frozenset({W + "smartTagPr"}), None),
    W + "customXml": (frozenset({W + "customXmlPr"}), None),
    W + "dir": (frozenset(), None),
    W + "bdo": (frozenset(), None),
    W + "sdt": (frozenset({W + "sdtPr", W + "sdtEndPr"}), W + "sdtContent"),
}
# Complex fields whose shown result is words a person reads (a link's text, the text a
# cross-reference repeats); every other field's result is computed (page numbers, dates,
# sequence numbers) or a placeholder (mail merge), and stays as it is.
_TEXT_FIELDS = frozenset({"HYPERLINK", "REF"})


@dataclass(frozen=True)
class _Dialect:
    """What differs between WordprocessingML, DrawingML and SpreadsheetML's rich text."""

    ns: str
    kind: Literal["word", "drawing", "sheet"]

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
SHEET = _Dialect("{http://schemas.openxmlformats.org/spreadsheetml/2006/main}", "sheet")


@dataclass(frozen=True)
class Wrapper:
    """An element around runs (`element`), or a complex field (`opening`: its atoms
    from `begin` to `separate`; `closing`: its `end`); `key` compares them."""

    key: bytes
    element: etree._Element | None = None
    opening: tuple[_Atom, ...] = ()
    closing: tuple[_Atom, ...] = ()


@dataclass(frozen=True)
class _Atom:
    """A child of a run (its `run`), or an element beside runs (run None), and the
    wrappers around it, outermost first."""

    element: etree._Element
    run: etree._Element | None
    chain: tuple[Wrapper, ...]


@dataclass(frozen=True)
class RunStyle:
    """A run's formatting: its visible properties and the wrappers around it (compared
    by their XML); `run` and `chain` are the first such run and wrappers, copied from."""

    key: tuple[bytes, tuple[bytes, ...]]
    run: etree._Element = field(compare=False, hash=False)
    properties: etree._Element | None = field(compare=False, hash=False)
    chain: tuple[Wrapper, ...] = field(compare=False, hash=False)

    @property
    def plain(self) -> bool:
        return self.key == (b"", ())


def find(root: etree._Element, dialect: _Dialect) -> list[Paragraph]:
    """The paragraphs under `root` with text to translate, in document order."""
    found = (paragraph(element, dialect) for element in root.iter(dialect.ns + "p"))
    return [p for p in found if p is not None]


def paragraph(p: etree._Element, dialect: _Dialect) -> Paragraph | None:
    atoms: list[_Atom] = []
    _walk(p, (), dialect, atoms)
    atoms, opaque, fields = _fields(atoms, dialect)
    pieces: list[Piece] = []
    where: dict[int, _Atom] = {}
    for atom in atoms:
        if (atom.element.tag == dialect.text and atom.run is not None
                and id(atom.element) not in opaque):
            pieces.append(Piece(atom.element.text or "", _style(atom, dialect)))
        else:
            pieces.append(Piece(None, content=(atom.element,)))
            where[id(atom.element)] = atom
    if not has_letters(pieces):
        return None
    return Paragraph(pieces, lambda out: _write(p, out, where, fields, dialect))


def _walk(container: etree._Element, chain: tuple[Wrapper, ...], dialect: _Dialect,
          atoms: list[_Atom]) -> None:
    skipped = {dialect.ns + "pPr", A + "endParaRPr"} if not chain else set()
    if chain and chain[-1].element is not None:
        skipped |= _WRAPPERS[chain[-1].element.tag][0]
    for child in container:
        tag = child.tag
        if tag in skipped or tag in _DROPPED:
            continue
        if tag == dialect.run:
            for part in child:
                if part.tag != dialect.properties and part.tag not in _DROPPED:
                    atoms.append(_Atom(part, child, chain))
        elif dialect is WORD and tag in _WRAPPERS and (
                tag != W + "fldSimple" or _text_field(child.get(W + "instr", ""))):
            props, inner = _WRAPPERS[tag]
            wrapper = Wrapper(_key(child, props), child)
            content = child.find(inner) if inner is not None else child
            if content is None:
                atoms.append(_Atom(child, None, chain))
            else:
                _walk(content, (*chain, wrapper), dialect, atoms)
        else:  # deletions, bookmarks, comment marks, math, ... : as they are
            atoms.append(_Atom(child, None, chain))


def _text_field(code: str) -> bool:
    """Whether a field of this code shows words a person reads (`_TEXT_FIELDS`)."""
    words = code.split()
    return bool(words) and words[0].upper() in _TEXT_FIELDS


def _key(element: etree._Element, props: frozenset[str]) -> bytes:
    shown = [etree.tostring(c) for c in element if c.tag in props]
    return repr((element.tag, sorted(element.attrib.items()), shown)).encode()


def _fields(atoms: list[_Atom], dialect: _Dialect
            ) -> tuple[list[_Atom], set[int], list[Wrapper]]:
    """The atoms with each text field's code and end taken into a `Wrapper` around its
    result; the ids of the texts inside other fields (opaque), and the text fields."""
    if dialect is not WORD:
        return atoms, set(), []
    opaque: set[int] = set()
    spans: list[tuple[int, int, int]] = []  # begin, separate, end of each outermost field
    depth, begin, separate = 0, -1, -1
    for i, atom in enumerate(atoms):
        kind = atom.element.get(W + "fldCharType") if atom.element.tag == W + "fldChar" else None
        if kind == "begin":
            depth += 1
            if depth == 1:
                begin, separate = i, -1
        elif kind == "separate" and depth == 1:
            separate = i
        elif kind == "end" and depth:
            depth -= 1
            if depth == 0 and separate > begin >= 0:
                spans.append((begin, separate, i))
        elif depth and atom.element.tag == dialect.text:
            opaque.add(id(atom.element))
    out = list(atoms)
    wrappers = []
    for begin, separate, end in reversed(spans):
        code = "".join(a.element.text or "" for a in atoms[begin:separate]
                       if a.element.tag == W + "instrText")
        result = atoms[separate + 1:end]
        chain = atoms[begin].chain
        if (not _text_field(code)
                or any(a.element.tag == W + "fldChar" for a in result)
                or any(a.chain != chain for a in (atoms[separate], atoms[end], *result))
                or not any(a.element.tag == W + "t" and any(c.isalpha() for c in a.element.text
                                                           or "") for a in result)):
            continue
        wrapper = Wrapper(b"field %d" % id(atoms[begin].element),
                          opening=tuple(atoms[begin:separate + 1]), closing=(atoms[end],))
        wrappers.append(wrapper)
        for a in result:
            opaque.discard(id(a.element))
        out[begin:end + 1] = [_Atom(a.element, a.run, (*chain, wrapper)) for a in result]
    return out, opaque, wrappers


def _style(atom: _Atom, dialect: _Dialect) -> RunStyle:
    assert atom.run is not None
    properties = atom.run.find(dialect.properties)
    return RunStyle((_visible(properties), tuple(w.key for w in atom.chain)), atom.run,
                    properties, atom.chain)


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


def _write(p: etree._Element, pieces: list[Piece], where: dict[int, _Atom],
           fields: Sequence[Wrapper], dialect: _Dialect) -> None:
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
            out.atom(where[id(element)])
    out.enter(())
    for wrapper in fields:  # a field whose result got no words: its code stays
        if wrapper.key not in out.opened:
            for atom in (*wrapper.opening, *wrapper.closing):
                out.enter(atom.chain)
                out.put(atom)
            out.enter(())


class _Writer:
    """Appends runs to a paragraph inside copies of the wrappers the source had them in;
    an element of the source is moved the first time and copied after that."""

    def __init__(self, p: etree._Element, end: etree._Element | None,
                 dialect: _Dialect) -> None:
        self.p, self.end, self.dialect = p, end, dialect
        self.stack: list[tuple[Wrapper, etree._Element]] = []  # open wrappers, their holder
        self.run: tuple[etree._Element, etree._Element] | None = None  # source run, copy
        self.used: set[int] = set()
        self.opened: set[bytes] = set()

    def _holder(self) -> etree._Element:
        return self.stack[-1][1] if self.stack else self.p

    def _add(self, element: etree._Element) -> None:
        holder = self._holder()
        if holder is self.p and self.end is not None:
            self.end.addprevious(element)  # a:endParaRPr stays last
        else:
            holder.append(element)

    def _own(self, element: etree._Element) -> etree._Element:
        if id(element) in self.used:
            return copy.deepcopy(element)
        self.used.add(id(element))
        return element

    def enter(self, chain: tuple[Wrapper, ...]) -> None:
        common = 0
        while (common < len(self.stack) and common < len(chain)
               and self.stack[common][0].key == chain[common].key):
            common += 1
        while len(self.stack) > common:
            wrapper, _ = self.stack.pop()
            self.run = None
            for atom in wrapper.closing:
                self.put(atom)
        for wrapper in chain[common:]:
            self.run = None
            self.opened.add(wrapper.key)
            if wrapper.element is None:  # a complex field: its code, then its result
                for atom in wrapper.opening:
                    self.put(atom)
                self.run = None
                self.stack.append((wrapper, self._holder()))
                continue
            source = wrapper.element
            props, inner = _WRAPPERS[source.tag]
            made = source.makeelement(source.tag, dict(source.attrib))
            for child in source:
                if child.tag in props:
                    made.append(copy.deepcopy(child))
            self._add(made)
            holder = made if inner is None else etree.SubElement(made, inner)
            self.stack.append((wrapper, holder))

    def _new_run(self, like: etree._Element, properties: etree._Element | None
                 ) -> etree._Element:
        run = like.makeelement(self.dialect.run, dict(like.attrib))
        if properties is not None:
            run.append(copy.deepcopy(properties))
        self._add(run)
        return run

    def text(self, words: str, style: RunStyle) -> None:
        self.enter(style.chain)
        self.run = None
        run = self._new_run(style.run, style.properties)
        text = etree.SubElement(run, self.dialect.text)
        text.text = words
        if self.dialect is not DRAWING:
            text.set(XML_SPACE, "preserve")

    def atom(self, atom: _Atom) -> None:
        self.enter(atom.chain)
        self.put(atom)

    def put(self, atom: _Atom) -> None:
        """`atom`'s element where the writer is: in a copy of its run if it had one."""
        element = self._own(atom.element)
        if atom.run is None:
            self.run = None
            self._add(element)
            return
        if self.run is None or self.run[0] is not atom.run:
            self.run = (atom.run, self._new_run(atom.run,
                                                atom.run.find(self.dialect.properties)))
        self.run[1].append(element)
