"""HTML fragments for `format=html` translation: the text to translate, and the markup kept.

`extract(html)` splits a fragment into its blocks of text (one text per sentence
or paragraph, whatever inline tags run through it) and the markup around them;
`Document.render(translations)` puts the fragment back together with each block
replaced by its translation. Only text is translated:

- Tags, attributes (including `href`, `alt` and `title`), comments, doctypes and
  processing instructions come back as they were spelled: a block's inline tags are
  the fragment's own start and end tags, copied, never rewritten.
- Text inside `<code>`, `<pre>`, `<script>`, `<style>`, `<kbd>`, `<samp>`, `<var>`,
  inside any element with `translate="no"` or with the class `notranslate`, and inside
  all their descendants, is kept as it is (a `translate="yes"` below such an element
  does not switch translation back on: being conservative leaves text untranslated,
  never garbles code). End tags the HTML standard leaves implicit are not inferred:
  `<p translate="no">a<p>b` keeps `b` too.

Blocks (the whole-sentence way of the office formats, core/documents/inline.py):
block-level elements (`<p>`, `<li>`, `<td>`, headings, `<div>`, `<br>`, any element not
named below) separate texts; inline elements (`INLINE_ELEMENTS`: `<b>`, `<i>`, `<em>`,
`<strong>`, `<a>`, `<span>`, `<sub>`, `<sup>`, `<u>`, `<small>`, `<mark>` ...) ride inside
the sentence. "My name <b>is</b> Michael" is one text, `My name <g1>is</g1> Michael`, whose
tag pair the core takes off before the model (which reads "My name is Michael") and puts
back around the words the alignment links to "is" (core/formatting.py); `inline.Paragraph`
reads the translation back, and a span is never dropped. An image, a `<code>` or a
`translate="no"` span inside the sentence is an empty `<xN/>`: moved with its words, put
back byte for byte, inside the inline elements it was in. The style that covers most of
a block goes untagged, so a block in one style (`<li><b>Title</b></li>`) or with no inline
tags at all is its plain text, entities unescaped, as the model sees any text. A block
whose inline tags do not nest (`<b>a <i>b</b> c</i>`), cross a block boundary
(`<b>a<br>b</b>`), nest deeper than `MAX_INLINE_DEPTH` or number more than
`MAX_INLINE_TAGS` is split at its inline tags instead, each run of text alone: the markup
always comes back intact. The parser is `html.parser`'s, not lxml's: lxml would rewrite
a fragment (close its tags, quote its attributes, respell its entities); so this module
shares inline.py's reading of tagged translations with the office formats, not
mixed.py's tree walk.

- A block is trimmed of whitespace (`&nbsp;` and other entities that stand for whitespace
  count as whitespace); the whitespace stays in the markup around it, so the layout
  survives a translation that drops or adds spaces. Blocks without a letter (`2024`,
  `|`, `&copy;`) are kept, not translated.

Entities: a block's text is HTML-unescaped before translation (`&amp;` in the fragment is
`&` for the model; in a block with tags it stays `&amp;`, which the core masks and brings
back) and each translation is escaped again (`&`, `<`, `>`), so a translation that
contains `<b>` shows that text and can never inject markup. A block whose translation
equals its text is put back in its original spelling, so the identity translation
reproduces the input exactly (`&#39;` stays `&#39;`), malformed input included.

Parsing uses `html.parser.HTMLParser` from the standard library: it is an event-based
tokenizer with no recursion, tolerant of any input (unclosed, stray and misnested tags;
nesting 10,000 deep is a list of that length here, not a call stack), and needs no
dependency. Each event's original text is the slice of the input from its start
(`getpos()`) to the next event's start, so every character of the input lands in exactly
one part or block, whatever the parser makes of it. Should the parser raise on some input
it cannot tokenize, the rest of the fragment from that point on is kept as markup.

Complexity: linear in the input for ordinary HTML (about 2 s per MB here, where
splitting at every tag took 0.8 s: the blocks and their tagged texts cost the rest), memory
linear in the input. The standard parser is quadratic on pathological input: 140 KB of
unterminated `<!--` take 3.4 s, 600 KB of `&#;` 5 s. So the caller bounds the input size
(at 20 KB the worst case is about 0.15 s) and, if it wishes, the number of blocks.
`extract` is pure; a `Document` renders one translation at a time (not shared between
threads).
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from html.parser import HTMLParser

from seq2serve.server.core.inline import Paragraph, Piece, has_letters

# Elements whose content is code, data or preformatted text: never translated.
SKIPPED_ELEMENTS = frozenset({"code", "pre", "script", "style", "kbd", "samp", "var"})
# The class that marks content not to translate (the convention of web translators).
NO_TRANSLATE_CLASS = "notranslate"
# Elements that have no end tag and so are never open: they must not enter the stack.
VOID_ELEMENTS = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "meta",
    "param", "source", "track", "wbr",
})
# Elements that style the words they wrap inside a sentence (HTML's phrasing content
# that holds text); every other element separates texts. E-books use the same (epub.py).
INLINE_ELEMENTS = frozenset({
    "a", "abbr", "b", "bdi", "bdo", "big", "cite", "del", "dfn", "em", "font", "i", "ins",
    "mark", "q", "s", "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u",
})
# Kept whole inside a sentence (an `<xN/>` the translation moves): the void elements
# that sit in running text, and the skipped elements that are phrasing content.
_OPAQUE_INLINE = frozenset({"img", "wbr", "code", "kbd", "samp", "var"}) | INLINE_ELEMENTS
# Beyond these a block is split at its inline tags (bounds the work per block and keeps
# the sentinels few: each tag is one).
MAX_INLINE_DEPTH = 16
MAX_INLINE_TAGS = 40


@dataclass(frozen=True)
class Rules:
    """Which elements are kept untranslated, ride inside a sentence, have no content,
    and are kept whole inside a sentence. HTML's are fixed (`HTML_RULES`); XML's come
    from the request (`xml_rules`: DeepL's ignore_tags, non_splitting_tags,
    splitting_tags, outline_detection). Names are lower case (the parser's)."""

    skipped: frozenset[str]
    inline: frozenset[str]
    void: frozenset[str]
    opaque_inline: frozenset[str]
    # XML, found in a first pass: besides `inline`, "mixed" makes inline the elements
    # that have text beside them in their parent (mixed content), "all" every element;
    # never those of `splitting`. "": no such pass (HTML).
    outline: str = ""
    splitting: frozenset[str] = frozenset()


HTML_RULES = Rules(SKIPPED_ELEMENTS, INLINE_ELEMENTS, VOID_ELEMENTS, _OPAQUE_INLINE)


def xml_rules(ignore: frozenset[str] = frozenset(), non_splitting: frozenset[str] = frozenset(),
              splitting: frozenset[str] = frozenset(), outline_detection: bool = True) -> Rules:
    """An XML document's rules, as DeepL's tag_handling=xml reads its fields: text in an
    `ignore` element is kept; a `splitting` element always separates sentences, a
    `non_splitting` one never does; the others, with outline detection, separate
    sentences unless they sit in running text (mixed content: `<p>a <term>b</term></p>`),
    and without it never do (only `splitting` elements split)."""
    low = (frozenset(t.lower() for t in tags) for tags in (ignore, non_splitting, splitting))
    ignored, inline, breaking = low
    return Rules(skipped=ignored, inline=inline - breaking, void=frozenset(),
                 opaque_inline=ignored | (inline - breaking),
                 outline="mixed" if outline_detection else "all", splitting=breaking)


@dataclass(frozen=True)
class Document:
    """A fragment split into translatable blocks and the markup between them.

    `parts` has one more item than `texts`: the fragment is
    parts[0] + block 0 + parts[1] + block 1 + ... + parts[-1]. `sources` holds each
    block as it is spelled in the fragment (inline tags, entities and all); `texts` what
    the model translates: a block's text unescaped, or, when it has inline tags, the
    tagged text of inline.py (`My name <g1>is</g1> Michael`).
    """

    texts: tuple[str, ...]
    sources: tuple[str, ...]
    parts: tuple[str, ...]
    blocks: tuple[_Block, ...]

    def render(self, translations: Sequence[str]) -> str:
        """The fragment with block i replaced by translations[i] (escaped)."""
        if len(translations) != len(self.texts):
            raise ValueError(f"translations: {len(translations)} given for "
                             f"{len(self.texts)} text blocks; one per block is needed")
        out = [self.parts[0]]
        for block, translation, after in zip(self.blocks, translations, self.parts[1:],
                                             strict=True):
            out.append(block.render(translation))
            out.append(after)
        return "".join(out)


@dataclass(frozen=True)
class _Chain:
    """The inline elements around a text, outermost first: each its start tag and its
    end tag as the fragment spells them."""

    elements: tuple[tuple[str, str], ...]

    @property
    def plain(self) -> bool:
        return not self.elements


_PLAIN = _Chain(())


@dataclass(frozen=True)
class _Opaque:
    """Markup kept whole inside a sentence, and the inline elements it was in."""

    source: str
    chain: _Chain


class _Block:
    """One block: its source spelling, the text the model translates, and how a
    translation becomes HTML again."""

    def __init__(self, source: str, pieces: list[Piece] | None) -> None:
        self.source = source
        self.paragraph: Paragraph | None = None
        self.tagged = False
        self._written: list[list[Piece]] = []
        if pieces is None:  # text alone
            self.text = html.unescape(source)
            return
        self.paragraph = Paragraph(pieces, self._written.append)
        self.tagged = bool(self.paragraph.tags)
        # Without tags the model gets plain text, as for a block without inline markup.
        self.text = self.paragraph.text if self.tagged else html.unescape(self.paragraph.text)

    def render(self, translation: str) -> str:
        # An unchanged block keeps its spelling, so identity round-trips exactly.
        if translation == self.text:
            return self.source
        if self.paragraph is None:
            return html.escape(translation, quote=False)
        self.paragraph.fill(translation if self.tagged
                            else html.escape(translation, quote=False))
        return _html(self._written.pop())


def _html(pieces: list[Piece]) -> str:
    """Pieces as HTML: text escaped, each in the fragment's own tags of its chain (open
    elements shared with the next piece stay open), opaque markup as it was."""
    out: list[str] = []
    stack: list[tuple[str, str]] = []

    def enter(chain: _Chain) -> None:
        common = 0
        while (common < len(stack) and common < len(chain.elements)
               and stack[common] == chain.elements[common]):
            common += 1
        while len(stack) > common:
            out.append(stack.pop()[1])
        for element in chain.elements[common:]:
            out.append(element[0])
            stack.append(element)

    for piece in pieces:
        if piece.text is not None:
            assert isinstance(piece.style, _Chain)
            enter(piece.style)
            out.append(html.escape(piece.text, quote=False))
            continue
        for item in piece.content:
            assert isinstance(item, _Opaque)
            enter(item.chain)
            out.append(item.source)
    enter(_PLAIN)
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
    tag: str = ""  # a tag's element name, lower case
    role: str = ""  # markup: open, close, void (no content), comment, other
    hidden: bool = False  # inside kept content (code, translate="no"), its tags included
    opens_hidden: bool = False  # the start tag of kept content
    closes_hidden: bool = False  # the end tag that ends kept content


class _Splitter(HTMLParser):
    """Records each event's start offset and kind; keeps a stack of the open elements."""

    def __init__(self, fragment: str, rules: Rules = HTML_RULES) -> None:
        # Character references as separate events: their spelling is needed for trimming.
        super().__init__(convert_charrefs=False)
        self.rules = rules
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
        if self._skipping():
            self._markup("other")
        else:
            self.events.append(_Event(self.position(), kind))

    def _markup(self, role: str, tag: str = "") -> None:
        self.events.append(_Event(self.position(), _Kind.MARKUP, tag, role, self._skipping()))

    def handle_data(self, data: str) -> None:
        self._text(_Kind.DATA)

    def handle_entityref(self, name: str) -> None:
        self._text(_Kind.REF)

    def handle_charref(self, name: str) -> None:
        self._text(_Kind.REF)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.rules.void:
            self._markup("void", tag)
            return
        before = self._skipping()
        skipped = before or tag in self.rules.skipped or _marked_no_translate(attrs)
        self.events.append(_Event(self.position(), _Kind.MARKUP, tag, "open", skipped,
                                  opens_hidden=skipped and not before))
        self._open.append((tag, skipped))
        self._open_count[tag] += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # `<x/>` opens nothing (its content, if any, is not inside it for the parser).
        self._markup("void", tag)

    def handle_endtag(self, tag: str) -> None:
        before = self._skipping()
        if self._open_count[tag]:
            # Close the innermost element of that name and everything opened inside it,
            # as browsers do for misnested tags. Each element is popped once: linear.
            while True:
                name, _ = self._open.pop()
                self._open_count[name] -= 1
                if name == tag:
                    break
        # (A stray end tag closes nothing.)
        self.events.append(_Event(self.position(), _Kind.MARKUP, tag, "close", before,
                                  closes_hidden=before and not self._skipping()))

    def handle_comment(self, data: str) -> None:
        self._markup("comment")

    def handle_decl(self, decl: str) -> None:
        self._markup("other")

    def handle_pi(self, data: str) -> None:
        self._markup("other")

    def unknown_decl(self, data: str) -> None:
        self._markup("other")


def _marked_no_translate(attrs: list[tuple[str, str | None]]) -> bool:
    for name, value in attrs:
        if value is None:
            continue
        if name == "translate" and value.strip().lower() == "no":
            return True
        if name == "class" and NO_TRANSLATE_CLASS in value.split():
            return True
    return False


def _parse(fragment: str, rules: Rules = HTML_RULES) -> list[_Event]:
    """The events of the fragment, in order, starting at offset 0."""
    parser = _Splitter(fragment, rules)
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


class _Token(str, Enum):
    """What a stretch of the fragment is to a block."""

    TEXT = "text"
    OPEN = "open"  # an inline element's start tag
    CLOSE = "close"  # an inline element's end tag
    OPAQUE = "opaque"  # kept whole inside a sentence: an image, a comment, <code>...</code>
    BREAK = "break"  # separates blocks: every other tag, declaration, kept block


@dataclass(frozen=True)
class _Span:
    kind: _Token
    begin: int
    end: int
    tag: str = ""


def _spans(fragment: str, events: list[_Event], rules: Rules = HTML_RULES) -> list[_Span]:
    """The fragment cut into text, inline tags, opaque and breaking markup."""
    out: list[_Span] = []
    i = 0
    while i < len(events):
        event = events[i]
        end = _next_start(events, i, len(fragment))
        if event.opens_hidden:
            # Kept content: to the end tag that ends it (or the fragment's end).
            j = i + 1
            while j < len(events) and events[j].hidden and not events[j].closes_hidden:
                j += 1
            closed = j < len(events) and events[j].closes_hidden
            end = _next_start(events, j, len(fragment)) if closed else (
                events[j].start if j < len(events) else len(fragment))
            whole = closed and events[j].tag == event.tag and event.tag in rules.opaque_inline
            out.append(_Span(_Token.OPAQUE if whole else _Token.BREAK, event.start, end))
            i = j + 1 if closed else j
            continue
        if event.kind is not _Kind.MARKUP:
            if out and out[-1].kind is _Token.TEXT:
                out[-1] = _Span(_Token.TEXT, out[-1].begin, end)
            else:
                out.append(_Span(_Token.TEXT, event.start, end))
        elif event.hidden:
            out.append(_Span(_Token.BREAK, event.start, end))
        elif event.role in ("open", "close") and event.tag in rules.inline:
            kind = _Token.OPEN if event.role == "open" else _Token.CLOSE
            out.append(_Span(kind, event.start, end, event.tag))
        elif event.role == "comment" or (event.role == "void" and event.tag in rules.opaque_inline):
            out.append(_Span(_Token.OPAQUE, event.start, end))
        else:
            out.append(_Span(_Token.BREAK, event.start, end))
        i += 1
    return out


def _well_formed(spans: list[_Span]) -> bool:
    """Whether a block's inline tags nest, close within it, and stay within the bounds."""
    stack: list[str] = []
    tags = 0
    for span in spans:
        if span.kind is _Token.OPEN:
            stack.append(span.tag)
            tags += 1
            if len(stack) > MAX_INLINE_DEPTH:
                return False
        elif span.kind is _Token.CLOSE:
            if not stack or stack.pop() != span.tag:
                return False
        elif span.kind is _Token.OPAQUE:
            tags += 1
        if tags > MAX_INLINE_TAGS:
            return False
    return not stack


def _candidates(spans: list[_Span]) -> list[list[_Span]]:
    """The stretches between breaks; one whose inline tags are not well-formed is cut at
    every tag (its runs of text translated alone, as before blocks)."""
    out: list[list[_Span]] = []
    current: list[_Span] = []
    for span in [*spans, _Span(_Token.BREAK, 0, 0)]:
        if span.kind is not _Token.BREAK:
            current.append(span)
            continue
        if _well_formed(current):
            out.append(current)
        else:
            out.extend([s] for s in current if s.kind is _Token.TEXT)
        current = []
    return [c for c in out if any(s.kind is _Token.TEXT for s in c)]


def _pieces(fragment: str, spans: list[_Span], begin: int, end: int) -> list[Piece] | None:
    """A block's pieces for inline.py, or None for text alone."""
    inside = [s for s in spans if s.end > begin and s.begin < end]
    if all(s.kind is _Token.TEXT for s in inside):
        return None
    closes: dict[int, str] = {}  # an open tag's offset -> its end tag's spelling
    opened: list[int] = []
    for span in inside:
        if span.kind is _Token.OPEN:
            opened.append(span.begin)
        elif span.kind is _Token.CLOSE:
            closes[opened.pop()] = fragment[span.begin:span.end]
    pieces: list[Piece] = []
    chain: list[tuple[str, str]] = []
    for span in inside:
        source = fragment[max(span.begin, begin):min(span.end, end)]
        if span.kind is _Token.OPEN:
            chain.append((source, closes[span.begin]))
        elif span.kind is _Token.CLOSE:
            chain.pop()
        elif span.kind is _Token.OPAQUE:
            pieces.append(Piece(None, content=(_Opaque(source, _Chain(tuple(chain))),)))
        elif source:
            pieces.append(Piece(html.unescape(source), _Chain(tuple(chain))))
    return pieces


def extract(fragment: str, rules: Rules = HTML_RULES) -> Document:
    """Split an HTML fragment (or, with `xml_rules`, an XML one) into the text blocks to
    translate and the markup around them."""
    if rules.outline:
        rules = _outlined(fragment, rules)
    events = _parse(fragment, rules)
    refs = {e.start: _next_start(events, k, len(fragment))
            for k, e in enumerate(events) if e.kind is _Kind.REF}
    ref_by_end = {stop: start for start, stop in refs.items()}
    blocks: list[_Block] = []
    parts: list[str] = []
    markup_from = 0  # where the markup not yet put into parts begins
    for spans in _candidates(_spans(fragment, events, rules)):
        begin, end = _trim(fragment, spans[0].begin, spans[-1].end, refs, ref_by_end)
        text = "".join(html.unescape(fragment[max(s.begin, begin):min(s.end, end)])
                       for s in spans if s.kind is _Token.TEXT)
        if not any(ch.isalpha() for ch in text):
            continue
        pieces = _pieces(fragment, spans, begin, end)
        if pieces is not None and not has_letters(pieces):
            continue
        parts.append(fragment[markup_from:begin])
        blocks.append(_Block(fragment[begin:end], pieces))
        markup_from = end
    parts.append(fragment[markup_from:])
    return Document(texts=tuple(b.text for b in blocks),
                    sources=tuple(b.source for b in blocks), parts=tuple(parts),
                    blocks=tuple(blocks))


def _next_start(events: list[_Event], k: int, length: int) -> int:
    return events[k + 1].start if k + 1 < len(events) else length


def _trim(fragment: str, begin: int, end: int, refs: dict[int, int],
          ref_by_end: dict[int, int]) -> tuple[int, int]:
    """[begin, end) without leading and trailing whitespace, literal or as a reference.

    `refs` maps the start of each character reference to its end, `ref_by_end` back.
    """
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


class _Outline(HTMLParser):
    """XML outline detection: the elements that occur inside running text, i.e. whose
    parent has text of its own (not only whitespace) beside its child elements."""

    def __init__(self, splitting: frozenset[str]) -> None:
        super().__init__(convert_charrefs=True)
        self._open: list[tuple[str, list[str], bool]] = []  # tag, children, has text
        self.mixed: set[str] = set()
        self.names: set[str] = set()
        self.splitting = splitting
        # Elements that hold a splitting one: never inline (an inline element must
        # close within its sentence).
        self.containers: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.names.add(tag)
        if tag in self.splitting:
            self.containers.update(name for name, _, _ in self._open)
        if self._open:
            self._open[-1][1].append(tag)
        self._open.append((tag, [], False))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.names.add(tag)
        if tag in self.splitting:
            self.containers.update(name for name, _, _ in self._open)
        if self._open:
            self._open[-1][1].append(tag)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            name, children, text = self._open.pop()
            if text:
                self.mixed.update(children)
            if name == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._open and data.strip():
            name, children, _ = self._open[-1]
            self._open[-1] = (name, children, True)


def _outlined(fragment: str, rules: Rules) -> Rules:
    """`rules` with the elements its outline makes inline (never the splitting ones),
    the second pass then reading an ordinary rule set."""
    outline = _Outline(rules.splitting)
    try:
        outline.feed(fragment)
        outline.close()
    except AssertionError:  # what the tokenizer cannot read stays as markup
        pass
    for _, children, text in outline._open:  # unclosed at the end: as if closed
        if text:
            outline.mixed.update(children)
    found = outline.mixed if rules.outline == "mixed" else outline.names
    inline = ((rules.inline | frozenset(found)) - rules.splitting - rules.skipped
              - frozenset(outline.containers))
    return Rules(rules.skipped, inline, rules.void, rules.opaque_inline | inline)
