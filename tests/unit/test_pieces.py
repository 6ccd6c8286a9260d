"""Pieces of a translation without gRPC: planning, the n-best join, streamed text."""

from __future__ import annotations

import pytest

from seq2serve.server.core.pieces import (
    OUTPUT_PER_SOURCE_TOKEN,
    Joined,
    Plan,
    StreamedText,
    TooLongForOnePiece,
    join,
    output_limit,
    piece_limit,
    plan,
    stream_text,
    whole,
)
from seq2serve.server.core.segment import Splitting, reassemble
from seq2serve.server.engine.search import Hypothesis

EOS = 0
_WORDS = ["</s>", "Hello", "world.", "How", "are", "you?", "Fine,", "thanks."]


def _encode(text: str) -> list[int]:
    """A word-level tokenizer with EOS appended, as the package tokenizer does."""
    return [_WORDS.index(w) if w in _WORDS else 99 for w in text.split()] + [EOS]


def _decode(ids: list[int]) -> str:
    return " ".join(f"<{i}>" for i in ids)


TEXT = "Hello world.  How are you?\nFine, thanks."


def _three_pieces() -> Plan:
    planned = plan(TEXT, "en", _encode, limit=16)
    assert [p.text for p in planned.pieces] == ["Hello world.", "How are you?", "Fine, thanks."]
    return planned


def test_plan_keeps_the_text_and_tokenizes_each_piece() -> None:
    planned = _three_pieces()
    assert planned.segmented.original == TEXT
    assert [p.source_ids for p in planned.pieces] == [[1, 2, 0], [3, 4, 5, 0], [6, 7, 0]]


def test_plan_splits_pieces_above_the_limit_and_caps_their_ids() -> None:
    planned = plan("Hello world. How are you?", "en", _encode, limit=3)
    assert all(len(p.source_ids) <= 3 for p in planned.pieces)
    # "How are you?" is 4 ids with EOS: cut between words, whitespace kept
    assert [p.text for p in planned.pieces] == ["Hello world.", "How are", "you?"]
    assert reassemble(planned.segmented, [p.text for p in planned.pieces]) == \
        "Hello world. How are you?"


def test_plan_of_a_blank_text_has_no_pieces() -> None:
    planned = plan(" \n\t", "en", _encode, limit=8)
    assert planned.pieces == ()
    assert join(planned, [], 2, _decode) == [Joined(" \n\t", None, None, None, "eos")] * 2


def test_join_takes_each_pieces_ith_best_or_its_best_with_offset_alignment() -> None:
    planned = _three_pieces()  # source lengths 3, 4, 3: offsets 0, 3, 7
    first = [Hypothesis([11], -1.0, "eos", [0]), Hypothesis([12], -2.0, "eos", [1]),
             Hypothesis([13], -3.0, "eos", [2])]
    second = [Hypothesis([21, 22], -0.5, "eos", [0, 3])]  # fewer than asked for
    third = [Hypothesis([31], -0.25, "eos", [2]), Hypothesis([32], -4.0, "length", [1])]
    joined = join(planned, [first, second, third], 3, _decode)
    assert len(joined) == 3
    assert joined[0] == Joined("<11>  <21> <22>\n<31>", -1.75, [11, 21, 22, 31],
                               [0, 3, 6, 9], "eos")
    # the second piece has one hypothesis: every joined one uses its best
    assert joined[1] == Joined("<12>  <21> <22>\n<32>", -6.5, [12, 21, 22, 32],
                               [1, 3, 6, 8], "length")
    assert joined[2] == Joined("<13>  <21> <22>\n<32>", -7.5, [13, 21, 22, 32],
                               [2, 3, 6, 8], "length")


def test_join_of_one_piece_is_that_pieces_n_best() -> None:
    planned = plan("  How are you?\n", "en", _encode, limit=16)
    nbest = [Hypothesis([5, 6], -0.5, "length", [1, 2]), Hypothesis([7], -1.5, "eos", [0])]
    joined = join(planned, [nbest], 2, _decode)
    assert joined == [Joined("  <5> <6>\n", -0.5, [5, 6], [1, 2], "length"),
                      Joined("  <7>\n", -1.5, [7], [0], "eos")]


def test_join_leaves_uncomputed_scores_and_alignments_unset() -> None:
    planned = plan("Hello world. How are you?", "en", _encode, limit=16)
    joined = join(planned, [[Hypothesis([1], None, "eos")], [Hypothesis([2], -1.0, "eos", [0])]],
                  1, _decode)
    assert joined[0].score is None and joined[0].alignment is None
    assert joined[0].token_ids == [1, 2]


def test_join_refuses_a_list_per_piece_mismatch() -> None:
    planned = _three_pieces()
    with pytest.raises(ValueError, match="expected 3 n-best lists, got 2"):
        join(planned, [[Hypothesis([1], 0.0, "eos")]] * 2, 1, _decode)
    with pytest.raises(ValueError, match="at least one hypothesis"):
        join(planned, [[Hypothesis([1], 0.0, "eos")], [], [Hypothesis([1], 0.0, "eos")]], 1,
             _decode)


def test_stream_text_is_finished_pieces_in_order_then_the_growing_one() -> None:
    planned = _three_pieces()
    assert stream_text(planned, {}, {}, _decode) == ""
    assert stream_text(planned, {}, {0: [4]}, _decode) == "<4>"
    # a later piece that finished first waits for the earlier ones
    assert stream_text(planned, {1: "<9>"}, {0: [4, 5]}, _decode) == "<4> <5>"
    # the whitespace after a finished piece shows once the next one has started
    assert stream_text(planned, {0: "<4> <5>"}, {1: []}, _decode) == "<4> <5>  "
    assert stream_text(planned, {0: "<4>", 1: "<9>"}, {2: [7]}, _decode) == "<4>  <9>\n<7>"
    assert stream_text(planned, {0: "<4>", 1: "<9>", 2: "<7>"}, {}, _decode) == \
        "<4>  <9>\n<7>"


def test_streamed_text_tells_each_addition_once_in_piece_order() -> None:
    streamed = StreamedText(_three_pieces(), _decode)
    assert streamed.delta() == "" and not streamed.finished
    streamed.token(1, 9)  # a later piece waits for the earlier ones
    assert streamed.delta() == ""
    streamed.token(0, 4)
    assert streamed.delta() == "<4>"
    assert streamed.delta() == ""  # told once
    streamed.finish(0, [4, 5])
    assert streamed.delta() == " <5>  <9>"  # the gap, then the next piece's tokens so far
    streamed.finish(1, [9])
    streamed.finish(2, [7])
    assert streamed.finished and streamed.delta() == "\n<7>"
    assert streamed.emitted == "<4> <5>  <9>\n<7>"
    assert streamed.rest("<4> <5>  <9>\n<7> <8>") == " <8>"
    assert streamed.rest("something else") == ""


def test_streamed_text_waits_while_the_text_so_far_changes() -> None:
    words = {4: "Hal", 5: "lo"}
    streamed = StreamedText(plan("Hello", "en", _encode, limit=16),
                            lambda ids: "".join(words[i] for i in ids) if ids != [4, 5] else "Hi")
    streamed.token(0, 4)
    assert streamed.delta() == "Hal"
    streamed.token(0, 5)
    assert streamed.delta() == ""  # "Hi" does not continue "Hal": nothing told
    assert streamed.rest("Hallo") == "lo"


def test_whole_is_one_hypothesis_decoded() -> None:
    assert whole(Hypothesis([3, 4], -2.0, "length", [1, 0]), _decode) == \
        Joined("<3> <4>", -2.0, [3, 4], [1, 0], "length")
    assert whole(Hypothesis([], 0.0, "eos"), _decode) == Joined("", 0.0, [], None, "eos")


def test_a_piece_holds_what_the_models_input_and_output_limits_allow() -> None:
    assert piece_limit(max_source_length=1024, max_output=512) == 256
    assert piece_limit(max_source_length=100, max_output=512) == 100
    assert piece_limit(max_source_length=100, max_output=1) == 1  # always some progress


def test_a_pieces_output_limit_rises_with_its_input_within_the_cap() -> None:
    # NLLB's generation_config says 200 new tokens, the server allows 512: a piece of 10
    # tokens keeps 200, one of 150 gets twice its input, one of 300 the cap.
    assert output_limit(200, 512, 10) == 200
    assert output_limit(200, 512, 150) == 2 * 150 == OUTPUT_PER_SOURCE_TOKEN * 150
    assert output_limit(200, 512, 300) == 512


def test_plan_within_piece_limit_cuts_an_unpunctuated_text_at_spaces() -> None:
    text = " ".join(["Hello"] * 40)  # no sentence end: one "sentence" of 41 tokens
    planned = plan(text, "en", _encode, limit=piece_limit(1024, 20))
    assert all(len(p.source_ids) <= 10 for p in planned.pieces)
    assert all(p.source_ids == _encode(p.text) for p in planned.pieces)  # nothing cut off
    assert " ".join(p.text for p in planned.pieces) == text


def test_a_character_past_the_piece_limit_is_sent_whole_when_the_model_reads_it() -> None:
    # "H" alone is 2 tokens (with EOS): above a piece limit of 1, within the model's 4.
    assert plan("H", "en", _encode, limit=1, max_source_length=4).pieces[0].source_ids == \
        _encode("H")
    assert plan("H", "en", _encode, limit=1).pieces[0].source_ids == _encode("H")[:1]


def test_plan_without_splitting_is_one_whole_piece() -> None:
    planned = plan(TEXT, "en", _encode, limit=8, max_source_length=16,
                   splitting=Splitting.OFF)
    assert [p.text for p in planned.pieces] == [TEXT]
    assert planned.pieces[0].source_ids == _encode(TEXT)  # 8 ids, where split it is 3 pieces


def test_plan_without_splitting_refuses_what_the_model_cannot_read_whole() -> None:
    with pytest.raises(TooLongForOnePiece) as refused:
        plan(TEXT, "en", _encode, limit=7, splitting=Splitting.OFF)
    assert (refused.value.tokens, refused.value.limit) == (8, 7)
    assert "texts[0] is 8 tokens" in refused.value.message
    assert "texts[3]" in refused.value.at(3).message


def test_plan_without_splitting_refuses_past_the_piece_limit_the_model_reads() -> None:
    """The model reads 8 tokens, but a fitted piece is held to `limit` (piece_limit: its
    output limit holds OUTPUT_PER_SOURCE_TOKEN tokens out per token in): past it the
    answer could be cut off, so the unsplit text is refused, naming that limit."""
    with pytest.raises(TooLongForOnePiece) as refused:
        plan(TEXT, "en", _encode, limit=4, max_source_length=8, splitting=Splitting.OFF)
    assert (refused.value.tokens, refused.value.limit) == (8, 4)
    assert "at most 4 (what the model reads, within its output limit, so that the " \
        "answer is whole)" in refused.value.message


def test_plan_without_newline_splits_keeps_a_sentence_across_lines() -> None:
    planned = plan("Hello world\nHow are you?", "en", _encode, limit=16,
                   splitting=Splitting.NO_NEWLINES)
    assert [p.text for p in planned.pieces] == ["Hello world\nHow are you?"]
    assert [p.text for p in plan("Hello world\nHow are you?", "en", _encode,
                                 limit=16).pieces] == ["Hello world", "How are you?"]
