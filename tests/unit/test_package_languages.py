"""A multilingual package's language codes (model/package/languages.py): the forms a
request may use, and the one it may not (another script)."""

from __future__ import annotations

import pytest

from seq2serve.model.package.languages import Languages

LANGUAGES = Languages(
    tokens={"eng_Latn": 5, "por_Latn": 7, "zho_Hans": 9, "zho_Hant": 10, "srp_Cyrl": 11},
    codes={"en": "eng_Latn", "pt": "por_Latn", "zh-Hans": "zho_Hans", "zh": "zho_Hans",
           "zh-Hant": "zho_Hant", "zh-TW": "zho_Hant", "sr": "srp_Cyrl",
           "sr-Cyrl": "srp_Cyrl", "pt-PT": "por_Latn"})
# A model that lists no script of its languages: a script asked for is its language's.
PLAIN = Languages(tokens={"zh": 3, "sr": 4}, codes={"zh": "zh", "sr": "sr"})


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


@pytest.mark.parametrize(("code", "own"), [("zh-Hans", "zh"), ("zh-Hant-TW", "zh"),
                                           ("sr-Latn", "sr"), ("zh-TW", "zh")])
def test_a_model_without_scripts_serves_any(code: str, own: str) -> None:
    assert PLAIN.model_code(code) == own


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
