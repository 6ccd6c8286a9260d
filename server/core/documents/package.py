"""Zipped XML packages (Office Open XML, OpenDocument, EPUB), read as untrusted input.

`Package` opens an upload as a zip archive within `Limits` (limits.py: members, bytes
each member inflates to, counted while inflating, not taken from the header alone).
A member asked for as a part is counted while it is inflated (`XmlCounter`: its XML
elements, paragraphs and characters, all parts together, refused at the first limit
passed, before any tree is built) and only then parsed, with a parser that resolves
no entity, reads no DTD, reaches no network and keeps libxml2's size limits
(`huge_tree` off); a member with a DOCTYPE that declares anything (`<!ENTITY`) is
refused outright. `PackageDocument` is the `Document` every zipped format shares: its
paragraphs (`inline.Paragraph`) are the texts, and `write` puts the changed XML
members back into a copy of the archive, every other member copied unchanged and in
order, the `mimetype` member (ODF, EPUB) first and stored, as both standards require.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from lxml import etree

from seq2serve.server.core.documents.base import Document, DocumentError, DocumentTooLarge
from seq2serve.server.core.documents.limits import (
    DECLARES,
    DEFAULT_LIMITS,
    Counts,
    Limits,
    XmlCounter,
    safe_parser,
)
from seq2serve.server.core.inline import Paragraph

__all__ = ["DEFAULT_LIMITS", "Limits", "Package", "PackageDocument", "Part", "safe_parser",
           "serialize"]

_CHUNK = 1 << 16


class Package:
    """An uploaded zip archive, its members read within `limits`."""

    def __init__(self, name: str, data: bytes, kind: str, limits: Limits = DEFAULT_LIMITS):
        self.name = name
        self.kind = kind  # "a Word document": for messages
        self.limits = limits
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(data))
            self.infos = self.zip.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError):
            raise DocumentError(f"{name} is not {kind}: it is not a zip archive") from None
        if len(self.infos) > limits.members:
            raise DocumentTooLarge(f"{name} has {len(self.infos)} files in its archive; the "
                                   f"limit is {limits.members}", "members")
        declared = sum(info.file_size for info in self.infos)
        if declared > limits.unpacked_bytes:
            raise DocumentTooLarge(f"{name} unpacks to {declared} bytes; the limit is "
                                   f"{limits.unpacked_bytes} bytes", "unpacked_bytes")
        if any(info.flag_bits & 0x1 for info in self.infos):
            raise DocumentError(f"{name} is encrypted")
        self.names = {info.filename for info in self.infos}
        if len(self.names) != len(self.infos):
            raise DocumentError(f"{name} has two files of one name in its archive")
        self.inflated = 0  # bytes inflated so far, all members together
        self.counts = Counts(name, limits)  # the parts' elements, paragraphs, characters
        self._paragraphs = 0  # with text, found so far, all parts together

    def require(self, member: str) -> None:
        if member not in self.names:
            raise DocumentError(f"{self.name} is not {self.kind}: it has no {member}")

    def read(self, member: str) -> bytes:
        """A member's bytes, inflated in chunks: the header's size is not trusted."""
        return b"".join(self._chunks(member))

    def _chunks(self, member: str) -> Iterator[bytes]:
        info = self.zip.getinfo(member)
        size = 0
        try:
            with self.zip.open(info) as stream:
                while chunk := stream.read(_CHUNK):
                    size += len(chunk)
                    self.inflated += len(chunk)
                    if self.inflated > self.limits.unpacked_bytes:
                        raise DocumentTooLarge(
                            f"{self.name} unpacks to more than {self.limits.unpacked_bytes} "
                            f"bytes (at {member[:64]}); the limit is "
                            f"{self.limits.unpacked_bytes} bytes", "unpacked_bytes")
                    if size > info.file_size:
                        raise DocumentError(f"{self.name}: {member[:64]} unpacks to more "
                                            "than its archive says")
                    yield chunk
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError) as e:
            raise DocumentError(f"{self.name}: {member[:64]} cannot be unpacked: {e}") from None

    def part(self, member: str, find: Callable[[etree._Element], list[Paragraph]],
             paragraphs: frozenset[str] = frozenset()) -> Part:
        """A member parsed and the paragraphs `find` finds in it. It is counted while it
        is inflated (its elements named in `paragraphs`, Clark notation, as paragraphs)
        and parsed only if every count is within the limits."""
        data = self._counted(member, paragraphs)
        tree = self.parse(member, data)
        part = Part(member, data, tree, find(tree.getroot()))
        self._paragraphs += len(part.paragraphs)
        if self._paragraphs > self.limits.paragraphs:
            raise DocumentTooLarge(f"{self.name} has more than {self.limits.paragraphs} "
                                   f"paragraphs to translate; the limit is "
                                   f"{self.limits.paragraphs}", "paragraphs")
        return part

    def xml(self, member: str) -> etree._ElementTree:
        """A member that says where the parts are (an e-book's container, its OPF),
        counted and parsed as a part is."""
        return self.parse(member, self._counted(member, frozenset()))

    def _counted(self, member: str, paragraphs: frozenset[str]) -> bytes:
        counter = XmlCounter(self.counts, member, paragraphs)
        raw = bytearray()
        for chunk in self._chunks(member):
            counter.feed(chunk)
            raw += chunk
        counter.close()
        return bytes(raw)

    def parse(self, member: str, data: bytes) -> etree._ElementTree:
        """A member's bytes parsed as XML, safely (see the module's note)."""
        if DECLARES.search(data):
            raise DocumentError(f"{self.name}: {member[:64]} declares a DTD subset or "
                                "entities, which are not accepted")
        try:
            tree = etree.ElementTree(etree.fromstring(data, safe_parser()))
        except etree.XMLSyntaxError as e:
            raise DocumentError(f"{self.name}: {member[:64]} is not well-formed XML: "
                                f"{e}") from None
        # The byte pattern misses other encodings (UTF-16): what the parser read counts.
        dtd = tree.docinfo.internalDTD
        if dtd is not None and (any(True for _ in dtd.iterentities())
                                or any(True for _ in dtd.iterelements())):
            raise DocumentError(f"{self.name}: {member[:64]} declares a DTD subset or "
                                "entities, which are not accepted")
        return tree

    def write(self, changed: dict[str, bytes]) -> bytes:
        """The archive again: `changed` members replaced, the others copied unchanged,
        in their order; `mimetype` first and stored."""
        out = io.BytesIO()
        self.inflated = 0  # each member once more: within the same bound
        ordered = sorted(self.infos, key=lambda info: info.filename != "mimetype")
        with zipfile.ZipFile(out, "w") as archive:
            for info in ordered:
                data = changed.get(info.filename)
                if data is None:
                    data = self.read(info.filename)
                copy = zipfile.ZipInfo(info.filename, info.date_time)
                copy.compress_type = (zipfile.ZIP_STORED if info.filename == "mimetype"
                                      else info.compress_type)
                copy.external_attr = info.external_attr
                copy.create_system = info.create_system
                copy.comment = info.comment
                archive.writestr(copy, data)
            archive.comment = self.zip.comment
        return out.getvalue()


def serialize(original: bytes, tree: etree._ElementTree) -> bytes:
    """A parsed member written back with its own XML declaration (lxml would write its
    own spelling of it)."""
    declaration = re.match(rb"^\s*<\?xml[^>]*\?>\s*", original)
    body: bytes = etree.tostring(tree, encoding="UTF-8", xml_declaration=False)
    return (declaration.group(0) if declaration else b"") + body


@dataclass
class Part:
    """One XML member with paragraphs to translate."""

    member: str
    raw: bytes
    tree: etree._ElementTree
    paragraphs: list[Paragraph]
    # Edits the part once the document has a translation in it (the target language
    # marked where the format marks one), whether or not its own paragraphs changed;
    # says whether it changed anything (else the part stays byte for byte).
    mark: Callable[[etree._Element], bool] | None = None


class PackageDocument(Document):
    """A zipped package's paragraphs, in member and document order."""

    def __init__(self, name: str, media_type: str, package: Package,
                 parts: Sequence[Part]) -> None:
        super().__init__(name, media_type)
        self.package = package
        self.parts = list(parts)
        self._texts = [p.text for part in self.parts for p in part.paragraphs]
        characters = sum(len(t) for t in self._texts)
        if characters > package.limits.characters:
            raise DocumentTooLarge(f"{name} has {characters} characters of text to translate; "
                                   f"the limit is {package.limits.characters}", "characters")
        self.tally.entries = len(self._texts)

    @property
    def texts(self) -> Sequence[str]:
        return self._texts

    def write(self, translations: Sequence[str | None]) -> bytes:
        self._check(translations)
        it = iter(translations)
        changed: dict[str, bytes] = {}
        placed = 0
        for part in self.parts:
            done = [(p, next(it)) for p in part.paragraphs]
            # Innermost first: a text box's paragraphs are done before the paragraph
            # that anchors it moves its drawing.
            touched = False
            for paragraph, translation in reversed(done):
                if translation is None or not translation.strip():
                    self.tally.skipped += 1
                    continue
                placed += paragraph.fill(translation)
                self.tally.filled += 1
                touched = True
            if touched:
                changed[part.member] = serialize(part.raw, part.tree)
        for part in self.parts if self.tally.filled else ():
            if part.mark is not None and part.mark(part.tree.getroot()):
                changed[part.member] = serialize(part.raw, part.tree)
        if placed:
            self.tally.notes.append(f"{placed} formatting spans not found in their "
                                    "translation, put on the nearest word")
        return self.package.write(changed)
