"""Language identification restricted to the languages the server translates from.

`Detector(languages).detect(text)` answers like LibreTranslate's /detect: every served
language the text may be in, each with a confidence from 0 to 100, best first. The
confidences are the identifier's probabilities over the served languages only, so they add
up to 100 (unless two served codes share a language, "pt-BR" and "pt-PT") or the list is
empty.

Text in which no served language can be seen — empty, whitespace, digits, symbols, or a
script none of the served languages uses (Chinese among en/de/fr) — gets an empty list:
"none of these", not a guess. LibreTranslate answers `[{"language": "en", "confidence":
0}]` there; a front door that mimics it maps the empty list to that itself.

The identifier is lingua (`lingua-language-detector`): its models are inside the wheel, so
nothing is downloaded at run time, and it is restricted to the served languages when the
detector is built. Measured here for en/de/fr against langid (restricted with
set_languages) and pycld2 (cannot be restricted) on the project's test text (each line
from ddtp_en_test_sample.txt and the en-de / en-fr models' DDTP and program-message
outputs, which are German and French):

| library | DDTP sentences (en, de, fr) | short messages (de, fr) | ms per text | memory |
| lingua 2.1 | 96.5, 98.9, 97.4 % | 93.9, 93.2 % | 0.07-0.18 | ~120 MB |
| langid 1.1.6 | 98.5, 99.0, 99.4 % | 90.3, 92.9 % | 0.04-0.09 | ~150 MB |
| pycld2 0.42 | 100, 94.3, 93.0 % | - | 0.01 | ~10 MB |

lingua is chosen: it is the most accurate on short text (interface strings, single words:
"Neuland", "Annuler", where langid answers English), which is what a /detect request and a
`source=auto` translation mostly carry; it is maintained (langid's last release is from
2016), ships type information, keeps no global state (langid.set_languages is
process-wide), and its confidences are probabilities, as LibreTranslate (which uses lingua
too) reports them. The cost is memory: the models of the served languages are loaded when
the detector is built (about 40 MB per language), so the first request is not slow.

Cost per call: linear in the text, about 0.5 ms per 1,000 characters on this machine; the
call holds the GIL throughout, so the caller bounds the text it passes (LibreTranslate's
character limit) rather than count on a thread pool. A Detector is immutable after it is
built and may be shared between threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lingua import IsoCode639_1, Language, LanguageDetector, LanguageDetectorBuilder


@dataclass(frozen=True)
class Detection:
    """One language the text may be in: a served language code, confidence 0-100 (2 decimals)."""

    language: str
    confidence: float


def _lingua_language(code: str) -> Language | None:
    """The lingua language of a served code ("de", "pt-BR" -> Portuguese), None if unknown."""
    primary = code.replace("_", "-").split("-", 1)[0].strip().lower()
    if len(primary) != 2 or not primary.isalpha():
        return None
    try:
        return Language.from_iso_code_639_1(IsoCode639_1.from_str(primary))
    except ValueError:
        return None


class Detector:
    """Identifies which of the served languages a text is written in."""

    def __init__(self, languages: Sequence[str]) -> None:
        if isinstance(languages, str):
            raise TypeError("languages: a sequence of codes, not one string")
        if not languages:
            raise ValueError("languages: at least one language code is needed")
        # served code -> lingua language; several codes may share one ("pt-BR", "pt-PT").
        self._codes: dict[str, Language] = {}
        for code in languages:
            language = _lingua_language(code)
            if language is None:
                raise ValueError(f"languages: {code!r} is not a language the identifier "
                                 f"knows (ISO 639-1 codes, such as en, de, fr); check with "
                                 f"Detector.can_identify")
            self._codes.setdefault(code, language)
        # Built once with every model loaded: no request pays for loading one.
        self._detector: LanguageDetector = (
            LanguageDetectorBuilder.from_languages(*set(self._codes.values()))
            .with_preloaded_language_models().build())

    @staticmethod
    def can_identify(code: str) -> bool:
        """Whether a served language code can be passed to Detector."""
        return _lingua_language(code) is not None

    @property
    def languages(self) -> tuple[str, ...]:
        """The served codes the detector chooses between, in the order given."""
        return tuple(self._codes)

    def detect(self, text: str) -> list[Detection]:
        """The served languages `text` may be in, best first; [] when none can be seen."""
        if not any(ch.isalpha() for ch in text):
            return []
        # Rounded to 2 decimals, as LibreTranslate reports them: lingua's sums vary in
        # their last bits from call to call, and the same text must get the same answer.
        confidence = {value.language: round(value.value * 100.0, 2)
                      for value in self._detector.compute_language_confidence_values(text)}
        found = [Detection(code, confidence.get(language, 0.0))
                 for code, language in self._codes.items()]
        # Stable sort: ties keep the served order, so the answer never depends on hashing.
        found.sort(key=lambda d: d.confidence, reverse=True)
        return [d for d in found if d.confidence > 0.0]
