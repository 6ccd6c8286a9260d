"""What is served, as every door lists it: the translation models, every pair (direct or
through English, registry.routes) with its models, each language's English name, and a
language detector over the served languages. Derived from the Translator per registry
generation (rebuilt when the models change, never frozen at a first request); each door
converts it to its own listing (LibreTranslate's /languages, DeepL's /v2/languages,
ListModels). Which of those models are loaded now, and which an operator unloaded
(core/residency.py), is read at each listing, not kept per generation: a model loads
and unloads without a new generation."""

from __future__ import annotations

from dataclasses import dataclass

from seq2serve.server.core.detect import Detector
from seq2serve.server.core.errors import InvalidArgument, NotFound
from seq2serve.server.core.requests import ModelInfo
from seq2serve.server.core.translator import Translator


@dataclass(frozen=True)
class Pair:
    """A pair as a request names it (`source`, `target`: the core routes it, by the
    rule of every door) and the models that serve it: one, two through English, or
    none (the same language, whose texts come back unchanged)."""

    source: str
    target: str
    models: tuple[str, ...]

    @property
    def last(self) -> str:
        """The model that writes the answer ("" for none)."""
        return self.models[-1] if self.models else ""


@dataclass(frozen=True)
class ServedLanguage:
    """A listed language: its targets (direct or through English), and what of it is
    loaded now. Under --lazy a language served only by models not loaded yet is
    listed all the same: its first request loads them (and waits). A pair whose model
    an operator unloaded stays listed too (it is served again once loaded), said
    unavailable: its requests are refused, none loads it."""

    code: str
    name: str
    targets: tuple[str, ...]
    # Every model that serves a pair from or to it is loaded (none held out): nothing
    # it is asked for waits for a load or is refused for its model.
    loaded: bool
    # The targets whose pair's models (one, or both legs through English) are loaded.
    loaded_targets: tuple[str, ...]
    # The targets whose pair has a model an operator unloaded (held out): refused until
    # it is loaded again (LoadModel), not loaded by a request.
    unavailable_targets: tuple[str, ...] = ()


class UnsupportedLanguage(InvalidArgument):
    """A language no served model reads (`role` "source") or writes ("target")."""

    def __init__(self, code: str, role: str) -> None:
        super().__init__(f"{code[:16]} is not supported")
        self.code, self.role = code, role


class NoRoute(InvalidArgument):
    """Both languages are served, but no model or chain goes from one to the other."""

    def __init__(self, message: str, source: str, target: str) -> None:
        super().__init__(message)
        self.source, self.target = source, target


@dataclass
class Listing:
    """One registry generation's catalog."""

    generation: int
    models: list[ModelInfo]  # the translation models
    pairs: dict[tuple[str, str], Pair]
    names: dict[str, str]  # each listed language's English name, no name twice
    detector: Detector | None = None  # built on first use: its language models cost memory

    @property
    def languages(self) -> list[str]:
        return sorted({code for pair in self.pairs for code in pair})

    @property
    def sources(self) -> list[str]:
        return sorted({s for s, _ in self.pairs})

    @property
    def targets(self) -> list[str]:
        return sorted({t for _, t in self.pairs})


class Catalog:
    """The served languages and pairs for every door; Unavailable (503) while the
    models load."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        self._listing: Listing | None = None
        # The last languages() answer, by the generation and the loaded and held-out
        # models it read.
        self._languages: tuple[int, frozenset[str], frozenset[str],
                               list[ServedLanguage]] | None = None

    def listing(self) -> Listing:
        generation = self.translator.generation()
        listing = self._listing
        if listing is None or listing.generation != generation:
            models = [m for m in self.translator.list_models() if m.task == "translate"]
            pairs = {(r.source_language, r.target_language):
                     Pair(r.source_language, r.target_language, r.models)
                     for r in self.translator.list_routes()}
            codes = sorted({code for pair in pairs for code in pair})
            listing = self._listing = Listing(generation, models, pairs,
                                              self.translator.language_names(codes))
        return listing

    def languages(self) -> list[ServedLanguage]:
        """Every listed language, by code, with its targets and what is loaded now."""
        listing = self.listing()
        ready = self.translator.loaded_models()
        held_out = self.translator.held_out_models()
        known = self._languages
        if known is not None and known[:3] == (listing.generation, ready, held_out):
            return known[3]
        targets: dict[str, list[str]] = {code: [] for code in listing.languages}
        loaded_targets: dict[str, list[str]] = {code: [] for code in listing.languages}
        unavailable: dict[str, list[str]] = {code: [] for code in listing.languages}
        loaded = dict.fromkeys(listing.languages, True)
        # One pass over the pairs (NLLB-200 has 40,000), not one per language.
        for (source, target), pair in sorted(listing.pairs.items()):
            targets[source].append(target)
            if any(model in held_out for model in pair.models):
                # Held out while its requests finish (still ready): refused all the same.
                unavailable[source].append(target)
                loaded[source] = loaded[target] = False
            elif all(model in ready for model in pair.models):
                loaded_targets[source].append(target)
            else:
                loaded[source] = loaded[target] = False
        served = [ServedLanguage(code, self.name(code), tuple(targets[code]), loaded[code],
                                 tuple(loaded_targets[code]), tuple(unavailable[code]))
                  for code in listing.languages]
        self._languages = (listing.generation, ready, held_out, served)
        return served

    def name(self, code: str) -> str:
        """A language's English name (CLDR's, with its script or region), else the code."""
        names = self.listing().names
        return names.get(code) or self.translator.language_names([code])[code]

    def code(self, code: str) -> str:
        """A code as the served models list it (pt-BR -> pt where that is the listed one)."""
        return self.translator.language_code(code)

    def detector(self) -> Detector:
        listing = self.listing()
        if listing.detector is None:
            # Every served language, so that a text in a language that is only a
            # target is named as such ("fr is not supported"), not mistaken for another.
            # (Those the identifier knows: a multilingual model's may include more.)
            listing.detector = Detector([code for code in listing.languages
                                         if Detector.can_identify(code)])
        return listing.detector

    def check_source(self, source: str) -> None:
        if self.code(source) not in self.listing().sources:
            raise UnsupportedLanguage(source, "source")

    def check_target(self, target: str) -> None:
        if self.code(target) not in self.listing().targets:
            raise UnsupportedLanguage(target, "target")

    def pair(self, source: str, target: str) -> Pair:
        """The pair as the core routes it (the rule of every door), or why not:
        UnsupportedLanguage for a target nothing writes, NoRoute otherwise."""
        try:
            route = self.translator.route(source, target)
        except NotFound:
            listed = self.code(target)
            if listed not in self.listing().targets:
                raise UnsupportedLanguage(target, "target") from None
            raise NoRoute(f"{self.name(listed)} ({target[:16]}) is not available as a target "
                          f"language from {self.name(self.code(source))} ({source[:16]})",
                          source, target) from None
        return Pair(source, target, route.models)
