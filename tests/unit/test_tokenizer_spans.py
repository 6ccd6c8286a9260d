"""Each token's characters (`source_spans`, `target_spans`): what turns the engine's token
alignment into the words formatting is placed on (core/alignment.py)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import JsonTokenizer, package_tokenizer

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "en-de"
TEXTS = ["The new printer is fast, but it is quite expensive.",
         "  Two  spaces, a ﬁne café — and {0} “quotes”.",
         "Größe: 5 €, naïve Übung!"]


@pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped models/en-de")
@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_source_and_target_spans(text: str) -> None:
    tokenizer = package_tokenizer(load_package(SHIPPED))
    ids = tokenizer.encode(text)
    spans = tokenizer.source_spans(text)
    assert len(spans) == len(ids) and spans[-1] == (len(text), len(text))  # EOS: none
    assert all(a <= b <= c for (a, b), (c, _) in pairwise(spans))  # in order
    for i, (a, b) in zip(ids[:-1], spans[:-1], strict=True):
        piece = tokenizer.id_to_piece[i].replace("\u2581", "")  # type: ignore[attr-defined]
        if text[a:b].strip().isascii():  # (NFKC turns "ﬁ" into "fi")
            assert text[a:b].strip() == piece
    target = tokenizer.encode_target(text)[:-1]
    decoded = tokenizer.decode(target)
    spans = tokenizer.target_spans(target + [tokenizer.eos_id, 5])
    assert "".join(decoded[a:b] for a, b in spans) == decoded
    assert spans[-2:] == [(0, 0), (0, 0)]  # EOS and what follows it stand for nothing


def test_tokenizer_json_source_and_target_spans(tmp_path: Path) -> None:
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.save(str(tmp_path / "tokenizer.json"))
    tokenizer = JsonTokenizer(tmp_path / "tokenizer.json", unk_id=2, eos_id=1, pad_id=0)
    for text in TEXTS:
        ids = tokenizer.encode(text)
        spans = tokenizer.source_spans(text)
        assert len(spans) == len(ids)
        assert all(a <= c for (a, _), (c, _) in pairwise(spans))  # in order
        # Every character is some token's (a character of several byte-level tokens is
        # each of theirs).
        covered = {k for a, b in spans for k in range(a, b)}
        assert covered >= {k for k, ch in enumerate(text) if not ch.isspace()}
        decoded = tokenizer.decode(ids)
        spans = tokenizer.target_spans(ids)
        assert "".join(decoded[a:b] for a, b in spans) == decoded
