"""OpenDocument text (.odt) and presentations (.odp), edited in their XML.

Translated: every paragraph and heading (`text:p`, `text:h`) of `content.xml`
(body, lists, tables, text boxes and frames, footnotes and endnotes, comments
(`office:annotation`), slides and their speaker notes) and of `styles.xml`
(headers and footers live in its master pages). A paragraph is one text
(mixed.py): `text:span` and `text:a` style their words; `text:s` is spaces;
tabs, line breaks, fields, notes, frames, bookmarks and change marks are
opaque. Everything else is copied byte for byte; `mimetype` stays the first
member, stored. A package with Basic or script macros (`Basic/`, `Scripts/`) is
refused.
"""

from __future__ import annotations

from lxml import etree

from seq2serve.server.core.documents.base import DocumentError
from seq2serve.server.core.documents.mixed import Rules, paragraphs
from seq2serve.server.core.documents.package import (
    DEFAULT_LIMITS,
    Limits,
    Package,
    PackageDocument,
)

ODT_MEDIA_TYPE = "application/vnd.oasis.opendocument.text"
ODP_MEDIA_TYPE = "application/vnd.oasis.opendocument.presentation"
TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
_BLOCKS = frozenset({TEXT + "p", TEXT + "h"})
_INLINE = frozenset({TEXT + "span", TEXT + "a"})
_MACRO_FOLDERS = ("Basic/", "Scripts/")


def _spaces(element: etree._Element) -> str | None:
    if element.tag != TEXT + "s":
        return None
    count = element.get(TEXT + "c", "1")
    return " " * min(int(count), 64) if count.isdigit() else " "


RULES = Rules(block=lambda e: e.tag in _BLOCKS, inline=lambda e: e.tag in _INLINE,
              skip=lambda e: False, spaces=_spaces)


def read_odt(name: str, data: bytes, limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    return _read(name, data, "an OpenDocument text (.odt)", ODT_MEDIA_TYPE, limits)


def read_odp(name: str, data: bytes, limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    return _read(name, data, "an OpenDocument presentation (.odp)", ODP_MEDIA_TYPE, limits)


def _read(name: str, data: bytes, kind: str, media_type: str,
          limits: Limits) -> PackageDocument:
    package = Package(name, data, kind, limits)
    package.require("mimetype")
    package.require("content.xml")
    declared = package.read("mimetype").strip()
    if not declared.startswith(media_type.encode()):
        raise DocumentError(f"{name} is not {kind}: its mimetype is "
                            f"{declared[:80].decode('ascii', 'replace')!r}")
    if any(n.startswith(_MACRO_FOLDERS) for n in package.names):
        raise DocumentError(f"{name} contains macros, which are not accepted")
    parts = []
    for member in ("content.xml", "styles.xml"):
        if member in package.names:
            parts.append(package.part(member, lambda root: paragraphs(root, RULES), _BLOCKS))
    return PackageDocument(name, media_type, package, parts)
