"""The application core: validate, plan, queue, await, join. Every front door calls this.

One work item per sentence-sized piece goes to the model's scheduler; a request
awaits every piece and reassembles the answer in input order (the pure parts of
that in pieces.py). All of a request's pieces enter the queue together, so the
texts of one request batch with each other and with everyone else's.

A pair with no model of its own is served through English (registry.Route): the
text is masked once, translated by the first model as any request is (its own
work items, batching with other traffic), its best joined, planned again and
queued for the second model, whose n-best is the answer; then unmasked. One Call
covers both legs, so a deadline or a cancel ends either. Refusals
raise core.errors.ServiceError (or options.InvalidOptions); the scheduler's
exceptions become ServiceErrors here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from seq2serve.model.package.languages import distinct_names
from seq2serve.server.batching.scheduler import Draining, ItemDropped, QueueFull, WorkItem
from seq2serve.server.config import setting_names
from seq2serve.server.core.alignment import compose, text_links
from seq2serve.server.core.cache import ResponseCache
from seq2serve.server.core.delivery import PieceEvents, deliver_to_future
from seq2serve.server.core.errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
    check_unicode,
)
from seq2serve.server.core.formatting import Link, carry_over, model_text, split
from seq2serve.server.core.glossary import Glossaries, request_terms
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.pieces import (
    Joined,
    Plan,
    StreamedText,
    TooLongForOnePiece,
    join,
    output_limit,
    piece_limit,
    plan,
    whole,
)
from seq2serve.server.core.placeholders import Masked, Terms, mask, restore
from seq2serve.server.core.registry import PIVOT, Leg, ModelHandle, ModelRegistry, Route
from seq2serve.server.core.requests import (
    Call,
    ModelInfo,
    ModelLimits,
    OptionValue,
    RouteInfo,
    StreamChunk,
    SummarizeRequest,
    SummarizeResult,
    Summary,
    TranslateRequest,
    TranslateResult,
    Translation,
)
from seq2serve.server.core.residency import ModelState
from seq2serve.server.core.segment import Splitting
from seq2serve.server.engine.options import ResolvedOptions
from seq2serve.server.engine.search import FinishReason, Hypothesis, Result
from seq2serve.server.metrics import Metrics

# The core's whole surface: the Translator and the values it takes and returns.
__all__ = ["Call", "ModelInfo", "ModelLimits", "RouteInfo", "SourceTooLong", "StreamChunk",
           "SummarizeRequest", "SummarizeResult", "Summary", "TranslateRequest",
           "TranslateResult", "Translation", "Translator"]

T = TypeVar("T")
_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(DecodingOptions))


@dataclass(frozen=True)
class _Leg:
    """A chain's first model and the options it runs with."""

    handle: ModelHandle
    options: ResolvedOptions
    leg: Leg  # its pair: source -> PIVOT


@dataclass(frozen=True)
class _Job:
    """A request past admission: its model, its checked texts, its resolved options."""

    handle: ModelHandle  # the model that writes the answer (a chain's second)
    texts: tuple[str, ...]
    options: ResolvedOptions
    count: int  # hypotheses per text
    protect: bool = False  # placeholders masked (translate only)
    terms: Terms = Terms()  # glossary terms masked and substituted
    first: _Leg | None = None  # a chain's first leg: source -> PIVOT
    leg: Leg | None = None  # the pair `handle` translates (None: summarize)
    # The request left max_length to the model: a long text's pieces are cut to what
    # the model's output limit holds, and each piece's limit rises with its input
    # (pieces.piece_limit, pieces.output_limit). A request's own max_length is applied
    # as it asked, and a piece that reaches it says so (finish_reason "length").
    fit: bool = False
    splitting: Splitting = Splitting.ON  # where texts are cut into pieces (the request's)

    @property
    def reader(self) -> ModelHandle:
        """The model that reads the request's texts."""
        return self.handle if self.first is None else self.first.handle

    @property
    def names(self) -> tuple[str, ...]:
        return (self.handle.name,) if self.first is None else (self.first.handle.name,
                                                                self.handle.name)


@dataclass(frozen=True)
class _Text:
    """A text on its way to the last model: masked once, planned for that model;
    for a chain, what its first leg's best added (score, a placeholder repair)."""

    masked: Masked
    plan: Plan
    head_score: float | None = 0.0
    head_repaired: bool = False
    # A chain's text with formatting: the first leg's links and English, as written.
    head_links: tuple[Link, ...] = ()
    head_text: str = ""

    @property
    def formatted(self) -> bool:
        """Whether the text has paired tags, placed by the alignment (core/formatting.py)."""
        return split(self.masked) is not None


class Translator:
    """Translate, summarize, stream and list models, for any front door."""

    def __init__(self, registry: ModelRegistry, *, max_texts_per_request: int,
                 max_text_chars: int, cache: ResponseCache[Translation] | None = None,
                 glossaries: Glossaries | None = None, metrics: Metrics | None = None) -> None:
        self.registry = registry
        self.metrics = metrics
        self.max_texts_per_request = max_texts_per_request
        self.max_text_chars = max_text_chars
        self.cache: ResponseCache[Translation] = cache or ResponseCache(0)
        self.glossaries = glossaries or Glossaries()

    # -- the calls -----------------------------------------------------------------

    async def translate(self, request: TranslateRequest, call: Call) -> TranslateResult:
        route = self._route(request, call)
        # Every model of the route (both legs of a chain) loaded, and held until the
        # answer: none is unloaded under the request (core/residency.py).
        async with self.registry.residency.lease(route.models, call.deadline):
            return await self._translate(request, call, route)

    async def _translate(self, request: TranslateRequest, call: Call,
                         route: Route) -> TranslateResult:
        if not route.models:
            return self._unchanged(request, route)
        job = self._admit_translation(request, route)
        # A text's answer depends on nothing but these: a hit is exact, and never queued.
        keys = [_cache_key(job, text) for text in job.texts]
        found = [self.cache.get(k) if k is not None else None for k in keys]
        todo = [i for i, hit in enumerate(found) if hit is None]
        if todo:
            # Masking, segmenting and tokenizing 64 long texts takes a while: off the event
            # loop, which must keep answering health checks and other calls meanwhile.
            def prepare() -> list[tuple[Masked, Plan]]:
                return [self._prepare(job, job.texts[i], i) for i in todo]

            ready = await self._through_pivot(job, await off_loop(prepare), todo, call)
            futures = self._queue(job.handle, job.options,
                                  [p.source_ids for t in ready for p in t.plan.pieces], call,
                                  forced_bos=_target_token(job.leg), fit=job.fit,
                                  aligned=_per_piece(ready))
            results = await _gather(futures, call)

            def answer() -> list[Translation]:
                it = iter(results)
                return [_translation(job, t, [next(it) for _ in t.plan.pieces]) for t in ready]

            for i, translation in zip(todo, await off_loop(answer), strict=True):
                found[i] = translation
                key = keys[i]
                if key is not None:
                    self.cache.put(key, translation, _size(translation))
        return TranslateResult(route.name, tuple(t for t in found if t is not None), job.names)

    async def summarize(self, request: SummarizeRequest, call: Call) -> SummarizeResult:
        job = self._admit("summarize", request.model, "", "", request.texts, request.options,
                          call)
        async with self.registry.residency.lease((job.handle,), call.deadline):
            return await self._summarize(job, request, call)

    async def _summarize(self, job: _Job, request: SummarizeRequest,
                         call: Call) -> SummarizeResult:
        sources, lengths = await off_loop(
            lambda: _summary_sources(job.handle, job.texts, request.truncate))
        wanted = [bool(text.strip()) for text in job.texts]  # a blank text answers itself
        futures = self._queue(job.handle, job.options,
                              [s for s, w in zip(sources, wanted, strict=True) if w], call)
        results = await _gather(futures, call)

        def answer() -> SummarizeResult:
            it = iter(results)
            decode = job.handle.tokenizer.decode
            summaries = []
            for want, source, length in zip(wanted, sources, lengths, strict=True):
                hyps = _enough(next(it).hypotheses, job.count) if want else [_EMPTY] * job.count
                summaries.append(Summary(tuple(whole(h, decode) for h in hyps[:job.count]),
                                         len(source) < length, length, len(source)))
            return SummarizeResult(job.handle.name, tuple(summaries))

        return await off_loop(answer)

    async def stream(self, request: TranslateRequest,
                     call: Call) -> AsyncGenerator[StreamChunk, None]:
        """One text's translation as it grows: text deltas as the engine chooses tokens
        (greedy, sampling), each finished piece at once (beam, whose best is known only
        at the end), then a final chunk carrying the whole translation. Its models are
        held until the last chunk: an unload waits for the stream to finish."""
        route = self._route(request, call)
        async with self.registry.residency.lease(route.models, call.deadline):
            async with contextlib.aclosing(self._stream(request, call, route)) as chunks:
                async for chunk in chunks:
                    yield chunk

    async def _stream(self, request: TranslateRequest, call: Call,
                      route: Route) -> AsyncGenerator[StreamChunk, None]:
        if not route.models:
            _one_text(self._texts(request.texts))
            [same] = self._unchanged(request, route).translations
            yield StreamChunk(same.hypotheses[0].text, same, ())
            return
        job = self._admit_translation(request, route)
        _one_text(job.texts)
        prepared = await off_loop(lambda: self._prepare(job, job.texts[0]))
        # A chain's first leg is not streamed: the second leg's output is the answer.
        [ready] = await self._through_pivot(job, [prepared], [0], call)
        masked, planned = ready.masked, ready.plan
        events = PieceEvents(asyncio.get_running_loop())
        # A masked text's deltas would show sentinels, and the repair may change text
        # already told: it comes whole, in the final chunk.
        quiet = masked.changed
        tokens = job.options.decoding != "beam" and not quiet
        futures = self._queue(job.handle, job.options, [p.source_ids for p in planned.pieces],
                              call,
                              [events.token_sink(i) if tokens else None
                               for i in range(len(planned.pieces))],
                              forced_bos=_target_token(job.leg), fit=job.fit,
                              aligned=[ready.formatted] * len(planned.pieces))
        events.watch(futures)
        streamed = StreamedText(planned, job.handle.tokenizer.decode)
        waiter = _gathered(futures)
        try:
            failed = False
            while not (streamed.finished or failed):
                for index, token in await events.arrived():  # all of them: one chunk
                    failed |= _take(streamed, futures[index], index, token)
                if not quiet and (delta := streamed.delta()):
                    yield StreamChunk(delta)
            nbests = await waiter  # a failed piece fails the request at once
        except (ItemDropped, Draining) as e:
            raise _dropped(e, call) from None
        finally:
            if not waiter.done():  # the client left, or a piece failed
                call.cancel()
                waiter.cancel()
        translation = _translation(job, ready, nbests)
        yield StreamChunk(streamed.rest(translation.hypotheses[0].text), translation, job.names)

    def list_models(self) -> list[ModelInfo]:
        """Every served model; Unavailable while the models load."""
        self.registry.require_ready()
        return [self._model_info(h) for h in self.registry.handles()]

    def list_routes(self) -> list[RouteInfo]:
        """Every translation pair served, direct or chained through English;
        Unavailable while the models load."""
        self.registry.require_ready()
        return [RouteInfo(r.source_language, r.target_language, r.names)
                for r in self.registry.routes()]

    def loaded_models(self) -> frozenset[str]:
        """The models loaded now (state ready): a request for them waits for no load
        (core/residency.py); Unavailable while the models load."""
        self.registry.require_ready()
        return frozenset(h.name for h in self.registry.handles()
                         if h.state is ModelState.READY)

    def held_out_models(self) -> frozenset[str]:
        """The models an operator unloaded: requests for them are refused until they
        are loaded again (core/residency.py); Unavailable while the models load."""
        self.registry.require_ready()
        return frozenset(h.name for h in self.registry.handles() if h.held_out)

    def route(self, source_language: str, target_language: str) -> RouteInfo:
        """The route a request of this pair without a model takes (registry.route: the
        one rule of every door): its codes as the chosen model lists them and its
        models (none: the same language); NotFound where nothing serves it;
        Unavailable while the models load."""
        route = self.registry.route("translate", "", source_language, target_language)
        return RouteInfo(route.source_language, route.target_language, route.names)

    def language_code(self, code: str) -> str:
        """A language code as the served models list it (`/languages`): a
        multilingual model's aliases (pt-BR, por_Latn) become its listed code;
        Unavailable while the models load."""
        self.registry.require_ready()
        return self.registry.listed_code(code)

    def language_names(self, codes: Sequence[str]) -> dict[str, str]:
        """Each listed code's English name (CLDR's, with its script or region), no
        name twice."""
        return distinct_names({code: self.registry.language_name(code) or code
                               for code in codes})

    def generation(self) -> int:
        """Changes whenever what is served changes: what a door derives from
        list_models and list_routes stays valid while it is the same. Unavailable
        while the models load."""
        self.registry.require_ready()
        return self.registry.generation

    # -- admission -----------------------------------------------------------------

    def _admit(self, task: str, model: str, source_language: str, target_language: str,
               texts: Sequence[str], options: DecodingOptions, call: Call) -> _Job:
        """Pick the model, check the texts, resolve the options: in that order, so
        that an error names the first problem a client should fix."""
        handle = self.registry.pick(task, model, source_language, target_language)
        call.serve_with(handle.name)
        checked = self._texts(texts)
        # The engine's resolve adds what this model allows (position cap, alignment).
        resolved: ResolvedOptions = handle.engine.resolve(options)
        return _Job(handle, checked, resolved, resolved.num_hypotheses)

    def _route(self, request: TranslateRequest, call: Call) -> Route:
        """The models that serve the request (registry.route), told to the call and
        counted by route."""
        route = self.registry.route("translate", request.model, request.source_language,
                                    request.target_language)
        if route.models:
            call.serve_with(route.name)
        if self.metrics is not None:
            self.metrics.count_route(route.kind, route.name)
        return route

    def _admit_translation(self, request: TranslateRequest, route: Route) -> _Job:
        """Check the texts, resolve each leg's options, resolve the terms (for the
        request's pair: a chain's terms go from its source to its target)."""
        handle = route.models[-1]
        checked = self._texts(request.texts)
        first = None
        options = request.options
        if route.chained:
            if options.return_alignment:
                raise InvalidArgument(
                    f"return_alignment is not available for {route.source_language}->"
                    f"{route.target_language}, which is served through {PIVOT} "
                    f"({route.name}): an alignment would point into the {PIVOT} text")
            options = dataclasses.replace(options, return_alignment=False)
        resolved: ResolvedOptions = handle.engine.resolve(options)
        if route.chained:
            # The first leg's best is what the second translates: one hypothesis, and a
            # score when the answer's scores need it (they add the two legs').
            head = route.models[0]
            first = _Leg(head, head.engine.resolve(dataclasses.replace(
                options, num_hypotheses=1, return_scores=resolved.return_scores)),
                route.legs[0])
        terms = request_terms(self.glossaries, request.glossary, request.terms,
                              request.do_not_translate, route.source_language,
                              route.target_language)
        return _Job(handle, checked, resolved, resolved.num_hypotheses,
                    protect=request.protect_placeholders, terms=terms, first=first,
                    leg=route.legs[-1], fit=request.options.max_length is None,
                    splitting=request.splitting)

    def _unchanged(self, request: TranslateRequest, route: Route) -> TranslateResult:
        """Source and target the same language: every text back as it is (as Argos
        Translate's IdentityTranslation, and so LibreTranslate, answer), with a score
        of 0.0 (log 1) where scores are asked for. The options are checked as a
        model of that language would check them."""
        checked = self._texts(request.texts)
        model = next(h for h in self.registry.handles() if h.manifest.task == "translate"
                     and h.listed_code(route.source_language) is not None)
        resolved = model.engine.resolve(request.options)
        score = 0.0 if resolved.return_scores else None
        return TranslateResult(route.name, tuple(
            Translation((Joined(text, score, None, None, FinishReason.EOS.value),)
                        * resolved.num_hypotheses) for text in checked), ())

    def _texts(self, texts: Sequence[str]) -> tuple[str, ...]:
        if not texts:
            raise InvalidArgument("texts must hold at least one text, got 0")
        if len(texts) > self.max_texts_per_request:
            raise InvalidArgument(f"texts must hold at most {self.max_texts_per_request} "
                                  f"texts per request, got {len(texts)}; the limit is "
                                  f"{setting_names('max_texts_per_request')}")
        for i, text in enumerate(texts):
            if len(text) > self.max_text_chars:
                raise InvalidArgument(f"texts[{i}] must be at most {self.max_text_chars} "
                                      f"characters, got {len(text)}; the limit is "
                                      f"{setting_names('max_text_chars')}")
            check_unicode(f"texts[{i}]", text)
        return tuple(texts)

    def _prepare(self, job: _Job, text: str, index: int = 0) -> tuple[Masked, Plan]:
        """The text (the request's `index`-th) as the model that reads it sees it
        (placeholders and terms masked), planned."""
        masked = mask(text, job.terms, placeholders=job.protect)
        # Paired tags are not sent: the model reads the plain text (core/formatting.py).
        return masked, _plan(job.reader, model_text(masked),
                             job.leg if job.first is None else job.first.leg, job.fit,
                             job.splitting, index)

    async def _through_pivot(self, job: _Job, prepared: Sequence[tuple[Masked, Plan]],
                             indices: Sequence[int], call: Call) -> list[_Text]:
        """Each prepared text (`indices`: their positions in the request) as the last
        model reads it: itself, or for a chain its first leg's best (queued like any
        request, awaited, joined), its sentinels carried over (placeholders.carry) and
        planned again in English."""
        if job.first is None:
            return [_Text(masked, planned) for masked, planned in prepared]
        first = job.first
        futures = self._queue(first.handle, first.options,
                              [p.source_ids for _, pl in prepared for p in pl.pieces], call,
                              forced_bos=_target_token(first.leg), fit=job.fit,
                              aligned=_per_piece([_Text(m, pl) for m, pl in prepared]))
        results = await _gather(futures, call)
        _check_call(call)  # the second leg never queues for a call that has ended

        def replan() -> list[_Text]:
            it = iter(results)
            out = []
            for index, (masked, planned) in zip(indices, prepared, strict=True):
                chosen = [_enough(next(it).hypotheses, 1)[0] for _ in planned.pieces]
                [head] = join(planned, [[h] for h in chosen], 1, first.handle.tokenizer.decode)
                middle, repaired = carry_over(masked, head.text)
                links = (tuple(text_links(first.handle, planned, first.leg, chosen))
                         if split(masked) is not None else ())
                try:
                    second = _plan(job.handle, middle, job.leg, job.fit, job.splitting,
                                   index)
                except TooLongForOnePiece as e:  # the intermediate, not the client's text
                    raise e.through(PIVOT) from None
                out.append(_Text(masked, second,
                                 head.score if planned.pieces else 0.0, repaired,
                                 links, head.text))
            return out

        return await off_loop(replan)

    def _queue(self, handle: ModelHandle, options: ResolvedOptions, sources: list[list[int]],
               call: Call, on_token: Sequence[Callable[[int], None] | None] = (),
               forced_bos: int | None = None, fit: bool = False,
               aligned: Sequence[bool] = ()) -> list[asyncio.Future[Result]]:
        """All of a request's work items for one model enter its queue together, or
        none does. forced_bos: every hypothesis's first token (a multilingual model's
        target language). fit: each piece's max_length rises with its input (_Job.fit).
        aligned: the sources whose alignment the core needs (a text with formatting)
        whether or not the request asked for it."""
        scheduler = handle.scheduler
        size = scheduler.limits.max_queue_size
        if len(sources) > size:  # would be refused as "queue full" on every retry
            raise InvalidArgument(f"texts split into {len(sources)} sentence-sized pieces; "
                                  f"a request may have at most {size} (the queue size): send "
                                  "fewer or shorter texts")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Result]] = [loop.create_future() for _ in sources]
        each = (_fitted(options, sources, handle.engine.limits.max_length) if fit
                else [options] * len(sources))
        items = [WorkItem(source=src,
                          options=(dataclasses.replace(each[i], return_alignment=True)
                                   if aligned and aligned[i] else each[i]),
                          deliver=deliver_to_future(loop, fut),
                          deadline=call.deadline, cancelled=call.cancelled,
                          on_token=on_token[i] if on_token else None, forced_bos=forced_bos)
                 for i, (src, fut) in enumerate(zip(sources, futures, strict=True))]
        try:
            scheduler.submit_many(items)
        except QueueFull as e:
            raise ResourceExhausted(str(e)) from None
        except Draining:
            raise Unavailable("the server is shutting down; retry on another replica") from None
        return futures

    # -- models --------------------------------------------------------------------

    def _model_info(self, handle: ModelHandle) -> ModelInfo:
        engine, manifest = handle.engine, handle.manifest
        # The manifest's defaults as they apply here (a max_length above the cap, capped).
        applied = engine.resolve(DecodingOptions())
        defaults: dict[str, OptionValue] = {
            name: getattr(applied, name) for name in manifest.generation.as_dict()
            if name in _OPTION_NAMES}
        limits = ModelLimits(
            max_length=engine.limits.max_length, max_positions=engine.max_positions,
            max_beam_size=engine.limits.max_beam_size,
            max_texts_per_request=self.max_texts_per_request,
            max_text_chars=self.max_text_chars)
        return ModelInfo(
            name=manifest.name, task=manifest.task, source_language=manifest.source_language,
            target_language=manifest.target_language, precision=manifest.precision,
            provider=handle.provider, max_source_length=manifest.max_source_length,
            defaults=defaults, limits=limits,
            languages=tuple(handle.language_codes()) if handle.languages else (),
            ignored_generation_keys=manifest.generation.ignored_keys or (),
            state=handle.state.value, error=handle.error, memory_bytes=handle.cost,
            device_memory_bytes=handle.device_cost, held_out=handle.held_out)

    # -- model control (the doors check the admin key) -----------------------------

    async def load_model(self, name: str, rescan: Callable[[], None] | None = None
                         ) -> ModelInfo:
        """Load a served model (again: after an unload or a failure) and wait until it
        is ready; a name not served yet first rescans the folder (`rescan`). A model
        that fails to load answers with its state failed and its error."""
        if rescan is not None and name not in {h.name for h in self.registry.handles()}:
            await off_loop(rescan)
        handle = self.registry.find(name)
        try:
            await asyncio.wrap_future(self.registry.residency.load(handle))
        except Unavailable:
            pass  # failed: its state and error say why
        return self._model_info(handle)

    async def unload_model(self, name: str) -> ModelInfo:
        """Unload a model once its requests have finished (its state says unloading
        until then); requests for it are refused until it is loaded again."""
        handle = self.registry.find(name)
        await asyncio.wrap_future(self.registry.residency.unload(handle))
        return self._model_info(handle)


# -- pieces and answers ------------------------------------------------------------


class SourceTooLong(InvalidArgument):
    """A text to summarize longer than the model reads, with `truncate` not set. The
    message names the core's field (texts[i]); a door whose fields are named otherwise
    words it with its own (`naming`)."""

    def __init__(self, index: int, tokens: int, limit: int) -> None:
        self.index, self.tokens, self.limit = index, tokens, limit
        super().__init__(self.naming(f"texts[{index}]", "truncate"))

    def naming(self, field: str, switch: str) -> str:
        return (f"{field} is {self.tokens} tokens; this model reads at most {self.limit} "
                f"(set {switch} to cut it)")


def _summary_sources(handle: ModelHandle, texts: Sequence[str],
                     truncate: bool) -> tuple[list[list[int]], list[int]]:
    """Token ids of each text, cut to the model's limit when `truncate` allows it (its
    last token, EOS, kept), and each text's whole length in tokens."""
    limit = handle.manifest.max_source_length
    sources, lengths = [], []
    for i, text in enumerate(texts):
        ids = handle.encode(text)
        if len(ids) > limit and not truncate:
            raise SourceTooLong(i, len(ids), limit)
        lengths.append(len(ids))
        sources.append(ids[: limit - 1] + [ids[-1]] if len(ids) > limit else ids)
    return sources, lengths


def _per_piece(texts: Sequence[_Text]) -> list[bool]:
    """For each piece of `texts`, whether its text has formatting (needs alignment)."""
    return [flag for t in texts for flag in [t.formatted] * len(t.plan.pieces)]


def _one_text(texts: Sequence[str]) -> None:
    if len(texts) != 1:
        raise InvalidArgument(f"texts must hold exactly 1 text for TranslateStream, "
                              f"got {len(texts)}")


def _plan(handle: ModelHandle, text: str, leg: Leg | None = None, fit: bool = False,
          splitting: Splitting = Splitting.ON, index: int = 0) -> Plan:
    """The text (the request's `index`-th) in sentence-sized pieces of the model's
    input, cut as `splitting` says, in the leg's source language (a multilingual
    model's with that language's token). fit: no piece longer than the model's output
    limit holds (pieces.piece_limit)."""
    manifest = handle.manifest
    limit = manifest.max_source_length
    if fit:
        limit = piece_limit(limit, handle.engine.limits.max_length)
    language, encode = manifest.source_language, handle.encode
    if leg is not None and handle.languages is not None:
        token, _ = leg.tokens()
        language, encode = leg.source_language, functools.partial(handle.encode,
                                                                  language=token)
    try:
        return plan(text, language, encode, limit, manifest.max_source_length, splitting)
    except TooLongForOnePiece as e:
        raise e.at(index) from None


def _fitted(options: ResolvedOptions, sources: Sequence[Sequence[int]],
            max_output: int) -> list[ResolvedOptions]:
    """Each source's options: `options` with max_length raised to what its input needs
    (pieces.output_limit), one value per distinct length."""
    by_length: dict[int, ResolvedOptions] = {}
    out = []
    for source in sources:
        length = output_limit(options.max_length, max_output, len(source))
        if length not in by_length:
            by_length[length] = (options if length == options.max_length
                                 else dataclasses.replace(options, max_length=length))
        out.append(by_length[length])
    return out


def _target_token(leg: Leg | None) -> int | None:
    """The forced first token of a leg's hypotheses: a multilingual model's target
    language; None otherwise (the package's own, if any)."""
    return None if leg is None else leg.tokens()[1]


def _check_call(call: Call) -> None:
    """Raise what a call that has ended answers: its deadline passed, or cancelled."""
    if call.deadline is not None and time.monotonic() > call.deadline:
        raise DeadlineExceeded("the deadline passed before the result was ready")
    if call.cancelled():
        raise Cancelled("the request was cancelled")


def _cache_key(job: _Job, text: str) -> tuple[object, ...] | None:
    """What a text's answer depends on: the packages of its route (each digest
    covers every file; a chain's two, in order), the task, the text as asked, each
    leg's resolved options, what is protected (placeholders on or off, the terms
    a glossary and the request resolved to) and whether its pieces were fitted to the
    output limit (a max_length asked for resolves as the model's own may); None when
    it depends on chance (sampling without a seed)."""
    if job.options.decoding == "sampling" and job.options.seed is None:
        return None
    legs = [job.handle] if job.first is None else [job.first.handle, job.handle]
    options = [job.options] if job.first is None else [job.first.options, job.options]
    pairs = [job.leg] if job.first is None else [job.first.leg, job.leg]
    return (tuple(h.digest for h in legs), "translate", text, tuple(repr(o) for o in options),
            tuple((p.source_language, p.target_language) for p in pairs if p is not None),
            job.protect, job.terms, job.fit, job.splitting)


def _size(translation: Translation) -> int:
    """About what a cached translation holds, in bytes."""
    return sum(len(h.text.encode()) + 8 * (len(h.token_ids or ()) + len(h.alignment or ()))
               + 64 for h in translation.hypotheses) + 2 * 64


def _translation(job: _Job, text: _Text, results: Sequence[Result]) -> Translation:
    """`job.count` hypotheses of a planned text, joined from its pieces' results,
    each with its placeholders and terms restored (token ids and alignment stay
    those of the masked text the model saw). A chain's hypotheses are the second
    leg's n-best over the first leg's best; each score adds the first leg's best's
    (the log-probability of the whole route), and a repair in either leg counts."""
    planned, masked = text.plan, text.masked
    nbests = [_enough(r.hypotheses, job.count) for r in results]
    joined: list[Joined] = join(planned, nbests, job.count, job.handle.tokenizer.decode)
    formatting = split(masked)
    if formatting is not None and not formatting.plain.text.strip():
        # Tags around nothing but spaces: no words to translate, the text as it was.
        joined = [dataclasses.replace(j, text=restore(masked, masked.text).text)
                  for j in joined]
    elif formatting is not None:
        restored = []
        for i, j in enumerate(joined):
            links = text_links(job.handle, planned, job.leg,
                               [n[min(i, len(n) - 1)] for n in nbests])
            if job.first is not None:
                links = compose(links, planned.segmented.original, text.head_text,
                                text.head_links)
            restored.append(formatting.restore(j.text, links))
        joined = [dataclasses.replace(j, text=r.text, repaired=r.repaired)
                  for j, r in zip(joined, restored, strict=True)]
        if not job.options.return_alignment:  # asked for by the core, not the client
            joined = [dataclasses.replace(j, alignment=None) for j in joined]
    elif masked.changed and planned.pieces:
        restored = [restore(masked, j.text) for j in joined]
        joined = [dataclasses.replace(j, text=r.text, repaired=r.repaired)
                  for j, r in zip(joined, restored, strict=True)]
    if job.first is not None:
        head = text.head_score
        joined = [dataclasses.replace(
            j, score=None if j.score is None or head is None else j.score + head,
            repaired=j.repaired or text.head_repaired) for j in joined]
    return Translation(tuple(joined))


def _enough(nbest: Sequence[Hypothesis], count: int) -> Sequence[Hypothesis]:
    """An answer holds every hypothesis asked for; fewer is a bug here, not the
    client's fault (length_penalty's range exists so that beam search finds them all)."""
    if len(nbest) < count:
        raise RuntimeError(f"the engine returned {len(nbest)} hypotheses where {count} were "
                           "asked for")
    return nbest


# The answer to a blank text, which is never sent to the engine.
_EMPTY = Hypothesis(token_ids=[], score=0.0, finish_reason=FinishReason.EOS)


# -- waiting -----------------------------------------------------------------------


async def off_loop(work: Callable[[], T]) -> T:
    """Run CPU work (segmenting, tokenizing, detokenizing) on the default executor."""
    return await asyncio.get_running_loop().run_in_executor(None, work)


async def _gather(futures: list[asyncio.Future[Result]], call: Call) -> list[Result]:
    try:
        return await asyncio.gather(*futures)
    except asyncio.CancelledError:
        call.cancel()  # the engine drops the request's items at its next step
        raise
    except (ItemDropped, Draining) as e:
        raise _dropped(e, call) from None


def _gathered(futures: list[asyncio.Future[Result]]) -> asyncio.Future[list[Result]]:
    """All of `futures` as one; its exception (cancelled or failed) counts as seen,
    or asyncio logs "exception was never retrieved" for every cancelled stream."""
    waiter = asyncio.ensure_future(asyncio.gather(*futures))
    waiter.add_done_callback(_retrieve)
    return waiter


def _retrieve(future: asyncio.Future[list[Result]]) -> None:
    if not future.cancelled():
        future.exception()


def _dropped(error: ItemDropped | Draining, call: Call) -> Exception:
    """The error for work the scheduler gave up on: past its deadline, cancelled,
    or still queued when the server had to stop."""
    call.cancel()  # the request's other pieces leave their batches too
    if isinstance(error, Draining):
        return Unavailable("the server stopped before this request ran; retry on another "
                           "replica")
    if error.reason == "deadline":
        return DeadlineExceeded("the deadline passed before the result was ready")
    return Cancelled("the request was cancelled")


def _take(streamed: StreamedText, piece: asyncio.Future[Result], index: int,
          token: int | None) -> bool:
    """Add one event to the streamed text; True when the piece failed (awaiting
    the pieces then raises why)."""
    if token is not None:
        streamed.token(index, token)
    elif piece.cancelled() or piece.exception() is not None:
        return True
    else:
        streamed.finish(index, piece.result().hypotheses[0].token_ids)
    return False
