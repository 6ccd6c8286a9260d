"""Small files that describe huge ones (the document limits' tests): made with the
libraries people make documents with, then their text part replaced."""

from __future__ import annotations

import io
import zipfile

from ebooklib import epub
from office_files import word_file

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def rezip(data: bytes, replace: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for info in source.infolist():
            archive.writestr(info.filename, replace.get(info.filename,
                                                        source.read(info.filename)))
    return out.getvalue()


def empty_paragraphs_docx(count: int) -> bytes:
    """A Word document (python-docx's) whose body is `count` empty paragraphs."""
    body = (f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:document '
            f'xmlns:w="{W_NS}"><w:body>').encode() + b"<w:p/>" * count \
        + b"</w:body></w:document>"
    return rezip(word_file(), {"word/document.xml": body})


def empty_paragraphs_epub(count: int) -> bytes:
    """An e-book (ebooklib's) whose one chapter is `count` empty paragraphs."""
    book = epub.EpubBook()
    book.set_identifier("hostile")
    book.set_title("Empty")
    book.set_language("en")
    chapter = epub.EpubHtml(title="One", file_name="one.xhtml", lang="en")
    chapter.content = "<html><body>" + "<p/>" * count + "</body></html>"
    book.add_item(chapter)
    book.spine = [chapter]
    book.add_item(epub.EpubNcx())
    buffer = io.BytesIO()
    epub.write_epub(buffer, book)
    return buffer.getvalue()
