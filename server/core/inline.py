"""One paragraph of a rich document as ONE text, its inline formatting carried as tags.

A format module reads a paragraph into `Piece`s: runs of text, each with a style
(a hashable key that names its formatting: bold, a link, a span's style), and
opaque pieces (a tab, a line break, an image, a footnote mark, a bookmark, a
field), which are never translated and are put back as they were. The paragraph
goes to the model as one text:

    Please <g1>open the file</g1> and save.<x2/> Then close it.

The style with the most characters is the paragraph's own and goes untagged;
every stretch in another style is a `<gN>` pair, every opaque stretch inside the
text an empty `<xN/>` (opaque pieces before the first and after the last text
are not sent: they stay at the edges). Text is XML-escaped, so a `<` or `&` of
the document is never taken for a tag. The core sends the model the text without
its `<gN>` pairs (the words of the translation are the plain text's) and puts each
pair back around the words the alignment links to its words (core/formatting.py);
an `<xN/>` is a sentinel the model carries (core/placeholders.py). So the translation
says which words take which style: "Bitte <g1>öffnen Sie die Datei</g1> und speichern
Sie sie."

Reading the translation back: text outside any pair takes the paragraph's style,
text inside a pair that pair's (the innermost, if the model nested them). A span
that comes back empty, or not at all, is never dropped: its style goes to the
word nearest to where it came back, else to the word at the same relative place
in the translation as in the source; an opaque piece that does not come back goes
to the word boundary nearest that place.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

_TAG = re.compile(r"<(/?)([gx])(\d+)\s*(/?)>")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Piece:
    """A run of text in one style, or (text None) opaque content kept as it is."""

    text: str | None
    style: Hashable = None  # a style with `plain` true is unformatted text
    content: tuple[object, ...] = ()  # an opaque piece's elements, for its format


Write = Callable[[list[Piece]], None]


def has_letters(pieces: Sequence[Piece]) -> bool:
    return any(p.text is not None and any(c.isalpha() for c in p.text) for p in pieces)


class Paragraph:
    """A paragraph's pieces, the tagged text the model translates, and `write`, which
    puts a list of pieces back into the document (the format module's)."""

    def __init__(self, pieces: Sequence[Piece], write: Write) -> None:
        merged = _merge(pieces)
        # What comes before the first visible character and after the last stays put.
        visible = [i for i, p in enumerate(merged) if p.text is not None and p.text.strip()]
        first, last = visible[0], visible[-1]
        self.head, self.body, self.tail = merged[:first], merged[first:last + 1], merged[last + 1:]
        self._write = write
        # The paragraph's own style: unstyled text where there is any (the model sees
        # fewer tags), else the style with the most visible characters.
        weights: dict[Hashable, int] = {}
        for p in self.body:
            if p.text is not None:
                weights[p.style] = weights.get(p.style, 0) + sum(not c.isspace()
                                                                 for c in p.text)
        plain = [s for s, w in weights.items() if w and getattr(s, "plain", False)]
        self.style = plain[0] if plain else max(weights, key=lambda s: weights[s])
        # Spaces alone between styled words take the paragraph's style: no tags for them.
        self.body = _merge([Piece(p.text, self.style) if p.text is not None
                            and not p.text.strip() else p for p in self.body])
        self.tags: dict[int, Piece] = {}
        out: list[str] = []
        self._where: dict[int, float] = {}  # tag -> its relative place in the source
        length = sum(len(p.text or "") for p in self.body) or 1
        seen = 0
        for p in self.body:
            if p.text is not None and p.style == self.style:
                out.append(html.escape(p.text, quote=False))
            else:
                n = len(self.tags) + 1
                self.tags[n] = p
                self._where[n] = seen / length
                out.append(f"<x{n}/>" if p.text is None
                           else f"<g{n}>{html.escape(p.text, quote=False)}</g{n}>")
            seen += len(p.text or "")
        tagged = "".join(out)
        core = tagged.strip()
        start = tagged.index(core[0]) if core else 0
        self.before, self.after = tagged[:start], tagged[start + len(core):]
        self.text = core

    def fill(self, translation: str) -> int:
        """Put `translation` (of `text`) into the document; how many spans and opaque
        pieces had to be placed by position."""
        pieces, placed = self._read(translation.strip())
        self._write(self.head + pieces + self.tail)
        return placed

    def _read(self, translation: str) -> tuple[list[Piece], int]:
        chars: list[str] = []
        styles: list[Hashable] = []
        opaque: dict[int, list[Piece]] = {}  # char position -> opaque pieces before it
        spans: dict[int, tuple[int, int]] = {}  # tag -> [start, end) in chars
        stack: list[int] = []
        used: set[int] = set()
        at = 0
        for match in _TAG.finditer(translation):
            self._add(chars, styles, translation[at:match.start()], stack)
            at = match.end()
            closing, kind, number = match.group(1), match.group(2), int(match.group(3))
            piece = self.tags.get(number)
            if piece is None or (kind == "x") != (piece.text is None):
                continue  # not one of ours: dropped (the core never invents one)
            if kind == "x":
                if number not in used:
                    used.add(number)
                    opaque.setdefault(len(chars), []).append(piece)
            elif not closing and number not in used:
                used.add(number)
                stack.append(number)
                spans[number] = (len(chars), len(chars))
            elif closing and number in stack:
                stack.remove(number)
                spans[number] = (spans[number][0], len(chars))
        self._add(chars, styles, translation[at:], stack)
        for number in stack:  # never closed: to the end
            spans[number] = (spans[number][0], len(chars))
        placed = 0
        for number, piece in self.tags.items():
            if piece.text is None:
                if number not in used:
                    placed += 1
                    where = _word_start(chars, round(self._where[number] * len(chars)))
                    opaque.setdefault(where, []).append(piece)
                continue
            start, end = spans.get(number, (-1, -1))
            if start < 0 or not any(c.strip() for c in chars[start:end]):
                placed += 1
                near = start if start >= 0 else round(self._where[number] * len(chars))
                start, end = _nearest_word(chars, near)
                for i in range(start, end):
                    styles[i] = piece.style
        pieces = _pieces(html.unescape(self.before), chars, styles, opaque, self.style)
        if self.after:
            pieces.append(Piece(html.unescape(self.after), self.style))
        return _merge(pieces), placed

    def _add(self, chars: list[str], styles: list[Hashable], text: str,
             stack: list[int]) -> None:
        text = html.unescape(text)
        style = self.tags[stack[-1]].style if stack else self.style
        chars.extend(text)
        styles.extend([style] * len(text))


def _pieces(before: str, chars: list[str], styles: list[Hashable],
            opaque: dict[int, list[Piece]], style: Hashable) -> list[Piece]:
    """The characters cut into pieces where the style changes or opaque ones go."""
    out: list[Piece] = [Piece(before, style)] if before else []
    start = 0
    for i in range(len(chars) + 1):
        if i == len(chars) or i in opaque or (i > start and styles[i] != styles[start]):
            if i > start:
                out.append(Piece("".join(chars[start:i]), styles[start]))
            out.extend(opaque.get(i, ()))
            start = i
    return out


def _merge(pieces: Sequence[Piece]) -> list[Piece]:
    """Neighbours of one style joined into one piece, neighbouring opaque ones too."""
    out: list[Piece] = []
    for p in pieces:
        if p.text == "":
            continue
        if out and (p.text is None) == (out[-1].text is None) and (
                p.text is None or p.style == out[-1].style):
            last = out[-1]
            out[-1] = (Piece(None, None, last.content + p.content) if p.text is None
                       else Piece((last.text or "") + p.text, p.style))
        else:
            out.append(p)
    return out


def _words(chars: list[str]) -> list[tuple[int, int]]:
    return [m.span() for m in _WORD.finditer("".join(chars))]


def _nearest_word(chars: list[str], at: int) -> tuple[int, int]:
    """The word nearest to character position `at` (the whole text if it has none)."""
    words = _words(chars)
    if not words:
        return 0, len(chars)
    return min(words, key=lambda w: 0 if w[0] <= at < w[1] else min(abs(w[0] - at),
                                                                    abs(w[1] - at)))


def _word_start(chars: list[str], at: int) -> int:
    """Where an opaque piece placed by position goes: the word boundary (a word's start
    or end) nearest to `at`, or the end of a text without words."""
    bounds = [b for word in _words(chars) for b in word]
    return min(bounds, key=lambda b: abs(b - at)) if bounds else len(chars)
