"""Placeholders, inline markup and glossary terms: masked before translation, restored after.

What is masked (one regular expression, alternatives in priority order, so that
at one position the earlier kind wins and a `<a href="https://…">` is one tag,
not a tag with a URL in it): inline tags (`<b>`, `</b>`, `<br/>`, `<a href=…>`),
URLs, e-mail addresses, entities (`&amp;`, `&#39;`), printf (`%s`, `%1$s`,
`%.1f`, `%(name)s`, `%%`, Qt's `%1`, `%<PRIu64>`), `{{name}}`, `${VAR}`, braces
(`{0}`, `{name}`, `{name:>10}`, `{}`), `$VAR`, escapes (`\\n`, `\\t`, `&&`) and
file paths; then the request's glossary terms and do-not-translate terms, as
whole words in the text between those. Tags are found by a pattern rather than
by `html.parser`: a message is running text in which `<` may be a literal
less-than, and only a `<` followed by a tag name and a closing `>` is a tag.

The sentinel: span k of a text becomes `{k}` (numbered from 0 in source order).
The shipped models were trained on messages whose placeholders were kept
verbatim (docs/data-card-messages.md), so brace indices are what they learned
to copy: `{0}` to `{3}` are single vocabulary pieces, and
`bench/quality/placeholders.py` measures how often each candidate form comes
through (docs/placeholders.md).
Every brace placeholder of the source is masked too, so a `{k}` in the masked
text is always a sentinel.

Paired tags are masked as two sentinels around the text they hold; tags stay
paired and in order (the repair rule). The translator sends the model no pair:
core/formatting.py takes them off (`assemble` builds its text) and puts them back by
the alignment, `restore(..., placed=True)`.

The repair rule (`restore`), applied to the model's output before the sentinels
are expanded: a sentinel the source does not have is removed, and so is a
placeholder the model wrote out itself (it never saw one); a sentinel that
comes back more than once keeps its first occurrence; a missing one is inserted
right after the nearest sentinel that precedes it in the source and is present,
else right before the nearest following one that is present, else at the start
(when it began the source) or at the end (before closing punctuation unless it
ended the source); a closing tag that comes back before its opening tag swaps
places with it. So every source placeholder appears exactly as often as in the
source, and `Restored.repaired` says whether any of this was needed.

Keyboard accelerators (GTK `_`, Qt/KDE `&` before a letter, exactly one in the
text) are removed before translation and put back before a letter of the
translation: the first word that starts with the same letter (case-insensitive),
else the first occurrence of that letter, else the first letter of the translation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    TAG_OPEN = "tag_open"
    TAG_CLOSE = "tag_close"
    TAG_EMPTY = "tag_empty"  # self-closing or unpaired
    URL = "url"
    EMAIL = "email"
    ENTITY = "entity"
    PRINTF = "printf"
    DOUBLE_BRACE = "double_brace"
    SHELL = "shell"
    BRACE = "brace"
    ESCAPE = "escape"
    PATH = "path"
    TERM = "term"  # a glossary pair: source term -> target term
    KEEP = "keep"  # a do-not-translate term


_TRAIL = r"[^\s<>\"'.,;:!?)\]]"  # a URL does not end in sentence punctuation
# Nor does it hold `<`, `>` or a quote escaped (`&lt;URL:http://x.org&gt;` in HTML text):
# it ends where the character would, so a text's URLs are the same escaped or not.
_UNESC = r"(?!&(?:lt|gt|quot|apos|#0*3[49]|#[xX]0*2[27]);)"
_PATTERN = re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern in (
    ("tag", r"</?[A-Za-z][\w:.-]*(?:\s+[^<>]*?)?\s*/?>"),
    ("url", rf"\b(?:https?|ftp|file)://(?:{_UNESC}[^\s<>\"'])*{_UNESC}{_TRAIL}"
            rf"|\bwww\.[\w-]+(?:\.[\w-]+)+(?:[/?#](?:{_UNESC}[^\s<>\"'])*{_UNESC}{_TRAIL})?"),
    ("email", r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+"),
    ("entity", r"&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);"),
    ("printf", r"%%|%(?:\d+\$)?[-+0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|ll|[hlLqjzt]|I64|I)?"
               r"[diouxXeEfFgGaAcCsSpn]|%<PRI\w+>|%\(\w+\)[-+0#]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"
               r"|%\{\w+\}|%\d+"),
    ("double_brace", r"\{\{\s*[\w.-]+\s*\}\}"),
    ("shell", r"\$\{\w+\}|\$[A-Za-z_]\w*"),
    ("brace", r"\{[\w.]*(?:[:!][^{}\s]*)?\}"),
    ("escape", r"\\[nrt\\\"']|&&"),
    ("path", r"(?<![\w.%/<])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+*-]*[\w@+*-]/?"),
)))
_TAG_NAME = re.compile(r"</?([A-Za-z][\w:.-]*)")
SENTINEL = re.compile(r"\{\s?(\d+)\s?\}")
_AMP_ACCEL = re.compile(r"(?<!&)&(?=[^\W\d_])(?![A-Za-z][A-Za-z0-9]*;)")
_CLOSING = ".!?…:;"
_GONE = "\x00"  # where an invented placeholder was, until the spaces around it are fixed
_TAGS = frozenset({Kind.TAG_OPEN, Kind.TAG_CLOSE, Kind.TAG_EMPTY})


def sentinel(index: int) -> str:
    return f"{{{index}}}"


@dataclass(frozen=True)
class Span:
    """One masked stretch of the source: where, what kind, and what goes back."""

    start: int
    end: int
    kind: Kind
    text: str  # as in the source
    replacement: str  # what the output gets: the text itself, or a glossary target
    partner: int | None = None  # the index of the other tag of a pair


@dataclass(frozen=True)
class Accelerator:
    marker: str  # "_" or "&"
    letter: str  # the letter it marked in the source


@dataclass(frozen=True)
class Masked:
    """A text as the model sees it: spans[k] is sentinel `{k}`."""

    text: str
    spans: tuple[Span, ...]
    accelerator: Accelerator | None = None
    source: str = ""  # the text the spans index (the input, less its accelerator)

    @property
    def changed(self) -> bool:
        return bool(self.spans) or self.accelerator is not None


@dataclass(frozen=True)
class Restored:
    text: str
    repaired: bool  # a sentinel was missing, repeated, unknown or out of order


@dataclass(frozen=True)
class Terms:
    """What a request protects besides placeholders: term pairs and kept terms."""

    pairs: tuple[tuple[str, str], ...] = ()  # (source term, target term)
    keep: tuple[str, ...] = ()  # never translated

    def __bool__(self) -> bool:
        return bool(self.pairs or self.keep)


def find(text: str) -> list[Span]:
    """The placeholders and inline tags of `text`, in order, tags paired."""
    spans: list[Span] = []
    for match in _PATTERN.finditer(text):
        body = match.group()
        if match.lastgroup == "tag":
            kind = (Kind.TAG_EMPTY if body.endswith("/>") else
                    Kind.TAG_CLOSE if body.startswith("</") else Kind.TAG_OPEN)
        else:
            kind = Kind(match.lastgroup or "")
        spans.append(Span(match.start(), match.end(), kind, match.group(), match.group()))
    return _pair_tags(spans)


def _pair_tags(spans: list[Span]) -> list[Span]:
    """Each closing tag pairs with the innermost open tag of its name; a tag left
    without a partner is a lone placeholder (TAG_EMPTY)."""
    partner: dict[int, int] = {}
    stack: list[tuple[str, int]] = []
    for i, span in enumerate(spans):
        if span.kind not in (Kind.TAG_OPEN, Kind.TAG_CLOSE):
            continue
        name = _TAG_NAME.match(span.text)
        tag = name[1].lower() if name else ""
        if span.kind is Kind.TAG_OPEN:
            stack.append((tag, i))
            continue
        for depth in range(len(stack) - 1, -1, -1):
            if stack[depth][0] == tag:
                opener = stack[depth][1]
                partner[opener], partner[i] = i, opener
                del stack[depth:]
                break
    out = []
    for i, span in enumerate(spans):
        if span.kind in (Kind.TAG_OPEN, Kind.TAG_CLOSE) and i not in partner:
            span = Span(span.start, span.end, Kind.TAG_EMPTY, span.text, span.replacement)
        elif i in partner:
            span = Span(span.start, span.end, span.kind, span.text, span.replacement, partner[i])
        out.append(span)
    return out


def _find_terms(text: str, taken: Sequence[Span], terms: Terms) -> list[Span]:
    """Whole-word occurrences of the terms outside `taken`, longest term first."""
    wanted = [(s, t, Kind.TERM) for s, t in terms.pairs if s] + \
             [(k, k, Kind.KEEP) for k in terms.keep if k]
    wanted.sort(key=lambda w: -len(w[0]))
    busy = [(s.start, s.end) for s in taken]
    found: list[Span] = []
    for source, target, kind in wanted:
        pattern = re.compile(rf"(?<!\w){re.escape(source)}(?!\w)")
        for match in pattern.finditer(text):
            if any(match.start() < e and s < match.end() for s, e in busy):
                continue
            busy.append((match.start(), match.end()))
            found.append(Span(match.start(), match.end(), kind, match.group(), target))
    return found


def split_accelerator(text: str) -> tuple[str, Accelerator | None]:
    """`text` without its keyboard accelerator marker, and the marker with its letter.

    `&` before a letter (not an entity, not `&&`; inside a word only before a
    lower-case letter) or `_` before a letter at a word's
    start, or inside a capitalized word (`Fi_le`), counts when it is the only one
    of its kind in the text; `file_name` and `MAX_SIZE` are identifiers."""
    # Inside a word only before a lower-case letter (`E&xit`): `R&D`, `AT&T` are names.
    amps = [m for m in _AMP_ACCEL.finditer(text)
            if m.start() == 0 or not text[m.start() - 1].isalnum() or text[m.end()].islower()]
    if len(amps) == 1:
        at = amps[0].start()
        return text[:at] + text[at + 1:], Accelerator("&", text[at + 1])
    if text.count("_") == 1:
        at = text.index("_")
        after = text[at + 1:at + 2]
        word = at
        while word > 0 and text[word - 1].isalpha():
            word -= 1
        # `_As` (a word's start) or `Fi_le` (inside a capitalized word, lower case around).
        inside = (word < at and text[word].isupper() and after.islower()
                  and text[word + 1:at] == text[word + 1:at].lower())
        if after.isalpha() and (word == at and (at == 0 or not text[at - 1].isalnum())
                                or inside):
            return text[:at] + text[at + 1:], Accelerator("_", after)
    return text, None


def mask(text: str, terms: Terms = Terms(), *, placeholders: bool = True) -> Masked:
    """`text` with each placeholder, tag and term replaced by its sentinel.

    With `placeholders` off only the terms and the paired tags are masked (and any
    literal `{k}`, which would otherwise read as a sentinel)."""
    accelerator = None
    if placeholders:
        text, accelerator = split_accelerator(text)
        found = find(text)
    else:
        # Paired tags are formatting, not placeholders: masked whatever `placeholders`
        # says, so that the words never depend on them (core/formatting.py).
        tags = _pair_tags([Span(s.start, s.end, s.kind, s.text, s.replacement)
                           for s in find(text) if s.partner is not None])
        if not tags and not terms:
            return Masked(text, (), None, text)
        inside = [(s.start, s.end) for s in tags]
        found = tags + [Span(m.start(), m.end(), Kind.BRACE, m.group(), m.group())
                        for m in SENTINEL.finditer(text)
                        if not any(a <= m.start() < b for a, b in inside)]
    merged = sorted([(s, i) for i, s in enumerate(found)]
                    + [(s, -1) for s in _find_terms(text, found, terms)],
                    key=lambda pair: pair[0].start)
    # Tag partners are indices into `found`: renumber them to the merged order.
    position = {i: k for k, (_, i) in enumerate(merged) if i >= 0}
    spans = tuple(Span(s.start, s.end, s.kind, s.text, s.replacement,
                       None if s.partner is None else position[s.partner])
                  for s, _ in merged)
    return assemble(text, spans, accelerator)[0]


def assemble(text: str, spans: Sequence[Span], accelerator: Accelerator | None = None,
             marks: Sequence[int] = ()) -> tuple[Masked, list[int]]:
    """`text` with spans[k] (in order, apart) replaced by sentinel `{k}`, and where each
    of `marks` (offsets of `text` outside every span) lands in the masked text: after
    the space `_padded` puts before a word, so a mark at a word's start stays there."""
    if not spans:
        return Masked(text, (), accelerator, text), list(marks)
    out: list[str] = []
    length, last = 0, 0
    landed: dict[int, int] = {}
    for k in range(len(spans) + 1):
        span = spans[k] if k < len(spans) else None
        end = span.start if span is not None else len(text)
        gap = _padded(text[last:end], spans[k - 1] if k else None, span)
        lead = 1 if gap[:1] == " " and text[last:last + 1] != " " else 0
        for mark in marks:
            if last <= mark <= end:
                landed.setdefault(mark, length + lead + mark - last)
        out.append(gap)
        length += len(gap)
        if span is not None:
            out.append(sentinel(k))
            length += len(sentinel(k))
            last = span.end
    return (Masked("".join(out), tuple(spans), accelerator, text),
            [landed.get(mark, length) for mark in marks])


def _padded(gap: str, before: Span | None, after: Span | None) -> str:
    """`gap` with a space between it and a tag it touches: a tag written against a
    word (`<b>Warning:</b>`) reads as part of it, and the word goes untranslated.
    `_glue` takes the space out again."""
    if before is not None and before.kind in _TAGS and gap[:1].isalnum():
        gap = " " + gap
    if after is not None and after.kind in _TAGS and gap[-1:].isalnum():
        gap = gap + " "
    return gap


def restore(masked: Masked, output: str, *, placed: bool = False) -> Restored:
    """The model's `output` for `masked.text` with every sentinel expanded, after
    the repair rule (module docstring) and the accelerator put back. `placed`: the
    paired tags were put around words by the alignment (core/formatting.py), not
    moved by the model, so the spaces beside them are the translation's own."""
    if not masked.changed:
        return Restored(output, False)
    text, repaired = repair(masked, output, placed=placed)
    if masked.accelerator is not None:
        text = place_accelerator(text, masked.accelerator)
    spans = masked.spans
    expanded = SENTINEL.sub(lambda m: spans[int(m[1])].replacement, text)
    return Restored(expanded, repaired)


def carry(masked: Masked, output: str) -> tuple[str, bool]:
    """A chain's first output, still masked, as its second model reads it: every
    sentinel exactly once (the repair rule), not yet expanded, the spaces `mask`
    put beside tags kept; and whether a repair was needed. The placeholders are
    protected once, before the first model, and put back after the last."""
    if not masked.spans:
        return output, False
    return repair(masked, output, glue=False)


def repair(masked: Masked, output: str, *, glue: bool = True,
           placed: bool = False) -> tuple[str, bool]:
    """`output` holding each sentinel of `masked` exactly once, tag pairs in order."""
    spans = masked.spans
    count = len(spans)
    seen: set[int] = set()
    repaired = False
    pieces: list[str | int] = []  # text and sentinel indices, in order
    last = 0
    for match in SENTINEL.finditer(output):
        pieces.append(output[last:match.start()])
        last = match.end()
        index = int(match[1])
        if index >= count or index in seen:
            repaired = True  # unknown or repeated: dropped, with the space before it
            if isinstance(pieces[-1], str) and output[last:last + 1] in ("", " ", ",", "."):
                pieces[-1] = pieces[-1].rstrip(" ")
            continue
        if match.group() != sentinel(index):
            repaired = True  # `{ 0}`: read as the sentinel, written back exactly
        seen.add(index)
        pieces.append(index)
    pieces.append(output[last:])
    # The model never saw the placeholders themselves: one it wrote out literally
    # (a `%1` of its own beside the sentinels) is invented, and goes.
    literal = sorted({s.text for s in spans if s.kind not in (Kind.TERM, Kind.KEEP)},
                     key=len, reverse=True)
    for k, piece in enumerate(pieces):
        if isinstance(piece, str) and any(t in piece for t in literal):
            for text in literal:
                piece = piece.replace(text, _GONE)
            pieces[k] = piece
            repaired = True
    for index in range(count):
        if index not in seen:
            repaired = True
            _insert(pieces, index, masked)
            seen.add(index)
    for index, span in enumerate(spans):
        if span.kind is Kind.TAG_OPEN and span.partner is not None:
            opened, closed = pieces.index(index), pieces.index(span.partner)
            if closed < opened:
                pieces[opened], pieces[closed] = span.partner, index
                repaired = True
    text = "".join(sentinel(p) if isinstance(p, int) else p for p in pieces)
    text = re.sub(f" ?{_GONE}+", "", text)  # with the space before it
    return (_glue(text, masked, placed) if glue else text), repaired


def _insert(pieces: list[str | int], index: int, masked: Masked) -> None:
    present = {p for p in pieces if isinstance(p, int)}
    before = [j for j in present if j < index]
    after = [j for j in present if j > index]
    if before:
        at = pieces.index(max(before)) + 1
        pieces[at:at] = [" ", index]
    elif after:
        at = pieces.index(min(after))
        pieces[at:at] = [index, " "]
    elif not masked.text[:masked.text.index(sentinel(index))].strip():
        pieces[0:0] = [index, " "]
    else:
        tail = "".join(p for p in pieces if isinstance(p, str))
        source_rest = masked.text[masked.text.index(sentinel(index)) + len(sentinel(index)):]
        stripped = tail.rstrip()
        closing = len(stripped) - len(stripped.rstrip(_CLOSING))
        if source_rest.strip() and closing and pieces and isinstance(pieces[-1], str):
            last = pieces[-1].rstrip()
            cut = len(last) - closing if len(last) >= closing else len(last)
            pieces[-1:] = [last[:cut], " ", index, last[cut:]]
        else:
            pieces.extend([" ", index])


def _glue(text: str, masked: Masked, placed: bool = False) -> str:
    """A tag written against its neighbour in the source (`<b>Warning:</b>`) is
    written against it in the output too: the space beside it goes (but beside a
    pair the alignment `placed`, which adds no space)."""
    source = masked.source
    for index, span in enumerate(masked.spans):
        if span.kind not in _TAGS or (placed and span.partner is not None):
            continue
        mark = re.escape(sentinel(index))
        if span.end < len(source) and not source[span.end].isspace():
            text = re.sub(rf"({mark})[ \t]+", r"\1", text)
        if span.start > 0 and not source[span.start - 1].isspace():
            text = re.sub(rf"[ \t]+({mark})", r"\1", text)
    return text


def place_accelerator(text: str, accelerator: Accelerator) -> str:
    """The marker before a letter of `text` (the rule in the module docstring)."""
    letter = accelerator.letter.lower()
    outside = _outside_sentinels(text)
    candidates = [i for i in outside if text[i].lower() == letter
                  and (i == 0 or not text[i - 1].isalnum())]
    candidates = candidates or [i for i in outside if text[i].lower() == letter]
    candidates = candidates or [i for i in outside if text[i].isalpha()]
    if not candidates:
        return text
    at = candidates[0]
    return text[:at] + accelerator.marker + text[at:]


def _outside_sentinels(text: str) -> list[int]:
    inside = {i for m in SENTINEL.finditer(text) for i in range(m.start(), m.end())}
    return [i for i in range(len(text)) if i not in inside]


def counts(text: str, spans: Iterable[Span]) -> dict[str, int]:
    """How often each span's replacement occurs in `text` (for checks and tests)."""
    return {s.replacement: text.count(s.replacement) for s in spans}
