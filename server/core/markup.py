"""HTML fragments for `format=html` translation: the text to translate, and the markup kept.

`extract(html)` splits a fragment into the runs of text worth translating and the markup
around them; `Document.render(translations)` puts the fragment back together with each run
replaced by its translation. Only text is translated:

- Tags, attributes (including `alt` and `title`), comments, doctypes and processing
  instructions come back byte for byte as they were.
- Text inside `<code>`, `<pre>`, `<script>` and `<style>`, inside any element with
  `translate="no"` or with the class `notranslate`, and inside all their descendants, is
  kept as it is (a `translate="yes"` below such an element does not switch translation back
  on: being conservative leaves text untranslated, never garbles code). End tags the
  HTML standard leaves implicit are not inferred: `<p translate="no">a<p>b` keeps `b` too.
- A run is the text between two tags, trimmed of whitespace (`&nbsp;` and other entities
  that stand for whitespace count as whitespace); the whitespace stays in the markup around
  it, so the layout survives a translation that drops or adds spaces. Runs without a letter
  (`2024`, `|`, `&copy;`) are kept, not translated.

Inline tags split a sentence: `<b>Warning:</b> the disk is almost full` is two runs,
`Warning:` and `the disk is almost full`, each translated alone. Translating the block as
one unit would need placeholder tokens in the sentence for the tags, which our models were
never trained on and would drop, move or translate. Splitting at tags is what
LibreTranslate's argos-translate-html does in practice too: it translates each text node
alone (argostranslate.tags has a tag-injection path for short sentences with inline tags,
but its `depth()` never counts a tag level, so the path is not taken). The cost is a worse
translation of sentences broken by inline tags; the gain is markup that always comes back
intact.

Entities: a run's text is HTML-unescaped before translation (`&amp;` in the fragment is `&`
for the model) and each translation is escaped again (`&`, `<`, `>`), so a translation that
contains `<b>` shows that text and can never inject markup. A run whose translation equals
its text is put back in its original spelling, so the identity translation reproduces the
input exactly (`&#39;` stays `&#39;`), malformed input included.

Parsing uses `html.parser.HTMLParser` from the standard library: it is an event-based
tokenizer with no recursion, tolerant of any input (unclosed, stray and misnested tags;
nesting 10,000 deep is a list of that length here, not a call stack), and needs no
dependency. Each event's original text is the slice of the input from its start
(`getpos()`) to the next event's start, so every character of the input lands in exactly
one part or run, whatever the parser makes of it. Should the parser raise on some input it
cannot tokenize, the rest of the fragment from that point on is kept as markup.

Complexity: linear in the input for ordinary HTML (about 0.6 s per MB here), memory linear
in the input. The standard parser is quadratic on pathological input: 140 KB of
unterminated `<!--` take 3.4 s, 600 KB of `&#;` 5 s. So the caller bounds the input size
(at 20 KB the worst case is about 0.15 s) and, if it wishes, the number of runs.
Thread-safe: both functions are pure.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from html.parser import HTMLParser

# Elements whose content is code, data or preformatted text: never translated.
SKIPPED_ELEMENTS = frozenset({"code", "pre", "script", "style"})
# The class that marks content not to translate (the convention of web translators).
NO_TRANSLATE_CLASS = "notranslate"
# Elements that have no end tag and so are never open: they must not enter the stack.
VOID_ELEMENTS = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "meta",
    "param", "source", "track", "wbr",
})


@dataclass(frozen=True)
class Document:
    """A fragment split into translatable runs and the markup between them.

    `parts` has one more item than `texts`: the fragment is
    parts[0] + run 0 + parts[1] + run 1 + ... + parts[-1]. `sources` holds each run as it
    was spelled in the fragment (entities and all); `texts` the same runs unescaped, which
    is what the model translates.
    """

    texts: tuple[str, ...]
    sources: tuple[str, ...]
    parts: tuple[str, ...]

    def render(self, translations: Sequence[str]) -> str:
        """The fragment with run i replaced by translations[i] (escaped)."""
        if len(translations) != len(self.texts):
            raise ValueError(f"translations: {len(translations)} given for "
                             f"{len(self.texts)} text runs; one per run is needed")
        out = [self.parts[0]]
        for text, source, translation, after in zip(self.texts, self.sources, translations,
                                                    self.parts[1:], strict=True):
            # An unchanged run keeps its spelling, so identity round-trips exactly.
            out.append(source if translation == text else html.escape(translation, quote=False))
            out.append(after)
        return "".join(out)


class _Kind(str, Enum):
    """What one parser event is, for splitting."""

    DATA = "data"  # literal text: its characters are themselves
    REF = "ref"  # an entity or character reference: `&amp;`, `&#39;`
    MARKUP = "markup"  # a tag, comment, declaration, or text not to translate


@dataclass(frozen=True)
class _Event:
    start: int  # offset of the event's first character in the fragment
    kind: _Kind


class _Splitter(HTMLParser):
    """Records each event's start offset and kind; keeps a stack of the open elements."""

    def __init__(self, fragment: str) -> None:
        # Character references as separate events: their spelling is needed for trimming.
        super().__init__(convert_charrefs=False)
        self.events: list[_Event] = []
        # (tag, skipped) for each open element; skipped is inherited downwards.
        self._open: list[tuple[str, bool]] = []
        # How many of each tag are open: a stray end tag is rejected without a stack scan.
        self._open_count: Counter[str] = Counter()
        # getpos() is (line, column); offsets need where each line starts.
        self._line_starts = [0]
        newline = fragment.find("\n")
        while newline >= 0:
            self._line_starts.append(newline + 1)
            newline = fragment.find("\n", newline + 1)

    def position(self) -> int:
        """The offset of the construct being handled (getpos() points at its start)."""
        line, column = self.getpos()
        return self._line_starts[line - 1] + column

    def _skipping(self) -> bool:
        return bool(self._open) and self._open[-1][1]

    def _text(self, kind: _Kind) -> None:
        self.events.append(_Event(self.position(), _Kind.MARKUP if self._skipping() else kind))

    def _markup(self) -> None:
        self.events.append(_Event(self.position(), _Kind.MARKUP))

    def handle_data(self, data: str) -> None:
        self._text(_Kind.DATA)

    def handle_entityref(self, name: str) -> None:
        self._text(_Kind.REF)

    def handle_charref(self, name: str) -> None:
        self._text(_Kind.REF)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._markup()
        if tag in VOID_ELEMENTS:
            return
        skipped = self._skipping() or tag in SKIPPED_ELEMENTS or _marked_no_translate(attrs)
        self._open.append((tag, skipped))
        self._open_count[tag] += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # `<x/>` opens nothing (its content, if any, is not inside it for the parser).
        self._markup()

    def handle_endtag(self, tag: str) -> None:
        self._markup()
        if not self._open_count[tag]:
            return  # a stray end tag closes nothing
        # Close the innermost element of that name and everything opened inside it, as
        # browsers do for misnested tags. Each element is popped once: linear overall.
        while True:
            name, _ = self._open.pop()
            self._open_count[name] -= 1
            if name == tag:
                return

    def handle_comment(self, data: str) -> None:
        self._markup()

    def handle_decl(self, decl: str) -> None:
        self._markup()

    def handle_pi(self, data: str) -> None:
        self._markup()

    def unknown_decl(self, data: str) -> None:
        self._markup()


def _marked_no_translate(attrs: list[tuple[str, str | None]]) -> bool:
    for name, value in attrs:
        if value is None:
            continue
        if name == "translate" and value.strip().lower() == "no":
            return True
        if name == "class" and NO_TRANSLATE_CLASS in value.split():
            return True
    return False


def _parse(fragment: str) -> list[_Event]:
    """The events of the fragment, in order, starting at offset 0."""
    parser = _Splitter(fragment)
    try:
        parser.feed(fragment)
        # The parser's loop stops at some odd constructs (`&#;`) and resumes on the next
        # feed: feed nothing until it stops moving, so close() does not take the whole
        # rest as one text event.
        while True:
            before = parser.getpos()
            parser.feed("")
            if parser.getpos() == before:
                break
        parser.close()
    except AssertionError:  # how the stdlib tokenizer rejects some input (`<![x[`)
        # The rest of the fragment, from the construct it failed on, stays as it was.
        parser.events.append(_Event(parser.position(), _Kind.MARKUP))
    events = parser.events
    if not events or events[0].start != 0:
        events.insert(0, _Event(0, _Kind.MARKUP))
    return events


def extract(fragment: str) -> Document:
    """Split an HTML fragment into the text runs to translate and the markup around them."""
    events = _parse(fragment)
    texts: list[str] = []
    sources: list[str] = []
    parts: list[str] = []
    markup_from = 0  # where the markup not yet put into parts begins
    i = 0
    while i < len(events):
        if events[i].kind is _Kind.MARKUP:
            i += 1
            continue
        # A run: the longest sequence of text events.
        j = i
        while j < len(events) and events[j].kind is not _Kind.MARKUP:
            j += 1
        run_start = events[i].start
        run_end = events[j].start if j < len(events) else len(fragment)
        refs = {e.start: _next_start(events, k, len(fragment))
                for k, e in enumerate(events[i:j], start=i) if e.kind is _Kind.REF}
        begin, end = _trim(fragment, run_start, run_end, refs)
        text = html.unescape(fragment[begin:end])
        if any(ch.isalpha() for ch in text):
            parts.append(fragment[markup_from:begin])
            texts.append(text)
            sources.append(fragment[begin:end])
            markup_from = end
        i = j
    parts.append(fragment[markup_from:])
    return Document(texts=tuple(texts), sources=tuple(sources), parts=tuple(parts))


def _next_start(events: list[_Event], k: int, length: int) -> int:
    return events[k + 1].start if k + 1 < len(events) else length


def _trim(fragment: str, begin: int, end: int, refs: dict[int, int]) -> tuple[int, int]:
    """[begin, end) without leading and trailing whitespace, literal or as a reference.

    `refs` maps the start of each character reference in the run to its end.
    """
    ref_by_end = {stop: start for start, stop in refs.items()}
    while begin < end:
        if fragment[begin].isspace():
            begin += 1
        elif begin in refs and _is_space_ref(fragment[begin:refs[begin]]):
            begin = refs[begin]
        else:
            break
    while end > begin:
        if fragment[end - 1].isspace():
            end -= 1
        elif end in ref_by_end and _is_space_ref(fragment[ref_by_end[end]:end]):
            end = ref_by_end[end]
        else:
            break
    return begin, end


def _is_space_ref(reference: str) -> bool:
    decoded = html.unescape(reference)
    return decoded != reference and decoded.isspace()
