"""A multilingual package's language codes (model/package/languages.py): the forms a
request may use (CLDR's aliases and macrolanguages, a region dropped, nb for no), the
ones it may not (another script), and the English names (CLDR's, one per language)."""

from __future__ import annotations

import pytest

from seq2serve.model.package.languages import CodeTable, Languages, distinct_names, english_name

LANGUAGES = Languages(
    tokens={"eng_Latn": 5, "por_Latn": 7, "zho_Hans": 9, "zho_Hant": 10, "srp_Cyrl": 11},
    codes={"en": "eng_Latn", "pt": "por_Latn", "zh-Hans": "zho_Hans", "zh": "zho_Hans",
           "zh-Hant": "zho_Hant", "zh-TW": "zho_Hant", "sr": "srp_Cyrl",
           "sr-Cyrl": "srp_Cyrl", "pt-PT": "por_Latn"})
# A model that lists no script of its languages (M2M100's): each is written in the
# script CLDR's likely subtags give it (zh: Hans, sr: Cyrl).
PLAIN = Languages(tokens={"zh": 3, "sr": 4, "no": 5, "he": 6, "fa": 7},
                  codes={"zh": "zh", "sr": "sr", "no": "no", "he": "he", "fa": "fa"})


@pytest.mark.parametrize(("code", "own"), [
    ("en", "eng_Latn"), ("EN", "eng_Latn"), (" en ", "eng_Latn"),  # listed, any case
    ("eng_Latn", "eng_Latn"), ("ENG_LATN", "eng_Latn"),  # the model's own
    ("en-US", "eng_Latn"), ("pt-BR", "por_Latn"), ("pt_PT", "por_Latn"),  # a region dropped
    ("zh-TW", "zho_Hant"), ("zh-Hant-TW", "zho_Hant"), ("zh-Hans-SG", "zho_Hans"),
    ("sr-Cyrl-RS", "srp_Cyrl"),
    ("sr-Latn", None),  # never another script than the one asked
    ("xx", None), ("", None), ("-", None)])
def test_model_code(code: str, own: str | None) -> None:
    assert LANGUAGES.model_code(code) == own
    assert LANGUAGES.token(code) == (None if own is None else LANGUAGES.tokens[own])


@pytest.mark.parametrize(("code", "own"), [
    ("zh-Hans", "zh"), ("zh-CN", "zh"), ("zh-SG", "zh"), ("sr-Cyrl", "sr"), ("sr-RS", "sr"),
    ("zh-Hant", None), ("zh-TW", None), ("zh-HK", None), ("zh-Hant-TW", None),  # Hant
    ("sr-Latn", None), ("sr-ME", None), ("sh", None)])  # Latin (sh is CLDR's sr-Latn)
def test_a_model_without_scripts_serves_its_languages_script_only(code: str,
                                                                  own: str | None) -> None:
    assert PLAIN.model_code(code) == own
    if own is None:  # the refusal says why
        assert PLAIN.table.refusal(code).startswith("written in ")


@pytest.mark.parametrize(("code", "plain", "nllb"), [
    ("iw", "he", None), ("IW", "he", None),  # legacy Hebrew (CLDR's alias)
    ("nb", "no", None), ("nb-NO", "no", None), ("nob", "no", None),  # Bokmål is M2M100's no
    ("nn", None, None),  # Nynorsk is not (CLDR: 20 apart)
    ("pes", "fa", None), ("prs", "fa", None), ("fa-AF", "fa", None),  # macrolanguage fa
    ("cmn", "zh", "zho_Hans"), ("cmn-Hant-TW", None, "zho_Hant"),  # ... and zh
    ("zh-HK", None, "zho_Hant"), ("zh-MO", None, "zho_Hant"),  # the region's likely script
])
def test_cldr_aliases_and_macrolanguages(code: str, plain: str | None,
                                         nllb: str | None) -> None:
    assert PLAIN.model_code(code) == plain
    assert LANGUAGES.model_code(code) == nllb


def test_a_model_with_bokmal_takes_norwegian() -> None:
    """The reverse of nb for no: a model of nb takes no (CLDR: 1 apart, both ways)."""
    bokmal = CodeTable.of(["en", "nb"])
    assert bokmal.find("no") is not None and bokmal.find("no").own == "nb"  # type: ignore[union-attr]
    assert bokmal.find("nn") is None and bokmal.find("da") is None  # da is 8 from nb


def test_exact_codes_are_told_from_their_language() -> None:
    assert [(LANGUAGES.match(c) or None) for c in ("zh-TW", "iw")] == [
        LANGUAGES.match("zh-Hant"), None]
    assert LANGUAGES.match("pt-PT").exact and not LANGUAGES.match("pt-BR").exact  # type: ignore[union-attr]
    assert PLAIN.match("iw").exact and not PLAIN.match("nb").exact  # type: ignore[union-attr]


def test_english_names_are_cldrs_with_script_and_region() -> None:
    assert [english_name(c) for c in ("zh", "zh-Hant", "fa", "fa-AF", "iw", "xx-unknown")] == [
        "Chinese", "Chinese (Traditional)", "Persian", "Persian (Afghanistan)", "Hebrew", None]
    assert distinct_names({"a": "X", "b": "Y", "c": "X"}) == {"a": "X [a]", "b": "Y",
                                                             "c": "X [c]"}


def test_listed_codes_and_problems() -> None:
    assert LANGUAGES.listed() == {"en": "eng_Latn", "pt": "por_Latn", "zh-Hans": "zho_Hans",
                                  "zh-Hant": "zho_Hant", "sr": "srp_Cyrl"}
    assert LANGUAGES.model_code("pt-PT") == "por_Latn"
    broken = Languages({"a": 3, "b": 99}, {"x": "c"}, source_token="middle")
    assert len(broken.problems(vocab_size=50)) == 3


def test_the_listed_code_does_not_depend_on_the_order_of_codes() -> None:
    """A manifest's JSON sorts its keys: the listed code comes from `listing`."""
    codes = {"zh-Hant": "zho_Hant", "zh-TW": "zho_Hant", "zh-HK": "zho_Hant"}
    listing = {"zho_Hant": "zh-Hant"}
    for order in (codes, dict(sorted(codes.items())), dict(reversed(codes.items()))):
        languages = Languages({"zho_Hant": 3}, order, listing=listing)
        assert languages.listed() == {"zh-Hant": "zho_Hant"}
        assert languages.listed_code("zh-HK") == "zh-Hant"
    wrong = Languages({"zho_Hant": 3}, codes, listing={"zho_Hant": "pt"})
    assert wrong.problems(vocab_size=10) == [
        "languages.listing.zho_Hant: 'pt' is not a code of 'zho_Hant' in languages.codes"]
