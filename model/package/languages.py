"""A multilingual package's languages (NLLB-200, M2M100, mBART-50): one package
serves every ordered pair of them. Each language is a token of the model's
vocabulary: the source's goes before the text (or, NLLB's `legacy_behaviour`,
after its EOS), the target's is the decoder's forced first token.

Requests name languages by the codes they use everywhere else (en, pt-BR,
zh-Hans); the package maps those to the model's own codes (eng_Latn, de, de_DE:
what the family's transformers tokenizer takes as `src_lang`). The model's own
codes are accepted too. No torch, no transformers.

How a request's code reaches one of a model's languages (`CodeTable.find`, for a
multilingual package and a model of one pair alike), with CLDR's data through
`langcodes`:

1. the code as written, any case, `_` or `-`: a listed code, a request code the
   export wrote, or the model's own (`eng_Latn`);
2. the code as CLDR standardizes it: legacy codes (`iw` is `he`, `in` is `id`, `sh` is
   `sr-Latn`), ISO 639-3 codes (`nob` is `nb`) and the individual languages CLDR folds
   into their macrolanguage (`cmn` is `zh`, `arb` is `ar`);
3. the same with its last subtags dropped (`pt-BR` -> `pt`, `zh-Hant-TW` -> `zh-Hant`),
   then with CLDR's likely script put in first (`zh-HK` -> `zh-Hant-HK` -> `zh-Hant`);
4. a language CLDR's language matching counts as the same one (`nb` and `no`, at a
   distance of 1; the next closest, `bs` and `hr`, are 4 apart and stay apart).

Steps 3 and 4 never change the script: the code's script, written or the one CLDR's
likely subtags give it (`zh-TW` is Hant, `sr-ME` Latn), must be the script of the
language reached (`zh`, listed for M2M100's only Chinese, is Hans: `zh-TW` is not a
language of that model; `sr-Latn` is not NLLB's `srp_Cyrl`). A language listed with a
region (`fa-AF`, NLLB's Dari) is reached only by codes of that region; one listed
without (`pt`, `fa`) is its language in every region. A match of steps 1-2 is
`exact`; the server's routing prefers a model that has the code exactly
(server/core/registry.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import langcodes

# Where a source's language token goes.
SOURCE_TOKEN_PLACES = ("prefix", "suffix")

MULTILINGUAL = "mul"  # ISO 639's code for many languages: a multilingual package's
# source_language and target_language
UNDETERMINED = "und"  # ISO 639's code for a language not known (a folder that says none)
# CLDR's language-matching distance under which two languages count as one, both ways:
# nb and no are 1 apart; bs and hr, the closest pair after them, 4.
SAME_LANGUAGE_DISTANCE = 3
# Most request codes whose lookups a table remembers (a request's code is the client's).
REMEMBERED_CODES = 4096


@dataclass(frozen=True)
class Match:
    """A request's code as a model has it: `own`, the model's code; `exact`, whether
    the model has the code itself (as written or as CLDR standardizes it), not only
    its language (a region dropped, or nb for no)."""

    own: str
    exact: bool


@functools.lru_cache(maxsize=REMEMBERED_CODES)
def standard_tag(code: str, macro: bool = False) -> str | None:
    """`code` as CLDR standardizes it (langcodes), or None where it is no language tag."""
    try:
        return str(langcodes.standardize_tag(code.strip().replace("_", "-"), macro=macro))
    except (ValueError, langcodes.tag_parser.LanguageTagError):
        return None


@functools.lru_cache(maxsize=REMEMBERED_CODES)
def script_of(tag: str) -> str | None:
    """A tag's script, written or CLDR's likely one (zh-TW: Hant); None where unknown."""
    standard = standard_tag(tag, macro=True)
    if standard is None:
        return None
    try:
        script = langcodes.Language.get(standard).maximize().script
    except (ValueError, LookupError, langcodes.tag_parser.LanguageTagError):
        return None
    return str(script) if script else None


@functools.lru_cache(maxsize=REMEMBERED_CODES)
def _one_language(a: str, b: str) -> bool:
    """Whether CLDR's language matching counts languages a and b as one, both ways."""
    try:
        apart = max(langcodes.tag_distance(a, b), langcodes.tag_distance(b, a))
    except (ValueError, LookupError, langcodes.tag_parser.LanguageTagError):
        return False
    return a != b and apart <= SAME_LANGUAGE_DISTANCE


def english_name(tag: str) -> str | None:
    """A tag's English name, CLDR's through langcodes, with its script and region where
    it has them ("Chinese (Traditional)", "Persian (Afghanistan)"); None where CLDR has
    no name for its language."""
    standard = standard_tag(tag)
    if standard is None:
        return None
    try:
        language = langcodes.Language.get(standard)
        name = str(language.display_name()) if language.language else ""
    except (ValueError, LookupError, langcodes.tag_parser.LanguageTagError):
        return None
    return name if name and not name.lower().startswith("unknown") else None


def distinct_names(names: Mapping[str, str]) -> dict[str, str]:
    """code -> name with no name twice: a name two codes share gets each code after it
    ("Chinese [zh]", "Chinese [zh-CN]")."""
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    return {code: name if counts[name] == 1 else f"{name} [{code}]"
            for code, name in names.items()}


@dataclass(frozen=True)
class CodeTable:
    """A model's languages by the codes requests use. known: a code, casefolded with
    `-` for `_`, -> the model's own code; tags: each own code -> the BCP 47 tag of its
    language (its listed code), whose script a code reached by dropping subtags must
    keep."""

    known: Mapping[str, str]
    tags: Mapping[str, str]

    @staticmethod
    def of(codes: Iterable[str]) -> CodeTable:
        """A table of codes that are the model's own (a model of one pair: en, de)."""
        own = list(codes)
        return CodeTable({_key(code): code for code in own}, {code: code for code in own})

    @cached_property
    def _languages(self) -> dict[str, list[str]]:
        """Each language subtag among the known codes -> the known codes of it."""
        by_language: dict[str, list[str]] = {}
        for key in self.known:
            by_language.setdefault(key.split("-")[0], []).append(key)
        return by_language

    @cached_property
    def _found(self) -> dict[str, Match | None]:
        return {}

    def find(self, code: str) -> Match | None:
        """The model's language for a request's code (the module's steps), or None."""
        found = self._found
        if code not in found:
            if len(found) >= REMEMBERED_CODES:
                found.clear()
            found[code] = self._find(code)
        return found[code]

    def _find(self, code: str) -> Match | None:
        if (own := self.known.get(_key(code))) is not None:
            return Match(own, exact=True)
        forms = [t for t in dict.fromkeys((standard_tag(code), standard_tag(code, macro=True)))
                 if t is not None]
        for form in forms:
            if (own := self.known.get(_key(form))) is not None:
                return Match(own, exact=True)
        # A region's likely script first where the model lists scripts (zh-HK: zh-Hant).
        for form in [*forms, *filter(None, map(_maximized, forms))]:
            if (own := self._shorter(form, form)) is not None:
                return Match(own, exact=False)
        for form in forms:
            language, _, rest = _key(form).partition("-")
            for other in self._languages:
                if "-" not in other and other.isalpha() and _one_language(language, other):
                    alike = f"{other}-{rest}" if rest else other
                    if (own := self.known.get(alike) or self._shorter(alike, form)) is not None:
                        return Match(own, exact=False)
        return None

    def _shorter(self, form: str, asked: str) -> str | None:
        """The own code of `form` with its last subtags dropped, of the script `asked`
        is written in."""
        subtags = _key(form).split("-")
        for end in range(len(subtags) - 1, 0, -1):
            own = self.known.get("-".join(subtags[:end]))
            if own is not None and _same_script(asked, self.tags.get(own, own)):
                return own
        return None

    def refusal(self, code: str) -> str:
        """Why `code` is none of the model's languages, when a script is why ("" else)."""
        for form in filter(None, (standard_tag(code, macro=True),)):
            subtags = _key(form).split("-")
            for end in range(len(subtags) - 1, 0, -1):
                own = self.known.get("-".join(subtags[:end]))
                if own is not None:
                    tag = self.tags.get(own, own)
                    return f"written in {script_of(form)}, the model's {tag} in {script_of(tag)}"
        return ""


def _key(code: str) -> str:
    return code.strip().replace("_", "-").casefold()


@functools.lru_cache(maxsize=REMEMBERED_CODES)
def _maximized(tag: str) -> str | None:
    """A tag with CLDR's likely script and region added (zh-HK: zh-Hant-HK)."""
    try:
        return str(langcodes.Language.get(tag).maximize().to_tag())
    except (ValueError, LookupError, langcodes.tag_parser.LanguageTagError):
        return None


def _same_script(asked: str, tag: str) -> bool:
    """Whether a code reached by dropping subtags keeps the script asked (unknown
    scripts are not told apart)."""
    a, b = script_of(asked), script_of(tag)
    return a is None or b is None or a == b


@dataclass(frozen=True)
class Languages:
    """tokens: the model's own code -> its language token's id. codes: a request's
    code -> the model's own code; the first code of each model code is the one
    listed (`/languages`) unless `listing` says. source_token: one of
    SOURCE_TOKEN_PLACES. names: each listed code's English name."""

    tokens: dict[str, int]
    codes: dict[str, str]
    source_token: str = "prefix"
    # The code each language is listed by (/languages), by the model's own code:
    # one of its request codes. Where absent, the first request code of the language
    # in `codes` (a manifest's JSON keeps no order: export writes this).
    listing: dict[str, str] = field(default_factory=dict)
    # Each listed code's English name, for people (/languages).
    names: dict[str, str] = field(default_factory=dict)

    @cached_property
    def table(self) -> CodeTable:
        """The model's languages by every code a request may use (the module's steps)."""
        known = {_key(own): own for own in self.tokens}
        known.update({_key(code): own for code, own in self.codes.items()})
        return CodeTable(known, self._listed_by_own)

    def match(self, code: str) -> Match | None:
        """A request's code as this model has it, or None (`CodeTable.find`)."""
        return self.table.find(code)

    def model_code(self, code: str) -> str | None:
        """The model's code for a request's language code (pt-BR -> por_Latn, iw ->
        heb_Hebr, never sr-Latn -> srp_Cyrl); None: not a language of this model."""
        found = self.table.find(code)
        return None if found is None else found.own

    def token(self, code: str) -> int | None:
        """The language token's id for a request's code, or None."""
        own = self.model_code(code)
        return None if own is None else self.tokens[own]

    def listed(self) -> dict[str, str]:
        """Each language's listed code (a request code where one maps to it, else the
        model's own) -> the model's own code, in the model's order."""
        return dict(self._listed)

    @cached_property
    def _listed(self) -> dict[str, str]:
        first: dict[str, str] = dict(self.listing)
        for code, own in self.codes.items():
            first.setdefault(own, code)
        return {first.get(own, own): own for own in self.tokens}

    @cached_property
    def _listed_by_own(self) -> dict[str, str]:
        return {own: code for code, own in self._listed.items()}

    def listed_code(self, code: str) -> str | None:
        """A request's code as the package lists its language, or None."""
        own = self.model_code(code)
        return None if own is None else self._listed_by_own[own]

    def token_ids(self) -> frozenset[int]:
        return frozenset(self.tokens.values())

    def problems(self, vocab_size: int) -> list[str]:
        """What a manifest's languages get wrong."""
        found = []
        if self.source_token not in SOURCE_TOKEN_PLACES:
            found.append(f"languages.source_token must be one of "
                         f"{', '.join(SOURCE_TOKEN_PLACES)}, got {self.source_token!r}")
        if not self.tokens:
            found.append("languages.tokens is empty")
        found += [f"languages.tokens.{own}: id {i} outside [0, {vocab_size})"
                  for own, i in self.tokens.items() if not 0 <= i < vocab_size]
        found += [f"languages.codes.{code}: {own!r} is not in languages.tokens"
                  for code, own in self.codes.items() if own not in self.tokens]
        found += [f"languages.listing.{own}: {code!r} is not a code of {own!r} in "
                  "languages.codes" for own, code in self.listing.items()
                  if code != own and self.codes.get(code) != own]
        return found
