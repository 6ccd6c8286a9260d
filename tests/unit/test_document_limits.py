"""The document limits hold while a file is read (server/core/documents/limits.py): a
small hostile file (a .docx of 1.9 million empty paragraphs is 230 KB, an .epub of a
million 21 KB) is refused at the first limit it passes, having inflated and counted
only what came before, and no tree of it is ever built; the other formats are counted
in their bytes before their parsers run."""

from __future__ import annotations

import pytest
from hostile_files import W_NS, empty_paragraphs_docx, empty_paragraphs_epub, rezip
from office_files import book_file, word_file

from seq2serve.server.core.documents import DocumentTooLarge, Limits, read_document
from seq2serve.server.core.documents.limits import DEFAULT_LIMITS
from seq2serve.server.core.documents.office import WORD_PARAGRAPHS, word_paragraphs
from seq2serve.server.core.documents.package import Package


def test_a_docx_of_two_million_empty_paragraphs_stops_at_the_limit() -> None:
    data = empty_paragraphs_docx(1_900_000)
    assert len(data) < 400_000  # small on the wire
    with pytest.raises(DocumentTooLarge, match=r"hostile.docx has more than 50000 paragraphs "
                                               r"\(at word/document.xml\); the limit is "
                                               r"50000 paragraphs"):
        read_document("hostile.docx", data, "de")
    # Where it stopped: the limit's count, and a few chunks of the member inflated.
    package = Package("hostile.docx", data, "a Word document")
    with pytest.raises(DocumentTooLarge):
        package.part("word/document.xml", word_paragraphs, WORD_PARAGRAPHS)
    assert package.counts.paragraphs == DEFAULT_LIMITS.paragraphs + 1
    assert package.counts.elements <= DEFAULT_LIMITS.paragraphs + 10
    member = package.zip.getinfo("word/document.xml").file_size
    assert package.inflated < member / 10, (package.inflated, member)


def test_an_epub_of_a_million_empty_paragraphs_stops_at_the_limit() -> None:
    data = empty_paragraphs_epub(1_000_000)
    assert len(data) < 100_000
    with pytest.raises(DocumentTooLarge, match=r"hostile.epub has more than 50000 paragraphs "
                                               r"\(at EPUB/one.xhtml\); the limit is 50000"):
        read_document("hostile.epub", data, "de")


def test_every_count_stops_at_its_own_limit_in_a_package() -> None:
    data = empty_paragraphs_docx(1000)
    with pytest.raises(DocumentTooLarge, match=r"more than 300 XML elements \(at "
                                               r"word/document.xml\); the limit is 300"):
        read_document("a.docx", data, "de", limits=Limits(elements=300))
    # The characters of a paragraph's text, counted before the paragraph is built.
    text = rezip(word_file(), {"word/document.xml": (
        f'<w:document xmlns:w="{W_NS}"><w:body><w:p><w:r><w:t>'
        + "word " * 5000 + "</w:t></w:r></w:p></w:body></w:document>").encode()})
    with pytest.raises(DocumentTooLarge, match="more than 1000 characters of text"):
        read_document("a.docx", text, "de", limits=Limits(characters=1000))
    # Books of ordinary size still read.
    assert read_document("b.epub", book_file(), "de").texts


@pytest.mark.parametrize(("name", "data", "message"), [
    ("a.txt", b"x\n" * 2000, "a.txt has more than 1000 lines; the limit is 1000 lines"),
    ("a.txt", b"\n" * 2000, "a.txt has more than 1000 lines"),
    ("a.srt", b"\n" * 2000, "a.srt has more than 1000 lines"),
    ("a.po", b'msgid "a"\nmsgstr ""\n\n' * 400, "a.po has more than 1000 lines"),
    ("a.html", b"<p></p>" * 600, "a.html has more than 1000 tags"),
    ("a.xlf", b'<xliff version="1.2"><file>' + b"<g/>" * 2000 + b"</file></xliff>",
     "a.xlf has more than 1000 XML elements"),
])
def test_the_other_formats_are_counted_before_they_are_parsed(name: str, data: bytes,
                                                              message: str) -> None:
    with pytest.raises(DocumentTooLarge, match=message):
        read_document(name, data, "de", limits=Limits(elements=1000))


def test_texts_of_the_other_formats_are_counted_before_they_are_parsed() -> None:
    with pytest.raises(DocumentTooLarge, match="a.txt has more than 10 paragraphs"):
        read_document("a.txt", b"line\n" * 11, "de", limits=Limits(paragraphs=10))
    with pytest.raises(DocumentTooLarge, match="a.po has more than 10 paragraphs"):
        read_document("a.po", b'msgid "a"\nmsgstr ""\n\n' * 11, "de",
                      limits=Limits(paragraphs=10))


def test_the_upload_itself_has_a_limit_of_its_own() -> None:
    assert DEFAULT_LIMITS.file_bytes > 4 * 1024 * 1024  # a .docx with a few photos
    with pytest.raises(DocumentTooLarge, match="a.docx is 4097 bytes; the limit is 4096 bytes"):
        read_document("a.docx", b"x" * 4097, "de", limits=Limits(file_bytes=4096))
