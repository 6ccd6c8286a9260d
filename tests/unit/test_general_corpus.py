"""General corpus: reading the shared gz files, cleaning, splits by English, held-out
sentences of the other corpora, the four-corpus mix."""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from corpus_folders import write_corpus

from seq2serve.model.data import corpus, general, mix
from seq2serve.model.train import card


def _gz(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8", newline="\n") as f:
        f.write("".join(f"{line}\n" for line in lines))


def _source(directory: Path, name: str, lang: str, pairs: list[tuple[str, str]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _gz(directory / f"{name}.en-{lang}.en.gz", [s for s, _ in pairs])
    _gz(directory / f"{name}.en-{lang}.{lang}.gz", [t for _, t in pairs])


def _english_in(split: str, start: int = 0) -> str:
    """An English sentence that the split rule puts in `split`."""
    return next(f"Sentence number {i}." for i in range(start, 10_000)
                if general.english_split(f"Sentence number {i}.") == split)


def test_split_rule_shares() -> None:
    splits = [general.english_split(f"Line {i}.") for i in range(20_000)]
    assert 0.007 < splits.count("test") / len(splits) < 0.013
    assert 0.007 < splits.count("valid") / len(splits) < 0.013


def test_build_cleans_dedupes_and_splits_by_english(tmp_path: Path) -> None:
    test_en = _english_in("test")
    _source(tmp_path, "manythings", "de", [
        ("I  am hungry.", "Ich habe Hunger."),       # whitespace collapsed
        ("I am hungry.", "Ich habe Hunger."),        # then a duplicate
        ("Cafe\u0301.", "Cafe\u0301."),               # NFC, then source equals target
        ("", "Leer."),                                # empty side
        (test_en, "Erste Übersetzung."),
        (test_en, "Zweite Übersetzung."),             # same English: same split
        ("Where is the station?", "Wo ist der Bahnhof?"),  # held out elsewhere
    ])
    _source(tmp_path, "newstest", "de", [("The market fell.", "Der Markt fiel.")])
    held = {"Wo ist der Bahnhof?"}
    built = general.build(tmp_path, "de", held)
    rows = {(s, t): (split, k) for split, r in built.splits.items() for k, s, t in r}
    assert rows[("I am hungry.", "Ich habe Hunger.")] == ("train", "manythings")
    assert rows[("The market fell.", "Der Markt fiel.")][1] == "newstest"
    assert rows[(test_en, "Erste Übersetzung.")][0] == "test"
    assert rows[(test_en, "Zweite Übersetzung.")][0] == "test"
    assert not any(s == "Where is the station?" and split == "train"
                   for (s, _), (split, _) in rows.items())
    assert built.dropped == {"duplicate": 1, "source equals target": 1, "empty side": 1,
                             "in another corpus's valid/test split": int(
                                 general.english_split("Where is the station?") == "train")}
    assert built.read == {"manythings": 7, "newstest": 1}


def test_unaligned_files_fail(tmp_path: Path) -> None:
    _gz(tmp_path / "tatoeba.en-fr.en.gz", ["One.", "Two."])
    _gz(tmp_path / "tatoeba.en-fr.fr.gz", ["Un."])
    with pytest.raises(ValueError):
        general.build(tmp_path, "fr", set())


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    corpus.configure(parser)
    return parser.parse_args(argv)


def test_cli_needs_the_other_corpora_then_writes_corpus_and_mix(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    train_en = _english_in("train")
    _source(shared, "manythings", "de", [(train_en, "Ein Satz."),
                                         ("A tool.", "Ein Werkzeug."),
                                         ("Test me.", "Teste mich.")])
    args = ["--general-from", str(shared), "--general-out", str(tmp_path / "general"),
            "--out", str(tmp_path / "ddtp"), "--messages-out", str(tmp_path / "messages"),
            "--everyday-out", str(tmp_path / "everyday"),
            "--general-mix-out", str(tmp_path / "mix"), "--mix-out", str(tmp_path / "weighted"),
            "--langs", "de",
            "--corpora", "general", "--ddtp-repeat", "2", "--everyday-repeat", "1",
            "--general-repeat", "3"]
    assert corpus.run(_parse(args)) == 1  # the other corpora are not built
    write_corpus(tmp_path / "ddtp" / "en-de", {
        "train": [("sentence", "A tool.", "Ein Werkzeug.")],
        "test": [("sentence", "Test me.", "Teste mich bitte.")]})
    write_corpus(tmp_path / "messages" / "en-de", {"train": [("message", "Open", "Öffnen")]})
    write_corpus(tmp_path / "everyday" / "en-de", {"train": [("sentence", "Hi.", "Hallo.")]})
    assert corpus.run(_parse(args)) == 0
    out = tmp_path / "general" / "en-de"
    info = json.loads((out / "corpus.json").read_text())
    assert info["source"]["files"]["manythings"]["license"].startswith("CC-BY 2.0 FR")
    train = (out / "train.src").read_text().split("\n")[:-1]
    assert "Test me." not in train  # another corpus's test sentence
    # the weighted mix: parts and weights, its training pairs repeated when read
    weighted = tmp_path / "weighted" / "en-de"
    assert not (weighted / "train.src").exists()
    assert [p["weight"] for p in json.loads((weighted / "corpus.json").read_text())["parts"]] \
        == [2, 1, 1, 3]
    pairs = [(s, t) for _, s, t in mix.train_rows(weighted)]
    assert pairs.count((train_en, "Ein Satz.")) == 3
    assert pairs.count(("A tool.", "Ein Werkzeug.")) == 2 + 3 * ("A tool." in train)
    assert pairs.count(("Hi.", "Hallo.")) == 1
    assert ("Test me.", "Teste mich bitte.") in list(zip(
        (weighted / "test.src").read_text().split("\n"),
        (weighted / "test.tgt").read_text().split("\n"), strict=True))
    # the written mix of older releases, from the corpora already built: the same pairs
    assert corpus.run(_parse([*args[:-8], "--corpora", "general-mix", "--ddtp-repeat", "2",
                              "--everyday-repeat", "1"])) == 0
    written = tmp_path / "mix" / "en-de"
    assert Counter(zip((written / "train.src").read_text().split("\n")[:-1],
                       (written / "train.tgt").read_text().split("\n")[:-1],
                       strict=True)) == Counter(pairs)
    assert corpus.run(_parse([*args[:-8], "--corpora", "general-mix", "--force",
                              "--general-repeat", "1"])) == 0
    pairs = (written / "train.src").read_text().split("\n")
    assert pairs.count(train_en) == 1


@pytest.mark.parametrize(("english", "spelled"), [
    ("I'm hungry.", "I am hungry."),
    ("We're going to the beach tomorrow.", "We are going to the beach tomorrow."),
    ("I don't know.", "I do not know."),
    ("Don't touch that!", "Do not touch that!"),
    ("I can't swim.", "I cannot swim."),
    ("He won't come, but they'll wait.", "He will not come, but they will wait."),
    ("You've won and I\u2019m glad.", "You have won and I am glad."),
    ("It's late and I'd rather go.", "It's late and I'd rather go."),  # 's, 'd: two readings
    ("Why don't you come?", "Why don't you come?"),  # inverted: not "do not you"
    ("Where're you going?", "Where are you going?"),
    ("He ain't here.", "He ain't here."),
])
def test_contractions_of_one_reading_are_spelled_out(english: str, spelled: str) -> None:
    assert general.expand_contractions(english) == spelled


def test_build_adds_spelled_out_train_pairs_but_never_a_held_out_or_other_split_one(
        tmp_path: Path) -> None:
    # an English "I'm ..." in train whose spelled-out form the split rule puts in test
    to_test = next(f"I'm number {i}." for i in range(10_000)
                   if general.english_split(f"I'm number {i}.") == "train"
                   and general.english_split(f"I am number {i}.") == "test")
    cold = next(f"I'm cold {i}." for i in range(10_000)
                if general.english_split(f"I'm cold {i}.") == "train"
                and general.english_split(f"I am cold {i}.") == "train")
    hungry = next(f"I'm hungry {i}." for i in range(10_000)
                  if general.english_split(f"I'm hungry {i}.") == "train"
                  and general.english_split(f"I am hungry {i}.") == "train")
    _source(tmp_path, "manythings", "fr", [(cold, "J'ai froid."), (hungry, "J'ai faim."),
                                           (to_test, "Je suis le numéro.")])
    held = {hungry.replace("I'm", "I am")}  # e.g. a hand-written test sentence
    plain = general.build(tmp_path, "fr", held)
    built = general.build(tmp_path, "fr", held, expand=True)
    assert plain.expanded == 0 and built.expanded == 1
    train = [(s, t) for _, s, t in built.splits["train"]]
    assert train == [(cold, "J'ai froid."), (cold.replace("I'm", "I am"), "J'ai froid."),
                     (hungry, "J'ai faim."), (to_test, "Je suis le numéro.")]
    assert [s for _, s, _ in built.splits["test"]] == []
    # what was built so is recorded, travels into a mix's parts and a card's command
    general.write(tmp_path / "out", [built], tmp_path)
    info = json.loads((tmp_path / "out" / "en-fr" / "corpus.json").read_text())
    assert info["build_flags"] == ["--general-expand-contractions"]
    assert info["contractions_spelled_out"] == 1
    folder = tmp_path / "mix" / "en-fr"
    mixed = mix.write_weighted(folder, [("general", tmp_path / "out" / "en-fr", 2)])
    assert mixed["parts"][0]["build_flags"] == ["--general-expand-contractions"]
    command = card.data_commands(card.training_data(str(folder), mixed))[0]  # the build
    assert "--general-expand-contractions" in command.split("#")[0]
    assert _parse(command.split("#")[0].split()[2:]).general_expand_contractions
