"""Plain text (.txt) and HTML (.html, .htm) files, as /translate_file has always read them.

- .txt: each non-blank line is one text; blank lines and line breaks stay.
- .html: the blocks of core/markup.py (the `format=html` rules of /translate: one
  text per paragraph or sentence, its inline tags as tag pairs that land on the
  translated words; tags, attributes, code and `translate="no"` kept as spelled),
  all of the file's blocks queued together.
"""

from __future__ import annotations

from collections.abc import Sequence

from seq2serve.server.core.documents.base import Document, decode_utf8
from seq2serve.server.core.markup import extract


class TextDocument(Document):
    def __init__(self, name: str, data: bytes) -> None:
        super().__init__(name, "text/plain")
        self.lines = decode_utf8(data, name).split("\n")
        self._wanted = [i for i, line in enumerate(self.lines) if line.strip()]
        self._texts = [self.lines[i] for i in self._wanted]
        self.tally.entries = len(self._texts)

    @property
    def texts(self) -> Sequence[str]:
        return self._texts

    def write(self, translations: Sequence[str | None]) -> bytes:
        self._check(translations)
        lines = list(self.lines)
        for i, text in zip(self._wanted, translations, strict=True):
            if text is None:
                self.tally.skipped += 1
            else:
                lines[i] = text
                self.tally.filled += 1
        return "\n".join(lines).encode("utf-8")


class HtmlDocument(Document):
    def __init__(self, name: str, data: bytes) -> None:
        super().__init__(name, "text/html")
        self.document = extract(decode_utf8(data, name))
        self.tally.entries = len(self.document.texts)

    @property
    def texts(self) -> Sequence[str]:
        return self.document.texts

    def write(self, translations: Sequence[str | None]) -> bytes:
        self._check(translations)
        self.tally.filled = sum(t is not None for t in translations)
        self.tally.skipped = len(translations) - self.tally.filled
        # A block left as it was is its own translation: markup.py puts it back as spelled.
        filled = [source if t is None else t
                  for source, t in zip(self.document.texts, translations, strict=True)]
        return self.document.render(filled).encode("utf-8")
