"""The weighted mix: the same training pairs as a written mix, read by the trainer."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from seq2serve.model.data import mix
from seq2serve.model.tokenizer import Tokenizer, train_tokenizer
from seq2serve.model.train import batching
from seq2serve.model.train import trainer as train

CORPUS = Path(__file__).parents[1] / "fixtures" / "tiny_corpus"
HELD_ENGLISH = {"Where is the station?"}


def _corpus(folder: Path, kind: str, splits: dict[str, list[tuple[str, str]]]) -> Path:
    folder.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        rows = [(kind, s, t) for s, t in splits.get(split, [])]
        for ext, col in (("kind", 0), ("src", 1), ("tgt", 2)):
            (folder / f"{split}.{ext}").write_text("".join(f"{r[col]}\n" for r in rows))
    (folder / "corpus.json").write_text(json.dumps(
        {"task": "translate", "src_lang": "en", "tgt_lang": "de", "dropped": {}}))
    return folder


@pytest.fixture
def parts(tmp_path: Path) -> list[tuple[str, Path, int]]:
    """Three corpora; the tiny fixture's pairs spread over them, plus pairs that
    a mix must drop: another part's valid/test pair, the held-out English."""
    src = (CORPUS / "train.src").read_text().split("\n")[:-1]
    tgt = (CORPUS / "train.tgt").read_text().split("\n")[:-1]
    pairs = list(zip(src, tgt, strict=True))
    a = _corpus(tmp_path / "a" / "en-de", "synopsis", {
        "train": [*pairs[:15], ("Where is the station?", "Wo ist der Bahnhof?"),
                  ("Open", "Öffnen")],
        "valid": [("Save", "Speichern")], "test": [("Close", "Schließen")]})
    b = _corpus(tmp_path / "b" / "en-de", "message", {
        "train": [*pairs[15:30], ("Save", "Speichern"), ("Close", "Zumachen"), pairs[0]],
        "test": [("Open", "Öffnen")]})
    c = _corpus(tmp_path / "c" / "en-de", "sentence", {
        "train": [*pairs[30:], ("Close", "Schließen")], "valid": [("Hi.", "Hallo.")]})
    return [("a", a, 3), ("b", b, 1), ("c", c, 2)]


def _pairs(folder: Path) -> list[tuple[str, str]]:
    return list(zip((folder / "train.src").read_text().split("\n")[:-1],
                    (folder / "train.tgt").read_text().split("\n")[:-1], strict=True))


def test_weighted_mix_reads_the_written_mixs_pairs(parts: list[tuple[str, Path, int]],
                                                   tmp_path: Path) -> None:
    written, weighted = tmp_path / "written", tmp_path / "weighted"
    mix.write_copies(written, [(d, w) for _, d, w in parts], HELD_ENGLISH)
    info = mix.write_weighted(weighted, parts, HELD_ENGLISH)
    assert not (weighted / "train.src").exists() and mix.is_weighted(weighted)
    assert not mix.is_weighted(written)
    rows = list(mix.train_rows(weighted))
    assert Counter((s, t) for _, s, t in rows) == Counter(_pairs(written))
    assert [(s, t) for _, s, t in rows] == _pairs(written)  # even the order
    assert info["counts"] == json.loads((written / "corpus.json").read_text())["counts"]
    for split in ("valid", "test"):
        for ext in ("kind", "src", "tgt"):
            assert (weighted / f"{split}.{ext}").read_bytes() == \
                (written / f"{split}.{ext}").read_bytes()
    pairs = Counter((s, t) for _, s, t in rows)
    # every valid/test pair of any part is left out, the same English with another
    # target is not; the held-out English is left out whatever its target
    assert not {("Open", "Öffnen"), ("Save", "Speichern"), ("Close", "Schließen")} & set(pairs)
    assert pairs[("Close", "Zumachen")] == 1
    assert not any(s in HELD_ENGLISH for s, _ in pairs)
    src = (CORPUS / "train.src").read_text().split("\n")[0]
    tgt = (CORPUS / "train.tgt").read_text().split("\n")[0]
    assert pairs[(src, tgt)] == 3 + 1  # part a x3, part b x1
    with mix.train_text(weighted, tmp_path / "scratch") as files:
        assert files[0].read_bytes() == (written / "train.src").read_bytes()
        assert files[1].read_bytes() == (written / "train.tgt").read_bytes()
    assert not any((tmp_path / "scratch").iterdir())


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    out = tmp_path_factory.mktemp("spm") / "spm.model"
    return train_tokenizer([CORPUS / "train.src", CORPUS / "train.tgt"], out, vocab_size=120,
                           character_coverage=1.0, num_threads=1)


def _examples(data: batching.TokenData) -> Counter[tuple[tuple[int, ...], tuple[int, ...]]]:
    repeats = data.repeats if data.repeats is not None else np.ones(len(data), dtype=np.int64)
    out: Counter[tuple[tuple[int, ...], tuple[int, ...]]] = Counter()
    for i in range(len(data)):
        out[(tuple(data.src(i).tolist()), tuple(data.tgt(i).tolist()))] += int(repeats[i])
    return out


def test_tokenized_weighted_mix_equals_the_written_one(parts: list[tuple[str, Path, int]],
                                                       tokenizer: Tokenizer,
                                                       tmp_path: Path) -> None:
    written, weighted = tmp_path / "written", tmp_path / "weighted"
    mix.write_copies(written, [(d, w) for _, d, w in parts], HELD_ENGLISH)
    mix.write_weighted(weighted, parts, HELD_ENGLISH)
    flat = batching.tokenize_split(written, "train", tokenizer, tmp_path / "c1", 24, 10)
    data = batching.tokenize_mix(weighted, tokenizer, tmp_path / "c2", 24, 10)
    assert _examples(data) == _examples(flat)
    assert data.epoch_size == len(flat) and len(data) < len(flat)
    assert len(list((tmp_path / "c2").glob("train-*.npz"))) == 3  # one entry per part
    again = batching.tokenize_mix(weighted, tokenizer, tmp_path / "c2", 24, 10)  # cached
    assert np.array_equal(again.src_ids, data.src_ids)
    assert np.array_equal(again.repeats, data.repeats)  # type: ignore[arg-type]
    # an epoch holds each example its part's weight times
    batches = batching.epoch_batches(data.src_lens, data.tgt_lens, 60, seed=2, epoch=0,
                                     bucket_size=16, repeats=data.repeats)
    seen = Counter(np.concatenate(batches).tolist())
    assert seen == {i: int(r) for i, r in enumerate(data.repeats)}  # type: ignore[arg-type]


def test_weighted_epochs_derive_from_seed_and_epoch_and_resume() -> None:
    rng = np.random.default_rng(0)
    n = 300
    data = batching.TokenData(
        np.ones(n * 3, dtype=np.int32), np.arange(0, n * 3 + 1, 3),
        np.ones(n * 2, dtype=np.int32), np.arange(0, n * 2 + 1, 2),
        rng.integers(1, 4, size=n))
    stream = batching.BatchStream(data, max_tokens=20, seed=3, bucket_size=32)
    [stream.next() for _ in range(250)]  # crosses an epoch boundary
    epoch, index = stream.epoch, stream.index
    later = [stream.next().tolist() for _ in range(20)]
    resumed = batching.BatchStream(data, max_tokens=20, seed=3, bucket_size=32, epoch=epoch,
                                   index=index)
    assert epoch >= 1 and [resumed.next().tolist() for _ in range(20)] == later
    # weights of one give exactly the unweighted epochs (plain corpora's runs resume as before)
    lens = rng.integers(2, 30, size=n), rng.integers(2, 30, size=n)
    plain = batching.epoch_batches(*lens, 100, seed=5, epoch=2, bucket_size=64)
    ones = batching.epoch_batches(*lens, 100, seed=5, epoch=2, bucket_size=64,
                                  repeats=np.ones(n, dtype=np.int64))
    assert [b.tolist() for b in plain] == [b.tolist() for b in ones]


def test_trainer_trains_on_a_weighted_mix(parts: list[tuple[str, Path, int]],
                                          tmp_path: Path) -> None:
    weighted = tmp_path / "weighted"
    mix.write_weighted(weighted, parts, HELD_ENGLISH)
    parser = argparse.ArgumentParser()
    train.configure(parser)
    args = parser.parse_args([
        "--data", str(weighted), "--out", str(tmp_path / "run"), "--vocab-size", "120",
        "--character-coverage", "1.0", "--d-model", "32", "--layers", "1", "--heads", "2",
        "--ffn", "64", "--max-tokens", "256", "--max-src-len", "24", "--max-tgt-len", "24",
        "--warmup", "5", "--threads", "1", "--no-progress", "--eval-max-sentences", "2",
        "--max-steps", "3", "--eval-every", "0"])
    assert train.run(args) == 0
    assert (tmp_path / "run" / "tokenizer.model").is_file()
    assert len(list((tmp_path / "run" / "cache").glob("train-*.npz"))) == 3
    assert not list((tmp_path / "run").glob(".mix-text-*"))

    # A release records the weighted mix, and so does the next phase's record of it, read
    # from the mix where an older release did not keep it.
    import json

    from seq2serve.model.train import release

    first = release.release_checkpoint(tmp_path / "run" / "checkpoints" / "step-000000003",
                                       tmp_path / "first", "tiny")
    assert first["train_weighted"] is True
    assert first["train_repeat"] == {str(folder): weight for _, folder, weight in parts}
    config = tmp_path / "first" / "config.json"
    older = {k: v for k, v in json.loads(config.read_text()).items() if k != "train_weighted"}
    config.write_text(json.dumps(older))
    args = parser.parse_args([
        "--data", str(weighted), "--out", str(tmp_path / "run2"), "--init-from",
        str(tmp_path / "first"), "--tokenizer", str(tmp_path / "first" / "tokenizer.model"),
        "--max-tokens", "256", "--max-src-len", "24", "--max-tgt-len", "24", "--warmup", "5",
        "--threads", "1", "--no-progress", "--eval-max-sentences", "2", "--max-steps", "4",
        "--eval-every", "0"])
    assert train.run(args) == 0
    second = release.release_checkpoint(tmp_path / "run2" / "checkpoints" / "step-000000004",
                                        tmp_path / "second", "tiny")
    assert second["base"]["train_weighted"] is True and second["train_weighted"] is True


def test_reversed_mix_reads_the_parts_backwards(parts: list[tuple[str, Path, int]],
                                                tokenizer: Tokenizer, tmp_path: Path) -> None:
    forward, backward = tmp_path / "en-de", tmp_path / "de-en"
    mix.write_weighted(forward, parts, HELD_ENGLISH)
    info = mix.write_weighted(backward, parts, HELD_ENGLISH, reverse=True)
    assert (info["src_lang"], info["tgt_lang"], mix.is_reversed(info)) == ("de", "en", True)
    assert not mix.is_reversed(mix.read_info(forward))
    # train: the forward mix's pairs, each the other way round (the English held out of
    # en-de is held out of de-en, where it is the target)
    rows = list(mix.train_rows(backward))
    assert [(t, s) for _, s, t in rows] == [(s, t) for _, s, t in mix.train_rows(forward)]
    assert ("Speichern", "Save") not in {(s, t) for _, s, t in rows}
    assert not any(t in HELD_ENGLISH for _, _, t in rows)
    for split in ("valid", "test"):
        assert (backward / f"{split}.src").read_bytes() == (forward / f"{split}.tgt").read_bytes()
        assert (backward / f"{split}.tgt").read_bytes() == (forward / f"{split}.src").read_bytes()
    assert info["counts"] == mix.read_info(forward)["counts"]
    # tokenized: the same examples with source and target exchanged
    ahead = batching.tokenize_mix(forward, tokenizer, tmp_path / "c1", 200, 200)
    back = batching.tokenize_mix(backward, tokenizer, tmp_path / "c2", 200, 200)
    assert _examples(back) == Counter({(t, s): n for (s, t), n in _examples(ahead).items()})
    with mix.train_text(backward, tmp_path / "scratch") as files:
        assert files[0].read_text().split("\n")[:-1] == [s for _, s, _ in rows]


def test_trainer_takes_the_direction_of_its_data_not_of_its_start(
        parts: list[tuple[str, Path, int]], tmp_path: Path) -> None:
    """de-en started from an en-de checkpoint records de-en (export reads it)."""
    from seq2serve.model import checkpoint as ckpt

    parser = argparse.ArgumentParser()
    train.configure(parser)
    common = ["--vocab-size", "120", "--character-coverage", "1.0", "--d-model", "32",
              "--layers", "1", "--heads", "2", "--ffn", "64", "--max-tokens", "256",
              "--max-src-len", "24", "--max-tgt-len", "24", "--warmup", "5", "--threads", "1",
              "--no-progress", "--eval-max-sentences", "2", "--max-steps", "2",
              "--eval-every", "0"]
    mix.write_weighted(tmp_path / "en-de", parts, HELD_ENGLISH)
    mix.write_weighted(tmp_path / "de-en", parts, HELD_ENGLISH, reverse=True)
    assert train.run(parser.parse_args(
        ["--data", str(tmp_path / "en-de"), "--out", str(tmp_path / "fwd"), *common])) == 0
    start = ckpt.latest_checkpoint(tmp_path / "fwd")
    assert start is not None
    assert train.run(parser.parse_args(
        ["--data", str(tmp_path / "de-en"), "--out", str(tmp_path / "back"),
         "--init-from", str(start), *common])) == 0
    latest = ckpt.latest_checkpoint(tmp_path / "back")
    assert latest is not None
    meta = ckpt.read_meta(latest)
    assert (meta["src_lang"], meta["tgt_lang"]) == ("de", "en")
    assert meta["model"]["extra"] == {"task": "translate", "src_lang": "de", "tgt_lang": "en"}
