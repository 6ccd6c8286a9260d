"""`seq2serve data`: DDTP index parsing, alignment, cleaning, splitting and the CLI."""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from collections import Counter
from pathlib import Path

import lz4.frame
import pytest

from seq2serve.model.data import corpus, ddtp
from seq2serve.model.data.ddtp import Description, Paragraph
from seq2serve.server.cli.main import main as cli_main

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ddtp"
ALPHA, BETA, GAMMA = (
    "0a1f3c6e2b7d4e5f8a9b0c1d2e3f4a5b",
    "1b2c3d4e5f60718293a4b5c6d7e8f901",
    "2c3d4e5f60718293a4b5c6d7e8f90a1b",
)


def fixture(name: str) -> dict[str, Description]:
    return ddtp.parse_index((FIXTURES / name).read_text("utf-8"))


@pytest.fixture
def index_dir(tmp_path: Path) -> Path:
    """The fixtures as apt would store them: one lz4, one gzip, two plain."""
    directory = tmp_path / "lists"
    directory.mkdir()
    en = (FIXTURES / "Translation-en").read_bytes()
    (directory / "x_main_i18n_Translation-en.lz4").write_bytes(lz4.frame.compress(en))
    fr = (FIXTURES / "Translation-fr").read_bytes()
    (directory / "x_main_i18n_Translation-fr.gz").write_bytes(gzip.compress(fr))
    shutil.copy(FIXTURES / "Translation-de", directory / "x_main_i18n_Translation-de")
    shutil.copy(FIXTURES / "security_Translation-en", directory / "sec_main_i18n_Translation-en")
    (directory / "x_main_binary-amd64_Packages").write_text("ignored\n")
    return directory


def run_cli(*argv: str) -> int:
    """DDTP only: the messages corpus would fetch packages (tests/test_gettext_corpus.py)."""
    parser = argparse.ArgumentParser()
    corpus.configure(parser)
    return corpus.run(parser.parse_args(["--corpora", "ddtp", *argv]))


# --------------------------------------------------------------------------- parsing


def test_parse_index_synopsis_paragraphs_and_continuations() -> None:
    en = fixture("Translation-en")
    assert set(en) >= {ALPHA, BETA, GAMMA}
    alpha = en[ALPHA]
    assert alpha.package == "alpha"
    assert alpha.synopsis == "Tool to frobnicate widgets"  # whitespace collapsed
    assert [p.text for p in alpha.paragraphs] == [
        "Alpha frobnicates widgets of all kinds, e.g. buttons and sliders. It is fast.",
        "This package contains the command-line tool.",
    ]
    assert alpha.long_text == " ".join(p.text for p in alpha.paragraphs)
    # the verbatim list (two leading spaces) stays one flagged paragraph
    assert [p.preformatted for p in en[GAMMA].paragraphs] == [False, True, False]
    assert en[GAMMA].paragraphs[1].text == (
        "Included tools: * gcat - concatenate files * gls - list files"
    )
    assert en["4e5f60718293a4b5c6d7e8f90a1b2c3d"].paragraphs == []


def test_parse_index_skips_incomplete_stanzas_and_ignores_other_fields() -> None:
    text = (
        "Package: a\nDescription-en: no md5\n\n"
        "Package: b\nDescription-md5: 11\n\n"
        "Package: c\nDescription-md5: 22\nDescription-en:  Syn \n line one\n"
        "  verbatim\n .\n .\n line two\nX-Other: v\n continuation of X\n"
    )
    parsed = ddtp.parse_index(text)
    assert list(parsed) == ["22"]
    assert parsed["22"].synopsis == "Syn"
    assert parsed["22"].paragraphs == [
        Paragraph("line one verbatim", True),
        Paragraph("line two", False),
    ]


def test_normalize_collapses_all_whitespace() -> None:
    assert ddtp.normalize("  a\t b\u2028c\n d  ") == "a b c d"


# --------------------------------------------------------------------------- sentences


@pytest.mark.parametrize(
    ("text", "lang", "expected"),
    [
        ("One. Two! Three? Four", "en", ["One.", "Two!", "Three?", "Four"]),
        ("Use e.g. Foo or i.e. Bar. Then stop.", "en", ["Use e.g. Foo or i.e. Bar.", "Then stop."]),
        ("Viele Formate, z.B. PNG, d.h. Bilder. Noch etwas.", "de",
         ["Viele Formate, z.B. PNG, d.h. Bilder.", "Noch etwas."]),
        ("Bilder usw. Alles bzw. Teile.", "de", ["Bilder usw. Alles bzw. Teile."]),
        ("Files, images, etc. Some more.", "en", ["Files, images, etc. Some more."]),
        ("Version 1.2.3 is out. Version 2. Next.", "en",
         ["Version 1.2.3 is out.", "Version 2. Next."]),
        ("Am 3. Mai kommt es. Gut.", "de", ["Am 3. Mai kommt es.", "Gut."]),
        ("Set in 0 A.D. The game.", "en", ["Set in 0 A.D. The game."]),
        ("C'est fini ! « Bien » dit-il.", "fr", ["C'est fini !", "« Bien » dit-il."]),
        ('He said "go." Then left.', "en", ['He said "go."', "Then left."]),
        ("see foo.conf. lower case continues", "en", ["see foo.conf. lower case continues"]),
        ("", "en", []),
    ],
)
def test_split_sentences(text: str, lang: str, expected: list[str]) -> None:
    assert ddtp.split_sentences(text, lang) == expected


# --------------------------------------------------------------------------- alignment


def test_align_sentences_when_counts_match() -> None:
    en, de = fixture("Translation-en"), fixture("Translation-de")
    pairs = ddtp.align(en[ALPHA], de[ALPHA])
    assert pairs == [
        ("synopsis", "Tool to frobnicate widgets", "Werkzeug zum Frobnizieren von Widgets"),
        ("paragraph", en[ALPHA].paragraphs[0].text, de[ALPHA].paragraphs[0].text),
        ("sentence", "Alpha frobnicates widgets of all kinds, e.g. buttons and sliders.",
         "Alpha frobniziert Widgets aller Art, z.B. Knöpfe und Schieberegler."),
        ("sentence", "It is fast.", "Es ist schnell."),
        # a one-sentence paragraph is emitted once, as a sentence
        ("sentence", "This package contains the command-line tool.",
         "Dieses Paket enthält das Befehlszeilenwerkzeug."),
    ]


def test_align_paragraph_count_mismatch_keeps_only_synopsis() -> None:
    en, de = fixture("Translation-en"), fixture("Translation-de")
    assert ddtp.align(en[BETA], de[BETA]) == [
        ("synopsis", "Library for reading maps", "Bibliothek zum Lesen von Karten"),
    ]


def test_align_sentence_count_mismatch_keeps_paragraph_only() -> None:
    en, fr = fixture("Translation-en"), fixture("Translation-fr")
    kinds = [kind for kind, _, _ in ddtp.align(en[ALPHA], fr[ALPHA])]
    # paragraph 1: 2 English sentences vs 1 French -> paragraph, no sentences
    assert kinds == ["synopsis", "paragraph", "sentence"]


def test_align_never_splits_preformatted_paragraphs() -> None:
    en, de = fixture("Translation-en"), fixture("Translation-de")
    pairs = ddtp.align(en[GAMMA], de[GAMMA])
    assert ("paragraph", en[GAMMA].paragraphs[1].text, de[GAMMA].paragraphs[1].text) in pairs
    assert not any(kind == "sentence" and "gcat" in src for kind, src, _ in pairs)
    # "0 A.D." is not a boundary in English, so paragraph 3 splits 1 vs 2: no sentences
    assert not any(kind == "sentence" and "joke" in src for kind, src, _ in pairs)
    assert ("sentence", "Version 1.2.3 added more of them.",
            "Version 1.2.3 hat weitere hinzugefügt.") in pairs


@pytest.mark.parametrize(
    ("pair", "reason"),
    [
        (("sentence", "", "x"), "empty side"),
        (("synopsis", "Same", "Same"), "source equals target"),
        (("sentence", "a" * 1001, "b" * 1001), "longer than 1000 chars"),
        (("paragraph", "short", "x" * 16), "length ratio > 3"),
        (("synopsis", "short", "x" * 16), None),  # ratio applies to paragraphs/sentences only
        (("sentence", "short", "x" * 15), None),
        (("description", "Short.", "A longer synopsis"), "synopsis not shorter"),
        (("description", "A long description.", "Short"), None),
    ],
)
def test_reject_reason(pair: tuple[str, str, str], reason: str | None) -> None:
    assert ddtp.reject_reason(*pair) == reason


# --------------------------------------------------------------------------- splits


def md5_in(split: str, start: int = 0) -> str:
    return next(m for i in range(start, 100_000) if corpus.split_of(m := f"{i:032x}") == split)


def test_split_of_is_deterministic_and_roughly_2_2_96() -> None:
    md5s = [f"{i:032x}" for i in range(20_000)]
    counts = Counter(corpus.split_of(m) for m in md5s)
    assert [corpus.split_of(m) for m in md5s[:50]] == [corpus.split_of(m) for m in md5s[:50]]
    assert corpus.split_of("d943033bedada21853d2ae54a2578a7b") == corpus.split_of(
        "d943033bedada21853d2ae54a2578a7b")
    assert 0.015 < counts["test"] / 20_000 < 0.025
    assert 0.015 < counts["valid"] / 20_000 < 0.025


def synthetic(md5: str, tag: str) -> tuple[Description, Description]:
    en = Description(md5, tag, f"Tool {tag}", [
        Paragraph(f"First {tag} sentence here. Second {tag} sentence here.", False)])
    de = Description(md5, tag, f"Werkzeug {tag}", [
        Paragraph(f"Erster {tag} Satz hier. Zweiter {tag} Satz hier.", False)])
    return en, de


def test_build_keeps_each_description_in_one_split() -> None:
    english, german = {}, {}
    for i in range(400):
        md5 = f"{i:032x}"
        english[md5], german[md5] = synthetic(md5, f"p{i}x")
    corpora = {c.name: c for c in corpus.build(english, {"de": german})}
    for c in corpora.values():
        where: dict[str, set[str]] = {}
        for split, pairs in c.splits.items():
            for _, src, _ in pairs:
                tag = next(w for w in src.split() if w.startswith("p") and w.endswith("x"))
                where.setdefault(tag, set()).add(split)
        assert len(where) == 400
        assert all(len(splits) == 1 for splits in where.values())
        assert {tag: s.pop() for tag, s in where.items()} == {
            f"p{i}x": corpus.split_of(f"{i:032x}") for i in range(400)}
    de_counts = corpora["en-de"].counts()
    assert sum(sum(k.values()) for k in de_counts.values()) == 400 * 4
    assert corpora["summarize-en"].counts()["train"]["description"] > 350


def test_build_dedupes_with_test_priority() -> None:
    in_train, in_test = md5_in("train"), md5_in("test")
    english, german = {}, {}
    for md5 in (in_train, in_test, md5_in("train", int(in_train, 16) + 1)):
        english[md5], german[md5] = synthetic(md5, "same")  # identical text, three md5s
    corpora = {c.name: c for c in corpus.build(english, {"de": german})}
    de = corpora["en-de"]
    assert de.splits["train"] == []
    assert [k for k, _, _ in de.splits["test"]] == ["synopsis", "paragraph", "sentence", "sentence"]
    assert de.dropped["duplicate"] == 8
    summ = corpora["summarize-en"]
    assert len(summ.splits["test"]) == 1 and summ.splits["train"] == []


# --------------------------------------------------------------------------- sources


def test_find_indexes_and_read_compressed(index_dir: Path) -> None:
    found = corpus.find_indexes(index_dir, ["en", "de", "fr"])
    assert [p.name for p in found["en"]] == [
        "sec_main_i18n_Translation-en", "x_main_i18n_Translation-en.lz4"]
    assert [p.name for p in found["fr"]] == ["x_main_i18n_Translation-fr.gz"]
    assert corpus.read_index(found["en"][1]) == (FIXTURES / "Translation-en").read_text("utf-8")
    assert corpus.read_index(found["fr"][0]).startswith("Package: alpha")


def test_release_info_reads_sibling_inrelease(tmp_path: Path) -> None:
    index = tmp_path / "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en.lz4"
    index.write_bytes(b"")
    (tmp_path / "deb.debian.org_debian_dists_bookworm_InRelease").write_text(
        "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\nOrigin: Debian\nSuite: oldstable\n"
        "Codename: bookworm\nDate: Sat, 11 Jul 2026 10:16:37 UTC\nMD5Sum:\n abc 1 x\n")
    assert corpus.release_info(index) == {
        "origin": "Debian", "suite": "oldstable", "codename": "bookworm",
        "date": "Sat, 11 Jul 2026 10:16:37 UTC"}
    assert corpus.release_info(tmp_path / "Translation-en") == {}


# --------------------------------------------------------------------------- CLI


def line_count(path: Path) -> int:
    text = path.read_text("utf-8")
    assert text == "" or text.endswith("\n")
    return text.count("\n")


def test_cli_end_to_end(index_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                        ) -> None:
    out = tmp_path / "out"
    assert cli_main(["data", "--corpora", "ddtp", "--from-dir", str(index_dir),
                     "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "DATA_CARD.md", "en-de", "en-fr", "summarize-en"]
    assert not list(tmp_path.glob(".out.tmp-*"))
    totals: dict[str, Counter[str]] = {}
    for name in ("en-de", "en-fr", "summarize-en"):
        meta = json.loads((out / name / "corpus.json").read_text("utf-8"))
        assert meta["task"] == ("summarize" if name == "summarize-en" else "translate")
        assert (meta["src_lang"], meta["tgt_lang"]) == ("en", name[-2:])
        totals[name] = Counter()
        for split in ("train", "valid", "test"):
            n = sum(meta["counts"][split].values())
            for ext in ("src", "tgt", "kind"):
                assert line_count(out / name / f"{split}.{ext}") == n
            kinds = (out / name / f"{split}.kind").read_text("utf-8").split()
            assert Counter(kinds) == meta["counts"][split]
            totals[name].update(kinds)
    # 5 English descriptions with a long text whose synopsis is shorter (zeta is not)
    assert totals["summarize-en"] == {"description": 5}
    # alpha 1+1+3, beta 1, gamma 1+3+2, delta 0+1+2 (its synopsis is left untranslated)
    assert totals["en-de"] == {"synopsis": 3, "paragraph": 5, "sentence": 7}
    # alpha synopsis/paragraph/sentence + epsilon synopsis
    assert totals["en-fr"] == {"synopsis": 2, "paragraph": 1, "sentence": 1}
    card = (out / "DATA_CARD.md").read_text("utf-8")
    assert "No single licence" in card and "x_main_i18n_Translation-de" in card
    assert "summarize-en" in capsys.readouterr().out


def test_cli_refuses_non_empty_out_unless_forced(index_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert run_cli("--from-dir", str(index_dir), "--out", str(out)) == 1
    assert (out / "keep.txt").read_text() == "precious"
    assert run_cli("--from-dir", str(index_dir), "--out", str(out), "--force") == 0
    assert not (out / "keep.txt").exists() and (out / "en-de" / "train.src").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lists", "out"]


def test_cli_langs_and_missing_index(index_dir: Path, tmp_path: Path) -> None:
    assert run_cli("--from-dir", str(index_dir), "--out", str(tmp_path / "a"),
                   "--langs", "fr") == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "DATA_CARD.md", "en-fr", "summarize-en"]
    assert run_cli("--from-dir", str(index_dir), "--out", str(tmp_path / "b"),
                   "--langs", "it") == 1
    assert run_cli("--from-dir", str(index_dir), "--out", str(tmp_path / "c"),
                   "--langs", "en") == 1
    assert not (tmp_path / "b").exists()


def test_help_documents_every_option() -> None:
    parser = argparse.ArgumentParser()
    corpus.configure(parser)
    text = parser.format_help()
    for option in ("--out", "--langs", "--from-dir", "--no-update", "--force", "--corpora",
                   "--messages-out", "--mixed-out", "--deb-cache", "--max-packages",
                   "--max-download-mb", "--max-deb-mb", "--per-package", "--catalogs-from",
                   "--ddtp-repeat"):
        assert option in text
