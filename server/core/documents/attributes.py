"""The attributes of (X)HTML meant for people, and its language marks.

Translated: `alt`, `title`, `placeholder`, `aria-label`, and the `content` of
`<meta name="description">`; set to the target: every `lang` and `xml:lang` (but
"no language", `zxx`) and `<meta http-equiv="content-language">`. Content that is
not translated (`<code>`, `<pre>`, `<script>`, `<style>`, `translate="no"`, the
class `notranslate`: core/markup.py's rules) keeps its attributes as they are.

Two readers of one rule: `tree_attributes` for an e-book's XHTML (an lxml tree,
the attribute set in place), `html_attributes` for an .html file, which is never
parsed into a tree (core/markup.py keeps its spelling): each attribute's value is
found by its place in the file (`html.parser` for the tags, a pattern for the
attributes in a start tag's own text).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser

from lxml import etree

from seq2serve.server.core.documents.language import Target, put
from seq2serve.server.core.documents.mixed import ChainStyle
from seq2serve.server.core.inline import Paragraph, Piece
from seq2serve.server.core.markup import NO_TRANSLATE_CLASS, SKIPPED_ELEMENTS, VOID_ELEMENTS

FOR_PEOPLE = frozenset({"alt", "title", "placeholder", "aria-label"})
LANGUAGE = frozenset({"lang", "xml:lang"})
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_PLAIN = ChainStyle((), ())
_ATTRIBUTE = re.compile(r"""\s([^\s"'>/=]+)(?:\s*=\s*("[^"]*"|'[^']*'|[^\s"'>]+))?""")


def _meta_role(name: str, attributes: dict[str, str]) -> str | None:
    """What a `<meta>` element's `content` is: "text" (a description), "language", None."""
    if name != "meta":
        return None
    if attributes.get("name", "").strip().lower() == "description":
        return "text"
    if attributes.get("http-equiv", "").strip().lower() == "content-language":
        return "language"
    return None


def _kept(name: str, attributes: dict[str, str]) -> bool:
    # A `<link>`'s title names a style sheet set, which pages select by that name.
    return (name in SKIPPED_ELEMENTS or name == "link"
            or attributes.get("translate", "").strip().lower() == "no"
            or NO_TRANSLATE_CLASS in attributes.get("class", "").split())


# -- an lxml tree (XHTML) ---------------------------------------------------------------


def _translated_elements(root: etree._Element, local: Callable[[etree._Element], str | None]
                         ) -> Iterator[tuple[etree._Element, str, dict[str, str]]]:
    """Each (X)HTML element under `root` whose content is translated, in document
    order, with its name and attributes; `local` gives an element's (X)HTML name, None
    for other vocabularies (SVG, MathML: not entered); kept elements are not entered."""
    stack = [root]
    while stack:
        element = stack.pop()
        name = local(element) if isinstance(element.tag, str) else None
        if name is None:
            continue
        attributes = {str(k): str(v) for k, v in element.attrib.items()}
        if _kept(name, attributes):
            continue
        yield element, name, attributes
        stack.extend(reversed(element))


def tree_attributes(root: etree._Element, local: Callable[[etree._Element], str | None]
                    ) -> list[Paragraph]:
    """The attributes meant for people under `root`, each one text."""
    found: list[Paragraph] = []
    for element, name, attributes in _translated_elements(root, local):
        wanted = [a for a in attributes if a in FOR_PEOPLE]
        if _meta_role(name, attributes) == "text":
            wanted.append("content")
        for attribute in wanted:
            paragraph = value_paragraph(attributes[attribute], _setter(element, attribute))
            if paragraph is not None:
                found.append(paragraph)
    return found


def mark_tree(root: etree._Element, target: Target,
              local: Callable[[etree._Element], str | None]) -> bool:
    """Every language mark of translated content under `root` says the target; whether
    one changed."""
    changed = False
    for element, name, attributes in _translated_elements(root, local):
        for attribute in ("lang", XML_LANG):
            if target.replaces(element.get(attribute)):
                changed |= put(element, attribute, target.tag)
        if _meta_role(name, attributes) == "language" and target.replaces(
                element.get("content")):
            changed |= put(element, "content", target.tag)
    return changed


def _setter(element: etree._Element, attribute: str) -> Callable[[str], None]:
    return lambda text: element.set(attribute, text)


def value_paragraph(value: str, write: Callable[[str], None]) -> Paragraph | None:
    if not any(c.isalpha() for c in value):
        return None
    return Paragraph([Piece(value, _PLAIN)],
                     lambda out: write("".join(p.text or "" for p in out)))


# -- an .html file's text ------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """An attribute's value in a file: [start, end) of its spelling (quotes included),
    its text, and whether it is a language mark (else text to translate)."""

    start: int
    end: int
    text: str
    language: bool


def html_attributes(page: str) -> list[Value]:
    """The values of the attributes meant for people and of the language marks in
    `page`, in file order."""
    finder = _Finder(page)
    try:
        finder.feed(page)
        finder.close()
    except AssertionError:  # how the stdlib tokenizer gives up: what it found stands
        pass
    return finder.found


def rewrite(page: str, values: list[Value], texts: list[str | None]) -> str:
    """`page` with each value replaced by its text (None: kept), quoted and escaped."""
    out, at = [], 0
    for value, text in zip(values, texts, strict=True):
        if text is None:
            continue
        out.append(page[at:value.start])
        out.append('"' + html.escape(text, quote=True) + '"')
        at = value.end
    out.append(page[at:])
    return "".join(out)


class _Finder(HTMLParser):
    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[Value] = []
        self._open: list[tuple[str, bool]] = []  # open elements: name, kept
        self._lines = [0] + [m.end() for m in re.finditer("\n", page)]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        kept = bool(self._open and self._open[-1][1]) or _kept(tag, attributes)
        if tag not in VOID_ELEMENTS:
            self._open.append((tag, kept))
        if not kept:
            self._values(tag, attributes)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        if not (self._open and self._open[-1][1]) and not _kept(tag, attributes):
            self._values(tag, attributes)

    def handle_endtag(self, tag: str) -> None:
        if any(name == tag for name, _ in self._open):
            while self._open and self._open.pop()[0] != tag:
                pass

    def _values(self, tag: str, attributes: dict[str, str]) -> None:
        raw = self.get_starttag_text() or ""
        line, column = self.getpos()
        offset = self._lines[line - 1] + column
        role = _meta_role(tag, attributes)
        for match in _ATTRIBUTE.finditer(raw, len(tag) + 1):
            name, spelled = match.group(1).lower(), match.group(2)
            if spelled is None:
                continue
            language = name in LANGUAGE or (name == "content" and role == "language")
            if not (language or name in FOR_PEOPLE or (name == "content" and role == "text")):
                continue
            text = html.unescape(spelled[1:-1] if spelled[0] in "\"'" else spelled)
            self.found.append(Value(offset + match.start(2), offset + match.end(2), text,
                                    language))
