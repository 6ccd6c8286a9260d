"""Long-input splitting for translation: lines and sentences in, the same whitespace out.

A model translates one sentence well and a page badly (it was trained on
sentences, and its positions end somewhere), so the service cuts a text into
sentences, translates them in the same batches as everything else and puts the
results back where the sentences were. The cut keeps every character that is
not sent for translation (indentation, the spaces between sentences, line
breaks of any style, blank lines between paragraphs), so reassembling with the
sentences unchanged gives the input back exactly.

Paragraphs are blank-line separated and a single line break is a break too: a
sentence never spans lines, because a translated sentence has no place to put
the source's line break back. Sentence boundaries inside a line come from
sentencex (Wikimedia's segmenter, per-language abbreviation lists: "e.g.",
"z.B.", "M. Dupont" do not end sentences).

That is the default (`Splitting.ON`, DeepL's split_sentences=1). A request may ask
for DeepL's other two: `NO_NEWLINES` (sentence ends only: a line break inside a
sentence stays inside its piece, as DeepL's "nonewlines" and its default for markup)
and `OFF` (no splitting: the text, its surrounding whitespace kept, is one piece).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import sentencex

# The characters str.splitlines() breaks on; "\r\n" first so that it stays one break.
_LINE_BREAK = re.compile(r"(\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029])")
# Clause ends inside a long sentence. ASCII punctuation needs a following space
# ("1,000" and "10:30" are not clause ends); CJK full-width punctuation has none.
_CLAUSE_BREAK = re.compile(r"(?<=[,;:])\s+|(?<=[\u3001\uff0c\uff1b\uff1a])\s*")
_WORD_BREAK = re.compile(r"\s+")


class Splitting(str, Enum):
    """Sentence splitting, as DeepL's `split_sentences` names its values."""

    ON = "1"  # at sentence ends and at every line break
    OFF = "0"  # none: the whole text is one piece
    NO_NEWLINES = "nonewlines"  # at sentence ends only; line breaks do not split


@dataclass(frozen=True)
class Segmented:
    """A text cut into parts; `"".join(parts)` is the text exactly.

    `piece_index` lists, in order, the parts to translate (the pieces): each is
    non-empty and has no leading or trailing whitespace. Every other part is
    whitespace (line breaks included) and is kept verbatim.
    """

    parts: tuple[str, ...]
    piece_index: tuple[int, ...]

    @property
    def pieces(self) -> tuple[str, ...]:
        """The texts to translate, in text order (none for a blank text)."""
        return tuple(self.parts[i] for i in self.piece_index)

    @property
    def original(self) -> str:
        return "".join(self.parts)


def segment(text: str, language: str, splitting: Splitting = Splitting.ON) -> Segmented:
    """Cut `text` into sentences (for `language`, e.g. "en" or "de-AT") and whitespace,
    at sentence ends and line breaks as `splitting` says."""
    code = _sentencex_language(language)
    builder = _Builder()
    if splitting is Splitting.OFF:
        builder.sentence(text)
        return builder.build()
    if splitting is Splitting.NO_NEWLINES:
        # sentencex reads the text with each line-break character as a space: the same
        # length, so its sentences' spans are the text's own, breaks and all.
        flat = _LINE_BREAK.sub(lambda m: " " * len(m.group()), text)
        start = 0
        for sentence in _sentences(flat, code):
            builder.sentence(text[start:start + len(sentence)])
            start += len(sentence)
        return builder.build()
    for part in _LINE_BREAK.split(text):
        if not part:
            continue
        if _LINE_BREAK.fullmatch(part):
            builder.gap(part)
            continue
        for sentence in _sentences(part, code):
            builder.sentence(sentence)
    return builder.build()


def reassemble(segmented: Segmented, translated: Sequence[str], partial: bool = False) -> str:
    """The text with each piece replaced by its translation, whitespace as it was.

    With `partial` (streaming), `translated` may hold only the first pieces; the
    text then ends right after the last of them, since the whitespace after a
    piece still being generated is not known to follow it yet.
    """
    count = len(segmented.piece_index)
    if len(translated) > count or (len(translated) < count and not partial):
        raise ValueError(f"expected {count} translated pieces, got {len(translated)}")
    parts = list(segmented.parts)
    for index, text in zip(segmented.piece_index, translated, strict=False):
        parts[index] = text
    if len(translated) < count:
        parts = parts[:segmented.piece_index[len(translated) - 1] + 1] if translated else []
    return "".join(parts)


def split_long(segmented: Segmented, count_tokens: Callable[[str], int],
               limit: int) -> Segmented:
    """Cut every piece longer than `limit` tokens into pieces of at most `limit`.

    Cuts go at clause ends (",", ";", ":") first, then between words, and only a
    word longer than the limit on its own (a URL, a language written without
    spaces) is cut between characters. The whitespace at a cut becomes a kept
    piece, so `reassemble` still restores the text exactly. `count_tokens` is
    the model's source tokenizer (special tokens included, so the limit is the
    model's own); a single character above the limit is left as it is.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    builder = _Builder()
    pieces = set(segmented.piece_index)
    for index, part in enumerate(segmented.parts):
        if index not in pieces:
            builder.gap(part)
        elif count_tokens(part) <= limit:
            builder.piece(part)
        else:
            _split(part, (_CLAUSE_BREAK, _WORD_BREAK), count_tokens, limit, builder)
    return builder.build()


class _Builder:
    """Collects parts, merging neighbouring whitespace into one kept part."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.piece_index: list[int] = []
        self._gap_open = False

    def gap(self, text: str) -> None:
        if not text:
            return
        if self._gap_open:
            self.parts[-1] += text
        else:
            self.parts.append(text)
            self._gap_open = True

    def piece(self, text: str) -> None:
        self.piece_index.append(len(self.parts))
        self.parts.append(text)
        self._gap_open = False

    def sentence(self, text: str) -> None:
        """A segmenter's sentence: its surrounding whitespace is kept, not translated."""
        core = text.strip()
        if not core:
            self.gap(text)
            return
        start = text.index(core)
        self.gap(text[:start])
        self.piece(core)
        self.gap(text[start + len(core):])

    def build(self) -> Segmented:
        return Segmented(tuple(self.parts), tuple(self.piece_index))


def _sentencex_language(language: str) -> str:
    # sentencex knows "en" but not "en-US" or "EN" (it would fall back to rules
    # without English abbreviations), so keep only the primary subtag.
    return re.split(r"[-_]", language.strip().lower(), maxsplit=1)[0]


def _sentences(line: str, language: str) -> list[str]:
    parts = list(sentencex.segment(language, line))
    # The rebuild-exactly promise rests on the segmenter returning every
    # character; a line it does not cover exactly is kept as one sentence.
    return parts if "".join(parts) == line else [line]


def _split(text: str, levels: tuple[re.Pattern[str], ...],
           count_tokens: Callable[[str], int], limit: int, builder: _Builder) -> None:
    """Pack the units between `levels[0]`'s breaks greedily into chunks within `limit`."""
    if not levels:
        _split_characters(text, count_tokens, limit, builder)
        return
    units: list[tuple[int, int]] = []  # (start, end) of the text between breaks
    start = 0
    for match in levels[0].finditer(text):
        if match.start() == len(text):
            continue  # a zero-width break after a final "，" cuts nothing off
        units.append((start, match.start()))
        start = match.end()
    units.append((start, len(text)))
    i = 0
    while i < len(units):
        # chunk = units[i:i + n], the most units that fit
        def fits(n: int, i: int = i) -> bool:
            return count_tokens(text[units[i][0]:units[i + n - 1][1]]) <= limit

        n = _most_that_fit(len(units) - i, fits)
        chunk = text[units[i][0]:units[i + n - 1][1]]
        if n == 1 and count_tokens(chunk) > limit:
            _split(chunk, levels[1:], count_tokens, limit, builder)
        else:
            builder.piece(chunk)
        if i + n < len(units):
            builder.gap(text[units[i + n - 1][1]:units[i + n][0]])
        i += n


def _split_characters(text: str, count_tokens: Callable[[str], int], limit: int,
                      builder: _Builder) -> None:
    while text:
        def fits(n: int, text: str = text) -> bool:
            return count_tokens(text[:n]) <= limit

        n = _most_that_fit(len(text), fits)
        builder.piece(text[:n])
        text = text[n:]


def _most_that_fit(available: int, fits: Callable[[int], bool]) -> int:
    """The largest n in [1, available] with fits(n), at least 1 (to make progress).

    Token counts grow with the text, near enough, so galloping then bisecting
    finds it in O(log n) tokenizer calls instead of one call per word; a long
    sentence of a capped-size input stays cheap.
    """
    low, step = 1, 1  # fits(low) is assumed: one unit is all we can do otherwise
    while low + step <= available and fits(low + step):
        low += step
        step *= 2
    high = min(available, low + step - 1)  # fits(low + step) failed or is out of range
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low
