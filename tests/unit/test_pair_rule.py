"""The one rule that chooses a pair's model (server/core/registry.py `route`, issue 51
items 2-4), on stand-ins with NLLB-200's and M2M100's real language lists and a model
of one pair: each candidate maps the codes itself (a model that would change the
script is none), the bilingual model first (or the multilingual ones), then
--prefer-model, then a model that has both codes exactly, then by name; `routes`
lists that choice for every pair; a named model of one pair takes only its own."""

from __future__ import annotations

import pytest
from test_chain import stand_in

from seq2serve.model.families import m2m100
from seq2serve.model.families.languages import family_languages
from seq2serve.model.package.languages import MULTILINGUAL
from seq2serve.server.core.errors import ErrorKind, ServiceError
from seq2serve.server.core.registry import ModelRegistry

NLLB = family_languages({code: i for i, code in enumerate(m2m100.NLLB_CODES)},
                        lambda code: code.replace("_", "-"), m2m100.NLLB_PREFERRED)
M2M100 = family_languages({code: i for i, code in enumerate(m2m100.M2M100_CODES["m2m100"])},
                          m2m100._tag)


def served(prefer_multilingual: bool = False, prefer_models: tuple[str, ...] = (),
           bilingual: tuple[str, ...] = ("opus-mt-en-de",)) -> ModelRegistry:
    registry = ModelRegistry(prefer_multilingual, prefer_models)
    for name in bilingual:
        source, target = name.split("-")[-2:]
        registry.add(stand_in(name, "translate", source, target))
    registry.add(stand_in("nllb", "translate", MULTILINGUAL, MULTILINGUAL, NLLB))
    registry.add(stand_in("m2m100", "translate", MULTILINGUAL, MULTILINGUAL, M2M100))
    registry.loaded()
    return registry


def chosen(registry: ModelRegistry, source: str, target: str) -> tuple[str, str, str]:
    """The model the rule chooses and the languages it is given."""
    [leg] = registry.route("translate", "", source, target).legs
    return leg.handle.name, leg.source_language, leg.target_language


@pytest.mark.parametrize(("source", "target", "want"), [
    ("en", "de", ("opus-mt-en-de", "en", "de")),  # bilingual first
    ("en-US", "de-DE", ("opus-mt-en-de", "en", "de")),  # ... by its language's codes too
    ("en", "fr", ("m2m100", "en", "fr")),  # both exact: by name
    # M2M100's only Chinese is Hans, its only Serbian Cyrillic: not candidates
    ("en", "zh-TW", ("nllb", "en", "zh-Hant")), ("en", "zh-Hant", ("nllb", "en", "zh-Hant")),
    ("en", "zh-HK", ("nllb", "en", "zh-Hant")), ("en", "zh", ("m2m100", "en", "zh")),
    # NLLB has the code exactly (Dari, Bokmål), M2M100 only the language
    ("en", "fa-AF", ("nllb", "en", "fa-AF")), ("en", "nb", ("nllb", "en", "nb")),
    ("en", "fa", ("m2m100", "en", "fa")),
    ("iw", "en", ("m2m100", "he", "en")), ("in", "en", ("m2m100", "id", "en")),  # legacy
])
def test_the_rule(source: str, target: str, want: tuple[str, str, str]) -> None:
    assert chosen(served(), source, target) == want


def test_prefer_multilingual_then_prefer_model() -> None:
    assert chosen(served(True), "en", "de") == ("m2m100", "en", "de")
    assert chosen(served(True, ("nllb",)), "en", "de") == ("nllb", "en", "de")
    preferring = served(prefer_models=("nllb", "m2m100"))
    assert chosen(preferring, "en", "fr") == ("nllb", "en", "fr")
    assert chosen(preferring, "en", "de") == ("opus-mt-en-de", "en", "de")  # kind first
    # a preferred model that would change the script is still no candidate
    assert chosen(served(prefer_models=("m2m100",)), "en", "zh-TW") == ("nllb", "en", "zh-Hant")
    # ... one that has the language only is: the setting comes before exactness
    assert chosen(served(prefer_models=("m2m100",)), "en", "fa-AF") == ("m2m100", "en", "fa")


def test_a_script_no_model_has_is_refused() -> None:
    with pytest.raises(ServiceError) as err:
        served().route("translate", "", "en", "sr-Latn")
    assert err.value.kind is ErrorKind.NOT_FOUND
    with pytest.raises(ServiceError) as err:
        served().route("translate", "m2m100", "en", "zh-TW")
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert err.value.message.startswith(
        "target_language='zh-TW' is not a language of model 'm2m100' (written in "
        "Hant, the model's zh in Hans; its languages: af, am, ar, ast, az, ba, be, bg, bn, "
        "br, bs, ca and 88 more: ListModels, /languages)")


def test_a_named_model_of_one_pair_takes_its_own_languages_only() -> None:
    registry = served()
    for source, target, field, valid in [("zh", "xx", "source_language='zh'", "en"),
                                         ("en", "fr", "target_language='fr'", "de"),
                                         ("de", "en", "source_language='de'", "en")]:
        with pytest.raises(ServiceError) as err:
            registry.route("translate", "opus-mt-en-de", source, target)
        assert err.value.kind is ErrorKind.INVALID_ARGUMENT
        assert err.value.message.startswith(field)
        assert err.value.message.endswith(f"must be {valid!r} or empty")
    for source, target in [("", ""), ("en", ""), ("EN-gb", "de-AT"), ("", "de")]:
        assert registry.route("translate", "opus-mt-en-de", source, target).names == (
            "opus-mt-en-de",)
    registry.add(stand_in("opus-mt-en-sr", "translate", "en", "sr"))
    with pytest.raises(ServiceError) as err:
        registry.route("translate", "opus-mt-en-sr", "en", "sr-Latn")
    assert err.value.message == (
        "target_language='sr-Latn' is not the target language of model 'opus-mt-en-sr' "
        "(written in Latn, the model's sr in Cyrl), which translates en->sr: "
        "target_language must be 'sr' or empty")
    # a folder that did not say its languages (und) cannot be checked: any code
    registry.add(stand_in("opus-mt-unknown", "translate", "und", "und"))
    assert registry.route("translate", "opus-mt-unknown", "zh", "xx").names == (
        "opus-mt-unknown",)


def test_a_named_multilingual_model_takes_cldrs_aliases() -> None:
    registry = served()
    # M2M100 has no (Norwegian): nb (Bokmål) is it, as CLDR's matching says
    assert [leg.target_language for leg in
            registry.route("translate", "m2m100", "en", "nb").legs] == ["no"]
    assert [leg.source_language for leg in
            registry.route("translate", "nllb", "iw", "en").legs] == ["he"]


def test_routes_list_the_rules_choice_for_every_pair() -> None:
    registry = served(prefer_models=("m2m100",), bilingual=("opus-mt-en-de", "opus-mt-de-xx"))
    routes = registry.routes()
    by_pair = {(r.source_language, r.target_language): r.names for r in routes}
    assert len(by_pair) == len(routes)  # one route per pair
    assert by_pair[("en", "de")] == ("opus-mt-en-de",) and by_pair[("en", "fr")] == ("m2m100",)
    assert by_pair[("en", "zh-Hant")] == ("nllb",) and by_pair[("en", "fa-AF")] == ("m2m100",)
    assert ("nb", "no") not in by_pair and ("no", "nb") not in by_pair  # one language
    assert registry.route("translate", "", "nb", "no").models == ()
    # every pair's listed route is what a request of that pair gets (a sample of 40k)
    for route in routes[::97]:
        assert registry.route("translate", "", route.source_language,
                              route.target_language).names == route.names, route
