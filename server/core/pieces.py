"""A translation's pieces: plan them, join their n-best lists, assemble streamed text.

The service cuts one text into sentence-sized pieces (segment.py), sends each
piece through the engine as its own work item and puts the answers back
together. These are the pure parts of that, with no gRPC and no engine: a
tokenizer's `encode`/`decode` come in as plain callables, hypotheses as any
object with `token_ids`, `score`, `alignment` and `finish_reason`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from seq2serve.server.core.errors import InvalidArgument
from seq2serve.server.core.segment import Segmented, Splitting, reassemble, segment, split_long

Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]

# The output tokens a piece may need per source token: what the shipped models'
# packages allow (their max_length_ratio), between fairseq's and Marian NMT's
# (--max-length-factor 3) defaults. A piece of a long text is never given a
# smaller output limit than this times its input (unless the request set its own).
OUTPUT_PER_SOURCE_TOKEN = 2


class PieceHypothesis(Protocol):
    """What the engine returns per hypothesis of one piece (engine.Hypothesis fits)."""

    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def score(self) -> float | None: ...
    @property
    def alignment(self) -> Sequence[int] | None: ...
    @property
    def finish_reason(self) -> str: ...


@dataclass(frozen=True)
class Piece:
    """One unit of work: a sentence-sized source segment and its token ids."""

    text: str
    source_ids: list[int]


@dataclass(frozen=True)
class Plan:
    """A text cut for translation: the segmentation and its pieces, in order."""

    segmented: Segmented
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class Joined:
    """One hypothesis of a whole text, joined from one hypothesis per piece.

    `score` is None when any piece's is (not computed), and so is `alignment`;
    `token_ids` is None only for a blank text, which has no pieces."""

    text: str
    score: float | None
    token_ids: list[int] | None
    alignment: list[int] | None
    finish_reason: str  # "length" when any piece was cut, else "eos"
    # A placeholder the model dropped, repeated or reordered was put right
    # (the repair rule in core/placeholders.py).
    repaired: bool = False


def piece_limit(max_source_length: int, max_output: int) -> int:
    """The most source tokens one piece of a long text may have: what the model reads,
    and no more than `max_output` (the most output tokens a piece may be given) holds
    at OUTPUT_PER_SOURCE_TOKEN tokens out per token in."""
    return max(1, min(max_source_length, max_output // OUTPUT_PER_SOURCE_TOKEN))


def output_limit(default: int, max_output: int, source_length: int) -> int:
    """A piece's max_length when the request left it to the model: the model's
    `default`, raised to OUTPUT_PER_SOURCE_TOKEN times the piece's source length, within
    `max_output` (the server's cap and the model's positions). generate() applies the
    default to a whole sentence; a page without sentence ends, cut into pieces of
    `piece_limit` tokens, must not lose the end of every piece to it."""
    return min(max_output, max(default, OUTPUT_PER_SOURCE_TOKEN * source_length))


class TooLongForOnePiece(InvalidArgument):
    """Sentence splitting off (`Splitting.OFF`) for a text longer than one piece may be
    (what the model reads, and within its output limit so that the answer is whole:
    piece_limit): refused, never cut, and never split against the request (a client
    that turns splitting off has its own segments, one answer per segment). The message
    names the core's field (texts[i]); a door words it with its own (`tokens`, `limit`,
    `index`, and `pivot`: the language of a chain's intermediate translation when that,
    the second leg's input, is what passed the limit)."""

    def __init__(self, tokens: int, limit: int, index: int = 0, pivot: str = "") -> None:
        self.tokens, self.limit, self.index, self.pivot = tokens, limit, index, pivot
        what = (f"the intermediate translation into {pivot} of texts[{index}] (the "
                "second leg's input)" if pivot else f"texts[{index}]")
        super().__init__(f"{what} is {tokens} tokens with sentence splitting off; one "
                         f"piece may have at most {limit} (what the model reads, within "
                         "its output limit, so that the answer is whole): turn splitting "
                         "on or send a shorter text")

    def at(self, index: int) -> TooLongForOnePiece:
        """The same refusal for the text at `index` of the request."""
        return TooLongForOnePiece(self.tokens, self.limit, index, self.pivot)

    def through(self, pivot: str) -> TooLongForOnePiece:
        """The same refusal for a chain's intermediate translation into `pivot`."""
        return TooLongForOnePiece(self.tokens, self.limit, self.index, pivot)


def plan(text: str, language: str, encode: Encode, limit: int,
         max_source_length: int | None = None,
         splitting: Splitting = Splitting.ON) -> Plan:
    """Sentences of `text` (in `language`, cut as `splitting` says), each cut to at most
    `limit` source tokens.

    Pieces longer than `limit` are split at clauses and words first; what is still
    longer (one character past the limit) is sent whole when the model reads it
    (`max_source_length`, by default `limit`), else cut to that many token ids.
    With splitting off the text is one piece, whole when it is within `limit`, else
    refused (TooLongForOnePiece): `limit` is also what keeps a fitted piece's answer
    whole (piece_limit), and a text past it could come back cut off at the output limit.
    """
    most = limit if max_source_length is None else max(limit, max_source_length)
    if splitting is Splitting.OFF:
        whole_text = segment(text, language, splitting)
        pieces = tuple(Piece(t, encode(t)) for t in whole_text.pieces)
        for piece in pieces:
            if len(piece.source_ids) > limit:
                raise TooLongForOnePiece(len(piece.source_ids), limit)
        return Plan(whole_text, pieces)
    segmented = split_long(segment(text, language, splitting), lambda t: len(encode(t)),
                           limit)
    return Plan(segmented, tuple(Piece(t, encode(t)[:most]) for t in segmented.pieces))


def join(plan: Plan, nbests: Sequence[Sequence[PieceHypothesis]], count: int,
         decode: Decode) -> list[Joined]:
    """`count` hypotheses of the planned text from each piece's n-best list.

    The i-th joins every piece's i-th best, or its best when that piece has fewer
    than i + 1; scores are summed over pieces; alignment positions count through
    the pieces' source token ids in order (a position in the second piece is offset
    by the first piece's source length). A blank text (no pieces) answers itself.
    """
    if len(nbests) != len(plan.pieces):
        raise ValueError(f"expected {len(plan.pieces)} n-best lists, got {len(nbests)}")
    if not plan.pieces:
        return [Joined(plan.segmented.original, None, None, None, "eos")] * count
    if any(not n for n in nbests):
        raise ValueError("every piece needs at least one hypothesis")
    offsets = list(itertools.accumulate((len(p.source_ids) for p in plan.pieces[:-1]),
                                        initial=0))
    out = []
    for i in range(count):
        chosen = [n[min(i, len(n) - 1)] for n in nbests]
        text = reassemble(plan.segmented, [decode(list(h.token_ids)) for h in chosen])
        scores = [h.score for h in chosen]
        alignments = [h.alignment for h in chosen]
        alignment = (None if any(a is None for a in alignments) else
                     [int(a) + offset for al, offset in zip(alignments, offsets, strict=True)
                      for a in al or ()])
        cut = any(h.finish_reason == "length" for h in chosen)
        out.append(Joined(
            text=text,
            score=None if None in scores else sum(s for s in scores if s is not None),
            token_ids=[int(t) for h in chosen for t in h.token_ids],
            alignment=alignment,
            finish_reason="length" if cut else "eos"))
    return out


def stream_text(plan: Plan, done: Mapping[int, str],
                partial: Mapping[int, Sequence[int]], decode: Decode) -> str:
    """The text so far: finished pieces in order (`done`: their best's text,
    decoded once), then the one still growing (`partial`: its tokens so far),
    nothing after it."""
    texts: list[str] = []
    for i in range(len(plan.pieces)):
        if i in done:
            texts.append(done[i])
        else:
            texts.append(decode(list(partial.get(i, ()))))
            break
    return reassemble(plan.segmented, texts, partial=True)


class StreamedText:
    """A planned text as its pieces stream in, told out as text deltas.

    Tokens of the piece still growing show as they come (`token`); a finished
    piece's best is decoded once (`finish`). Pieces show in order: a later
    piece's tokens wait for the earlier ones to finish."""

    def __init__(self, plan: Plan, decode: Decode) -> None:
        self.plan, self.decode = plan, decode
        self.done: dict[int, str] = {}
        self.partial: dict[int, list[int]] = {i: [] for i in range(len(plan.pieces))}
        self.emitted = ""  # the deltas so far, joined

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.plan.pieces)

    def token(self, index: int, token: int) -> None:
        self.partial[index].append(token)

    def finish(self, index: int, token_ids: Sequence[int]) -> None:
        self.done[index] = self.decode(list(token_ids))

    def delta(self) -> str:
        """The text added since the last delta; "" when none was, or when the text
        so far no longer starts with what was told (decoding one more token can
        change the characters before it): it waits until it does again."""
        text = stream_text(self.plan, self.done, self.partial, self.decode)
        if len(text) > len(self.emitted) and text.startswith(self.emitted):
            delta, self.emitted = text[len(self.emitted):], text
            return delta
        return ""

    def rest(self, final: str) -> str:
        """What `final`, the whole text's best, adds to what was told ("" when it
        does not start with it)."""
        return final[len(self.emitted):] if final.startswith(self.emitted) else ""


def whole(hypothesis: PieceHypothesis, decode: Decode) -> Joined:
    """A hypothesis of a text sent as one piece, uncut (a summary's source)."""
    return Joined(decode(list(hypothesis.token_ids)), hypothesis.score,
                  [int(t) for t in hypothesis.token_ids],
                  None if hypothesis.alignment is None else [int(a) for a in hypothesis.alignment],
                  hypothesis.finish_reason)
