"""OpenDocument text (.odt) and presentations (.odp), edited in their XML.

Translated: every paragraph and heading (`text:p`, `text:h`) of `content.xml`
(body, lists, tables, text boxes and frames, footnotes and endnotes, comments
(`office:annotation`), slides and their speaker notes) and of `styles.xml`
(headers and footers live in its master pages), the text of every embedded object
(a chart's `Object 1/content.xml`: its title, subtitle and axis titles, and the
strings of its own data table, which hold the series names and category labels),
and the title in `meta.xml`. A table cell that holds a value (a number, a date, a
percentage, a truth value) or a formula is not text: its shown form stays as it
is. A paragraph is one text (mixed.py): `text:span` and `text:a` style their words;
`text:s` is spaces; tabs, line breaks, fields, notes, frames, bookmarks and change
marks are opaque. The target language is marked wherever a style marks a language
(`fo:language` and `fo:country`, or the Asian or complex ones for a target written
in such a script) and in `dc:language`. Everything else is copied byte for byte;
`mimetype` stays the first member, stored. A package with Basic or script macros
(`Basic/`, `Scripts/`) is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from lxml import etree

from seq2serve.server.core.documents.base import DocumentError
from seq2serve.server.core.documents.charts import DC, mark_core, title_paragraphs
from seq2serve.server.core.documents.language import Target, put, target_language
from seq2serve.server.core.documents.mixed import Rules, paragraphs
from seq2serve.server.core.documents.package import (
    DEFAULT_LIMITS,
    Limits,
    Package,
    PackageDocument,
    Part,
)
from seq2serve.server.core.inline import Paragraph

ODT_MEDIA_TYPE = "application/vnd.oasis.opendocument.text"
ODP_MEDIA_TYPE = "application/vnd.oasis.opendocument.presentation"
TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
TABLE = "{urn:oasis:names:tc:opendocument:xmlns:table:1.0}"
OFFICE = "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}"
STYLE = "{urn:oasis:names:tc:opendocument:xmlns:style:1.0}"
FO = "{urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0}"
# The attributes that mark a language, per kind of script (language.py).
_MARKS = {kind: (FO + "language", FO + "country", FO + "script", STYLE + "rfc-language-tag")
          if kind == "western" else (STYLE + f"language-{kind}", STYLE + f"country-{kind}",
                                     STYLE + f"script-{kind}",
                                     STYLE + f"rfc-language-tag-{kind}")
          for kind in ("western", "asian", "complex")}
# The members with text: the document's, and each embedded object's (charts).
_TEXT_PARTS = re.compile(r"(?:[^/]+/)*(content|styles)\.xml")
_BLOCKS = frozenset({TEXT + "p", TEXT + "h"})
_INLINE = frozenset({TEXT + "span", TEXT + "a"})
_MACRO_FOLDERS = ("Basic/", "Scripts/")


def _spaces(element: etree._Element) -> str | None:
    if element.tag != TEXT + "s":
        return None
    count = element.get(TEXT + "c", "1")
    return " " * min(int(count), 64) if count.isdigit() else " "


def holds_value(element: etree._Element) -> bool:
    """A paragraph of a table cell whose shown text is a value's (a number, a date, a
    truth value) or a formula's: not text to translate (a note in the cell is)."""
    cell = element.getparent() if element.tag in _BLOCKS else None
    return cell is not None and cell.tag == TABLE + "table-cell" and (
        cell.get(OFFICE + "value-type", "string") != "string"
        or cell.get(TABLE + "formula") is not None)


RULES = Rules(block=lambda e: e.tag in _BLOCKS, inline=lambda e: e.tag in _INLINE,
              skip=holds_value, spaces=_spaces)


def read_odt(name: str, data: bytes, target: str,
             limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    return _read(name, data, target, "an OpenDocument text (.odt)", ODT_MEDIA_TYPE, limits)


def read_odp(name: str, data: bytes, target: str,
             limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    return _read(name, data, target, "an OpenDocument presentation (.odp)", ODP_MEDIA_TYPE,
                 limits)


def _read(name: str, data: bytes, target: str, kind: str, media_type: str,
          limits: Limits) -> PackageDocument:
    package = open_package(name, data, kind, media_type, limits)
    language = target_language(target)
    parts = [part(package, m.filename, language, lambda root: paragraphs(root, RULES))
             for m in package.infos if _TEXT_PARTS.fullmatch(m.filename)]
    return PackageDocument(name, media_type, package, parts + meta_parts(package, language))


def open_package(name: str, data: bytes, kind: str, media_type: str,
                 limits: Limits) -> Package:
    """An OpenDocument package of `media_type`, checked: its mimetype, no macros."""
    package = Package(name, data, kind, limits)
    package.require("mimetype")
    package.require("content.xml")
    declared = package.read("mimetype").strip()
    if not declared.startswith(media_type.encode()):
        raise DocumentError(f"{name} is not {kind}: its mimetype is "
                            f"{declared[:80].decode('ascii', 'replace')!r}")
    if any(n.startswith(_MACRO_FOLDERS) for n in package.names):
        raise DocumentError(f"{name} contains macros, which are not accepted")
    return package


def part(package: Package, member: str, language: Target,
         find: Callable[[etree._Element], list[Paragraph]],
         counted: frozenset[str] = _BLOCKS) -> Part:
    """A member with text (its `counted` elements counted as paragraphs while it is
    read), its language marks set to `language` once translated."""
    found = package.part(member, find, counted)
    found.mark = lambda root: mark_styles(root, language)
    return found


def meta_parts(package: Package, language: Target) -> list[Part]:
    """`meta.xml`: its title translated, its `dc:language` the target."""
    if "meta.xml" not in package.names:
        return []
    found = package.part("meta.xml", title_paragraphs, frozenset({DC + "title"}))
    found.mark = lambda root: mark_core(root, language)
    return [found]


def mark_styles(root: etree._Element, target: Target) -> bool:
    """Each style that marks a language of the target's kind says the target."""
    language, country, script, tag = _MARKS[target.kind]
    changed = False
    for properties in root.iter(STYLE + "text-properties"):
        if not target.replaces(properties.get(language)):
            continue
        changed |= put(properties, language, target.language)
        if target.territory:
            changed |= put(properties, country, target.territory)
        elif properties.attrib.pop(country, None) is not None:
            changed = True
        if properties.attrib.pop(script, None) is not None:  # it went with the language
            changed = True
        if tag in properties.attrib:
            changed |= put(properties, tag, target.tag)
    return changed
