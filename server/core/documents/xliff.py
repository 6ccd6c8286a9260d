"""XLIFF 1.2 (and 1.1) and 2.x, read with translate-toolkit (`xliff`, `xliff2`).

translate-toolkit parses the file into its lxml tree and finds the units; the
file is written from that same tree without the toolkit's re-indentation, with
the original XML declaration, so everything not filled here stays byte for
byte (the toolkit's own `serialize` re-indents the whole document).

- Filled: translatable units (`translate="no"` is respected) whose target is
  missing or empty; with `overwrite`, every translatable unit.
- Marked for review, as each standard says it: XLIFF 1.2 `<target
  state="needs-review-translation" state-qualifier="mt-suggestion">` (the
  state-qualifier the standard has for machine translation); XLIFF 2.x
  `<segment state="initial" subState="seq2serve:mt">` (2.x has no review state
  below `translated`; `initial` with a target is what translate-toolkit, and so
  Weblate, read as needing review; `subState` says why, in the standard's
  `prefix:value` form). The file's target language is set where it is missing.
- Inline codes (`<g>`, `<x/>`, `<ph>`, `<pc>`, `<mrk>` ...) go to the model as
  tags, which the core masks and brings back paired and in order; a translation
  whose codes do not come back as the source's exactly (same elements, same
  attributes) leaves the unit untranslated, counted as skipped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from html import escape

from lxml import etree
from translate.storage import xliff, xliff2

from seq2serve.server.core.documents.base import (
    Document,
    DocumentError,
    check_target,
    same_edges,
)

MEDIA_TYPE = "application/xliff+xml"
XML_NS = "http://www.w3.org/XML/1998/namespace"
MT_SUBSTATE = "seq2serve:mt"
_DECLARATION = re.compile(rb"^\s*<\?xml[^>]*\?>\s*")
_VERSION_2 = re.compile(rb"<xliff\b[^>]*(?:version\s*=\s*[\"']2\.|xliff:document:2\.)")


class XliffDocument(Document):
    def __init__(self, name: str, data: bytes, target: str, overwrite: bool) -> None:
        super().__init__(name, MEDIA_TYPE)
        self.raw = data
        self.version2 = bool(_VERSION_2.search(data[:4096]))
        try:
            self.store: xliff.xlifffile[xliff.xliffunit] | xliff2.Xliff2File = (
                xliff2.Xliff2File(data) if self.version2 else xliff.xlifffile(data))
        except Exception as e:  # lxml's and the toolkit's errors have no common type
            raise DocumentError(f"{name} is not a readable XLIFF file: {e}") from None
        check_target(self.store.gettargetlanguage(), target, name)
        self.target = target
        self.namespace = self.store.namespace or ""
        self.source_language = str(self.store.getsourcelanguage() or "")
        self._fill: list[tuple[etree._Element, etree._Element]] = []  # (element, source)
        self._texts: list[str] = []
        self._inline: list[bool] = []
        for unit in self.store.units:
            element = unit.xmlelement
            source = element.find(self._tag("source"))
            if (source is None or not unit.istranslatable() or not _content(source).strip()
                    or element.get("restype") == "x-gettext-domain-header"):
                continue
            self.tally.entries += 1
            existing = element.find(self._tag("target"))
            if existing is not None and _content(existing).strip() and not overwrite:
                self.tally.kept += 1
                continue
            inline = len(source) > 0
            self._fill.append((element, source))
            self._inline.append(inline)
            self._texts.append(_inner_xml(source) if inline else source.text or "")

    @property
    def texts(self) -> Sequence[str]:
        return self._texts

    def write(self, translations: Sequence[str | None]) -> bytes:
        self._check(translations)
        for (element, source), inline, text in zip(self._fill, self._inline, translations,
                                                   strict=True):
            content = self._content(source, text, inline)
            if content is None:
                self.tally.skipped += 1
                continue
            self._set_target(element, source, content)
            self.tally.filled += 1
        if self.tally.filled:
            self._set_target_language()
        document = self.store.document
        encoding = document.docinfo.encoding or "UTF-8"
        body: bytes = etree.tostring(document, encoding=encoding, xml_declaration=False)
        declaration = _DECLARATION.match(self.raw)
        ending = b"\n" if self.raw.endswith(b"\n") and not body.endswith(b"\n") else b""
        return (declaration.group(0) if declaration else b"") + body + ending

    # -- targets -------------------------------------------------------------------

    def _tag(self, name: str) -> str:
        return f"{{{self.namespace}}}{name}" if self.namespace else name

    def _content(self, source: etree._Element, text: str | None,
                 inline: bool) -> etree._Element | None:
        """The target's content as an element to copy from, or None to leave the unit."""
        if text is None or not text.strip():
            return None
        holder = etree.Element(self._tag("target"))
        if not inline:
            holder.text = same_edges(source.text or "", text)
            return holder
        try:
            parsed = etree.fromstring(
                f'<w xmlns="{escape(self.namespace)}">{text}</w>'.encode(),
                etree.XMLParser(resolve_entities=False, no_network=True))
        except etree.XMLSyntaxError:
            self.tally.notes.append("inline codes not well-formed in a translation")
            return None
        if _codes(parsed) != _codes(source):
            self.tally.notes.append("inline codes changed in a translation")
            return None
        holder.text = parsed.text
        holder.extend(list(parsed))
        return holder

    def _set_target(self, element: etree._Element, source: etree._Element,
                    content: etree._Element) -> None:
        target = element.find(self._tag("target"))
        if target is None:
            target = etree.Element(self._tag("target"))
            # After <source> (and 1.2's <seg-source>), laid out as the source is.
            anchor = element.find(self._tag("seg-source"))
            anchor = source if anchor is None else anchor
            target.tail = anchor.tail
            anchor.addnext(target)
            anchor.tail = _indent_before(anchor, anchor.tail)
        else:
            for child in list(target):
                target.remove(child)
        target.text = content.text
        target.extend(list(content))
        if source.get(f"{{{XML_NS}}}space") == "preserve":
            target.set(f"{{{XML_NS}}}space", "preserve")
        if self.version2:
            element.set("state", "initial")
            element.set("subState", MT_SUBSTATE)
        else:
            target.set(f"{{{XML_NS}}}lang", self.target)
            target.set("state", "needs-review-translation")
            target.set("state-qualifier", "mt-suggestion")
            if element.get("approved") == "yes":
                element.set("approved", "no")

    def _set_target_language(self) -> None:
        root = self.store.document.getroot()
        if self.version2:
            if not root.get("trgLang"):
                root.set("trgLang", self.target)
            return
        for file_element in root.iter(self._tag("file")):
            if not file_element.get("target-language"):
                file_element.set("target-language", self.target)


def _indent_before(element: etree._Element, fallback: str | None) -> str | None:
    """The whitespace that precedes `element` in its parent (its indentation)."""
    previous = element.getprevious()
    before = previous.tail if previous is not None else element.getparent().text
    return before if before is not None and not before.strip() else fallback


def _content(element: etree._Element) -> str:
    """An element's text, inline codes' text included; an empty code counts as content."""
    text: str = "".join(element.itertext())
    return text + ("<>" if len(element) else "")


def _inner_xml(element: etree._Element) -> str:
    """An element's content as XML text with unprefixed tags, as the model sees it:
    `Click <g id="1">here</g> to save <x id="2"/> files.`"""
    parts = [escape(element.text or "", quote=False)]
    for child in element:
        parts.append(_outer_xml(child))
        parts.append(escape(child.tail or "", quote=False))
    return "".join(parts)


def _outer_xml(element: etree._Element) -> str:
    name = etree.QName(element).localname
    attributes = "".join(f' {_attribute_name(k)}="{escape(str(v))}"'
                         for k, v in element.attrib.items())
    if len(element) == 0 and not element.text:
        return f"<{name}{attributes}/>"
    return f"<{name}{attributes}>{_inner_xml(element)}</{name}>"


def _attribute_name(name: str) -> str:
    qualified = etree.QName(name)
    if qualified.namespace == XML_NS:
        return f"xml:{qualified.localname}"
    if qualified.namespace:
        raise DocumentError(f"inline code attribute {name[:64]!r} in another namespace")
    return str(qualified.localname)


def _codes(element: etree._Element) -> Counter[tuple[str, tuple[tuple[str, str], ...]]]:
    """The inline codes under an element: local name and attributes, each as often as
    it occurs."""
    return Counter((etree.QName(e).localname,
                    tuple(sorted((etree.QName(k).localname, str(v)) for k, v in e.attrib.items())))
                   for e in element.iterdescendants() if isinstance(e.tag, str))
