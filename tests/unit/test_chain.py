"""Pairs served through English (core/registry.py `route`, core/translator.py): the
lookup rules on stand-in models, then chains of real tiny ONNX packages driven
through the application core: the answer is the second leg applied to the first
leg's best, exactly; batching, the cache, cancellation and deadlines, streaming,
placeholders, listings, metrics and errors."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from conftest import CORPUS
from serving import server_config

from seq2serve.model.package.languages import MULTILINGUAL, Languages
from seq2serve.server.api import convert
from seq2serve.server.api.http.access import Access
from seq2serve.server.api.http.libretranslate import LibreSettings, LibreTranslateApi
from seq2serve.server.assembly import load_models
from seq2serve.server.batching.scheduler import WorkItem
from seq2serve.server.core import translator as core_translator
from seq2serve.server.core.cache import ResponseCache
from seq2serve.server.core.errors import ErrorKind, ServiceError
from seq2serve.server.core.options import DecodingOptions, InvalidOptions
from seq2serve.server.core.pieces import TooLongForOnePiece
from seq2serve.server.core.registry import ModelHandle, ModelRegistry, Route
from seq2serve.server.core.requests import Call, StreamChunk, TranslateRequest, Translation
from seq2serve.server.core.segment import Splitting
from seq2serve.server.core.translator import Translator
from seq2serve.server.metrics import Metrics

T = TypeVar("T")
CHAIN = ("tiny-de-en", "tiny-en-fr")
TWO_SENTENCES = f"{CORPUS[0]} {CORPUS[1]}"
LIMITS = dict(max_texts_per_request=8, max_text_chars=500, max_length_cap=64)


# -- the lookup rules, on stand-in models ------------------------------------------


def stand_in(name: str, task: str, source: str, target: str,
             languages: Languages | None = None) -> ModelHandle:
    """A ModelHandle whose package is only its manifest's routing facts."""
    handle = object.__new__(ModelHandle)
    handle.name = name
    handle.package = SimpleNamespace(manifest=SimpleNamespace(  # type: ignore[assignment]
        task=task, source_language=source, target_language=target, languages=languages))
    return handle


def fake_registry(*pairs: str, prefer_multilingual: bool = False) -> ModelRegistry:
    """A ready registry of stand-ins named "src-tgt" (a "summarize-xx" is a summarizer;
    "mul-CODES", CODES joined by "+", a multilingual model of those languages whose
    own codes are xx_XX)."""
    registry = ModelRegistry(prefer_multilingual)
    for name in pairs:
        source, target = name.split("-", 1)
        if source == "mul":
            codes = target.split("+")
            languages = Languages({f"{c}_XX": i for i, c in enumerate(codes)},
                                  {c: f"{c}_XX" for c in codes})
            registry._handles[name] = stand_in(name, "translate", MULTILINGUAL, MULTILINGUAL,
                                               languages)
            continue
        target = target.split("-")[0]
        task = "summarize" if source == "summarize" else "translate"
        registry._handles[name] = stand_in(name, task, target if task == "summarize"
                                           else source, target)
    registry.ready = True
    return registry


def names(route: Route) -> tuple[str, ...]:
    return route.names


def pairs(route: Route) -> list[tuple[str, str, str]]:
    return [(leg.handle.name, leg.source_language, leg.target_language) for leg in route.legs]


def test_a_multilingual_model_serves_every_pair_and_a_bilingual_model_wins() -> None:
    registry = fake_registry("en-de", "mul-en+de+pt+sr-Latn", "fr-en")
    many = "mul-en+de+pt+sr-Latn"
    # every ordered pair of its languages, codes as listed (case, region, own codes)
    assert pairs(registry.route("translate", "", "pt-BR", "DE")) == [(many, "pt", "de")]
    assert pairs(registry.route("translate", "", "sr_Latn", "pt_XX")) == [(many, "sr-Latn", "pt")]
    # a pair a bilingual model serves too: the bilingual one, unless told otherwise
    assert names(registry.route("translate", "", "en", "de")) == ("en-de",)
    preferring = fake_registry("en-de", many, prefer_multilingual=True)
    assert names(preferring.route("translate", "", "en", "de")) == (many,)
    # through English only where no model serves the pair: fr -> en (bilingual), en -> pt
    assert pairs(registry.route("translate", "", "fr", "pt")) == [
        ("fr-en", "fr", "en"), (many, "en", "pt")]
    # the same language is the text itself, by whichever code it is named
    assert registry.route("translate", "", "pt", "pt-PT").models == ()
    listed = {(r.source_language, r.target_language): r.names for r in registry.routes()}
    assert listed[("en", "de")] == ("en-de",) and listed[("de", "en")] == (many,)
    assert listed[("fr", "de")] == ("fr-en", "en-de") and listed[("fr", "pt")] == ("fr-en", many)
    assert len(listed) == 4 * 3 + 1 + 3
    assert registry.languages() == {"en", "de", "pt", "sr-Latn", "fr"}


def test_a_named_multilingual_model_needs_two_of_its_languages() -> None:
    registry = fake_registry("mul-en+de")
    assert pairs(registry.route("translate", "mul-en+de", "de", "en")) == [
        ("mul-en+de", "de", "en")]
    for source, target, said in [("", "de", "source_language is required"),
                                 ("de", "xx", "target_language='xx' is not a language"),
                                 ("en", "EN", "the same language")]:
        with pytest.raises(ServiceError) as err:
            registry.route("translate", "mul-en+de", source, target)
        assert err.value.kind is ErrorKind.INVALID_ARGUMENT and said in str(err.value)
        assert "(its languages: en, de)" in str(err.value) or "same" in said


def test_a_pair_without_a_model_goes_through_english() -> None:
    registry = fake_registry("en-de", "en-fr", "de-en", "summarize-en")
    route = registry.route("translate", "", "de", "fr")
    assert names(route) == ("de-en", "en-fr") and route.chained and route.kind == "chained"
    assert route.name == "de-en+en-fr"
    assert names(registry.route("translate", "", "de", "en")) == ("de-en",)
    # fr -> en has no model: fr -> de has no chain either
    with pytest.raises(ServiceError) as err:
        registry.route("translate", "", "fr", "de")
    assert err.value.kind == ErrorKind.NOT_FOUND
    assert err.value.message == (
        "no translate model for source_language='fr' target_language='de'; available: "
        "en-de (translate en->de), en-fr (translate en->fr), de-en (translate de->en), "
        "summarize-en (summarize en->en); through en: de->fr")


def test_a_direct_model_always_wins_over_a_chain() -> None:
    registry = fake_registry("en-de", "en-fr", "de-en", "de-fr")
    assert names(registry.route("translate", "", "de", "fr")) == ("de-fr",)
    assert [(r.source_language, r.target_language, r.names) for r in registry.routes()] == [
        ("de", "en", ("de-en",)), ("de", "fr", ("de-fr",)), ("en", "de", ("en-de",)),
        ("en", "fr", ("en-fr",))]
    # A model asked for by name is that model, for its own pair only ("": its own).
    assert names(registry.route("translate", "de-en", "de", "en")) == ("de-en",)
    assert names(registry.route("translate", "de-en", "", "")) == ("de-en",)
    with pytest.raises(ServiceError) as err:
        registry.route("translate", "de-en", "de", "fr")
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT and err.value.message == (
        "target_language='fr' is not the target language of model 'de-en', which translates "
        "de->en: target_language must be 'en' or empty")


def test_a_model_is_never_chained_with_itself() -> None:
    # en -> en is the one pair whose two legs could be one model: it is that model
    # alone (direct), and no route anywhere repeats a model.
    registry = fake_registry("en-en", "de-en", "en-fr")
    assert names(registry.route("translate", "", "en", "en")) == ("en-en",)
    assert registry._chain("en", "en") is None
    for route in registry.routes():
        assert len(set(route.names)) == len(route.names)
    # A round trip is not a chain either: de -> de is the same language.
    registry = fake_registry("de-en", "en-de")
    route = registry.route("translate", "", "de", "de")
    assert route.models == () and route.kind == "same_language" and route.name == ""


def test_chains_never_start_or_end_at_english_and_each_leg_follows_the_rule() -> None:
    registry = fake_registry("de-en", "en-fr", "en-fr2")
    registry._handles["en-fr2"].manifest.target_language = "fr"  # type: ignore[attr-defined]
    # two en -> fr models: the rule's (by name) serves en -> fr and the chain's second leg
    assert names(registry.route("translate", "", "en", "fr")) == ("en-fr",)
    assert names(registry.route("translate", "", "de", "fr")) == ("de-en", "en-fr")
    registry.prefer_models = ("en-fr2",)
    assert names(registry.route("translate", "", "en", "fr")) == ("en-fr2",)
    assert names(registry.route("translate", "", "de", "fr")) == ("de-en", "en-fr2")
    with pytest.raises(ServiceError) as err:  # one language: the model must be named
        registry.route("translate", "", "", "fr")
    assert err.value.kind == ErrorKind.INVALID_ARGUMENT and "model is required" in \
        err.value.message
    # A language nobody serves is not "the same language".
    with pytest.raises(ServiceError) as err:
        registry.route("translate", "", "es", "es")
    assert err.value.kind == ErrorKind.NOT_FOUND
    # Summarization never chains.
    registry = fake_registry("de-en", "summarize-en")
    with pytest.raises(ServiceError):
        registry.route("summarize", "", "de", "en")


# -- chains of real packages ---------------------------------------------------------


def relabel(package: Path, root: Path, name: str, source: str, target: str) -> None:
    """A copy of the tiny package that says it translates source -> target."""
    shutil.copytree(package, root / name)
    manifest_path = root / name / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.update(name=name, source_language=source, target_language=target)
    manifest_path.write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def models(marian_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """de -> en, en -> fr, en -> de, fr -> en and fr -> de, all the tiny package: de -> fr
    is served through English, fr -> de directly (its chain fr-en + en-de loses)."""
    root = tmp_path_factory.mktemp("chain-models")
    for name, source, target in [("tiny-de-en", "de", "en"), ("tiny-en-fr", "en", "fr"),
                                 ("tiny-en-de", "en", "de"), ("tiny-fr-en", "fr", "en"),
                                 ("tiny-fr-de", "fr", "de")]:
        relabel(marian_package, root, name, source, target)
    return root


@pytest.fixture(scope="module")
def registry(models: Path) -> Iterator[ModelRegistry]:
    registry = ModelRegistry()
    load_models(registry, server_config(models, **LIMITS), Metrics())
    yield registry
    registry.close(drain=False, timeout=5)


def make_translator(registry: ModelRegistry, **kwargs: Any) -> Translator:
    return Translator(registry, max_texts_per_request=8, max_text_chars=500, **kwargs)


@pytest.fixture
def translator(registry: ModelRegistry) -> Translator:
    return make_translator(registry)


def run(work: Awaitable[T]) -> T:
    async def wrapped() -> T:
        return await work

    return asyncio.run(wrapped())


def chained(texts: tuple[str, ...], **options: Any) -> TranslateRequest:
    return TranslateRequest(texts, source_language="de", target_language="fr",
                            options=DecodingOptions(**options))


def kind_of(work: Awaitable[object]) -> ErrorKind:
    with pytest.raises(ServiceError) as err:
        run(work)
    return err.value.kind


def handle(registry: ModelRegistry, name: str) -> Any:
    [found] = [h for h in registry.handles() if h.name == name]
    return found


def test_the_chain_is_the_second_leg_over_the_first_legs_best(translator: Translator) -> None:
    options = dict(beam_size=4, num_hypotheses=2, max_length=40, return_scores=True)
    texts = (TWO_SENTENCES, "", CORPUS[4])
    result = run(translator.translate(chained(texts, **options), Call()))
    assert result.models == CHAIN and result.model == "tiny-de-en+tiny-en-fr"
    # Leg by leg, as two ordinary requests: the first's best, then the second's n-best.
    first = run(translator.translate(TranslateRequest(
        texts, model=CHAIN[0], options=DecodingOptions(**{**options, "num_hypotheses": 1})),
        Call()))
    middle = tuple(t.hypotheses[0].text for t in first.translations)
    second = run(translator.translate(TranslateRequest(
        middle, model=CHAIN[1], options=DecodingOptions(**options)), Call()))
    for got, head, tail in zip(result.translations, first.translations, second.translations,
                               strict=True):
        assert [h.text for h in got.hypotheses] == [h.text for h in tail.hypotheses]
        assert [h.token_ids for h in got.hypotheses] == [h.token_ids for h in tail.hypotheses]
        head_score = head.hypotheses[0].score
        for chain_hyp, tail_hyp in zip(got.hypotheses, tail.hypotheses, strict=True):
            if head_score is None:  # the blank text: never sent to a model
                assert chain_hyp.score is None
            else:  # the log-probability of the whole route
                assert tail_hyp.score is not None
                assert chain_hyp.score == tail_hyp.score + head_score
            assert chain_hyp.alignment is None
    assert result.translations[1].hypotheses[0].text == ""
    # The legs did something: the chain is not its first leg's answer.
    assert [t.hypotheses[0].text for t in result.translations] != list(middle)


def test_both_legs_go_through_the_queues(registry: ModelRegistry, translator: Translator,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    queued: dict[str, list[int]] = {}
    for name in CHAIN:
        scheduler = handle(registry, name).scheduler

        def spy(items: list[WorkItem], submit: Any = scheduler.submit_many,
                name: str = name) -> None:
            queued.setdefault(name, []).append(len(items))
            submit(items)

        monkeypatch.setattr(scheduler, "submit_many", spy)
    run(translator.translate(chained((TWO_SENTENCES, CORPUS[4]), beam_size=1), Call()))
    # Each leg queues all of the request's pieces at once: two sentences and one; the
    # second, the English text's pieces (at most 32 source tokens each here: half the
    # server's output cap of 64, pieces.piece_limit), at least one per sentence.
    assert queued[CHAIN[0]] == [3]
    assert len(queued[CHAIN[1]]) == 1 and queued[CHAIN[1]][0] >= 3


def test_a_chained_answer_does_not_depend_on_its_batch_mates(translator: Translator) -> None:
    request = chained((TWO_SENTENCES,), beam_size=1, max_length=40, return_scores=True)
    alone = run(translator.translate(request, Call()))

    async def busy() -> list[Any]:
        others = [TranslateRequest((text,), model=name, options=DecodingOptions(beam_size=1))
                  for text in CORPUS for name in (*CHAIN, "tiny-fr-de")]
        return await asyncio.gather(translator.translate(request, Call()),
                                    *[translator.translate(o, Call()) for o in others],
                                    translator.translate(request, Call()))

    results = run(busy())
    assert results[0].translations == alone.translations == results[-1].translations


def test_the_cache_keys_the_whole_chain(registry: ModelRegistry,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cache: ResponseCache[Translation] = ResponseCache(2**20)
    translator = make_translator(registry, cache=cache)
    request = chained((CORPUS[2],), beam_size=2, max_length=30)
    first = run(translator.translate(request, Call()))
    assert cache.stats().entries == 1  # one entry for the request as asked, not per leg

    def refuse(items: list[WorkItem]) -> None:
        raise AssertionError("a cached answer queued work")

    for name in CHAIN:
        monkeypatch.setattr(handle(registry, name).scheduler, "submit_many", refuse)
    assert run(translator.translate(request, Call())) == first
    assert cache.stats().hits == 1
    monkeypatch.undo()
    # The first leg alone, the same text: another answer, another entry.
    leg = run(translator.translate(TranslateRequest((CORPUS[2],), model=CHAIN[0],
                                                    options=request.options), Call()))
    assert cache.stats().entries == 2 and cache.stats().hits == 1
    assert leg.models == (CHAIN[0],)
    # Other options for either leg: another entry.
    run(translator.translate(chained((CORPUS[2],), beam_size=1, max_length=30), Call()))
    assert cache.stats().entries == 3


def test_a_cancel_between_the_legs_ends_the_call(registry: ModelRegistry,
                                                 translator: Translator,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    second: list[WorkItem] = []
    scheduler = handle(registry, CHAIN[1]).scheduler
    submit = scheduler.submit_many

    def spy(items: list[WorkItem]) -> None:
        second.extend(items)
        submit(items)

    monkeypatch.setattr(scheduler, "submit_many", spy)
    carry = core_translator.carry_over
    for end, kind in [("cancel", ErrorKind.CANCELLED),
                      ("deadline", ErrorKind.DEADLINE_EXCEEDED)]:
        call = Call(timeout=60)
        second.clear()

        def ending(*args: Any, call: Call = call, end: str = end) -> Any:
            # The first leg has finished: the client leaves, or its deadline passes.
            if end == "cancel":
                call.cancel()
            else:
                call.deadline = time.monotonic() - 1
            return carry(*args)

        monkeypatch.setattr(core_translator, "carry_over", ending)
        assert kind_of(translator.translate(chained((TWO_SENTENCES,), beam_size=1),
                                            call)) == kind
        # The second leg's items were dropped, never run.
        assert second and all(item.drop_reason() in ("cancelled", "deadline")
                              for item in second)
    monkeypatch.setattr(core_translator, "carry_over", carry)
    # A call that has ended before the chain starts never reaches the second leg.
    second.clear()
    call = Call()
    call.cancel()
    assert kind_of(translator.translate(chained((CORPUS[1],)), call)) == ErrorKind.CANCELLED
    assert second == []
    assert kind_of(translator.translate(chained((CORPUS[1],)), Call(timeout=0.0))) == \
        ErrorKind.DEADLINE_EXCEEDED


def collect(chunks: Any) -> list[StreamChunk]:
    async def everything() -> list[StreamChunk]:
        return [chunk async for chunk in chunks]

    return run(everything())


@pytest.mark.parametrize("options", [dict(beam_size=1), dict(beam_size=4)])
def test_a_chain_streams_its_second_leg(translator: Translator,
                                        options: dict[str, Any]) -> None:
    request = chained((TWO_SENTENCES,), max_length=40, **options)
    chunks = collect(translator.stream(request, Call()))
    *growing, final = chunks
    assert final.final and final.translation is not None and final.models == CHAIN
    assert "".join(c.text_delta for c in chunks) == final.translation.hypotheses[0].text
    assert run(translator.translate(request, Call())).translations[0] == final.translation


def test_placeholders_and_terms_survive_both_legs(translator: Translator) -> None:
    text = "Open <b>%s</b> with {0} at https://example.org/x and _Save."
    result = run(translator.translate(
        TranslateRequest((text,), source_language="de", target_language="fr",
                         terms=(("library", "bibliothèque"),),
                         options=DecodingOptions(beam_size=2, num_hypotheses=2)), Call()))
    for hypothesis in result.translations[0].hypotheses:
        out = hypothesis.text
        for placeholder in ("<b>", "</b>", "%s", "{0}", "https://example.org/x"):
            assert out.count(placeholder) == 1, (placeholder, out)
        assert out.index("<b>") < out.index("</b>")
        assert out.count("_") == 1  # the accelerator, put back once
    # A term of the request's pair (de -> fr) comes out as its target.
    [hyp] = run(translator.translate(TranslateRequest(
        ("Open the library.",), source_language="de", target_language="fr",
        terms=(("library", "bibliothèque"),)), Call())).translations[0].hypotheses
    assert hyp.text.count("bibliothèque") == 1


def test_the_same_language_gives_the_text_back(translator: Translator) -> None:
    texts = ("Öffne die Datei.", "")
    result = run(translator.translate(TranslateRequest(
        texts, source_language="de", target_language="de",
        options=DecodingOptions(num_hypotheses=2, beam_size=2, return_scores=True)), Call()))
    assert result.models == () and result.model == ""
    assert [[(h.text, h.score) for h in t.hypotheses] for t in result.translations] == [
        [(texts[0], 0.0)] * 2, [("", 0.0)] * 2]
    [final] = collect(translator.stream(TranslateRequest(
        texts[:1], source_language="de", target_language="de"), Call()))
    assert final.text_delta == texts[0] and final.final and final.models == ()
    # Its texts and options are checked as any request's.
    assert kind_of(translator.translate(TranslateRequest(
        ("a" * 501,), source_language="de", target_language="de"), Call())) == \
        ErrorKind.INVALID_ARGUMENT
    with pytest.raises(InvalidOptions, match="beam_size must be in"):
        run(translator.translate(TranslateRequest(
            ("a",), source_language="de", target_language="de",
            options=DecodingOptions(beam_size=0)), Call()))


def test_errors_of_chained_pairs(translator: Translator) -> None:
    with pytest.raises(ServiceError) as err:
        run(translator.translate(TranslateRequest(("a",), source_language="de",
                                                  target_language="es"), Call()))
    assert err.value.kind == ErrorKind.NOT_FOUND
    assert "available: " in err.value.message and "through en: de->fr" in err.value.message
    with pytest.raises(ServiceError) as err:
        run(translator.translate(chained(("a",), return_alignment=True), Call()))
    assert err.value.kind == ErrorKind.INVALID_ARGUMENT
    assert err.value.message == (
        "return_alignment is not available for de->fr, which is served through en "
        "(tiny-de-en+tiny-en-fr): an alignment would point into the en text")


def test_routes_are_listed_and_counted(registry: ModelRegistry) -> None:
    metrics = Metrics()
    translator = make_translator(registry, metrics=metrics)
    routes = {(r.source_language, r.target_language): r.models
              for r in translator.list_routes()}
    assert routes == {("de", "en"): ("tiny-de-en",), ("de", "fr"): CHAIN,
                      ("en", "de"): ("tiny-en-de",), ("en", "fr"): ("tiny-en-fr",),
                      ("fr", "de"): ("tiny-fr-de",), ("fr", "en"): ("tiny-fr-en",)}
    message = convert.list_models_to_pb(translator.list_models(), translator.list_routes())
    assert [(r.source_language, r.target_language, list(r.models)) for r in message.routes] \
        == [(s, t, list(m)) for (s, t), m in routes.items()]
    # fr -> de is direct (its chain fr-en + en-de loses)
    chosen: list[str] = []
    result = run(translator.translate(TranslateRequest(
        ("a",), source_language="fr", target_language="de"), Call(on_model=chosen.append)))
    assert result.models == ("tiny-fr-de",)
    run(translator.translate(chained(("a",)), Call(on_model=chosen.append)))
    run(translator.translate(TranslateRequest(("a",), source_language="fr",
                                              target_language="fr"), Call()))
    assert chosen == ["tiny-fr-de", "tiny-de-en+tiny-en-fr"]

    def counted(route: str, models: str) -> float | None:
        return metrics.registry.get_sample_value(
            "seq2serve_translate_routes_total", {"route": route, "models": models})

    assert counted("direct", "tiny-fr-de") == 1
    assert counted("chained", "tiny-de-en+tiny-en-fr") == 1
    assert counted("same_language", "(none)") == 1


def test_libretranslate_languages_lists_every_reachable_target(translator: Translator) -> None:
    api = LibreTranslateApi(translator, Access(), LibreSettings(char_limit=500, batch_limit=8,
                                                                alternatives_limit=3))
    response = run(api.languages(None))  # type: ignore[arg-type]  # the request is not read
    assert [(lang["code"], lang["targets"]) for lang in json.loads(response.body)] == [
        ("de", ["en", "fr"]), ("en", ["de", "fr"]), ("fr", ["de", "en"])]
    assert set(api.catalog.detector().languages) == {"de", "en", "fr"}
    assert api.catalog.pair("de", "fr").models == CHAIN
    assert api.catalog.pair("de", "de").models == ()


def test_a_second_leg_refusal_names_the_request_s_text_and_the_intermediate(
        registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """Splitting off, de -> fr through English: texts[0] a cache hit and the English
    intermediate of texts[1] past the en -> fr model's limit. The refusal names texts[1]
    (its place in the request, not among the texts that missed the cache) and says the
    intermediate, not the client's text, is what passed the limit."""
    translator = make_translator(registry, cache=ResponseCache(2**20))

    def request(texts: tuple[str, ...]) -> TranslateRequest:
        return TranslateRequest(texts, source_language="de", target_language="fr",
                                options=DecodingOptions(beam_size=1, max_length=30),
                                splitting=Splitting.OFF)

    run(translator.translate(request((CORPUS[0],)), Call()))  # texts[0] now cached
    real = core_translator.plan

    def second_leg_too_long(text: str, language: str, *args: Any, **kwargs: Any) -> Any:
        if language == "en":  # only the second leg reads English
            raise TooLongForOnePiece(99, 7)
        return real(text, language, *args, **kwargs)

    monkeypatch.setattr(core_translator, "plan", second_leg_too_long)
    with pytest.raises(TooLongForOnePiece) as refused:
        run(translator.translate(request((CORPUS[0], CORPUS[1])), Call()))
    assert refused.value.index == 1, refused.value.message
    assert refused.value.pivot == "en"
    assert refused.value.message.startswith(
        "the intermediate translation into en of texts[1] (the second leg's input) is 99")
