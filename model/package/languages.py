"""A multilingual package's languages (NLLB-200, M2M100, mBART-50): one package
serves every ordered pair of them. Each language is a token of the model's
vocabulary: the source's goes before the text (or, NLLB's `legacy_behaviour`,
after its EOS), the target's is the decoder's forced first token.

Requests name languages by the codes they use everywhere else (en, pt-BR,
zh-Hans); the package maps those to the model's own codes (eng_Latn, de, de_DE:
what the family's transformers tokenizer takes as `src_lang`). The model's own
codes are accepted too. No torch, no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

# Where a source's language token goes.
SOURCE_TOKEN_PLACES = ("prefix", "suffix")

MULTILINGUAL = "mul"  # ISO 639's code for many languages: a multilingual package's
# source_language and target_language


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
    def _folded(self) -> dict[str, str]:
        folded = {own.casefold(): own for own in self.tokens}
        folded.update({code.casefold(): own for code, own in self.codes.items()})
        return folded

    def model_code(self, code: str) -> str | None:
        """The model's code for a request's language code, case-insensitively: a
        listed code, one of the model's own, or a BCP 47 tag with its last subtags
        dropped where the whole tag is not listed (pt-BR -> pt, zh-Hant-TW ->
        zh-Hant); its script only where the model lists no script of that language
        (M2M100's zh serves zh-Hans; NLLB's srp_Cyrl, listed as sr-Cyrl, never
        sr-Latn). None: not a language of this model."""
        raw = code.strip().casefold()
        if (own := self._folded.get(raw)) is not None:
            return own
        subtags = raw.replace("_", "-").split("-")
        scripted = len(subtags) > 1 and len(subtags[1]) == 4 and subtags[1].isalpha()
        keep = 2 if scripted and self._has_scripts(subtags[0]) else 1
        for end in range(len(subtags), keep - 1, -1):
            if (own := self._folded.get("-".join(subtags[:end]))) is not None:
                return own
        return None

    def _has_scripts(self, language: str) -> bool:
        """Whether a listed code names `language` with a script (zh-hant)."""
        return any(len(parts := key.split("-")) > 1 and parts[0] == language
                   and len(parts[1]) == 4 and parts[1].isalpha() for key in self._folded)

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
