"""Segmentation for long inputs: exact whitespace round trips, sentence splits, split_long."""

from __future__ import annotations

import random

import pytest

from seq2serve.server.core.segment import Segmented, Splitting, reassemble, segment, split_long

# Random texts are built from these, weighted towards what breaks segmenters:
# runs of spaces, every line-break style, abbreviations, punctuation at the end.
_ATOMS = [
    "word", "Straße", "café", "日本語", "e.g.", "z.B.", "Dr.", "U.S.", "3.14", "1,000",
    ".", ". ", "?", "!", "...", ",", ";", ":", "。", "，", "\"", "(", ")",
    " ", " ", " ", "  ", "\t", "\u00a0", "\u3000",
    "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", "\u2028", "\x0c", " \n ",
]


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice(_ATOMS) for _ in range(rng.randint(0, 40)))


def _check_invariants(seg: Segmented, text: str) -> None:
    assert seg.original == text
    assert reassemble(seg, seg.pieces) == text
    for i, part in enumerate(seg.parts):
        if i in seg.piece_index:
            assert part and part == part.strip()  # nothing blank is sent to the model
            assert "\n" not in part and "\r" not in part
        else:
            assert part and not part.strip()  # kept parts are whitespace only


@pytest.mark.parametrize("language", ["en", "de", "fr", "ja", "xx"])
def test_random_texts_round_trip_exactly(language: str) -> None:
    rng = random.Random(f"segment-{language}")
    for _ in range(300):
        text = _random_text(rng)
        _check_invariants(segment(text, language), text)


@pytest.mark.parametrize("text", [
    "",
    "   ",
    "\n\n\r\n",
    "One.",
    "  Leading and trailing whitespace.  \n",
    "First paragraph. Second sentence.\n\nSecond paragraph!\n\n\nThird?",
    "Windows line one.\r\nLine two.\r\n\r\nNew paragraph.\r\n",
    "\tIndented line.\n    - a bullet\n    - another bullet\n",
    " ".join(["a very long sentence without any end"] * 40),
])
def test_hand_cases_round_trip(text: str) -> None:
    _check_invariants(segment(text, "en"), text)


def test_paragraphs_and_whitespace_are_kept_parts() -> None:
    text = "  Hello there. How are you?\r\n\r\nFine!  Thanks.\n"
    seg = segment(text, "en")
    assert seg.pieces == ("Hello there.", "How are you?", "Fine!", "Thanks.")
    assert seg.parts == ("  ", "Hello there.", " ", "How are you?", "\r\n\r\n", "Fine!",
                         "  ", "Thanks.", "\n")
    assert reassemble(seg, ["A.", "B?", "C!", "D."]) == "  A. B?\r\n\r\nC!  D.\n"


def test_a_single_line_break_ends_a_piece() -> None:
    assert segment("no full stop here\nnext line", "en").pieces == (
        "no full stop here", "next line")


def test_blank_text_has_no_pieces() -> None:
    seg = segment(" \n\t\n", "en")
    assert seg.pieces == ()
    assert reassemble(seg, []) == " \n\t\n"


@pytest.mark.parametrize("language, text, expected", [
    ("en", "Use a tool, e.g. a hammer. Then stop.", ("Use a tool, e.g. a hammer.", "Then stop.")),
    ("en-US", "Ask Dr. Smith. He knows.", ("Ask Dr. Smith.", "He knows.")),
    ("de", "Das ist z.B. gut. Am 3. Mai kam er.", ("Das ist z.B. gut.", "Am 3. Mai kam er.")),
    ("fr", "Bonjour M. Dupont. Ça va ? Oui !", ("Bonjour M. Dupont.", "Ça va ?", "Oui !")),
])
def test_sentence_splits(language: str, text: str, expected: tuple[str, ...]) -> None:
    assert segment(text, language).pieces == expected


def test_reassemble_checks_the_count() -> None:
    seg = segment("One. Two.", "en")
    with pytest.raises(ValueError, match="expected 2 translated pieces, got 1"):
        reassemble(seg, ["Eins."])
    with pytest.raises(ValueError, match="got 3"):
        reassemble(seg, ["a", "b", "c"], partial=True)


def test_partial_reassembly_is_a_prefix_of_the_whole() -> None:
    seg = segment("  One. Two.\n\nThree.\n", "en")
    whole = reassemble(seg, ["Eins.", "Zwei.", "Drei."])
    assert whole == "  Eins. Zwei.\n\nDrei.\n"
    assert reassemble(seg, [], partial=True) == ""
    assert reassemble(seg, ["Ei"], partial=True) == "  Ei"
    assert reassemble(seg, ["Eins.", "Zwei."], partial=True) == "  Eins. Zwei."
    assert reassemble(seg, ["Eins.", "Zwei.", "Drei."], partial=True) == whole


def _words(text: str) -> int:
    return len(text.split()) + 1  # + EOS, as a real tokenizer counts it


def test_split_long_leaves_short_pieces_alone() -> None:
    seg = segment("Short one. Another short one.", "en")
    assert split_long(seg, _words, 10) == seg


def test_split_long_prefers_clause_ends() -> None:
    text = "  one two three, four five six; seven eight. Short.\n"
    seg = split_long(segment(text, "en"), _words, 4)
    assert seg.pieces == ("one two three,", "four five six;", "seven eight.", "Short.")
    assert reassemble(seg, seg.pieces) == text


def test_split_long_packs_clauses_and_falls_back_to_words() -> None:
    text = "a, b, c, d " + " ".join(f"w{i}" for i in range(9)) + "."
    seg = split_long(segment(text, "en"), _words, 4)
    assert all(_words(p) <= 4 for p in seg.pieces)
    assert seg.pieces[:2] == ("a, b, c,", "d w0 w1")  # clauses packed, then words
    assert reassemble(seg, seg.pieces) == text


def test_split_long_cuts_unspaced_text_between_characters() -> None:
    text = "日本語の文章はとても長いです，句読点が少ない"
    seg = split_long(segment(text, "ja"), len, 5)
    assert all(len(p) <= 5 for p in seg.pieces)
    assert "".join(seg.pieces) == text
    assert reassemble(seg, seg.pieces) == text


def test_split_long_keeps_digit_groups_and_times_together() -> None:
    seg = split_long(segment("Pay 1,000 at 10:30 now please", "en"), _words, 3)
    assert "1,000" in " ".join(seg.pieces).split()
    assert "10:30" in " ".join(seg.pieces).split()


def test_split_long_random_texts_stay_exact_and_within_the_limit() -> None:
    rng = random.Random("split-long")
    for _ in range(200):
        text = _random_text(rng)
        limit = rng.randint(1, 6)
        seg = split_long(segment(text, "en"), len, limit)
        _check_invariants(seg, text)
        assert all(len(p) <= limit for p in seg.pieces)


def test_split_long_rejects_a_useless_limit() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1, got 0"):
        split_long(segment("x", "en"), len, 0)


def test_split_long_needs_few_tokenizer_calls() -> None:
    # Galloping + bisection: a 5000-word sentence must not cost a call per word.
    text = " ".join(f"w{i}" for i in range(5000))
    calls = []

    def count(piece: str) -> int:
        calls.append(piece)
        return _words(piece)

    seg = split_long(segment(text, "en"), count, 100)
    assert len(seg.pieces) == 51 and all(_words(p) <= 100 for p in seg.pieces)
    assert len(calls) < 1000  # one call per word would be 5000


SPLIT_TEXT = "  This is a line\nthat goes on. Second one.\n\nThird\r\n"


@pytest.mark.parametrize(("splitting", "pieces"), [
    (Splitting.ON, ("This is a line", "that goes on.", "Second one.", "Third")),
    (Splitting.NO_NEWLINES, ("This is a line\nthat goes on.", "Second one.", "Third")),
    (Splitting.OFF, ("This is a line\nthat goes on. Second one.\n\nThird",)),
])
def test_splitting_cuts_as_deepl_s_split_sentences_says(splitting: Splitting,
                                                        pieces: tuple[str, ...]) -> None:
    """1: sentence ends and line breaks; nonewlines: sentence ends only (a line break
    inside a sentence stays in it); 0: none. Every character is kept either way."""
    segmented = segment(SPLIT_TEXT, "en", splitting)
    assert segmented.pieces == pieces
    assert segmented.original == SPLIT_TEXT


@pytest.mark.parametrize("splitting", list(Splitting))
def test_every_splitting_round_trips_random_texts(splitting: Splitting) -> None:
    rng = random.Random(7)
    pool = ["Hello.", "e.g. this", "\n", "\r\n", "\n\n", " ", "  ", "Dr. Who?", "word", "!"]
    for _ in range(200):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 12)))
        segmented = segment(text, "en", splitting)
        assert segmented.original == text
        assert all(p and p == p.strip() for p in segmented.pieces)
        if splitting is not Splitting.ON:
            assert len(segmented.pieces) <= (1 if splitting is Splitting.OFF else
                                             len(segment(text, "en").pieces))
