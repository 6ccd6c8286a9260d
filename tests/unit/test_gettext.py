"""Program messages: the .mo reader (against Python's own gettext) and the cleaning rules."""

from __future__ import annotations

import gettext as pygettext
import io
from collections import Counter

import pytest
from mo_files import mo_bytes

from seq2serve.model.data import gettext
from seq2serve.model.data.gettext import Entry, MoError

ENTRIES = [
    ("Open", "Öffnen"),
    ("menu\x04Quit", "Beenden"),
    ("%d file\x00%d files", "%d Datei\x00%d Dateien"),
    ("Größe: %s", "Größe: %s"),
]


@pytest.mark.parametrize("big_endian", [False, True])
def test_read_mo_agrees_with_python_gettext(big_endian: bool) -> None:
    data = mo_bytes(ENTRIES, big_endian=big_endian)
    catalog = gettext.read_mo(data)
    reference = pygettext.GNUTranslations(io.BytesIO(data))
    assert catalog.nplurals == 2
    assert catalog.header["content-type"] == "text/plain; charset=UTF-8"
    by_id = {(e.context, e.msgid): e for e in catalog.entries}
    assert len(by_id) == 4
    for (context, msgid), entry in by_id.items():
        if entry.msgid_plural is not None:
            for n, form in ((1, 0), (5, 1)):
                assert reference.ngettext(msgid, entry.msgid_plural, n) == entry.msgstrs[form]
        elif context is not None:
            assert reference.pgettext(context, msgid) == entry.msgstrs[0]
        else:
            assert reference.gettext(msgid) == entry.msgstrs[0]
    assert by_id[("menu", "Quit")].msgstrs == ("Beenden",)
    assert by_id[(None, "%d file")] == Entry(None, "%d file", "%d files",
                                             ("%d Datei", "%d Dateien"))


def test_read_mo_decodes_the_header_charset() -> None:
    data = mo_bytes([("Size", "Größe")], charset="ISO-8859-1")
    assert "Größe".encode("latin-1") in data
    assert gettext.read_mo(data).entries == [Entry(None, "Size", None, ("Größe",))]


@pytest.mark.parametrize("data", [b"", b"\x00" * 40, mo_bytes(ENTRIES)[:60]])
def test_read_mo_rejects_broken_files(data: bytes) -> None:
    with pytest.raises(MoError):
        gettext.read_mo(data)


def test_entry_pairs_plurals_and_credits() -> None:
    plural = Entry(None, "%d file", "%d files", ("%d Datei", "%d Dateien"))
    assert gettext.entry_pairs(plural, 2) == [("%d file", "%d Datei"), ("%d files", "%d Dateien")]
    assert gettext.entry_pairs(plural, 3) == "plural forms other than 2"
    assert gettext.entry_pairs(Entry("ctx", "Quit", None, ("Beenden",)), 2) == [
        ("Quit", "Beenden")]
    assert gettext.entry_pairs(Entry(None, "translator-credits", None, ("A B",)), 2) == (
        "translator credits")
    assert gettext.entry_pairs(Entry("NAME OF TRANSLATORS", "Your names", None, ("A",)),
                               2) == "translator credits"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("%s of %d (%.1f%%)", ["%s", "%d", "%.1f"]),
        ("%2$s then %1$s", ["%s", "%s"]),
        ("%lu bytes, %<PRIu64> more", ["%lu", "%<PRIu64>"]),
        ("%(count)d items in %(name)s", ["%(count)d", "%(name)s"]),
        ("Copy %1 to %2", ["%1", "%2"]),
        ("{0} of {total} ({:>8})", ["{0}", "{total}", "{:>8}"]),
        ("Set $HOME or ${XDG_DATA_HOME}", ["$HOME", "${XDG_DATA_HOME}"]),
        ("100% sure, costs $5", []),
    ],
)
def test_placeholders(text: str, expected: list[str]) -> None:
    assert gettext.placeholders(text) == Counter(expected)


@pytest.mark.parametrize(
    ("src", "tgt", "expected"),
    [
        ("_Open", "Ö_ffnen", ("Open", "Öffnen")),
        ("&File", "&Datei", ("File", "Datei")),
        ("Save _As…", "Speichern _unter …", ("Save As…", "Speichern unter …")),
        ("Drag && Drop", "Ziehen && Ablegen", ("Drag & Drop", "Ziehen & Ablegen")),
        ("Edit file_name", "file_name bearbeiten", ("Edit file_name", "file_name bearbeiten")),
        ("A_B and C_D", "A_B und C_D", ("A_B and C_D", "A_B und C_D")),
        ("Tom &amp; Jerry", "Tom &amp; Jerry", ("Tom &amp; Jerry", "Tom &amp; Jerry")),
    ],
)
def test_strip_accelerators(src: str, tgt: str, expected: tuple[str, str]) -> None:
    assert gettext.strip_accelerators(src, tgt) == expected


def test_strip_markup() -> None:
    assert gettext.strip_markup("<b>Bold</b> &amp; <i>it</i><br/>next") == "Bold & it next"
    assert gettext.strip_markup("a &amp; b") == "a &amp; b"  # no markup: entities are text
    assert gettext.tags('<a href="x">link</a><br/>') == Counter({"a": 2, "br": 1})


@pytest.mark.parametrize(
    ("src", "tgt", "expected"),
    [
        ("Could not open %s: %s", "Konnte %s nicht öffnen: %s",
         ("Could not open %s: %s", "Konnte %s nicht öffnen: %s")),
        ("Could not open %s", "Konnte nicht öffnen", "placeholders differ"),
        ("File %1$s in %2$s", "Datei %2$s enthält %1$s",
         ("File %1$s in %2$s", "Datei %2$s enthält %1$s")),
        ("<b>Warning:</b> disk\nis full", "<b>Warnung:</b> Platte\nist voll",
         ("Warning: disk is full", "Warnung: Platte ist voll")),
        ("<b>Warning</b>", "Warnung", "markup differs"),
        ("Edit /etc/fstab first", "Zuerst /etc/fstab bearbeiten",
         ("Edit /etc/fstab first", "Zuerst /etc/fstab bearbeiten")),
        ("Edit /etc/fstab first", "Zuerst /etc/mtab bearbeiten", "paths/options/URLs differ"),
        ("Use --force to overwrite", "Mit --force überschreiben",
         ("Use --force to overwrite", "Mit --force überschreiben")),
        ("Use --force to overwrite", "Mit --erzwingen überschreiben",
         "paths/options/URLs differ"),
        ("See https://example.org/a for input/output", "Siehe https://example.org/a zu E/A",
         ("See https://example.org/a for input/output", "Siehe https://example.org/a zu E/A")),
        ("  -v, --verbose    explain what is done", "  -v, --verbose    erklären",
         "option table"),
        ("default:LTR", "default:LTR", "key, not text"),
        ("locate_motion_style", "Bewegungsstil suchen", "key, not text"),
        ("%s: %s", "%s : %s", "nothing to translate"),
        ("OK", "OK", "source equals target"),
        ("", "x", "empty side"),
        ("Cancel", "", "empty side"),
        ("Go", "Weiter zu", ("Go", "Weiter zu")),  # short: no ratio check
        ("Show more details", "Zeigt weitere Einzelheiten über den ausgewählten Eintrag an",
         "length ratio > 3"),
        ("A\u0308rger\u00a0über", "Annoyance", ("Ärger über", "Annoyance")),  # NFC, NBSP
    ],
)
def test_clean_pair(src: str, tgt: str, expected: tuple[str, str] | str) -> None:
    assert gettext.clean_pair(src, tgt) == expected
