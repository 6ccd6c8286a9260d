"""Program-messages corpus: package choice, held-out exclusion, splits, caps, apt and the CLI."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import lz4.frame
import pytest
import system_tools
from mo_files import mo_bytes, write_tree

from seq2serve.model.data import corpus, debian_debs, messages, messages_data
from seq2serve.model.data.debian_debs import Deb
from seq2serve.server.cli.main import main as cli_main

DDTP = Path(__file__).parents[1] / "fixtures" / "ddtp"


def package_in(split: str, prefix: str = "pkg") -> str:
    return next(name for i in range(10_000)
                if messages.split_of_package(name := f"{prefix}{i}") == split)


# --------------------------------------------------------------------------- choice


def test_split_of_package_is_deterministic_and_roughly_3_3_94() -> None:
    names = [f"package-{i}" for i in range(20_000)]
    counts = Counter(messages.split_of_package(n) for n in names)
    assert [messages.split_of_package(n) for n in names[:100]] == [
        messages.split_of_package(n) for n in names[:100]]
    assert 0.025 < counts["test"] / 20_000 < 0.035
    assert 0.025 < counts["valid"] / 20_000 < 0.035


def test_domain_family_drops_versions() -> None:
    assert messages.domain_family("gtk30") == messages.domain_family("gtk40") == "gtk"
    assert messages.domain_family("gtk30-properties") == "gtkproperties"
    assert messages.domain_family("gnome-control-center-2.0") == "gnomecontrolcenter"


ISSUE_13_HELD_OUT = """coreutils, tar, grep, sed, findutils, diffutils, wget, bash,
  gawk, make, xz-utils, gettext, gettext-base, nano, procps, libparted-i18n, man-db,
  binutils-common, gcc-12-locales, dpkg, apt, aptitude-common, debconf-i18n,
  e2fsprogs-l10n, util-linux-locales, gnupg-l10n, libc-l10n, network-manager, systemd,
  login, sudo, git, libglib2.0-data, libgtk-3-common, vlc-l10n, transmission-gtk,
  gparted-common, synaptic, filezilla-common, pidgin-data, audacity-data,
  gnome-control-center-data, nautilus-data, evince-common, totem-common, rhythmbox-data,
  gnumeric-common, claws-mail-i18n, mutt, gnucash-common, thunar-data, mousepad,
  gedit-common."""  # as the issue spells it


def test_every_issue_package_is_held_out() -> None:
    listed = {name.strip(" .\n") for name in ISSUE_13_HELD_OUT.split(",")}
    assert messages.HELD_OUT_PACKAGES == listed and len(listed) == 53


def test_exclusions_cover_held_out_relatives() -> None:
    listing = {
        "libgtk-3-common": {("de", "gtk30")},
        "libgtk-4-common": {("de", "gtk40"), ("fr", "gtk40")},  # same family
        "git-gui": {("de", "git-gui")},  # same source package as git
        "git": {("de", "git")},
        "hello": {("de", "hello")},
    }
    sources = {"git-gui": "git", "git": "git", "libgtk-4-common": "gtk4",
               "libgtk-3-common": "gtk+3.0", "hello": "hello"}
    excluded = messages.exclusions(listing, sources)
    assert set(excluded) == {"libgtk-3-common", "libgtk-4-common", "git-gui", "git"}
    assert excluded["git"] == "held out"
    assert "gtk40" in excluded["libgtk-4-common"] and "git" in excluded["git-gui"]


def test_select_smallest_first_within_budgets() -> None:
    listing = {name: {("de", name)} for name in ("a", "b", "c", "d", "e", "sed")}
    index = {"a": Deb("a", "a", 30), "b": Deb("b", "b", 10), "c": Deb("c", "c", 20),
             "d": Deb("d", "d", 500), "sed": Deb("sed", "sed", 1)}
    chosen = messages.select(listing, index, max_packages=10, max_bytes=60, max_deb_bytes=100)
    assert [d.package for d in chosen.debs] == ["b", "c", "a"]
    assert chosen.excluded == {"sed": "held out"}
    assert chosen.skipped == {"not in the Packages index": 1, "larger than --max-deb-mb": 1}
    two = messages.select(listing, index, max_packages=2, max_bytes=10**9, max_deb_bytes=10**9)
    assert [d.package for d in two.debs] == ["b", "c"]
    assert two.skipped["over --max-packages/--max-download-mb"] == 2


# --------------------------------------------------------------------------- corpus


def test_build_splits_by_package_dedupes_to_train_and_caps() -> None:
    train, test = package_in("train"), package_in("test")
    shared = [("Cancel", "Abbrechen"), ("Open the file", "Datei öffnen")]
    own = [(f"Message number {i}", f"Meldung Nummer {i}") for i in range(12)]
    catalogs = [
        (test, "de", mo_bytes(shared + own[:6])),
        (train, "de", mo_bytes(shared + own[6:])),
        (train, "fr", mo_bytes([("Cancel", "Annuler"), ("Cancel", "Annuler")])),
        (train, "it", mo_bytes([("Cancel", "Annulla")])),  # not asked for
        (test, "de", b"not a catalog"),
    ]
    de, fr = messages.build(catalogs, ["de", "fr"], per_package=100)
    assert de.name == "en-de" and fr.name == "en-fr"
    assert {(s, t) for _, s, t in de.splits["train"]} == set(shared) | set(own[6:])
    assert {(s, t) for _, s, t in de.splits["test"]} == set(own[:6])
    assert {p for p, _, _ in de.splits["test"]} == {test}
    assert de.dropped["duplicate"] == 2
    assert any(r.startswith("unreadable catalog") for r in de.dropped)
    assert fr.splits["train"] == [(train, "Cancel", "Annuler")]
    capped, _ = messages.build(catalogs[:2], ["de", "fr"], per_package=3)
    assert capped.packages[train] == 3 and 1 <= capped.packages[test] <= 3
    assert capped.dropped["over the per-package cap"] == 2 * (8 - 3)
    again, _ = messages.build(catalogs[:2], ["de", "fr"], per_package=3)
    assert again.splits == capped.splits


# --------------------------------------------------------------------------- apt side


def test_contents_and_packages_indexes(tmp_path: Path) -> None:
    contents = (
        "usr/bin/hello                                  devel/hello\n"
        "usr/share/locale/de/LC_MESSAGES/hello.mo       devel/hello,devel/hello-l10n\n"
        "usr/share/locale/fr/LC_MESSAGES/hello.mo       devel/hello\n"
        "usr/share/locale/de_CH/LC_MESSAGES/hello.mo    devel/hello\n"
        "usr/share/locale/it/LC_MESSAGES/hello.mo       devel/hello\n"
    )
    (tmp_path / "x_dists_b_main_Contents-all.lz4").write_bytes(
        lz4.frame.compress(contents.encode()))
    (tmp_path / "x_dists_b_main_binary-amd64_Packages").write_text(
        "Package: hello\nVersion: 1\nSize: 1234\nDescription: x\n continued: y\n\n"
        "Package: hello-l10n\nSource: hello (1)\nSize: 99\n")
    assert debian_debs.contents_listing(tmp_path) == {
        "hello": {("de", "hello"), ("fr", "hello")}, "hello-l10n": {("de", "hello")}}
    assert debian_debs.packages_index(tmp_path) == {
        "hello": Deb("hello", "hello", 1234), "hello-l10n": Deb("hello-l10n", "hello", 99)}


def test_download_resumes_and_skips_what_apt_cannot_fetch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    debs = tmp_path / "debs"
    debs.mkdir()
    payload = {"a": b"A" * 10, "b": b"B" * 20, "c": b"C" * 30}
    sha = {k: __import__("hashlib").sha256(v).hexdigest() for k, v in payload.items()}
    (debs / "a_1_all.deb").write_bytes(payload["a"])  # complete from an earlier run
    (debs / "b_1_all.deb").write_bytes(b"B" * 7)  # interrupted download
    calls: list[list[str]] = []

    def fake_apt(conf: Path, cwd: Path, args: list[str]) -> str:
        calls.append(args)
        if args[1] == "--print-uris":
            return "".join(f"'http://x/{p}_1_all.deb' {p}_1_all.deb {len(payload[p])} "
                           f"SHA256:{sha[p]}\n" for p in args[2:] if p in payload)
        for name in args[1:]:
            if name == "c":
                raise subprocess.CalledProcessError(100, "apt-get")
            (cwd / f"{name}_1_all.deb").write_bytes(payload[name])
        return ""

    monkeypatch.setattr(debian_debs, "_apt", fake_apt)
    seen: list[int] = []
    wanted = [Deb(n, n, 0) for n in ("a", "b", "c", "gone")]
    got = debian_debs.download(tmp_path / "apt.conf", debs, wanted, seen.append)
    assert got == {"a": debs / "a_1_all.deb", "b": debs / "b_1_all.deb"}
    assert (debs / "b_1_all.deb").read_bytes() == payload["b"]
    assert ["download", "a"] not in calls and ["download", "c"] in calls
    assert sorted(seen) == [10, 20]


@pytest.mark.needs("dpkg-deb")
def test_deb_catalogs_reads_only_de_fr_catalogs(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    write_tree(root, "pkg", "de", "hello", [("Hello", "Hallo")])
    write_tree(root, "pkg", "it", "hello", [("Hello", "Ciao")])
    (root / "pkg" / "DEBIAN").mkdir()
    (root / "pkg" / "DEBIAN" / "control").write_text(
        "Package: pkg\nVersion: 1\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n")
    subprocess.run([system_tools.path("dpkg-deb"), "--build", "--root-owner-group",
                    str(root / "pkg"), str(tmp_path / "pkg.deb")], check=True,
                   capture_output=True)
    found = list(debian_debs.deb_catalogs(tmp_path / "pkg.deb"))
    assert [(lang, domain) for lang, domain, _ in found] == [("de", "hello")]
    assert found[0][2] == (root / "pkg/usr/share/locale/de/LC_MESSAGES/hello.mo").read_bytes()


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def catalog_tree(tmp_path: Path) -> Path:
    root = tmp_path / "unpacked"
    for i in range(40):
        write_tree(root, f"prog{i}", "de", f"prog{i}", [
            (f"Unable to open document {i}", f"Dokument {i} kann nicht geöffnet werden"),
            ("_Quit", "_Beenden"), (f"%d item in list {i}\x00%d items in list {i}",
                                    f"%d Eintrag in Liste {i}\x00%d Einträge in Liste {i}")])
        write_tree(root, f"prog{i}", "fr", f"prog{i}", [
            (f"Unable to open document {i}", f"Impossible d'ouvrir le document {i}")])
    # a held-out package's catalog must reach no split
    write_tree(root, "coreutils", "de", "coreutils", [("Secret held-out text", "Geheim")])
    return root


def test_cli_builds_messages_and_the_mix(catalog_tree: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    lists = tmp_path / "lists"
    lists.mkdir()
    for name in ("Translation-en", "Translation-de", "Translation-fr"):
        shutil.copy(DDTP / name, lists / f"x_main_i18n_{name}")
    out = tmp_path / "data"
    assert cli_main(["data", "--from-dir", str(lists), "--catalogs-from", str(catalog_tree),
                     "--out", str(out / "ddtp"), "--messages-out", str(out / "messages"),
                     "--mixed-out", str(out / "mixed")]) == 0
    messages_dir = out / "messages"
    assert sorted(p.name for p in messages_dir.iterdir()) == [
        "DATA_CARD.md", "en-de", "en-fr", "packages.json"]
    everything = ""
    for name, expected in (("en-de", 40 * 3 + 1), ("en-fr", 40)):
        meta = json.loads((messages_dir / name / "corpus.json").read_text("utf-8"))
        assert meta["normalization"] == "NFC" and "coreutils" in meta["source"][
            "held_out_packages"]
        total = 0
        for split in ("train", "valid", "test"):
            lines = {ext: (messages_dir / name / f"{split}.{ext}").read_text("utf-8")
                     for ext in ("src", "tgt", "kind", "pkg")}
            n = lines["src"].count("\n")
            assert all(text.count("\n") == n for text in lines.values())
            assert meta["counts"][split] == ({"message": n} if n else {})
            assert set(lines["kind"].split()) <= {"message"}
            everything += lines["src"] + lines["tgt"]
            total += n
        # "Quit" is in every German catalog: kept once; the other 3 pairs once each
        assert total == expected
    assert "Geheim" not in everything and "held-out" not in everything
    assert "Beenden\n" in everything and "_" not in everything  # accelerator stripped
    packages = json.loads((messages_dir / "packages.json").read_text("utf-8"))
    assert packages["excluded"] == {"coreutils": "held out"}
    card = (messages_dir / "DATA_CARD.md").read_text("utf-8")
    assert "coreutils" in card and "independent evaluation" in card
    mixed = out / "mixed" / "en-de"
    kinds = Counter((mixed / "train.kind").read_text("utf-8").split())
    assert kinds["message"] > 0 and kinds["sentence"] > 0
    mix_test = (mixed / "test.src").read_text("utf-8").splitlines()
    assert len(mix_test) == sum((out / c / "en-de" / "test.src").read_text("utf-8").count("\n")
                                for c in ("ddtp", "messages"))
    assert "wrote" in capsys.readouterr().out


def test_cli_only_ddtp_and_bad_corpora(tmp_path: Path, catalog_tree: Path) -> None:
    parser = argparse.ArgumentParser()
    corpus.configure(parser)
    args = parser.parse_args(["--corpora", "messages", "--catalogs-from", str(catalog_tree),
                              "--messages-out", str(tmp_path / "m"), "--langs", "de"])
    assert corpus.run(args) == 0
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "DATA_CARD.md", "en-de", "packages.json"]
    assert corpus.run(args) == 1  # not empty, no --force
    bad = parser.parse_args(["--corpora", "messages,other"])
    assert corpus.run(bad) == 1
    italian = parser.parse_args(["--corpora", "messages", "--langs", "it",
                                 "--catalogs-from", str(catalog_tree),
                                 "--messages-out", str(tmp_path / "it")])
    assert messages_data.run(italian, ["it"], False) == 1
    assert not (tmp_path / "it").exists()


def test_mixed_train_never_holds_an_evaluation_pair(tmp_path: Path) -> None:
    def write(folder: Path, splits: dict[str, list[tuple[str, str, str]]]) -> None:
        folder.mkdir(parents=True)
        (folder / "corpus.json").write_text(json.dumps(
            {"task": "translate", "src_lang": "en", "tgt_lang": "de", "dropped": {}}))
        for split in ("train", "valid", "test"):
            rows = splits.get(split, [])
            for ext, col in (("kind", 0), ("src", 1), ("tgt", 2)):
                (folder / f"{split}.{ext}").write_text("".join(f"{r[col]}\n" for r in rows))

    write(tmp_path / "ddtp" / "en-de", {"train": [("sentence", "Cancel", "Abbrechen"),
                                                  ("sentence", "A tool", "Ein Werkzeug")],
                                        "test": [("synopsis", "A library", "Eine Bibliothek")]})
    write(tmp_path / "msg" / "en-de", {"train": [("message", "A library", "Eine Bibliothek")],
                                       "test": [("message", "Cancel", "Abbrechen")],
                                       "valid": [("message", "Quit", "Beenden")]})
    names = messages_data.write_mixed(tmp_path / "ddtp", tmp_path / "msg", tmp_path / "mix",
                                      force=False)
    assert names == ["en-de"]
    mix = tmp_path / "mix" / "en-de"
    assert (mix / "train.src").read_text() == "A tool\n"
    assert (mix / "test.src").read_text() == "A library\nCancel\n"
    assert json.loads((mix / "corpus.json").read_text())["counts"] == {
        "test": {"synopsis": 1, "message": 1}, "valid": {"message": 1},
        "train": {"sentence": 1}}

    # weighting DDTP up repeats its train pairs only; `seq2serve data --corpora mix`
    # rewrites the mix alone from the corpora already built
    parser = argparse.ArgumentParser()
    corpus.configure(parser)
    args = parser.parse_args(["--corpora", "mix", "--out", str(tmp_path / "ddtp"),
                              "--messages-out", str(tmp_path / "msg"),
                              "--mixed-out", str(tmp_path / "mix3"), "--ddtp-repeat", "3"])
    assert corpus.run(args) == 0
    mix3 = tmp_path / "mix3" / "en-de"
    assert (mix3 / "train.src").read_text() == "A tool\n" * 3
    assert (mix3 / "test.src").read_text() == "A library\nCancel\n"
    assert json.loads((mix3 / "corpus.json").read_text())["ddtp_repeat"] == 3
    assert corpus.run(args) == 1  # not empty, no --force
    assert corpus.run(parser.parse_args(["--corpora", "mix", "--ddtp-repeat", "0"])) == 1
    missing = parser.parse_args(["--corpora", "mix", "--out", str(tmp_path / "none"),
                                 "--mixed-out", str(tmp_path / "mix4")])
    assert corpus.run(missing) == 1
    assert not (tmp_path / "mix4").exists()
