"""The application core driven directly (no gRPC) on the tiny real package:
answers, queueing, truncation, streaming, error kinds, cancellation."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from conftest import CORPUS
from serving import RunningServer, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.api import convert
from seq2serve.server.assembly import load_models
from seq2serve.server.batching.scheduler import Draining, QueueFull, WorkItem
from seq2serve.server.core.cache import ResponseCache
from seq2serve.server.core.errors import ErrorKind, ServiceError
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.pieces import OUTPUT_PER_SOURCE_TOKEN, TooLongForOnePiece, piece_limit
from seq2serve.server.core.registry import ModelRegistry
from seq2serve.server.core.requests import (
    Call,
    StreamChunk,
    SummarizeRequest,
    TranslateRequest,
)
from seq2serve.server.core.segment import Splitting
from seq2serve.server.core.translator import Translator
from seq2serve.server.metrics import Metrics

T = TypeVar("T")
MODEL = "opus-mt-en-de"  # the tiny package's name
TWO_SENTENCES = f"{CORPUS[0]} {CORPUS[1]}"
LIMITS = dict(max_texts_per_request=8, max_text_chars=500, max_length_cap=64)


@pytest.fixture(scope="module")
def models(marian_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny translation package and a copy of it serving as a summarizer that
    reads at most 12 tokens."""
    root = tmp_path_factory.mktemp("core-models")
    shutil.copytree(marian_package, root / "tiny-en-de")
    summarizer = root / "tiny-summarize"
    shutil.copytree(marian_package, summarizer)
    manifest = json.loads((summarizer / "manifest.json").read_text())
    manifest.update(name="tiny-summarize", task="summarize", target_language="en",
                    max_source_length=12)
    (summarizer / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(scope="module")
def translator(models: Path) -> Iterator[Translator]:
    config = server_config(models, **LIMITS)
    registry = ModelRegistry()
    load_models(registry, config, Metrics())
    yield Translator(registry, max_texts_per_request=config.max_texts_per_request,
                     max_text_chars=config.max_text_chars)
    registry.close(drain=False, timeout=5)


def run(work: Awaitable[T]) -> T:
    async def wrapped() -> T:
        return await work

    return asyncio.run(wrapped())


def translate(translator: Translator, texts: list[str], call: Call | None = None,
              **options: Any) -> list[list[str]]:
    result = run(translator.translate(
        TranslateRequest(tuple(texts), model=MODEL, options=DecodingOptions(**options)),
        call or Call()))
    assert result.model == MODEL
    return [[h.text for h in t.hypotheses] for t in result.translations]


def collect(chunks: AsyncIterator[StreamChunk]) -> list[StreamChunk]:
    async def everything() -> list[StreamChunk]:
        return [chunk async for chunk in chunks]

    return run(everything())


def kind_of(work: Awaitable[object]) -> ErrorKind:
    with pytest.raises(ServiceError) as err:
        run(work)
    return err.value.kind


def test_translate_equals_the_grpc_answer(translator: Translator, models: Path) -> None:
    texts = [TWO_SENTENCES, "", CORPUS[2]]
    options = pb.DecodingOptions(beam_size=4, num_hypotheses=2, max_length=40,
                                 return_scores=True, return_token_ids=True,
                                 return_alignment=True)
    request = pb.TranslateRequest(model=MODEL, texts=texts, options=options)
    result = run(translator.translate(convert.translate_request_from_pb(request), Call()))
    running = RunningServer(server_config(models, **LIMITS))
    try:
        with grpc.insecure_channel(running.target) as channel:
            answer = pb_grpc.TranslatorStub(channel).Translate(request, timeout=60)
    finally:
        running.stop()
    assert convert.translate_response_to_pb(result, options) == answer
    assert [len(t.hypotheses) for t in result.translations] == [2, 2, 2]
    best = result.translations[0].hypotheses[0]
    assert best.score is not None and best.token_ids and best.alignment is not None


def test_a_list_is_queued_as_one_request(translator: Translator,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    [handle] = [h for h in translator.registry.handles() if h.name == MODEL]
    submitted: list[int] = []
    submit_many = handle.scheduler.submit_many

    def spy(items: list[Any]) -> None:
        submitted.append(len(items))
        submit_many(items)

    monkeypatch.setattr(handle.scheduler, "submit_many", spy)
    # (Each sentence within the 32 source tokens a piece has here: half the server's
    # output cap of 64, pieces.piece_limit.)
    got = translate(translator, [TWO_SENTENCES, CORPUS[4], ""], beam_size=1)
    assert submitted == [3]  # two sentences, one, and no piece for the blank text
    assert len(got) == 3 and got[2] == [""]
    # Each text's answer is its own: the same as translated alone.
    assert translate(translator, [CORPUS[4]], beam_size=1) == [got[1]]


def test_summarize_refuses_or_truncates_long_input(translator: Translator) -> None:
    long = " ".join(CORPUS)
    refused = SummarizeRequest((long,), model="tiny-summarize",
                               options=DecodingOptions(beam_size=1))
    with pytest.raises(ServiceError) as err:
        run(translator.summarize(refused, Call()))
    assert err.value.kind == ErrorKind.INVALID_ARGUMENT
    assert "at most 12" in err.value.message and "truncate" in err.value.message
    result = run(translator.summarize(
        SummarizeRequest((long, "", "Open it."), options=DecodingOptions(beam_size=1),
                         truncate=True), Call()))
    assert result.model == "tiny-summarize"
    cut, empty, short = result.summaries
    assert cut.truncated and not empty.truncated and not short.truncated
    assert cut.hypotheses[0].text and empty.hypotheses[0].text == ""


def _queued(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> list[WorkItem]:
    """The work items the tiny translation model's scheduler receives from now on."""
    [handle] = [h for h in translator.registry.handles() if h.name == MODEL]
    queued: list[WorkItem] = []
    submit_many = handle.scheduler.submit_many

    def spy(items: list[WorkItem]) -> None:
        queued.extend(items)
        submit_many(items)

    monkeypatch.setattr(handle.scheduler, "submit_many", spy)
    return queued


# A text with no sentence end, no clause end and no line break: what an NLLB user
# pasted (issue 51: 2,000 words came back as 391 characters).
UNPUNCTUATED = " ".join(" ".join(CORPUS).replace(".", "").replace("-", " ").lower().split())


def test_a_long_unpunctuated_text_is_cut_where_the_model_can_take_it(
        translator: Translator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every word reaches the model, in order, in pieces whose output limit is at least
    OUTPUT_PER_SOURCE_TOKEN times their input; the answer says whether a piece still
    stopped at its limit."""
    [handle] = [h for h in translator.registry.handles() if h.name == MODEL]
    queued = _queued(translator, monkeypatch)
    result = run(translator.translate(TranslateRequest(
        (UNPUNCTUATED,), model=MODEL, options=DecodingOptions(beam_size=1)), Call()))
    words = UNPUNCTUATED.split()
    assert len(handle.encode(UNPUNCTUATED)) > handle.manifest.max_source_length
    assert len(queued) > 1
    # Each piece's source is its text's whole encoding (nothing cut off: it ends with
    # EOS), and the pieces' texts are the text's words, each once, in order.
    texts = [handle.tokenizer.decode(item.source) for item in queued]
    assert [w for t in texts for w in t.split()] == words
    assert all(handle.encode(t) == item.source for t, item in zip(texts, queued, strict=True))
    for item in queued:
        needed = OUTPUT_PER_SOURCE_TOKEN * len(item.source)
        assert item.options.max_new_tokens(len(item.source)) >= needed
        assert item.options.max_new_tokens(len(item.source)) <= handle.engine.limits.max_length
    [best] = result.translations[0].hypotheses
    assert best.finish_reason in ("eos", "length")
    # The engine's own finish reasons, joined: "length" exactly when one piece stopped there.
    alone = [run(translator.translate(TranslateRequest(
        (t,), model=MODEL, options=DecodingOptions(beam_size=1)), Call()))
        .translations[0].hypotheses[0] for t in texts]
    assert best.text == " ".join(a.text for a in alone)
    assert best.finish_reason == ("length" if any(a.finish_reason == "length" for a in alone)
                                  else "eos")


def test_a_requests_own_max_length_is_applied_as_given_and_a_cut_reported(
        translator: Translator, monkeypatch: pytest.MonkeyPatch) -> None:
    queued = _queued(translator, monkeypatch)
    result = run(translator.translate(TranslateRequest(
        (UNPUNCTUATED,), model=MODEL, options=DecodingOptions(beam_size=1, max_length=3)),
        Call()))
    assert queued and all(item.options.max_new_tokens(len(item.source)) == 3
                          for item in queued)
    assert result.translations[0].hypotheses[0].finish_reason == "length"


def test_the_cache_tells_a_requests_own_max_length_from_the_models(
        translator: Translator) -> None:
    """max_length=64 asked for is the same resolved option as the model's 64 left to it,
    but only the latter's pieces are fitted to it: one must not answer for the other."""
    cached = Translator(translator.registry, max_texts_per_request=8, max_text_chars=500,
                        cache=ResponseCache(1 << 20))

    def best(**options: Any) -> Any:
        return run(cached.translate(TranslateRequest(
            (UNPUNCTUATED,), model=MODEL, options=DecodingOptions(beam_size=1, **options)),
            Call())).translations[0].hypotheses[0]

    fitted, asked = best(), best(max_length=64)
    assert asked.finish_reason == "length" and asked != fitted
    assert best() == fitted and best(max_length=64) == asked  # each from its own entry
    assert cached.cache.stats().hits == 2


@pytest.mark.parametrize("options", [dict(beam_size=1), dict(beam_size=4),
                                     dict(sampling_temperature=0.8, seed=3)])
def test_stream_chunks_add_up_to_the_final_text(translator: Translator,
                                                options: dict[str, Any]) -> None:
    request = TranslateRequest((TWO_SENTENCES,), model=MODEL,
                               options=DecodingOptions(max_length=40, **options))
    chunks = collect(translator.stream(request, Call()))
    *growing, final = chunks
    assert final.final and not any(c.final for c in growing)
    assert final.translation is not None
    best = final.translation.hypotheses[0].text
    assert "".join(c.text_delta for c in chunks) == best
    whole = run(translator.translate(request, Call()))
    assert whole.translations[0] == final.translation
    if options.get("beam_size") == 4:  # each finished sentence at once
        assert len(growing) <= 2


def test_errors_carry_their_kind(translator: Translator,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def request(texts: tuple[str, ...] = ("Hello",), model: str = MODEL) -> TranslateRequest:
        return TranslateRequest(texts, model=model)

    assert kind_of(translator.translate(request(model="nope"), Call())) == ErrorKind.NOT_FOUND
    assert kind_of(translator.translate(request(()), Call())) == ErrorKind.INVALID_ARGUMENT
    assert kind_of(translator.translate(request(("a",) * 9), Call())) == \
        ErrorKind.INVALID_ARGUMENT
    assert kind_of(translator.translate(request(("a" * 501,)), Call())) == \
        ErrorKind.INVALID_ARGUMENT
    assert kind_of(translator.summarize(SummarizeRequest(("a",), model=MODEL), Call())) == \
        ErrorKind.INVALID_ARGUMENT  # a translation model
    assert kind_of(collect_later(translator, request(("a", "b")))) == \
        ErrorKind.INVALID_ARGUMENT  # a stream takes one text
    [handle] = [h for h in translator.registry.handles() if h.name == MODEL]
    for error, kind in [(QueueFull("the queue is full"), ErrorKind.RESOURCE_EXHAUSTED),
                        (Draining(), ErrorKind.UNAVAILABLE)]:
        def refuse(items: list[Any], error: Exception = error) -> None:
            raise error

        monkeypatch.setattr(handle.scheduler, "submit_many", refuse)
        assert kind_of(translator.translate(request(), Call())) == kind


def test_a_text_that_is_not_unicode_is_invalid_naming_it(translator: Translator) -> None:
    """A lone surrogate (JSON's \\ud800 reaches a str that way) failed in segmentation as
    an internal error; every way into the core now refuses it as the client's input."""
    texts = ("Open the file.", "a \ud800 b")
    calls = {"translate": translator.translate(TranslateRequest(texts, model=MODEL), Call()),
             "summarize": translator.summarize(SummarizeRequest(texts), Call()),
             "stream": collect_later(translator, TranslateRequest(texts[1:], model=MODEL))}
    for name, work in calls.items():
        with pytest.raises(ServiceError) as err:
            run(work)
        assert err.value.kind == ErrorKind.INVALID_ARGUMENT, name
        index = 0 if name == "stream" else 1
        assert err.value.message == (f"texts[{index}] must be valid Unicode, got a lone "
                                     "surrogate U+D800 at character 2"), name


async def collect_later(translator: Translator, request: TranslateRequest) -> None:
    async for _ in translator.stream(request, Call()):
        pass


def test_a_call_past_its_deadline_is_deadline_exceeded(translator: Translator) -> None:
    call = Call(timeout=0.0)
    assert kind_of(translator.translate(TranslateRequest((TWO_SENTENCES,), model=MODEL),
                                        call)) == ErrorKind.DEADLINE_EXCEEDED


def test_a_cancelled_call_drops_its_pieces(translator: Translator,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    [handle] = [h for h in translator.registry.handles() if h.name == MODEL]
    queued: list[WorkItem] = []
    submit_many = handle.scheduler.submit_many

    def spy(items: list[WorkItem]) -> None:
        queued.extend(items)
        submit_many(items)

    monkeypatch.setattr(handle.scheduler, "submit_many", spy)
    call = Call()
    call.cancel()
    texts = (TWO_SENTENCES, CORPUS[4], CORPUS[5])
    assert kind_of(translator.translate(TranslateRequest(texts, model=MODEL), call)) == \
        ErrorKind.CANCELLED
    assert len(queued) == 4 and all(item.drop_reason() == "cancelled" for item in queued)
    end = time.monotonic() + 10
    while handle.scheduler.depth and time.monotonic() < end:
        time.sleep(0.01)
    assert handle.scheduler.depth == 0  # none of them waits for a batch
    assert translate(translator, [CORPUS[0]], beam_size=1)[0][0]  # still serving


def test_leaving_a_stream_cancels_its_call(translator: Translator) -> None:
    chosen: list[str] = []
    call = Call(on_model=chosen.append)
    request = TranslateRequest((" ".join(CORPUS),), model=MODEL,
                               options=DecodingOptions(beam_size=1, max_length=64))

    async def first_chunk() -> StreamChunk:
        chunks = translator.stream(request, call)
        try:
            return await chunks.__anext__()
        finally:
            await chunks.aclose()

    assert not run(first_chunk()).final
    assert call.cancelled() and chosen == [MODEL] and call.model == MODEL


def test_list_models(translator: Translator) -> None:
    models = {m.name: m for m in translator.list_models()}
    assert set(models) == {MODEL, "tiny-summarize"}
    info = models[MODEL]
    assert (info.task, info.source_language, info.target_language) == ("translate", "en", "de")
    assert info.limits.max_texts_per_request == 8 and info.limits.max_text_chars == 500
    assert info.limits.max_length == 64  # the server's cap
    assert models["tiny-summarize"].max_source_length == 12


def test_a_size_limit_names_the_setting_that_raises_it(translator: Translator) -> None:
    """"must be at most 500 characters" says which setting makes it 500, wherever the
    limit is enforced: the core (gRPC, /v1), and a document's texts left untranslated."""
    from seq2serve.server.core.documents import read_document
    from seq2serve.server.core.documents.service import translate_with_core

    for texts, wanted in [(("a" * 501,), "texts[0] must be at most 500 characters, got 501; "
                           "the limit is the server's --max-text-chars "
                           "(SEQ2SERVE_MAX_TEXT_CHARS)"),
                          (("a",) * 9, "texts must hold at most 8 texts per request, got 9; "
                           "the limit is the server's --max-texts-per-request "
                           "(SEQ2SERVE_MAX_TEXTS_PER_REQUEST)")]:
        with pytest.raises(ServiceError) as err:
            run(translator.translate(TranslateRequest(texts, model=MODEL), Call()))
        assert err.value.message == wanted
    document = read_document("notes.txt", b"short\n\n" + b"long " * 120 + b"\n", "de")
    run(translate_with_core(document, translator, TranslateRequest((), model=MODEL), Call()))
    assert document.tally.notes[-1] == ("1 texts over 500 characters not sent (the limit is "
                                        "the server's --max-text-chars "
                                        "(SEQ2SERVE_MAX_TEXT_CHARS))")


def test_splitting_off_refuses_a_text_whose_whole_answer_the_output_limit_cannot_hold(
        translator: Translator) -> None:
    """With splitting off and the model's own max_length, a text the model reads but whose
    answer the output limit (--max-length-cap 64 here) cannot hold at OUTPUT_PER_SOURCE_TOKEN
    tokens per token in is refused, never answered cut off."""
    [handle] = [h for h in translator.registry.handles() if h.name == MODEL]
    limit = piece_limit(handle.manifest.max_source_length, handle.engine.limits.max_length)
    assert limit < handle.manifest.max_source_length  # the case: the model reads more
    words = UNPUNCTUATED.split()
    text = next(" ".join(words[:n]) for n in range(1, len(words) + 1)
                if len(handle.encode(" ".join(words[:n]))) > limit)
    assert len(handle.encode(text)) <= handle.manifest.max_source_length

    def request(splitting: Splitting) -> TranslateRequest:
        return TranslateRequest(("Hallo", text), model=MODEL,
                                options=DecodingOptions(beam_size=1), splitting=splitting)

    with pytest.raises(TooLongForOnePiece) as refused:
        run(translator.translate(request(Splitting.OFF), Call()))
    assert (refused.value.index, refused.value.limit) == (1, limit)
    assert f"at most {limit}" in refused.value.message
    # Split, the same text is answered whole.
    [_, split] = run(translator.translate(request(Splitting.ON), Call())).translations
    assert split.hypotheses[0].finish_reason == "eos"
