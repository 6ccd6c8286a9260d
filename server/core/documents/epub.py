"""E-books (.epub, 2 and 3), edited in their XHTML.

The package says where everything is: `META-INF/container.xml` names the OPF
file, whose manifest lists the chapters (`application/xhtml+xml`, the EPUB 3
navigation document among them) and the EPUB 2 table of contents (`toc.ncx`).
Translated: each chapter's blocks (`<p>`, headings, list items, table cells,
captions, quotes, `<div>`s with text of their own, the `<title>`) as one text
each (mixed.py: `<b>`, `<i>`, `<a>`, `<span>` ... style their words; images and
line breaks are opaque), the navigation document's titles, and toc.ncx's
`navLabel` texts. Not entered: `<code>`, `<pre>`, `<kbd>`, `<samp>`, `<script>`,
`<style>`, SVG and MathML, and anything marked `translate="no"` or with the class
`notranslate` (as for HTML, core/markup.py). The attributes meant for people
(`alt`, `title`, `aria-label` ...: attributes.py) are translated; the book's title
(`dc:title` in the OPF) too. The book says it is in the target language: the OPF's
`dc:language` and every `lang` and `xml:lang` of the OPF, the chapters and
`toc.ncx`. XHTML's named entities (`&rsquo;`, `&nbsp;`, `&mdash;`: an EPUB 2
chapter's XHTML 1.1 DTD declares them, and the parser reads no DTD) are the
characters they stand for, so they are translated as the text they are (written
back as those characters); an entity no (X)HTML defines stays as it is. The rest of
the OPF (metadata, spine) and every other member are copied byte for byte;
`mimetype` stays first and stored.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from html.entities import html5
from urllib.parse import unquote

from lxml import etree

from seq2serve.server.core.documents.attributes import mark_tree, tree_attributes
from seq2serve.server.core.documents.base import DocumentError
from seq2serve.server.core.documents.charts import title_paragraphs
from seq2serve.server.core.documents.language import Target, put_text, target_language
from seq2serve.server.core.documents.mixed import Rules, paragraphs
from seq2serve.server.core.documents.package import (
    DEFAULT_LIMITS,
    Limits,
    Package,
    PackageDocument,
    Part,
)
from seq2serve.server.core.inline import Paragraph
from seq2serve.server.core.markup import INLINE_ELEMENTS, NO_TRANSLATE_CLASS, SKIPPED_ELEMENTS

MEDIA_TYPE = "application/epub+zip"
CONTAINER = "META-INF/container.xml"
_CONTAINER_NS = "{urn:oasis:names:tc:opendocument:xmlns:container}"
_OPF_NS = "{http://www.idpf.org/2007/opf}"
_DC = "{http://purl.org/dc/elements/1.1/}"
XHTML = "http://www.w3.org/1999/xhtml"
NCX = "http://www.daisy.org/z3986/2005/ncx/"
_BLOCKS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "td", "th",
                     "caption", "figcaption", "blockquote", "div", "title", "summary",
                     "legend", "label", "section", "article", "aside", "header", "footer",
                     "nav", "figure", "main", "body"})
_SKIPPED = SKIPPED_ELEMENTS | {"svg", "math"}
# The blocks as the streaming count sees them (Clark notation; XHTML or no namespace).
_COUNTED_BLOCKS = frozenset({*_BLOCKS, *(f"{{{XHTML}}}{name}" for name in _BLOCKS)})
_COUNTED_NCX = frozenset({"text", f"{{{NCX}}}text"})


def _local(element: etree._Element, namespace: str) -> str | None:
    """The element's local name when it is in `namespace` (or in none), else None."""
    name = etree.QName(element)
    return name.localname if name.namespace in (namespace, None) else None


def _skipped(element: etree._Element) -> bool:
    name = _local(element, XHTML)
    if name is None or name in _SKIPPED:
        return True
    return (element.get("translate", "").strip().lower() == "no"
            or NO_TRANSLATE_CLASS in element.get("class", "").split())


XHTML_RULES = Rules(block=lambda e: _local(e, XHTML) in _BLOCKS,
                    inline=lambda e: _local(e, XHTML) in INLINE_ELEMENTS, skip=_skipped)
NCX_RULES = Rules(block=lambda e: _local(e, NCX) == "text", inline=lambda e: False,
                  skip=lambda e: False)


def read_epub(name: str, data: bytes, target: str,
              limits: Limits = DEFAULT_LIMITS) -> PackageDocument:
    package = Package(name, data, "an e-book (.epub)", limits)
    package.require(CONTAINER)
    if "mimetype" in package.names and package.read("mimetype").strip() != MEDIA_TYPE.encode():
        raise DocumentError(f"{name} is not an e-book (.epub): its mimetype is not "
                            f"{MEDIA_TYPE}")
    rootfile = package.xml(CONTAINER).getroot().find(f".//{_CONTAINER_NS}rootfile")
    opf = unquote(rootfile.get("full-path", "")) if rootfile is not None else ""
    package.require(opf or "an OPF file named in META-INF/container.xml")
    language = target_language(target)
    book = _part(package, opf, lambda root: title_paragraphs(_resolved(root)),
                 lambda root: _mark_opf(root, language), frozenset({_DC + "title"}))
    parts = []
    for member, media_type in _manifest(book.tree.getroot(), opf):
        if member not in package.names or member == opf:
            continue
        if media_type == "application/xhtml+xml":
            parts.append(_part(package, member, _chapter,
                               lambda root: mark_tree(root, language, _xhtml),
                               _COUNTED_BLOCKS))
        elif media_type == "application/x-dtbncx+xml":
            parts.append(_part(package, member,
                               lambda root: paragraphs(_resolved(root), NCX_RULES),
                               lambda root: mark_tree(root, language, _any), _COUNTED_NCX))
    return PackageDocument(name, MEDIA_TYPE, package, [*parts, book])


def _part(package: Package, member: str, find: Callable[[etree._Element], list[Paragraph]],
          mark: Callable[[etree._Element], bool], counted: frozenset[str]) -> Part:
    part = package.part(member, find, counted)
    part.mark = mark
    return part


def _chapter(root: etree._Element) -> list[Paragraph]:
    _resolved(root)
    return paragraphs(root, XHTML_RULES) + tree_attributes(root, _xhtml)


def _xhtml(element: etree._Element) -> str | None:
    return _local(element, XHTML)


def _any(element: etree._Element) -> str | None:
    return str(etree.QName(element).localname)


def _mark_opf(root: etree._Element, language: Target) -> bool:
    marked = [put_text(element, language.tag) for element in root.iter(_DC + "language")
              if language.replaces(element.text)]
    return mark_tree(root, language, _any) or any(marked)


def _resolved(root: etree._Element) -> etree._Element:
    """`root` with each entity reference (XHTML's, which the parser leaves unresolved:
    it reads no DTD) replaced by its characters; unknown ones stay."""
    for entity in list(root.iter(etree.Entity)):
        characters = html5.get(str(entity.name) + ";")
        parent = entity.getparent()
        if characters is None or parent is None:
            continue
        text = characters + (entity.tail or "")
        previous = entity.getprevious()
        if previous is not None:
            previous.tail = (previous.tail or "") + text
        else:
            parent.text = (parent.text or "") + text
        parent.remove(entity)
    return root


def _manifest(root: etree._Element, opf: str) -> list[tuple[str, str]]:
    """(member, media type) of each manifest item, chapters in spine order first."""
    folder = posixpath.dirname(opf)
    items: dict[str, tuple[str, str]] = {}
    for item in root.iter(_OPF_NS + "item"):
        href = unquote(item.get("href", "").split("#")[0])
        member = posixpath.normpath(posixpath.join(folder, href)) if href else ""
        items[item.get("id", "")] = (member, item.get("media-type", ""))
    spine = [ref.get("idref", "") for ref in root.iter(_OPF_NS + "itemref")]
    ordered = [items[i] for i in dict.fromkeys(spine) if i in items]
    rest = [v for v in items.values() if v not in ordered]
    return list(dict.fromkeys(ordered + rest))
