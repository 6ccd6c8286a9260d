"""What an uploaded file may hold, counted while it is read, so that a small hostile file
(a .docx of two million empty paragraphs is 230 KB) is refused at the first limit it
passes, in milliseconds and without building what it describes.

`Limits` are the bounds (the `--max-document-*` settings, declared in
server/document_settings.py for the server and translate-file); `Counts` keeps the
running counts of one file, all its parts together, and raises `DocumentTooLarge`
(HTTP 413) naming the limit the moment a count passes it. XML is counted by
`XmlCounter`, a streaming parser (libxml2 through lxml's parser-target interface: no
tree is built) fed the member's bytes as they are inflated; the other formats by
`prescan`, over the upload's bytes before the format's own parser builds anything.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from lxml import etree

from seq2serve.server.core.documents.base import DocumentError, DocumentTooLarge
from seq2serve.server.document_settings import DocumentLimitSettings

_DECLARED = DocumentLimitSettings()  # the defaults, where the settings are declared


@dataclass(frozen=True)
class Limits:
    """How much an uploaded file may hold: the bounds on time and memory. Past any of
    them a file is refused with `DocumentTooLarge` (HTTP 413). The server and
    `seq2serve translate-file` take them from their settings (`Limits.of`)."""

    # The upload itself. Images in an office file are copied byte for byte and cost
    # nothing to translate: the limits below protect the server, this one the network.
    file_bytes: int = _DECLARED.max_document_bytes
    members: int = _DECLARED.max_document_members  # files in the archive
    unpacked_bytes: int = _DECLARED.max_document_unpacked_bytes  # all members inflated
    # XML elements of the parts read for translation (an HTML tag, a line of a text
    # file, count as one): what a parsed tree costs, about 150 bytes each.
    elements: int = _DECLARED.max_document_elements
    # Characters of text to translate in the file (any format).
    characters: int = _DECLARED.max_document_characters
    # Texts to translate (any format); in a package, its paragraph elements, empty or
    # not, counted as read. About 2 KB of memory each while translated.
    paragraphs: int = _DECLARED.max_document_paragraphs

    @classmethod
    def of(cls, settings: DocumentLimitSettings) -> Limits:
        return cls(**{bound: getattr(settings, name) for bound, name in SETTINGS.items()})


# Each bound and the setting it is (DocumentTooLarge.bound -> the flag to name).
SETTINGS = {"file_bytes": "max_document_bytes", "members": "max_document_members",
            "unpacked_bytes": "max_document_unpacked_bytes",
            "elements": "max_document_elements", "characters": "max_document_characters",
            "paragraphs": "max_document_paragraphs"}
DEFAULT_LIMITS = Limits()
DEFAULT_IN_FLIGHT = 4  # documents read or translated at once (the document jobs' workers)


class Counts:
    """One file's counts so far; each `add_*` raises at the first limit passed."""

    def __init__(self, name: str, limits: Limits) -> None:
        self.name = name
        self.limits = limits
        self.elements = 0
        self.paragraphs = 0
        self.characters = 0

    def add_element(self, where: str, what: str = "XML elements") -> None:
        self.elements += 1
        if self.elements > self.limits.elements:
            raise self._past(what, "elements", where)

    def add_paragraph(self, where: str) -> None:
        self.paragraphs += 1
        if self.paragraphs > self.limits.paragraphs:
            raise self._past("paragraphs", "paragraphs", where)

    def add_characters(self, count: int, where: str) -> None:
        self.characters += count
        if self.characters > self.limits.characters:
            raise self._past("characters of text", "characters", where)

    def _past(self, what: str, bound: str, where: str) -> DocumentTooLarge:
        at = f" (at {where[:64]})" if where else ""
        limit = getattr(self.limits, bound)
        return DocumentTooLarge(f"{self.name} has more than {limit} {what}{at}; the limit "
                                f"is {limit} {what}", bound)


# A DOCTYPE with an internal subset (`[ ... ]`) or any entity declaration: never in
# an office file, and how entity expansion ("billion laughs") and external entities
# get in.
DECLARES = re.compile(rb"<!DOCTYPE[^>\[]*\[|<!ENTITY", re.IGNORECASE)
_OVERLAP = 256  # bytes of the previous chunk searched again: a pattern across two chunks
# How an XML document's first bytes say it is UTF-16 or UTF-32 (XML 1.0, appendix F),
# where the byte pattern above would not see a declaration.
_WIDE = ((codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF32_LE, "utf-32-le"),
         (b"\0\0\0<", "utf-32-be"), (b"<\0\0\0", "utf-32-le"),
         (codecs.BOM_UTF16_BE, "utf-16-be"), (codecs.BOM_UTF16_LE, "utf-16-le"),
         (b"\0<\0?", "utf-16-be"), (b"<\0?\0", "utf-16-le"))


def safe_parser(**options: object) -> etree.XMLParser:
    """libxml2 resolving no entity, reading no DTD, reaching no network and keeping its
    size limits (`huge_tree` off)."""
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                           dtd_validation=False, huge_tree=False, remove_blank_text=False,
                           **options)


class _Target:
    """lxml parser target: counts as libxml2 reads, builds nothing."""

    def __init__(self, counts: Counts, member: str, paragraphs: frozenset[str]) -> None:
        self.counts, self.member, self.paragraphs = counts, member, paragraphs

    def start(self, tag: str, attrib: object, nsmap: object = None) -> None:
        self.counts.add_element(self.member)
        if tag in self.paragraphs:
            self.counts.add_paragraph(self.member)

    def data(self, text: str) -> None:
        # Layout between elements (indentation) is not text to translate.
        if not text.isspace():
            self.counts.add_characters(len(text), self.member)

    def close(self) -> None:
        return None


class XmlCounter:
    """One XML member's bytes fed as they come: counted into `counts` (the paragraphs
    are the elements named in `paragraphs`, Clark notation), refused at once if it
    declares a DTD subset or entities."""

    def __init__(self, counts: Counts, member: str, paragraphs: frozenset[str] = frozenset()):
        self.counts, self.member = counts, member
        self.parser = safe_parser(target=_Target(counts, member, paragraphs))
        self._tail = b""
        self._decoder: codecs.IncrementalDecoder | None = None
        self._started = False

    def feed(self, chunk: bytes) -> None:
        if not self._started:
            self._started = True
            encoding = next((e for mark, e in _WIDE if chunk.startswith(mark)), None)
            if encoding is not None:
                self._decoder = codecs.getincrementaldecoder(encoding)("replace")
        seen = chunk if self._decoder is None else self._decoder.decode(chunk).encode()
        if DECLARES.search(self._tail + seen):
            raise DocumentError(f"{self.counts.name}: {self.member[:64]} declares a DTD "
                                "subset or entities, which are not accepted")
        self._tail = seen[-_OVERLAP:]
        try:
            self.parser.feed(chunk)
        except etree.XMLSyntaxError as e:
            raise self._malformed(e) from None

    def close(self) -> None:
        try:
            self.parser.close()
        except etree.XMLSyntaxError as e:
            raise self._malformed(e) from None

    def _malformed(self, error: etree.XMLSyntaxError) -> DocumentError:
        return DocumentError(f"{self.counts.name}: {self.member[:64]} is not well-formed "
                             f"XML: {error}")


# Per format, what stands for one parsed piece (an element, a tag, a line) and one text
# to translate, counted in the upload's bytes before the format's parser runs: the
# parsers build the whole file (translate-toolkit's units, a list of lines, the HTML
# splitter's events), each piece some 50-2000 bytes of memory.
_LINE = (re.compile(rb"\n"), "lines")
_TAG = (re.compile(rb"<[A-Za-z!?/]"), "tags")
_PIECES = {".txt": _LINE, ".srt": _LINE, ".po": _LINE, ".pot": _LINE, ".html": _TAG,
           ".htm": _TAG}
_TEXTS = {".txt": re.compile(rb"^[ \t\r\f\v]*[^\s]", re.MULTILINE),
          ".srt": re.compile(rb"-->"),
          ".po": re.compile(rb"^(?:#~\s*)?msgid\b", re.MULTILINE),
          ".pot": re.compile(rb"^(?:#~\s*)?msgid\b", re.MULTILINE)}
_XML = (".xliff", ".xlf")
_CHUNK = 1 << 16


def check_file_bytes(name: str, size: int, limits: Limits) -> None:
    if size > limits.file_bytes:
        raise DocumentTooLarge(f"{name} is {size} bytes; the limit is {limits.file_bytes} "
                               "bytes", "file_bytes")


def prescan(name: str, suffix: str, data: bytes, limits: Limits) -> None:
    """Refuse a file that is not zipped past `limits.elements` or `limits.paragraphs`,
    counting in its bytes and stopping at the first limit passed; XML (XLIFF) through
    `XmlCounter`. What is then read is counted exactly (`read_document`)."""
    counts = Counts(name, limits)
    if suffix in _XML:
        counter = XmlCounter(counts, "")
        try:
            for start in range(0, len(data), _CHUNK):
                counter.feed(data[start:start + _CHUNK])
        except DocumentTooLarge:
            raise
        except DocumentError:  # not well-formed: translate-toolkit says so in its words
            pass
        return
    if suffix in _PIECES:
        pieces, what = _PIECES[suffix]
        for _ in pieces.finditer(data):
            counts.add_element("", what)
    if (texts := _TEXTS.get(suffix)) is not None:
        for _ in texts.finditer(data):
            counts.add_paragraph("")
