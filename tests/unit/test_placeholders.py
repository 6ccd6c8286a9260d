"""Masking and restoring placeholders, tags, accelerators and glossary terms
(server/core/placeholders.py), checked against translate-toolkit's own
placeholder checks where they apply."""

from __future__ import annotations

import pytest
from translate.filters import checks

from seq2serve.server.core.placeholders import Kind, Terms, carry, find, mask, restore

# Every kind the issue names, each with one example.
KINDS = [
    ("Copied %s files", "%s", Kind.PRINTF),
    ("Copied %d files", "%d", Kind.PRINTF),
    ("File %1$s of %2$s", "%1$s", Kind.PRINTF),
    ("%.1f MB free", "%.1f", Kind.PRINTF),
    ("Hello %(name)s", "%(name)s", Kind.PRINTF),
    ("100%% done", "%%", Kind.PRINTF),
    ("Page %1 of %2", "%1", Kind.PRINTF),
    ("Open {0} now", "{0}", Kind.BRACE),
    ("Hello {name}", "{name}", Kind.BRACE),
    ("Size: {size:>10}", "{size:>10}", Kind.BRACE),
    ("Hello {{name}}", "{{name}}", Kind.DOUBLE_BRACE),
    ("Set $HOME first", "$HOME", Kind.SHELL),
    ("Set ${HOME} first", "${HOME}", Kind.SHELL),
    ("<b>Warning:</b> full", "<b>", Kind.TAG_OPEN),
    ("<b>Warning:</b> full", "</b>", Kind.TAG_CLOSE),
    ('See <a href="https://x.org/?a=1&amp;b=2">here</a>', '<a href="https://x.org/?a=1&amp;b=2">',
     Kind.TAG_OPEN),
    ("Line<br/>break", "<br/>", Kind.TAG_EMPTY),
    ("Tom &amp; Jerry", "&amp;", Kind.ENTITY),
    ("Quote &#39;x&#39;", "&#39;", Kind.ENTITY),
    ("Visit https://example.org/help for more.", "https://example.org/help", Kind.URL),
    ("Write to help@example.org today", "help@example.org", Kind.EMAIL),
    ("Cannot open /etc/fstab.", "/etc/fstab", Kind.PATH),
    ("Saved in ~/.config/app", "~/.config/app", Kind.PATH),
    ("First line\\nsecond", "\\n", Kind.ESCAPE),
    ("Name:\\tvalue", "\\t", Kind.ESCAPE),
]


@pytest.mark.parametrize(("text", "placeholder", "kind"), KINDS)
def test_every_kind_is_found_and_comes_back(text: str, placeholder: str, kind: Kind) -> None:
    spans = find(text)
    assert any(s.text == placeholder and s.kind is kind for s in spans), spans
    masked = mask(text)
    assert placeholder not in masked.text or placeholder == "{0}"
    assert restore(masked, masked.text).text == text  # the identity translation
    assert not restore(masked, masked.text).repaired


@pytest.mark.parametrize("text", ["and/or", "a < b and c > d", "100% sure", "costs $5",
                                  "1/2 done", "file_name", "MAX_SIZE", "R&D", "Tom & Jerry"])
def test_plain_text_is_left_alone(text: str) -> None:
    masked = mask(text)
    assert masked.text == text and not masked.changed


def test_issue_examples_mask_as_expected() -> None:
    assert mask("Hello {{name}}, you have {0} new messages").text == \
        "Hello {0}, you have {1} new messages"
    # The tag's text is translated with the sentence; a space keeps the word apart.
    assert mask("<b>Warning:</b> the disk is almost full").text == \
        "{0} Warning:{1} the disk is almost full"
    save = mask("Save _As…")
    assert save.text == "Save As…" and save.accelerator is not None
    assert save.accelerator.marker == "_" and save.accelerator.letter == "A"
    recent = mask("&Open Recent")
    assert recent.text == "Open Recent" and recent.accelerator is not None
    assert mask("Visit https://example.org/help for more information.").text == \
        "Visit {0} for more information."


def test_restore_puts_each_placeholder_back() -> None:
    masked = mask("Hello {{name}}, you have {0} new messages")
    out = restore(masked, "Hallo {0}, Sie haben {1} neue Nachrichten")
    assert out.text == "Hallo {{name}}, Sie haben {0} neue Nachrichten"
    assert not out.repaired


def test_tags_glue_back_to_their_text() -> None:
    masked = mask("<b>Warning:</b> the disk is almost full")
    out = restore(masked, "{0} Warnung:{1} Die Festplatte ist fast voll")
    assert out.text == "<b>Warnung:</b> Die Festplatte ist fast voll"


def test_carry_hands_a_chains_second_model_each_sentinel_once() -> None:
    """Through English the first model's output stays masked: repaired (each sentinel
    once, in order), tags not glued yet, the accelerator not placed; the second
    model's output is restored as any."""
    masked = mask("<b>Warnung:</b> %s ist fast _voll")
    assert masked.text == "{0} Warnung:{1} {2} ist fast voll"
    middle, repaired = carry(masked, "{0} Warning:{1} {2} {2} is almost full")
    assert (middle, repaired) == ("{0} Warning:{1} {2} is almost full", True)
    middle, repaired = carry(masked, "{0} Warning:{1} is almost full")  # {2} dropped
    assert middle.count("{2}") == 1 and repaired
    assert carry(mask("Nichts hier"), "Nothing here") == ("Nothing here", False)
    out = restore(masked, "{0} Attention :{1} {2} est presque plein")
    # no "v" in the French: the accelerator goes on its first letter
    assert out.text == "<b>_Attention :</b> %s est presque plein" and not out.repaired


def test_accelerator_rule_exactly() -> None:
    assert restore(mask("&Delete"), "Löschen und drucken").text == "Löschen und &drucken"
    assert restore(mask("_Save"), "Enregistrer sous").text == "Enregistrer _sous"
    assert restore(mask("&Open"), "Zuletzt").text == "&Zuletzt"
    assert restore(mask("E&xit"), "Beenden").text == "&Beenden"  # no x at all
    assert restore(mask("Fi_le"), "Fichier").text == "Fichier".replace("F", "_F", 1)


@pytest.mark.parametrize(("output", "expected"), [
    # dropped: after the nearest present predecessor in the source
    ("Hallo {0}, Sie haben neue Nachrichten", "Hallo %s %d, Sie haben neue Nachrichten"),
    # dropped with no neighbour present: at the end, before closing punctuation
    ("Hallo, Sie haben neue Nachrichten.", "Hallo, Sie haben neue Nachrichten %s %d."),
    # repeated: the first occurrence stays
    ("Hallo {0} {0}, Sie haben {1} neue Nachrichten.", "Hallo %s, Sie haben %d neue Nachrichten."),
    # invented: dropped
    ("Hallo {0}, Sie haben {1} {5} neue Nachrichten.", "Hallo %s, Sie haben %d neue Nachrichten."),
])
def test_repair_rule(output: str, expected: str) -> None:
    masked = mask("Hello %s, you have %d new messages.")
    restored = restore(masked, output)
    assert restored.text == expected
    assert restored.repaired


def test_missing_first_placeholder_goes_first() -> None:
    masked = mask("%s: not found")
    assert restore(masked, "nicht gefunden").text == "%s nicht gefunden"


def test_paired_tags_stay_paired_and_in_order() -> None:
    masked = mask("Click <b>here</b> to <i>continue</i>")
    assert [s.partner for s in masked.spans] == [1, 0, 3, 2]
    swapped = restore(masked, "Klicken Sie {1}hier{0}, um {2}fortzufahren{3}")
    assert swapped.repaired
    text = swapped.text
    assert text.index("<b>") < text.index("</b>") < text.index("<i>") < text.index("</i>")
    dropped = restore(masked, "Klicken Sie hier, um fortzufahren")
    assert dropped.repaired
    for tag in ("<b>", "</b>", "<i>", "</i>"):
        assert dropped.text.count(tag) == 1
    assert dropped.text.index("<b>") < dropped.text.index("</b>")


def test_nested_and_unpaired_tags() -> None:
    nested = mask("<big><b>Errors</b></big>")
    assert [s.partner for s in nested.spans] == [3, 2, 1, 0]
    lone = mask("a<i>b</u>c")
    assert all(s.kind is Kind.TAG_EMPTY for s in lone.spans)


@pytest.mark.parametrize("output", [
    "", "{0}", "{9} {8} {7}", "{3}{2}{1}{0}", "{ 0 } text {1 }", "}{", "{0}{0}{0}{0}{0}"])
def test_every_placeholder_exactly_as_often_as_in_the_source(output: str) -> None:
    source = "Copy %s to <b>%s</b> ({0} of {0})"
    masked = mask(source)
    text = restore(masked, output).text
    for placeholder in ("%s", "<b>", "</b>", "{0}"):
        assert text.count(placeholder) == source.count(placeholder), (placeholder, text)


def test_translate_toolkit_checks_pass_after_repair() -> None:
    checker = checks.StandardChecker(checks.CheckerConfig(accelmarkers=["&", "_"]))
    cases = [("Copy %s to %d places", "Kopieren nach Orten"),
             ("<b>Warning:</b> {0} is full", "Warnung: voll"),
             ("Visit https://example.org or mail a@example.org", "Besuchen"),
             ("_Save %(name)s", "Speichern")]
    for source, model_output in cases:
        masked = mask(source)
        sentinels_dropped = restore(masked, model_output).text
        for name in ("printf", "xmltags", "urls", "emails", "accelerators", "pythonbraceformat"):
            assert getattr(checker, name)(source, sentinels_dropped), (name, sentinels_dropped)


def test_glossary_terms_are_masked_and_substituted() -> None:
    terms = Terms(pairs=(("disk", "Datenträger"), ("disk image", "Abbild")), keep=("Seq2Serve",))
    masked = mask("Seq2Serve wrote the disk image to the disk.", terms)
    assert masked.text == "{0} wrote the {1} to the {2}."
    out = restore(masked, "{0} schrieb das {1} auf den {2}.")
    assert out.text == "Seq2Serve schrieb das Abbild auf den Datenträger."
    # whole words only, case-sensitive
    assert not mask("disks and Disk", terms).spans


def test_terms_without_placeholder_protection_still_mask_literal_sentinels() -> None:
    masked = mask("Open {0} on the disk", Terms(pairs=(("disk", "Platte"),)),
                  placeholders=False)
    assert [s.text for s in masked.spans] == ["{0}", "disk"]
    assert restore(masked, "{0} auf der {1} öffnen").text == "{0} auf der Platte öffnen"
    assert mask("Open %s _now", placeholders=False).text == "Open %s _now"


def test_a_placeholder_the_model_writes_itself_is_removed() -> None:
    # en-fr, "%1's Kolab %2": the model wrote a `%1` of its own beside the sentinels.
    masked = mask("%1's Kolab %2")
    restored = restore(masked, "{0} Kolab %1 {1}")
    assert restored.text == "%1 Kolab %2" and restored.repaired
