"""Plain text (.txt) and HTML (.html, .htm) files, as /translate_file has always read them.

- .txt: each non-blank line is one text; blank lines and line breaks stay.
- .html: the blocks of core/markup.py (the `format=html` rules of /translate: one
  text per paragraph or sentence, its inline tags as tag pairs that land on the
  translated words; tags, attributes, code and `translate="no"` kept as spelled),
  all of the file's blocks queued together; the attributes meant for people (`alt`,
  `title`, `placeholder`, `aria-label`, the meta description) translated, each one
  text, and every language mark (`lang`) set to the target (attributes.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from seq2serve.server.core.documents.attributes import html_attributes, rewrite
from seq2serve.server.core.documents.base import Document, decode_utf8
from seq2serve.server.core.documents.language import target_language
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
    def __init__(self, name: str, data: bytes, target: str) -> None:
        super().__init__(name, "text/html")
        self.page = decode_utf8(data, name)
        self.document = extract(self.page)
        self.target = target_language(target)
        self.values = html_attributes(self.page)
        self.attributes = [v for v in self.values
                           if not v.language and any(c.isalpha() for c in v.text)]
        self._texts = (*self.document.texts, *(v.text for v in self.attributes))
        self.tally.entries = len(self._texts)

    @property
    def texts(self) -> Sequence[str]:
        return self._texts

    def write(self, translations: Sequence[str | None]) -> bytes:
        self._check(translations)
        self.tally.filled = sum(t is not None for t in translations)
        self.tally.skipped = len(translations) - self.tally.filled
        blocks = len(self.document.texts)
        document = self.document
        if self.tally.filled:
            # The attributes put into the page, which is read again: the blocks are the
            # same (no attribute rewritten here decides where one is).
            said = dict(zip(map(id, self.attributes), translations[blocks:], strict=True))
            page = rewrite(self.page, self.values, [
                (self.target.tag if self.target.replaces(v.text) else None) if v.language
                else said.get(id(v)) for v in self.values])
            document = extract(page)
            if len(document.texts) != blocks:
                raise RuntimeError(f"{self.name}: {blocks} blocks read, {len(document.texts)} "
                                   "after its attributes were translated")
        # A block left as it was is its own translation: markup.py puts it back as spelled.
        filled = [source if t is None else t
                  for source, t in zip(document.texts, translations[:blocks], strict=True)]
        return document.render(filled).encode("utf-8")
