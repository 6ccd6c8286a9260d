"""Paragraphs whose text lies in the XML itself, between inline elements: OpenDocument's
`text:p` and an e-book's XHTML `<p>`, the same way for both.

`Rules` says, per format, which elements are paragraphs (blocks), which style the
text they wrap (`text:span`, `text:a`; `<b>`, `<a>`, `<span>`), which stand for
text (`text:s`: spaces), and which are not entered at all (`<code>`, `<pre>`). A
block's text and the text of its inline elements is one text (inline.py); its
style is the chain of inline elements around it, compared by their names and
attributes. Anything else inside a block (an image, a line break, a note, a
frame, a nested block, an inline element that wraps no text) is opaque: moved
back as it is, with its own content, where the translation puts it (inside
copies of the inline elements it was in: an image stays in its link). Blocks nest:
a list item that holds a nested list is translated for its own words, and the
nested items each for theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lxml import etree

from seq2serve.server.core.inline import Paragraph, Piece, has_letters

Test = Callable[[etree._Element], bool]


@dataclass(frozen=True)
class Rules:
    block: Test  # a paragraph
    inline: Test  # styles the text it wraps
    skip: Test  # neither translated nor entered (code, a no-translate mark)
    spaces: Callable[[etree._Element], str | None] = lambda e: None  # text it stands for


@dataclass(frozen=True)
class ChainStyle:
    """The inline elements around a text, outermost first, compared by name and
    attributes; `chain` holds the first such elements, copied from."""

    key: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    chain: tuple[etree._Element, ...] = field(compare=False, hash=False)

    @property
    def plain(self) -> bool:
        return not self.key


def paragraphs(root: etree._Element, rules: Rules) -> list[Paragraph]:
    """The blocks under `root` with text to translate, in document order."""
    found: list[Paragraph] = []
    _visit(root, rules, found)
    return found


def _visit(element: etree._Element, rules: Rules, found: list[Paragraph]) -> None:
    if not isinstance(element.tag, str) or rules.skip(element):
        return
    if rules.block(element):
        pieces: list[Piece] = []
        chains: dict[int, ChainStyle] = {}
        _pieces(element, (), rules, pieces, chains)
        if has_letters(pieces):
            found.append(Paragraph(pieces, lambda out: _write(element, out, chains)))
    for child in element:
        _visit(child, rules, found)


def _pieces(element: etree._Element, chain: tuple[etree._Element, ...], rules: Rules,
            out: list[Piece], chains: dict[int, ChainStyle]) -> None:
    """The pieces of `element`'s content; `chains` gets the inline elements around each
    opaque one that has some (an image in a link)."""
    style = _style(chain)
    if element.text:
        out.append(Piece(element.text, style))
    for child in element:
        if isinstance(child.tag, str) and (spaces := rules.spaces(child)) is not None:
            out.append(Piece(spaces, style))
        elif (isinstance(child.tag, str) and rules.inline(child) and not rules.skip(child)
              and "".join(child.itertext()).strip()):
            _pieces(child, (*chain, child), rules, out, chains)
        else:  # a comment, an entity reference, an image, a break, a note ...
            out.append(Piece(None, content=(child,)))
            if chain:
                chains[id(child)] = style
        if child.tail:
            out.append(Piece(child.tail, style))


def _style(chain: tuple[etree._Element, ...]) -> ChainStyle:
    return ChainStyle(tuple((str(e.tag), tuple(sorted((str(k), str(v))
                                                      for k, v in e.attrib.items())))
                            for e in chain), chain)


def _write(block: etree._Element, pieces: list[Piece], chains: dict[int, ChainStyle]) -> None:
    block.text = None
    for child in list(block):
        block.remove(child)
    out = _Writer(block)
    for piece in pieces:
        if piece.text is not None:
            assert isinstance(piece.style, ChainStyle)
            out.text(piece.text, piece.style)
            continue
        for element in piece.content:
            assert isinstance(element, etree._Element)
            out.element(element, chains.get(id(element), _PLAIN))


_PLAIN = ChainStyle((), ())


class _Writer:
    """Appends text and elements to a block; the inline elements around them are
    copies of the source's, one copy for neighbours of one style."""

    def __init__(self, block: etree._Element) -> None:
        self.block = block
        self.open: tuple[ChainStyle, etree._Element] | None = None  # the last chain made

    def _holder(self, style: ChainStyle) -> etree._Element:
        if not style.chain:
            self.open = None
            return self.block
        if self.open is None or self.open[0] != style:
            holder = self.block
            for original in style.chain:
                made = holder.makeelement(original.tag, dict(original.attrib))
                holder.append(made)
                holder = made
            self.open = (style, holder)
        return self.open[1]

    def text(self, words: str, style: ChainStyle) -> None:
        holder = self._holder(style)
        if len(holder):
            holder[-1].tail = (holder[-1].tail or "") + words
        else:
            holder.text = (holder.text or "") + words

    def element(self, element: etree._Element, style: ChainStyle) -> None:
        element.tail = None
        self._holder(style).append(element)
