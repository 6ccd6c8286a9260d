"""Formatting never changes the words: paired tags are taken off, and put back by alignment.

A text's paired tags (`<b>…</b>`, inline.py's `<g1>…</g1>`, XLIFF's `<g id="1">…</g>`)
say how words look, not which words there are. Sent to the model as sentinels they
change the translation (the model drops or moves the words between them: "it is
<i>quite expensive</i> for" came back "es <i>ist</i> für"). So the model reads the text
without them (`Formatting.plain`: every other placeholder masked as `placeholders.mask`
masks it, numbered from 0, and nothing else changed): the words of a formatted
sentence's translation are those of its plain text's, token for token. Each pair then
goes around the target words the engine's alignment links to the source words it held
(`place`, links from core/alignment.py):

- Words are runs of letters and digits, a sentinel, or one other non-space character.
  A pair covers the first to the last target word linked to any source word inside it
  (a pair that holds every source word holds the whole translation).
- Where no target word is linked to the pair's words, it goes to the target word
  linked to the nearest source word that has one; where nothing is linked at all, to
  the word at the same relative place.
- The pairs stay well nested: a pair inside another in the source stays inside it;
  two that overlap in the target give up the overlap to the one placed first (source
  order), and one left with nothing nests in it.
- No space is added or removed: tags go at word edges.

A text written with escapes (`&amp;`, `&lt;`, `&gt;`, and no bare `&`, `<` or `>`: the
tagged text of inline.py, an XLIFF unit) is markup: the model reads those characters
themselves, and the translation's are escaped again around the tags.
"""

from __future__ import annotations

import html
import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from seq2serve.server.core.placeholders import (
    SENTINEL,
    Kind,
    Masked,
    Restored,
    Span,
    assemble,
    carry,
    repair,
    restore,
    sentinel,
)

Chars = tuple[int, int]  # [start, end) in a text
Link = tuple[Chars, Chars]  # target characters, the source characters they translate

_UNIT = re.compile(r"\{\s?\d+\s?\}|\w+|[^\w\s]")
_WORD = re.compile(r"\{\s?\d+\s?\}|\w+")
_ESCAPES = {"&amp;": "&", "&lt;": "<", "&gt;": ">"}
_BARE = re.compile(r"[&<>]")


@dataclass(frozen=True)
class _Pair:
    opening: int  # its opening tag's index in the full masked text
    closing: int
    start: int  # [start, end) in the plain text
    end: int


@dataclass(frozen=True)
class Formatting:
    """A text with paired tags: as masked whole (`full`), and as the model reads it."""

    full: Masked
    plain: Masked  # no paired tags; plain.spans[k] is full.spans[numbers[k]]
    numbers: tuple[int, ...]
    pairs: tuple[_Pair, ...]
    escaped: bool

    def place(self, output: str, links: Sequence[Link]) -> str:
        """The model's `output` for `plain.text` in the full masked text's terms: every
        pair's sentinels put around the words the links give it, the other sentinels
        renumbered as the full text numbers them."""
        target = [m.span() for m in _UNIT.finditer(output)]
        source = [m.span() for m in _UNIT.finditer(self.plain.text)]
        if not target:  # nothing to hold them (an empty translation): the pairs, empty
            pairs = "".join(sentinel(p.opening) + sentinel(p.closing) for p in self.pairs)
            return self._text(output) + pairs
        counts = _unit_links(links, target, source)
        ranges = _nested(self.pairs, [self._range(p, target, source, counts, output)
                                      for p in self.pairs])
        inserts: list[tuple[int, int, int, str]] = []  # (char, order, rank, sentinel)
        for rank, (pair, (first, last)) in enumerate(sorted(
                zip(self.pairs, ranges, strict=True),
                key=lambda item: (item[1][0], -item[1][1]))):
            begin, end = target[first][0], target[last][1]
            inserts.append((begin, 1, rank, sentinel(pair.opening)))
            inserts.append((end, 0, -rank, sentinel(pair.closing)))
        inserts.sort()
        out: list[str] = []
        at = 0
        for char, _, _, mark in inserts:
            out += [self._text(output[at:char]), mark]
            at = char
        out.append(self._text(output[at:]))
        return "".join(out)

    def _text(self, text: str) -> str:
        """Model output between tags, its sentinels numbered as the full text's."""
        out = []
        for i, part in enumerate(SENTINEL.split(text)):  # text, number, text, ...
            if i % 2:
                k = int(part)
                # One the plain text never had stays unknown (the repair rule drops it).
                out.append(sentinel(self.numbers[k] if k < len(self.numbers)
                                    else len(self.full.spans) + k))
            else:
                out.append(html.escape(part, quote=False) if self.escaped else part)
        return "".join(out)

    def _range(self, pair: _Pair, target: list[Chars], source: list[Chars],
               counts: list[Counter[int]], output: str) -> tuple[int, int]:
        """The first and last target word of a pair (unit indices)."""
        inside = {i for i, (a, b) in enumerate(source) if a < pair.end and pair.start < b}
        if inside and len(inside) == len(source):
            return 0, len(target) - 1
        linked = [set(c) for c in counts]
        hits = [t for t, s in enumerate(linked) if s & inside]
        if hits:
            first, last = _densest(hits[0], hits[-1], inside, counts)
            return _trimmed(first, last, inside, linked, source, self.plain.text)
        # No word of the translation is linked to the pair's: the nearest source word
        # that has a linked target word decides, else the same relative place.
        by_source: dict[int, list[int]] = {}
        for t, s in enumerate(linked):
            for i in s:
                by_source.setdefault(i, []).append(t)
        middle = _middle(pair, source)
        if by_source:
            nearest = min(by_source, key=lambda i: (abs(i - middle), i))
            near = by_source[nearest]
            at = near[len(near) // 2]
        else:
            at = round(pair.start / max(len(self.plain.text), 1) * (len(target) - 1))
        word = _nearest_word(output, target, at)
        return word, word

    def restore(self, output: str, links: Sequence[Link]) -> Restored:
        """`output` with the repair rule applied as to the plain text's (so a placeholder
        the model dropped goes where it goes without formatting), placed (above), then
        restored as any masked text: the accelerator, every sentinel expanded."""
        fixed, repaired = repair(self.plain, output)
        if fixed != output:
            where = char_map(output, fixed)
            links = [((min(m), max(m) + 1), source) for (a, b), source in links
                     if (m := [k for k in where[a:b] if k is not None])]
        restored = restore(self.full, self.place(fixed, links), placed=True)
        return Restored(restored.text, repaired or restored.repaired)


def char_map(old: str, new: str) -> list[int | None]:
    """For each character of `old`, where it is in `new` (None where the two differ)."""
    mapped: list[int | None] = [None] * len(old)
    for block in SequenceMatcher(None, old, new, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            mapped[block.a + k] = block.b + k
    return mapped


def split(masked: Masked) -> Formatting | None:
    """`masked` without its paired tags, or None when it has none."""
    if not any(s.partner is not None for s in masked.spans):
        return None
    full = _unescaped(masked) if _escaped(masked.source, masked.spans) else masked
    spans, text = full.spans, full.source
    kept: list[Span] = []
    numbers: list[int] = []
    pieces: list[str] = []
    where: dict[int, int] = {}  # a paired tag -> its offset in the text without them
    length, last = 0, 0
    for k, span in enumerate(spans):
        gap = text[last:span.start]
        pieces.append(gap)
        length += len(gap)
        last = span.end
        if span.partner is not None:
            where[k] = length
        else:
            numbers.append(k)
            kept.append(Span(length, length + len(span.text), span.kind, span.text,
                             span.replacement))
            pieces.append(span.text)
            length += len(span.text)
    pieces.append(text[last:])
    order = sorted(where)
    plain, landed = assemble("".join(pieces), kept, None, [where[k] for k in order])
    at = dict(zip(order, landed, strict=True))
    pairs = tuple(_Pair(k, partner, at[k], at[partner]) for k in order
                  if spans[k].kind is Kind.TAG_OPEN and (partner := spans[k].partner) is not None)
    return Formatting(full, plain, tuple(numbers), pairs, full is not masked)


def _unescaped(masked: Masked) -> Masked:
    """`masked` with `&amp;`, `&lt;` and `&gt;` as the characters they stand for."""
    text, spans = masked.source, masked.spans
    kept: list[Span] = []
    index: dict[int, int] = {}  # old span index -> new
    pieces: list[str] = []
    length, last = 0, 0
    for k, span in enumerate(spans):
        gap = text[last:span.start]
        pieces.append(gap)
        length += len(gap)
        last = span.end
        if span.kind is Kind.ENTITY and span.text in _ESCAPES:
            pieces.append(_ESCAPES[span.text])
            length += 1
            continue
        index[k] = len(kept)
        kept.append(span)
        pieces.append(span.text)
        kept[-1] = Span(length, length + len(span.text), span.kind, span.text,
                        span.replacement, span.partner)
        length += len(span.text)
    pieces.append(text[last:])
    renumbered = [Span(s.start, s.end, s.kind, s.text, s.replacement,
                       None if s.partner is None else index[s.partner]) for s in kept]
    return assemble("".join(pieces), renumbered, masked.accelerator)[0]


def model_text(masked: Masked) -> str:
    """What the model reads for `masked`: its text without paired tags."""
    formatting = split(masked)
    return masked.text if formatting is None else formatting.plain.text


def carry_over(masked: Masked, output: str) -> tuple[str, bool]:
    """A chain's first output as the second model reads it (placeholders.carry), in
    the terms of the text the first model read."""
    formatting = split(masked)
    return carry(masked if formatting is None else formatting.plain, output)


def _escaped(text: str, spans: Sequence[Span]) -> bool:
    """Whether the text is markup that spells `&`, `<`, `>` as escapes: it has one,
    and none of those characters bare between its placeholders and tags."""
    if not any(s.kind is Kind.ENTITY and s.text in _ESCAPES for s in spans):
        return False
    last = 0
    for span in spans:
        if _BARE.search(text, last, span.start):
            return False
        last = span.end
    return not _BARE.search(text, last)


def _unit_links(links: Sequence[Link], target: list[Chars],
                source: list[Chars]) -> list[Counter[int]]:
    """For each target unit, the source units linked to it, each with the number of
    links (a word of several tokens has one per token)."""
    linked: list[Counter[int]] = [Counter() for _ in target]
    for (t0, t1), (s0, s1) in links:
        sources = _overlapping(source, s0, s1)
        if not sources:
            continue
        for t in _overlapping(target, t0, t1):
            linked[t].update(sources)
    return linked


def _overlapping(units: list[Chars], start: int, end: int) -> list[int]:
    """The units that share a character with [start, end)."""
    out = []
    i = max(bisect_left(units, (start, start)) - 1, 0)
    while i < len(units) and units[i][0] < end:
        if units[i][1] > start:
            out.append(i)
        i += 1
    return out


def _densest(first: int, last: int, inside: set[int],
             counts: list[Counter[int]]) -> tuple[int, int]:
    """The run of target words in [first, last] with the most links into the pair less
    those out of it (the widest of the best): a stray link ("Wir" linked to "Sundays")
    does not stretch a span over words that translate others."""
    best = (0, 0, first, first)  # (score, width, start, end)
    score, start = 0, first
    for t in range(first, last + 1):
        into = sum(n for i, n in counts[t].items() if i in inside)
        weight = into - (sum(counts[t].values()) - into)
        if score < 0:
            score, start = 0, t
        score += weight
        if into and (score, t - start) > best[:2]:
            best = (score, t - start, start, t)
    _, _, begin, end = best
    while not any(i in inside for i in counts[begin]):  # a run starts and ends on a hit
        begin += 1
    return begin, end


def _trimmed(first: int, last: int, inside: set[int], linked: list[set[int]],
             source: list[Chars], text: str) -> tuple[int, int]:
    """A range's edge word given to the source word beside the pair when that word has
    no link of its own, the edge word none outside the pair, and the range more words
    than the pair: an article or a preposition ("La <b>maison</b>" -> "The house")
    whose target word the attention gave to the noun it agrees with."""
    anywhere: set[int] = set().union(*linked)

    def word(units: list[Chars], i: int, of: str) -> bool:
        return bool(_WORD.fullmatch(of[units[i][0]:units[i][1]]))

    def unlinked_word(i: int) -> bool:
        return 0 <= i < len(source) and i not in anywhere and word(source, i, text)

    def more_words(first: int, last: int) -> bool:
        words = sum(bool(linked[t]) for t in range(first, last + 1))
        return words > sum(word(source, i, text) for i in inside)

    if (first < last and unlinked_word(min(inside) - 1) and linked[first] <= inside
            and more_words(first, last)):
        first += 1
    if (first < last and unlinked_word(max(inside) + 1) and linked[last] <= inside
            and more_words(first, last)):
        last -= 1
    return first, last


def _middle(pair: _Pair, source: list[Chars]) -> int:
    """The source unit at the pair's place (the first one it holds, or the one after)."""
    return min(bisect_left(source, (pair.start, pair.start)), max(len(source) - 1, 0))


def _nearest_word(output: str, target: list[Chars], at: int) -> int:
    """The unit nearest `at` that is a word (a letter, digit or placeholder), else `at`."""
    words = [i for i, (a, b) in enumerate(target) if _WORD.fullmatch(output[a:b])]
    return min(words, key=lambda i: (abs(i - at), i)) if words else at


def _nested(pairs: Sequence[_Pair], wanted: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The wanted unit ranges made well nested, in source order: inside the pairs that
    hold a pair in the source; beside the others, or inside one whose range it cannot
    leave without losing every word."""
    placed: list[tuple[int, int]] = []
    for k, (pair, (first, last)) in enumerate(zip(pairs, wanted, strict=True)):
        for j in range(k):
            outer, (a, b) = pairs[j], placed[j]
            if outer.start <= pair.start and pair.end <= outer.end:  # held in the source
                first, last = max(first, a), min(last, b)
                if first > last:
                    first = last = min(max(wanted[k][0], a), b)
        for _ in range(len(placed)):  # each trim can meet another placed range
            clash = next(((a, b) for a, b in placed
                          if first <= b and a <= last  # overlapping
                          and not (a <= first and last <= b)  # inside it
                          and not (first <= a and b <= last)), None)  # around it
            if clash is None:
                break
            a, b = clash
            if first < a:
                last = a - 1
            elif last > b:
                first = b + 1
            else:  # nothing of its own: inside
                first, last = max(first, a), min(last, b)
        placed.append((first, last))
    return placed
