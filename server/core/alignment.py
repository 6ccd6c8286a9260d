"""Which characters of a translation translate which characters of its source.

The engine aligns each target token with one source token (the source position the
decoder's cross-attention weighs most when it chooses the token, averaged over the
last layer's heads: `Seq2SeqTransformer.decode_step`). Here those token positions
become character spans through the tokenizer's offsets (`source_spans`,
`target_spans`), over every piece of a planned text, in the joined text's terms; and a
chain's two legs compose through the English text between them
(core/formatting.py places formatting by these links).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from seq2serve.server.core.formatting import Link, char_map
from seq2serve.server.core.pieces import PieceHypothesis, Plan
from seq2serve.server.core.registry import Leg, ModelHandle


def text_links(handle: ModelHandle, planned: Plan, leg: Leg | None,
               chosen: Sequence[PieceHypothesis]) -> list[Link]:
    """The links of one joined hypothesis of `planned` (`chosen`: one hypothesis per
    piece, each with its alignment), in the characters of the joined text (as
    pieces.join joins it) and of the planned source text."""
    segmented = planned.segmented
    tokenizer = handle.tokenizer
    translated = list(segmented.parts)
    decoded = [tokenizer.decode(list(h.token_ids)) for h in chosen]
    for index, text in zip(segmented.piece_index, decoded, strict=True):
        translated[index] = text
    source_at = [0, *accumulate(len(p) for p in segmented.parts)]
    target_at = [0, *accumulate(len(p) for p in translated)]
    language = None if leg is None or handle.languages is None else leg.tokens()[0]
    prefix = len(handle.manifest.input_prefix)
    links: list[Link] = []
    for piece, index, hypothesis in zip(planned.pieces, segmented.piece_index, chosen,
                                        strict=True):
        alignment = hypothesis.alignment
        if alignment is None:
            continue
        spans = tokenizer.source_spans(handle.manifest.input_prefix + piece.text, language)
        spans = spans[:len(piece.source_ids)]
        s0, t0 = source_at[index] - prefix, target_at[index]
        for (a, b), position in zip(tokenizer.target_spans(list(hypothesis.token_ids)),
                                    alignment, strict=True):
            if a == b or not 0 <= position < len(spans):
                continue
            x, y = spans[position]
            if x < y and x >= prefix:
                links.append(((t0 + a, t0 + b), (s0 + x, s0 + y)))
    return links


def compose(second: Sequence[Link], middle: str, first_output: str,
            first: Sequence[Link]) -> list[Link]:
    """A chain's links: the second leg's (target -> `middle`, the English it read) through
    the first leg's (`first_output`, the English it wrote, which `middle` is after the
    repair rule -> the source). Characters of `middle` map to `first_output`'s where the
    two texts agree."""
    mapped = char_map(middle, first_output)
    by_char: list[list[tuple[int, int]]] = [[] for _ in first_output]
    for (e0, e1), source in first:
        for k in range(max(e0, 0), min(e1, len(first_output))):
            by_char[k].append(source)
    links: list[Link] = []
    for target, (m0, m1) in second:
        sources = {s for k in range(max(m0, 0), min(m1, len(middle)))
                   if (at := mapped[k]) is not None for s in by_char[at]}
        links.extend((target, s) for s in sorted(sources))
    return links
