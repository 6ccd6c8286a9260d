"""Whole files: gettext catalogs, XLIFF, subtitles, plain text, HTML, office documents
and e-books.

`read_document(name, data, target)` reads a file by its name's suffix into a
`Document` (the texts it asks to have translated, and how to write it back);
`translate_document` (in `queueing.py`) sends those texts through any
translate function, every chunk of the file queued together, and writes the
file. The formats: `gettext.py` (.po, .pot), `xliff.py` (.xlf, .xliff: 1.2 and
2.x), `srt.py` (.srt), `text.py` (.txt, .html, .htm), `office.py` (.docx, .pptx),
`opendocument.py` (.odt, .odp), `epub.py` (.epub), `spreadsheet.py` (.xlsx, .ods);
the zipped ones share `package.py` (the archive read as untrusted input), `limits.py`
(the `Limits`, counted while a file is read, every format), `core/inline.py`
(a paragraph as one text, its formatting as tags) and `mixed.py` (text between
inline elements: ODF and XHTML). Used by the HTTP
`/translate_file` (over the core's `Translator`, `service.py`) and by
`seq2serve translate-file` (over gRPC).
"""

from __future__ import annotations

from pathlib import PurePath

from seq2serve.server.core.documents import epub, office, opendocument, spreadsheet
from seq2serve.server.core.documents.base import (
    Document,
    DocumentError,
    DocumentTooLarge,
    Tally,
)
from seq2serve.server.core.documents.epub import read_epub
from seq2serve.server.core.documents.gettext import GettextDocument
from seq2serve.server.core.documents.limits import (
    DEFAULT_LIMITS,
    Limits,
    check_file_bytes,
    prescan,
)
from seq2serve.server.core.documents.office import read_docx, read_pptx
from seq2serve.server.core.documents.opendocument import read_odp, read_odt
from seq2serve.server.core.documents.spreadsheet import read_ods, read_xlsx
from seq2serve.server.core.documents.srt import SubtitleDocument
from seq2serve.server.core.documents.text import HtmlDocument, TextDocument
from seq2serve.server.core.documents.xliff import XliffDocument
from seq2serve.server.core.errors import lone_surrogate

__all__ = ["DEFAULT_LIMITS", "SUFFIXES", "Document", "DocumentError", "DocumentTooLarge",
           "Limits", "Tally", "media_type", "read_document"]

# LibreTranslate's `supportedFilesFormat` spelling: the suffix with its dot.
SUFFIXES = (".txt", ".html", ".htm", ".po", ".pot", ".xliff", ".xlf", ".srt", ".docx", ".pptx",
            ".odt", ".odp", ".epub", ".xlsx", ".ods")
# The zipped formats: their reader and the media type of the file written.
_PACKAGES = {".docx": (read_docx, office.DOCX_MEDIA_TYPE),
             ".pptx": (read_pptx, office.PPTX_MEDIA_TYPE),
             ".odt": (read_odt, opendocument.ODT_MEDIA_TYPE),
             ".odp": (read_odp, opendocument.ODP_MEDIA_TYPE),
             ".epub": (read_epub, epub.MEDIA_TYPE),
             ".xlsx": (read_xlsx, spreadsheet.XLSX_MEDIA_TYPE),
             ".ods": (read_ods, spreadsheet.ODS_MEDIA_TYPE)}


def read_document(name: str, data: bytes, target: str, overwrite: bool = False,
                  limits: Limits = DEFAULT_LIMITS) -> Document:
    """The file `name` (its suffix says the format) read for translation into `target`;
    `overwrite` retranslates entries that are translated already (formats with entries
    that can be: .po, .xliff); `limits` bound what a zipped format may unpack to, and
    what any format may ask to have translated (DocumentTooLarge past them)."""
    base = PurePath(name).name
    suffix = PurePath(base).suffix.lower()
    check_file_bytes(base[:64], len(data), limits)
    document: Document
    if suffix in _PACKAGES:
        document = _PACKAGES[suffix][0](base, data, target, limits)
    else:
        # A package counts as it inflates (package.py); the others are counted in their
        # bytes before their parser builds anything, then exactly once read.
        prescan(base[:64], suffix, data, limits)
        document = _read(base, data, target, overwrite)
        if len(document.texts) > limits.paragraphs:
            raise DocumentTooLarge(f"{base[:64]} has {len(document.texts)} texts to "
                                   f"translate; the limit is {limits.paragraphs}",
                                   "paragraphs")
        characters = sum(len(text) for text in document.texts)
        if characters > limits.characters:
            raise DocumentTooLarge(f"{base[:64]} has {characters} characters of text to "
                                   f"translate; the limit is {limits.characters}",
                                   "characters")
    # A format's own escapes or declared charset (a catalog in `unicode_escape`) can
    # still yield a lone surrogate, which no translation could encode.
    for i, text in enumerate(document.texts):
        if (at := lone_surrogate(text)) is not None:
            raise DocumentError(f"{base[:64]} is not valid Unicode: text {i} has a lone "
                                f"surrogate at character {at}")
    return document


def _read(base: str, data: bytes, target: str, overwrite: bool) -> Document:
    suffix = PurePath(base).suffix.lower()
    if suffix in (".po", ".pot"):
        return GettextDocument(base, data, target, overwrite)
    if suffix in (".xliff", ".xlf"):
        return XliffDocument(base, data, target, overwrite)
    if suffix == ".srt":
        return SubtitleDocument(base, data)
    if suffix in (".html", ".htm"):
        return HtmlDocument(base, data, target)
    if suffix == ".txt":
        return TextDocument(base, data)
    raise DocumentError(f"file format not supported: {suffix[:16] or base[:64]!r}; "
                        f"supported: {', '.join(SUFFIXES)}")


def media_type(name: str) -> str:
    """The media type a translated file is served as."""
    suffix = PurePath(name).suffix.lower()
    kind = {".po": "text/x-gettext-translation", ".xliff": "application/xliff+xml",
            ".xlf": "application/xliff+xml", ".srt": "application/x-subrip",
            ".html": "text/html", ".htm": "text/html",
            **{s: kind for s, (_, kind) in _PACKAGES.items()}}.get(suffix, "text/plain")
    return f"{kind}; charset=utf-8" if kind.startswith("text/") else kind
