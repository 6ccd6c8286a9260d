"""The target language as each format marks a language, so that the translated file says
what it is (a spell checker, a screen reader, an e-reader's hyphenation read it).

`Target` is the request's target language (`de`, `pt-BR`, `zh-Hans`) with the region
and script CLDR gives it where the request names none (`de` is written `de-DE`
where a format wants a locale: Word, OpenDocument, PowerPoint), through langcodes,
and the kind of script office formats file it under: western, East Asian
(`asian`: Han, kana, Hangul) or complex (`complex`: right-to-left and Indic scripts,
Thai ...), each of which Word (`w:val`, `w:eastAsia`, `w:bidi`) and OpenDocument
(`fo:language`, `style:language-asian`, `style:language-complex`) mark apart. A
marker that says "no language" (`zxx`, `x-none`, `none`, `und`: text not to be
spell-checked) is kept as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

import langcodes
from lxml import etree

_ASIAN = frozenset({"Hans", "Hant", "Hani", "Jpan", "Kore", "Hira", "Kana", "Hang"})
_COMPLEX = frozenset({"Arab", "Hebr", "Syrc", "Thaa", "Deva", "Beng", "Guru", "Gujr",
                      "Orya", "Taml", "Telu", "Knda", "Mlym", "Sinh", "Thai", "Laoo",
                      "Khmr", "Mymr", "Tibt"})
NO_LANGUAGE = frozenset({"zxx", "x-none", "none", "und", ""})


@dataclass(frozen=True)
class Target:
    tag: str  # as the request names it: "de", "pt-BR" (HTML's and EPUB's `lang`)
    language: str  # "de"
    territory: str  # "DE" (CLDR's likeliest where the request names none)
    kind: Literal["western", "asian", "complex"]

    @property
    def locale(self) -> str:
        """Language and region: what Word and PowerPoint write (`de-DE`)."""
        return f"{self.language}-{self.territory}" if self.territory else self.language

    def replaces(self, value: str | None) -> bool:
        """Whether a marker of `value` is set to the target (not one of "no language")."""
        return value is not None and value.strip().lower() not in NO_LANGUAGE


@cache
def target_language(code: str) -> Target:
    """`code` (a request's target language) as the formats mark it."""
    try:
        asked = langcodes.Language.get(code)
        likely = asked.maximize()
    except (ValueError, LookupError):  # not BCP 47: written as it came, western
        return Target(code, code, "", "western")
    script = asked.script or likely.script or ""
    kind: Literal["western", "asian", "complex"] = (
        "asian" if script in _ASIAN else "complex" if script in _COMPLEX else "western")
    return Target(code, asked.language or code, asked.territory or likely.territory or "",
                  kind)


def put(element: etree._Element, attribute: str, value: str) -> bool:
    """`element`'s `attribute` set to `value`; whether that changed it."""
    if element.get(attribute) == value:
        return False
    element.set(attribute, value)
    return True


def put_text(element: etree._Element, value: str) -> bool:
    """`element`'s text set to `value`; whether that changed it."""
    if element.text == value:
        return False
    element.text = value
    return True
