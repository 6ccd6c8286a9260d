"""What the catalog says is loaded (server/core/catalog.py `languages`, issue 54 item 2):
each listed language keeps its targets whatever is loaded (under --lazy nothing is
hidden), `loadedTargets` holds the pairs whose every model (both legs through English)
is loaded now, and `loaded` is true only when every pair from or to the language is.
A pair with a model an operator unloaded (held out) is in `unavailableTargets`, not
in `loadedTargets`, whether that model is still finishing its requests or gone.
The answer follows the models as they load and unload, within one registry generation."""

from __future__ import annotations

from typing import cast

from seq2serve.server.core.catalog import Catalog
from seq2serve.server.core.requests import RouteInfo
from seq2serve.server.core.translator import Translator

# en<->de and en<->fr served directly; de<->fr through English.
ROUTES = [RouteInfo("de", "en", ("de-en",)), RouteInfo("en", "de", ("en-de",)),
          RouteInfo("en", "fr", ("en-fr",)), RouteInfo("fr", "en", ("fr-en",)),
          RouteInfo("de", "fr", ("de-en", "en-fr")), RouteInfo("fr", "de", ("fr-en", "en-de"))]


class Served:
    """The Translator calls the catalog reads: routes, names, and the loaded models."""

    def __init__(self) -> None:
        self.ready: set[str] = set()
        self.held_out: set[str] = set()
        self.route_lists = 0

    def generation(self) -> int:
        return 1  # loading and unloading change no generation

    def list_models(self) -> list[object]:
        return []

    def list_routes(self) -> list[RouteInfo]:
        self.route_lists += 1
        return ROUTES

    def language_names(self, codes: list[str]) -> dict[str, str]:
        return {code: code.upper() for code in codes}

    def loaded_models(self) -> frozenset[str]:
        return frozenset(self.ready)

    def held_out_models(self) -> frozenset[str]:
        return frozenset(self.held_out)


def listed(catalog: Catalog) -> dict[str, tuple[tuple[str, ...], bool, tuple[str, ...]]]:
    return {lang.code: (lang.targets, lang.loaded, lang.loaded_targets)
            for lang in catalog.languages()}


def test_nothing_loaded_lists_every_language_and_target() -> None:
    catalog = Catalog(cast(Translator, Served()))
    assert listed(catalog) == {"de": (("en", "fr"), False, ()),
                               "en": (("de", "fr"), False, ()),
                               "fr": (("de", "en"), False, ())}
    assert [lang.name for lang in catalog.languages()] == ["DE", "EN", "FR"]


def test_a_pair_is_loaded_when_each_of_its_models_is() -> None:
    served = Served()
    catalog = Catalog(cast(Translator, served))
    served.ready = {"en-de", "de-en"}
    assert listed(catalog) == {"de": (("en", "fr"), False, ("en",)),
                               "en": (("de", "fr"), False, ("de",)),
                               "fr": (("de", "en"), False, ())}
    served.ready = {"en-de", "de-en", "en-fr"}  # de -> fr: both legs now
    assert listed(catalog)["de"] == (("en", "fr"), False, ("en", "fr"))
    assert listed(catalog)["fr"] == (("de", "en"), False, ())  # fr-en is not
    served.ready = {"en-de", "de-en", "en-fr", "fr-en"}
    assert all(loaded and targets == done
               for targets, loaded, done in listed(catalog).values())
    served.ready = {"en-de", "de-en", "en-fr"}  # unloaded (the budget): said again
    assert [lang.loaded for lang in catalog.languages()] == [False, False, False]
    assert served.route_lists == 1  # the routes are listed once per generation


def unavailable(catalog: Catalog) -> dict[str, tuple[str, ...]]:
    return {lang.code: lang.unavailable_targets for lang in catalog.languages()}


def test_a_pair_whose_model_the_operator_unloaded_is_unavailable() -> None:
    served = Served()
    catalog = Catalog(cast(Translator, served))
    served.ready = {"en-de", "de-en", "en-fr", "fr-en"}
    assert unavailable(catalog) == {"de": (), "en": (), "fr": ()}
    # en-fr held out while its last requests finish: still ready, refused all the same.
    served.held_out = {"en-fr"}
    assert unavailable(catalog) == {"de": ("fr",), "en": ("fr",), "fr": ()}
    assert listed(catalog) == {"de": (("en", "fr"), False, ("en",)),
                               "en": (("de", "fr"), False, ("de",)),
                               "fr": (("de", "en"), False, ("de", "en"))}
    served.ready -= {"en-fr"}  # unloaded: still held out, not "loads on first request"
    assert unavailable(catalog) == {"de": ("fr",), "en": ("fr",), "fr": ()}
    served.held_out = set()  # loaded again by the operator
    served.ready |= {"en-fr"}
    assert unavailable(catalog) == {"de": (), "en": (), "fr": ()}
    assert all(lang.loaded for lang in catalog.languages())
    assert served.route_lists == 1
