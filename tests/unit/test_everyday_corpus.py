"""Everyday corpus: .po, catalog paths, Ding and Tux Paint readers, splits, mix, CLI."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import pytest
from corpus_folders import write_corpus
from mo_files import mo_bytes

from seq2serve.model.data import corpus, everyday, everyday_data, messages
from seq2serve.model.data.gettext import MoError
from seq2serve.model.data.po import read_po

PO = r'''# German translation
msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"
"Plural-Forms: nplurals=2; plural=(n != 1);\n"

#. a comment
#: src/story.cfg:12
msgid "Where is the "
"train station?"
msgstr "Wo ist der "
"Bahnhof?"

#, fuzzy
msgid "I am hungry."
msgstr "Ich habe Durst."

msgctxt "weather"
msgid "The weather is nice today."
msgstr "Das Wetter ist heute schön."

msgid "one apple"
msgid_plural "%d apples"
msgstr[0] "ein Apfel"
msgstr[1] "%d Äpfel"

#~ msgid "Obsolete line."
#~ msgstr "Veraltete Zeile."

msgid "Say \"hello\".\n"
msgstr "Sag „hallo“.\n"
'''


def test_read_po_skips_fuzzy_and_obsolete_and_joins_lines() -> None:
    catalog = read_po(PO)
    assert catalog.nplurals == 2
    got = [(e.context, e.msgid, e.msgid_plural, e.msgstrs) for e in catalog.entries]
    assert got == [
        (None, "Where is the train station?", None, ("Wo ist der Bahnhof?",)),
        ("weather", "The weather is nice today.", None, ("Das Wetter ist heute schön.",)),
        (None, "one apple", "%d apples", ("ein Apfel", "%d Äpfel")),
        (None, 'Say "hello".\n', None, ("Sag „hallo“.\n",)),
    ]


def test_read_po_refuses_garbage() -> None:
    with pytest.raises(MoError):
        read_po('msgid "a"\nmsgstr "b"\nthis is not po\n')


@pytest.mark.parametrize(("path", "expected"), [
    ("usr/share/games/wesnoth/1.16/locale/de/LC_MESSAGES/wesnoth-tsg.mo",
     ("de", "usr/share/games/wesnoth/1.16/locale/{lang}/LC_MESSAGES/wesnoth-tsg.mo")),
    ("usr/share/games/pingus/data/po/fr.po", ("fr", "usr/share/games/pingus/data/po/{lang}.po")),
    ("usr/share/games/flare/mods/default/languages/data.de.po",
     ("de", "usr/share/games/flare/mods/default/languages/data.{lang}.po")),
    ("./usr/lib/python3/dist-packages/singularity/i18n/lang_de_DE/story.po",
     ("de", "usr/lib/python3/dist-packages/singularity/i18n/lang_{lang}/story.po")),
    ("usr/share/locale/fr/LC_MESSAGES/freeciv-core.mo",
     ("fr", "usr/share/locale/{lang}/LC_MESSAGES/freeciv-core.mo")),
    ("usr/share/games/pingus/data/po/es.po", None),
    ("usr/share/ledgersmb/locale/po/de_CH.po", None),  # Swiss German: not de_DE
    ("usr/share/doc/x/README.de", None),
    ("usr/share/games/x/defaults.mo", None),
])
def test_catalog_lang(path: str, expected: tuple[str, str] | None) -> None:
    assert everyday.catalog_lang(path) == expected


DING = """# Version :: devel 2023-01-30
Ich liebe dich! :: I love you!
Wo ist der Bahnhof? {m} :: Where is the station? [Br.]
Er wohnt in Berlin. | Sie wohnt in Paris. :: He lives in Berlin. | She lives in Paris.
Hund {m}; Köter {m} :: dog; cur
Das ist mir egal. :: I don't care. /IDC/
Sie teilte den Kuchen. :: She divided the pie in half/into six pieces.
Ja. :: Yes.
"""


def test_dictionary_pairs_keep_sentence_examples_only() -> None:
    assert everyday.dictionary_pairs(DING) == [
        ("I love you!", "Ich liebe dich!"),
        ("Where is the station?", "Wo ist der Bahnhof?"),
        ("He lives in Berlin.", "Er wohnt in Berlin."),
        ("She lives in Paris.", "Sie wohnt in Paris."),
        ("I don't care.", "Das ist mir egal."),
    ]


FREEDICT = """00-database-info
This is the English-French FreeDict dictionary /eng-fra/ of 2017.

beach /biːtʃ/
plage
station /steiʃən/
1. gare
2. station
care /kɛə/
1. avoir soin de, se soucier de
the /ðə/
à l'
water /wɔːtər/
[adj.] aquatique; eau
give a ring /ɡɪv ə rɪŋ/
sonner
bus stop /bʌs stɔp/
arrêt de bus
a very long headword /x/
mot
hungry /hʌŋɡri/
   "I am hungry"  -  j'ai faim
"""


def test_word_list_pairs_take_each_headwords_first_translation() -> None:
    assert everyday.word_list_pairs(FREEDICT) == [
        ("beach", "plage"), ("station", "gare"), ("care", "avoir soin de"),
        ("water", "aquatique"), ("give a ring", "sonner"), ("bus stop", "arrêt de bus"),
    ]


def test_stamp_pairs() -> None:
    text = "A happy lion!\nca.utf8=Un lleó feliç.\nde.utf8=Ein fröhlicher Löwe!\n" \
           "fr.utf8=Un lion heureux !\n"
    assert everyday.stamp_pairs(text, "de") == [("A happy lion!", "Ein fröhlicher Löwe!")]
    assert everyday.stamp_pairs(text, "fr") == [("A happy lion!", "Un lion heureux !")]
    assert everyday.stamp_pairs("A cat.\nes.utf8=Un gato.\n", "de") == []


def test_with_sentences_splits_aligned_passages() -> None:
    assert everyday.with_sentences("We must hurry.", "Wir müssen uns beeilen.") == [
        ("sentence", "We must hurry.", "Wir müssen uns beeilen.")]
    assert everyday.with_sentences("Run! The orcs are here.", "Lauft! Die Orks sind da.") == [
        ("paragraph", "Run! The orcs are here.", "Lauft! Die Orks sind da."),
        ("sentence", "Run!", "Lauft!"), ("sentence", "The orcs are here.", "Die Orks sind da.")]
    # counts differ: the passage only
    assert [k for k, _, _ in everyday.with_sentences("Go. Now.", "Geh jetzt.")] == ["paragraph"]


def test_package_split_named_and_inherited() -> None:
    assert everyday.package_split("wesnoth-1.16-dm", "wesnoth-1.16") == "test"
    assert everyday.package_split("wesnoth-1.16-thot", "wesnoth-1.16") == "valid"
    assert everyday.package_split("wesnoth-1.16-tsg", "wesnoth-1.16") == "train"
    # adonthell-data's source package is a test package of the messages corpus
    assert messages.split_of_package("adonthell-data") == "test"
    assert everyday.package_split("adonthell-data", "adonthell-data") == "test"


ISSUE_SENTENCES = ["I love you.", "The weather is nice today.", "Where is the train station?",
                   "My brother lives in Berlin.", "We are going to the beach tomorrow.",
                   "I am hungry."]


@pytest.mark.parametrize("lang", ["de", "fr"])
def test_handwritten_test_set(lang: str) -> None:
    pairs = everyday.handwritten(lang)
    assert len(pairs) >= 200 and len({s for s, _ in pairs}) == len(pairs)
    assert [s for s, _ in pairs[:6]] == ISSUE_SENTENCES
    assert all(s and t and s != t and "\t" not in t for s, t in pairs)
    assert everyday.handwritten("de")[5] == ("I am hungry.", "Ich habe Hunger.")


# --------------------------------------------------------------------------- a tree


def _campaign(n: int) -> list[tuple[str, str]]:
    return [(f"Soldier {i}, hold the bridge until dawn.", f"Soldat {i}, haltet die Brücke "
             "bis zum Morgengrauen.") for i in range(n)]


def make_tree(root: Path) -> Path:
    """Packages as `dpkg-deb -x` leaves them: catalogs in and out of usr/share/locale,
    a .po, Ding, a stamp, a held-out package and one sharing a held-out source."""
    def put(package: str, path: str, data: bytes, source: str | None = None) -> None:
        target = root / package / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if source:
            (root / package / "SOURCE").write_text(source)

    loc = "usr/share/games/wesnoth/1.16/locale/{}/LC_MESSAGES/wesnoth-{}.mo"
    put("wesnoth-1.16-tsg", loc.format("de", "tsg"), mo_bytes(
        [*_campaign(5), ("Cancel", "Abbrechen"), ("%s gold", "%d Gold")]), "wesnoth-1.16")
    put("wesnoth-1.16-tsg", loc.format("fr", "tsg"), mo_bytes(
        [("We must go home now.", "Nous devons rentrer maintenant.")]), "wesnoth-1.16")
    put("wesnoth-1.16-dm", loc.format("de", "dm"), mo_bytes(
        [("Where is my brother?", "Wo ist mein Bruder?"), ("Cancel", "Abbrechen")]),
        "wesnoth-1.16")
    put("pingus-data", "usr/share/games/pingus/data/po/de.po", PO.encode(), "pingus")
    put("trans-de-en", "usr/share/trans/de-en", DING.encode(), "ding")
    put("tuxpaint-stamps-default", "usr/share/tuxpaint/stamps/animals/lion.txt",
        "A happy lion!\nde.utf8=Ein fröhlicher Löwe!\nfr.utf8=Un lion heureux !\n".encode())
    put("coreutils", "usr/share/locale/de/LC_MESSAGES/coreutils.mo",
        mo_bytes([("Copy the file.", "Kopiere die Datei.")]))
    put("bash-doc", "usr/share/doc/bash/po/de.po", PO.encode(), "bash")
    put("dict-freedict-eng-fra", "usr/share/dictd/freedict-eng-fra.dict.dz",
        gzip.compress(FREEDICT.encode()), "freedict")
    return root


def test_build_from_tree(tmp_path: Path) -> None:
    members = list(everyday_data.tree_members(make_tree(tmp_path)))
    assert {m[0] for m in members} >= {"wesnoth-1.16-tsg", "trans-de-en", "coreutils"}
    de, fr = everyday.build(members, ["de", "fr"], per_package=5)
    rows = {(r[2], r[3]): (split, r[0], r[1]) for split, split_rows in de.splits.items()
            for r in split_rows}
    texts = {src for src, _ in rows}
    # held out, or sharing a held-out source package: never read
    assert "Copy the file." not in texts and de.dropped["held-out package"] == 2
    # per-package cap on catalogs (5 campaign lines + Cancel: 5 kept), none on Ding
    assert de.dropped["over the per-package cap"] == 1
    assert sum(r[0] == "trans-de-en" for split in de.splits.values() for r in split) == 5
    # named test package; a pair shared with a train package stays in train
    assert rows[("Where is my brother?", "Wo ist mein Bruder?")][0] == "test"
    if ("Cancel", "Abbrechen") in rows:
        assert rows[("Cancel", "Abbrechen")][0] == "train"
    # .po: fuzzy left out, plural forms kept, printf placeholders checked
    assert ("Where is the train station?", "Wo ist der Bahnhof?") in rows
    assert "I am hungry." not in texts
    assert rows[("%d apples", "%d Äpfel")][2] == "sentence"
    assert ("%s gold", "%d Gold") not in rows and de.dropped["placeholders differ"] == 1
    # stamps and Ding split per entry
    lion = rows[("A happy lion!", "Ein fröhlicher Löwe!")]
    assert lion[0] == everyday.entry_split("A happy lion!")
    assert [r[2] for split in fr.splits.values() for r in split
            if r[0] == "wesnoth-1.16-tsg"] == ["We must go home now."]
    assert not any(r[0] == "trans-de-en" for split in fr.splits.values() for r in split)
    # dictionary headwords: French only, training only, kind `word`
    words = [(split, r[1], r[2], r[3]) for split, rows in fr.splits.items() for r in rows
             if r[0] == "dict-freedict-eng-fra"]
    assert sorted(words) == sorted(("train", "word", src, tgt)
                                   for src, tgt in everyday.word_list_pairs(FREEDICT))
    assert not any(r[0] == "dict-freedict-eng-fra" for rows in de.splits.values() for r in rows)


def _args(tmp_path: Path, **extra: object) -> list[str]:
    return ["--everyday-from", str(make_tree(tmp_path / "tree")),
            "--everyday-out", str(tmp_path / "everyday"), "--out", str(tmp_path / "ddtp"),
            "--messages-out", str(tmp_path / "messages"),
            "--everyday-mix-out", str(tmp_path / "mix"), "--corpora", "everyday",
            *[str(x) for kv in extra.items() for x in kv]]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    corpus.configure(parser)
    return parser.parse_args(argv)


def test_cli_writes_corpus_and_card(tmp_path: Path) -> None:
    assert corpus.run(_parse(_args(tmp_path))) == 0
    out = tmp_path / "everyday"
    assert {p.name for p in out.iterdir()} == {
        "en-de", "en-fr", "en-de-handwritten", "en-fr-handwritten", "DATA_CARD.md",
        "packages.json", "sources.json"}
    handwritten = (out / "en-fr-handwritten" / "test.tgt").read_text().split("\n")
    assert handwritten[0] == "Je t'aime." and len(handwritten) > 200
    info = json.loads((out / "en-de" / "corpus.json").read_text())
    assert info["counts"]["test"] and info["tgt_lang"] == "de"
    lines = {ext: (out / "en-de" / f"train.{ext}").read_text().split("\n")
             for ext in ("src", "tgt", "kind", "pkg")}
    assert len({len(v) for v in lines.values()}) == 1
    assert "wesnoth-1.16-dm" in (out / "DATA_CARD.md").read_text()
    assert not (tmp_path / "mix").exists()  # no DDTP/messages built: no mix
    # a second run refuses to overwrite without --force
    assert corpus.run(_parse(_args(tmp_path))) == 1


def test_mix_repeats_and_keeps_evaluation_pairs_out(tmp_path: Path) -> None:
    write_corpus(tmp_path / "ddtp" / "en-de", {
        "train": [("sentence", "A tool.", "Ein Werkzeug.")],
        "test": [("sentence", "A test.", "Ein Test.")]})
    write_corpus(tmp_path / "messages" / "en-de", {
        "train": [("message", "Open", "Öffnen"), ("message", "Go home.", "Geh heim."),
                  ("message", "Help!", "Hilfe!")]})  # a hand-written test sentence
    assert corpus.run(_parse(_args(tmp_path, **{"--ddtp-repeat": 2,
                                                 "--everyday-repeat": 3}))) == 0
    mix = tmp_path / "mix" / "en-de"
    train = list(zip((mix / "train.src").read_text().split("\n")[:-1],
                     (mix / "train.tgt").read_text().split("\n")[:-1], strict=True))
    everyday_train = (tmp_path / "everyday" / "en-de" / "train.src").read_text().split("\n")[:-1]
    assert train.count(("A tool.", "Ein Werkzeug.")) == 2
    assert train.count(("Open", "Öffnen")) == 1
    assert not any(src == "Help!" for src, _ in train)
    handwritten = {src for src, _ in everyday.handwritten("de")}
    assert "The weather is nice today." in everyday_train
    assert len(train) == 2 + 2 + 3 * len([s for s in everyday_train if s not in handwritten])
    held = set(zip((mix / "test.src").read_text().split("\n"),
                   (mix / "test.tgt").read_text().split("\n"), strict=True))
    assert ("A test.", "Ein Test.") in held and not held & set(train)
    assert json.loads((mix / "corpus.json").read_text())["counts"]["test"]["sentence"] >= 1
    # the mix alone, from the corpora already built
    assert corpus.run(_parse([*_args(tmp_path), "--corpora", "everyday-mix", "--force"])) == 0


def test_measure() -> None:
    m = everyday.measure(["Where is my brother?", "Open file", "I love you and your dog."])
    assert m == {"pairs": 3, "words": 12, "words_per_pair": 4.0, "everyday": 0.67,
                 "dialogue": 0.67, "sentences": 0.67}
    assert everyday.measure([])["pairs"] == 0
