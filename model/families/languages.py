"""The request codes of a multilingual model's languages (NLLB-200, M2M100, mBART-50):
from the family's own codes (`eng_Latn`, `de`, `de_DE`) to the codes requests use
everywhere else (ISO 639-1 where one exists: `en`, `de`; BCP 47 with a script or
region subtag where one is needed: `zh-Hans`, `zh-Hant`, `zh-TW`, `fa-AF`), at export.

The standard's data comes from `langcodes` (CLDR's aliases and likely subtags: `deu`
is `de`, `arb` is the `ar` macrolanguage's representative, `zh-TW` is written in
Hant), never from a hand table; a family says only how its codes read as BCP 47 tags
(`tag_of`) and which model code a request code must mean where the rule is ambiguous
(`preferred`).

For each model code, in this order of strength: its tag with a redundant script
dropped (`eng-Latn` -> `en`), the standardized tag (`zh-Hant`, `ks-Deva`), the
family's own tag, the same with ISO 639-3 individual languages folded into their
macrolanguage (`arb` -> `ar`, `pes` -> `fa`, `zsm` -> `ms`), and the bare language
subtag (`ko` for `ko-Hang`, `az` for `azj-Latn`). A request code goes to the model
code that claims it most strongly. A tie (`zh` for zho_Hans and zho_Hant), and the
regional tags that decide a script (`zh-TW`, `zh-HK` -> Hant; `zh-CN`, `zh-SG` ->
Hans), go to the model code of the language and script CLDR's likely subtags say;
the family's `preferred` codes (`tl`, `no` for NLLB) override. The model's own codes
stay accepted (`Languages.model_code`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from seq2serve.model.package.languages import Languages, distinct_names, english_name

# Regional tags whose likely script picks between a model's scripts of one language.
REGIONAL_TAGS = ("zh-CN", "zh-SG", "zh-TW", "zh-HK", "zh-MO")


def _langcodes() -> Any:
    try:
        import langcodes
    except ImportError as e:  # export's extra installs it
        raise ImportError("mapping a multilingual model's language codes needs langcodes "
                          "(pip install 'seq2serve[train]')") from e
    return langcodes


def _claims(tag: str) -> list[str]:
    """The request codes a model code's BCP 47 `tag` claims, strongest first."""
    lc = _langcodes()
    try:
        exact = lc.standardize_tag(tag)
        macro = lc.standardize_tag(tag, macro=True)
    except (ValueError, lc.tag_parser.LanguageTagError):
        return []
    found: list[str] = []
    for code in (lc.Language.get(exact).simplify_script().to_tag(), exact, tag,
                 lc.Language.get(macro).simplify_script().to_tag(), macro,
                 lc.Language.get(exact).language or "", lc.Language.get(macro).language or ""):
        if code and code not in found:
            found.append(code)
    return found


def _script_of(tag: str) -> tuple[str, str] | None:
    """(language, likely script) of a BCP 47 tag, macrolanguages folded."""
    lc = _langcodes()
    try:
        full = lc.Language.get(lc.standardize_tag(tag, macro=True)).maximize()
    except (ValueError, lc.tag_parser.LanguageTagError):
        return None
    return full.language or "", full.script or ""


def _listing_order(tag: str) -> tuple[bool, int]:
    """ISO 639-1 codes first, then fewer subtags."""
    return len(tag.split("-")[0]) != 2, tag.count("-")


def request_codes(own_codes: Iterable[str], tag_of: Callable[[str], str],
                  preferred: Mapping[str, str] | None = None) -> dict[str, str]:
    """request code -> model code, for the model codes `own_codes` (in the model's
    order; each model code's ISO 639-1 code first, so that it is the one listed).
    `tag_of`: a model code as a BCP 47 tag. `preferred`: request code -> model code
    where the family decides (applied where that model code is among `own_codes`).
    A code claimed equally by several model codes (`zh` by zho_Hans and zho_Hant), and
    the regional tags of REGIONAL_TAGS, go to the model code of the language and
    script the code's likely subtags say (CLDR: `zh` -> Hans, `zh-TW` -> Hant)."""
    own = list(own_codes)
    claims = {code: _claims(tag_of(code)) for code in own}
    best: dict[str, tuple[int, list[str]]] = {}  # request code -> (rank, model codes)
    for code, tags in claims.items():
        for rank, tag in enumerate(tags):
            held = best.get(tag)
            if held is None or rank < held[0]:
                best[tag] = (rank, [code])
            elif rank == held[0]:
                held[1].append(code)
    chosen = {tag: codes[0] for tag, (_, codes) in best.items() if len(codes) == 1}
    by_script: dict[tuple[str, str], str] = {}
    for code in own:
        key = _script_of(tag_of(code))
        if key is not None:
            by_script.setdefault(key, code)
    tied = [tag for tag, (_, codes) in best.items() if len(codes) > 1]
    for tag in [*tied, *REGIONAL_TAGS]:
        key = _script_of(tag)
        code = by_script.get(key) if key is not None else None
        if code is not None and tag not in chosen:
            chosen[tag] = code
    for tag, code in (preferred or {}).items():
        if code in claims:
            chosen[tag] = code
    ordered: dict[str, str] = {}
    for code in own:  # each model code's codes together, its ISO 639-1 code first
        for tag in sorted((t for t, c in chosen.items() if c == code), key=_listing_order):
            ordered[tag] = code
    return ordered


def family_languages(tokens: Mapping[str, int], tag_of: Callable[[str], str],
                     preferred: Mapping[str, str] | None = None,
                     source_token: str = "prefix") -> Languages:
    """A package's `Languages`: the model's codes with their token ids (`tokens`, in
    the model's order), the request codes mapped to them, and each listed language's
    English name: CLDR's name of the listed code, with its script or region where the
    code has one ("Chinese (Traditional)" for zh-Hant, "Persian (Afghanistan)" for
    fa-AF), else of the model's own code; no name twice (`distinct_names`)."""
    bare = Languages(tokens=dict(tokens), codes=request_codes(tokens, tag_of, preferred),
                     source_token=source_token)
    listed = bare.listed()  # each language's first request code, strongest first
    names = {code: english_name(code) or english_name(tag_of(own)) or own
             for code, own in listed.items()}
    return Languages(tokens=bare.tokens, codes=bare.codes, source_token=source_token,
                     listing={own: code for code, own in listed.items()},
                     names=distinct_names(names))
