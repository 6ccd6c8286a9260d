"""What every benchmark reads (bench/inputs.py), and the quality benchmarks'
length-sorted decoding (bench/quality/score.py)."""

from __future__ import annotations

from pathlib import Path

from seq2serve.bench.inputs import numbers, read_sentences, source_ids
from seq2serve.bench.quality.score import generate_sorted


def test_read_sentences_of_a_file_or_a_split(tmp_path: Path) -> None:
    text = tmp_path / "texts.txt"
    text.write_text(" One.\n\nTwo. \nThree.\n", encoding="utf-8")
    assert read_sentences(text) == ["One.", "Two.", "Three."]
    assert read_sentences(text, 2) == ["One.", "Two."]
    (tmp_path / "test.src").write_text("A whole description.\nA sentence.\n", encoding="utf-8")
    (tmp_path / "test.kind").write_text("description\nsentence\n", encoding="utf-8")
    assert read_sentences(tmp_path) == ["A whole description.", "A sentence."]
    assert read_sentences(tmp_path, only_sentences=True) == ["A sentence."]


def test_source_ids_keep_eos_last_when_cut() -> None:
    class Tokenizer:
        eos_id = 0

        def encode(self, text: str) -> list[int]:
            return [len(word) for word in text.split()] + [self.eos_id]

    assert source_ids(Tokenizer(), ["a bb", "a bb ccc dddd"], limit=4) == [
        [1, 2, 0], [1, 2, 3, 0]]


def test_numbers_parse_comma_lists() -> None:
    assert numbers(int)("8,32, 64,") == [8, 32, 64]
    assert numbers(float)("0.5") == [0.5]
    assert numbers(float)("") == []


def test_generate_sorted_batches_by_length_and_answers_in_order() -> None:
    batches: list[list[list[int]]] = []

    class Engine:
        def generate(self, sources: list[list[int]], options: object) -> list[str]:
            batches.append(sources)
            return [f"out{len(s)}" for s in sources]

    ids = [[1, 1, 1], [1], [1, 1, 1, 1], [1, 1]]
    assert generate_sorted(Engine(), ids, None, 2) == ["out3", "out1", "out4", "out2"]
    assert batches == [[[1], [1, 1]], [[1, 1, 1], [1, 1, 1, 1]]]
