"""The gRPC handlers: validate, tokenize, queue, await, answer. Nothing else.

One work item per sentence-sized piece goes to the model's scheduler; the
handler awaits every piece and reassembles the answer in input order (the
pure parts of that in pieces.py, every message built by convert.py). Errors
are raised as ServiceError/InvalidOptions and mapped to status codes by the
interceptor in errors.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.api import convert
from seq2serve.server.api.grpc_errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from seq2serve.server.batching.scheduler import Draining, ItemDropped, QueueFull, WorkItem
from seq2serve.server.config import ServerConfig
from seq2serve.server.core.delivery import deliver_to_future, mailbox
from seq2serve.server.core.pieces import Joined, Plan, join, plan, stream_text, whole
from seq2serve.server.core.registry import ModelHandle, ModelRegistry
from seq2serve.server.engine.engine import Hypothesis, Result
from seq2serve.server.engine.options import DecodingOptions
from seq2serve.server.metrics import Metrics

T = TypeVar("T")


class RequestContext:
    """Deadline and cancellation of one RPC, shared by all of its work items."""

    def __init__(self, context: grpc.aio.ServicerContext):
        remaining = context.time_remaining()
        self.deadline = None if remaining is None else time.monotonic() + remaining
        self._cancelled = False
        context.add_done_callback(self._on_done)
        self._context = context

    def _on_done(self, _: Any) -> None:
        # Called when the RPC ends for any reason; only a client cancel matters here.
        if self._context.cancelled():
            self._cancelled = True

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled or (self.deadline is not None and time.monotonic() > self.deadline)


def _dropped(error: ItemDropped | Draining, rpc: RequestContext) -> Exception:
    """The status for work the scheduler gave up on: past its deadline, cancelled,
    or still queued when the server had to stop."""
    rpc.cancel()  # the request's other pieces leave their batches too
    if isinstance(error, Draining):
        return Unavailable("the server stopped before this request ran; retry on another "
                           "replica")
    if error.reason == "deadline":
        return DeadlineExceeded("the deadline passed before the result was ready")
    return Cancelled("the request was cancelled")


class TranslatorService(pb_grpc.TranslatorServicer):
    def __init__(self, registry: ModelRegistry, config: ServerConfig, metrics: Metrics):
        self.registry = registry
        self.config = config
        self.metrics = metrics

    # -- validation -----------------------------------------------------------

    def _texts(self, texts: list[str]) -> list[str]:
        if not texts:
            raise InvalidArgument("texts must hold at least one text, got 0")
        if len(texts) > self.config.max_texts_per_request:
            raise InvalidArgument(f"texts must hold at most {self.config.max_texts_per_request} "
                                  f"texts per request, got {len(texts)}")
        for i, text in enumerate(texts):
            if len(text) > self.config.max_text_chars:
                raise InvalidArgument(f"texts[{i}] must be at most {self.config.max_text_chars} "
                                      f"characters, got {len(text)}")
        return list(texts)

    def _options(self, request_options: pb.DecodingOptions,
                 handle: ModelHandle) -> DecodingOptions:
        # The engine's resolve adds what this model allows (position cap, alignment).
        return handle.engine.resolve(convert.options_from_pb(request_options))

    # -- queueing -------------------------------------------------------------

    def _queue(self, handle: ModelHandle, sources: list[list[int]], options: DecodingOptions,
               rpc: RequestContext,
               on_token: list[Callable[[int], None] | None] | None = None
               ) -> list[asyncio.Future]:
        """All of a request's work items enter the queue together, or none does."""
        size = handle.scheduler.limits.max_queue_size
        if len(sources) > size:  # would be refused as "queue full" on every retry
            raise InvalidArgument(f"texts split into {len(sources)} sentence-sized pieces; "
                                  f"a request may have at most {size} (the queue size): send "
                                  "fewer or shorter texts")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in sources]
        items = [WorkItem(source=src, options=options, deliver=deliver_to_future(loop, fut),
                          deadline=rpc.deadline, cancelled=rpc.cancelled,
                          on_token=on_token[i] if on_token else None)
                 for i, (src, fut) in enumerate(zip(sources, futures, strict=True))]
        try:
            handle.scheduler.submit_many(items)
        except QueueFull as e:
            raise ResourceExhausted(str(e)) from None
        except Draining:
            raise Unavailable("the server is shutting down; retry on another replica") from None
        return futures

    async def _gather(self, futures: list[asyncio.Future],
                      rpc: RequestContext) -> list[Result]:
        try:
            return await asyncio.gather(*futures)
        except asyncio.CancelledError:
            rpc.cancel()  # the engine drops our items at its next step
            raise
        except (ItemDropped, Draining) as e:
            raise _dropped(e, rpc) from None

    # -- handlers -------------------------------------------------------------

    async def Translate(self, request: pb.TranslateRequest,
                        context: grpc.aio.ServicerContext) -> pb.TranslateResponse:
        with self.metrics.track("Translate") as track:
            handle = self.registry.pick("translate", request.model, request.source_language,
                                        request.target_language)
            track.bind(handle.name)
            texts = self._texts(request.texts)
            options = self._options(request.options, handle)
            rpc = RequestContext(context)
            track.deadline = rpc.deadline
            # Segmenting and tokenizing 64 long texts takes a while: off the event loop,
            # which must keep answering health checks and other calls meanwhile.
            plans = await _off_loop(lambda: [self._plan_translation(handle, t) for t in texts])
            futures = self._queue(handle, [p.source_ids for pl in plans for p in pl.pieces],
                                  options, rpc)
            results = await self._gather(futures, rpc)

            def answer() -> pb.TranslateResponse:
                it = iter(results)
                translations = [
                    _translation(handle, pl, [next(it) for _ in pl.pieces], request.options,
                                 options.num_hypotheses)
                    for pl in plans]
                return convert.translate_response_to_pb(handle.name, translations)

            response = self._within_limit(await _off_loop(answer))
            track.ok()
            return response

    async def Summarize(self, request: pb.SummarizeRequest,
                        context: grpc.aio.ServicerContext) -> pb.SummarizeResponse:
        with self.metrics.track("Summarize") as track:
            handle = self.registry.pick("summarize", request.model, "", "")
            track.bind(handle.name)
            texts = self._texts(request.texts)
            options = self._options(request.options, handle)
            rpc = RequestContext(context)
            track.deadline = rpc.deadline
            sources, truncated = await _off_loop(
                lambda: self._summary_sources(handle, texts, request.truncate))
            wanted = [bool(text.strip()) for text in texts]
            futures = self._queue(handle, [s for s, w in zip(sources, wanted, strict=True) if w],
                                  options, rpc)
            results = await self._gather(futures, rpc)

            def answer() -> pb.SummarizeResponse:
                it = iter(results)
                count = options.num_hypotheses
                summaries = []
                for want, cut in zip(wanted, truncated, strict=True):
                    hyps = _enough(next(it), count) if want else [_EMPTY] * count
                    summaries.append(convert.summary_to_pb(
                        [whole(h, handle.tokenizer.decode) for h in hyps[:count]], cut,
                        request.options))
                return convert.summarize_response_to_pb(handle.name, summaries)

            response = self._within_limit(await _off_loop(answer))
            track.ok()
            return response

    def _summary_sources(self, handle: ModelHandle, texts: list[str],
                         truncate: bool) -> tuple[list[list[int]], list[bool]]:
        """Token ids of each text, cut to the model's limit when `truncate` allows it."""
        limit = handle.manifest.max_source_length
        sources, truncated = [], []
        for i, text in enumerate(texts):
            ids = handle.tokenizer.encode(text)
            if len(ids) > limit and not truncate:
                raise InvalidArgument(
                    f"texts[{i}] is {len(ids)} tokens; this model reads at most {limit} "
                    "(set truncate to cut it)")
            truncated.append(len(ids) > limit)
            sources.append(ids[: limit - 1] + [ids[-1]] if len(ids) > limit else ids)
        return sources, truncated

    async def TranslateStream(self, request: pb.TranslateRequest,
                              context: grpc.aio.ServicerContext
                              ) -> AsyncIterator[pb.TranslateChunk]:
        with self.metrics.track("TranslateStream") as track:
            handle = self.registry.pick("translate", request.model, request.source_language,
                                        request.target_language)
            track.bind(handle.name)
            texts = self._texts(request.texts)
            if len(texts) != 1:
                raise InvalidArgument(f"texts must hold exactly 1 text for TranslateStream, "
                                      f"got {len(texts)}")
            options = self._options(request.options, handle)
            rpc = RequestContext(context)
            track.deadline = rpc.deadline
            planned = await _off_loop(lambda: self._plan_translation(handle, texts[0]))
            pieces = planned.pieces
            stream_tokens = options.decoding != "beam"
            # (piece, token) as the engine chooses them; (piece, None) once a piece is done
            events: asyncio.Queue[tuple[int, int | None]] = asyncio.Queue()
            box = mailbox(asyncio.get_running_loop())

            def token_sink(index: int) -> Callable[[int], None]:
                def on_token(token: int) -> None:  # runs on the engine's thread
                    box.post(events.put_nowait, (index, token))
                return on_token

            callbacks = [token_sink(i) if stream_tokens else None for i in range(len(pieces))]
            futures = self._queue(handle, [p.source_ids for p in pieces], options, rpc,
                                  callbacks)
            for i, future in enumerate(futures):  # after its tokens: the same mailbox
                future.add_done_callback(functools.partial(_piece_done, events, i))
            # Pieces are emitted in order: a later piece's tokens wait for the earlier ones.
            emitted = ""
            done_texts: dict[int, str] = {}  # a finished piece's best, decoded once
            partial: dict[int, list[int]] = {i: [] for i in range(len(pieces))}
            waiter = asyncio.ensure_future(asyncio.gather(*futures))
            # Cancelled or failed, the gather's exception must count as seen, or asyncio
            # logs "exception was never retrieved" for every cancelled stream.
            waiter.add_done_callback(_retrieve)
            try:
                failed = False
                while len(done_texts) < len(pieces) and not failed:
                    # Everything that arrived since the last chunk goes out as one.
                    arrived = [await events.get()]
                    while not events.empty():
                        arrived.append(events.get_nowait())
                    for index, token in arrived:
                        piece = futures[index]
                        if token is not None:
                            partial[index].append(token)
                        elif piece.cancelled() or piece.exception() is not None:
                            failed = True  # awaiting the gather raises it
                        else:
                            done_texts[index] = handle.tokenizer.decode(
                                list(piece.result()[0].token_ids))
                    text = stream_text(planned, done_texts, partial, handle.tokenizer.decode)
                    if len(text) > len(emitted) and text.startswith(emitted):
                        yield self._within_limit(convert.chunk_to_pb(text[len(emitted):]))
                        emitted = text
                nbests = await waiter  # a failed piece fails the request at once
            except (ItemDropped, Draining) as e:
                raise _dropped(e, rpc) from None
            finally:
                if not waiter.done():  # the client left, or a piece failed
                    rpc.cancel()
                    waiter.cancel()
            translation = _translation(handle, planned, nbests, request.options,
                                       options.num_hypotheses)
            final_text = translation.hypotheses[0].text
            yield self._within_limit(convert.chunk_to_pb(
                final_text[len(emitted):] if final_text.startswith(emitted) else "",
                translation))
            track.ok()

    async def ListModels(self, request: pb.ListModelsRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListModelsResponse:
        with self.metrics.track("ListModels") as track:
            response = convert.list_models_to_pb([
                self._model_info(h) for h in self.registry.handles()])
            track.ok()
            return response

    def _model_info(self, handle: ModelHandle) -> pb.ModelInfo:
        engine = handle.engine
        # The manifest's defaults as they apply here (a max_length above the cap, capped).
        applied = dataclasses.asdict(engine.resolve(DecodingOptions()))
        defaults = {name: applied[name] for name in handle.manifest.generation
                    if name in applied}
        limits = convert.ModelLimits(
            max_length=engine.limits.max_length, max_positions=engine.runner.max_positions,
            max_beam_size=engine.limits.max_beam_size,
            max_texts_per_request=self.config.max_texts_per_request,
            max_text_chars=self.config.max_text_chars)
        return convert.model_info_to_pb(handle.manifest, handle.provider, defaults, limits)

    # -- pieces and answers ------------------------------------------------------

    def _plan_translation(self, handle: ModelHandle, text: str) -> Plan:
        return plan(text, handle.manifest.source_language, handle.tokenizer.encode,
                    handle.manifest.max_source_length)

    def _within_limit(self, message: Any) -> Any:
        """Refuse an answer gRPC would refuse to send, with a message saying why."""
        size = message.ByteSize()
        limit = self.config.max_message_bytes
        if size > limit:
            raise ResourceExhausted(
                f"the answer would be {size} bytes, above this server's limit of {limit} "
                "(--max-message-bytes): send fewer or shorter texts, or ask for fewer "
                "hypotheses, token ids or alignments")
        return message


def _translation(handle: ModelHandle, planned: Plan, nbests: Sequence[Sequence[Hypothesis]],
                 options: pb.DecodingOptions, count: int) -> pb.Translation:
    """`count` hypotheses of a planned text, extras as the request's `options` ask."""
    joined: list[Joined] = join(planned, [_enough(n, count) for n in nbests], count,
                                handle.tokenizer.decode)
    return convert.translation_to_pb(joined, options)


async def _off_loop(work: Callable[[], T]) -> T:
    """Run CPU work (segmenting, tokenizing, detokenizing) on the default executor."""
    return await asyncio.get_running_loop().run_in_executor(None, work)


def _piece_done(events: asyncio.Queue, index: int, _: asyncio.Future) -> None:
    events.put_nowait((index, None))


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _enough(nbest: Sequence[Hypothesis], count: int) -> Sequence[Hypothesis]:
    """An OK answer holds every hypothesis asked for; fewer is a bug here, not the
    client's fault (length_penalty's range exists so that beam search finds them all)."""
    if len(nbest) < count:
        raise RuntimeError(f"the engine returned {len(nbest)} hypotheses where {count} were "
                           "asked for")
    return nbest


# The answer to a blank text, which is never sent to the engine.
_EMPTY = Hypothesis(token_ids=[], score=0.0, finish_reason="eos")
