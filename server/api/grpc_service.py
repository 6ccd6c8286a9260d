"""The gRPC front door: each handler counts the call, converts the request, calls the
application core (core/translator.py) and converts its answer.

Messages are built by convert.py, which also decides which extras (scores, token
ids, alignment) go on the wire from the request's options. Errors are raised as
core ServiceErrors (or InvalidOptions) and mapped to status codes by the
interceptor in grpc_errors.py. What is gRPC's own stays here: the call's deadline
and cancellation (`_call`) and the message-size limit (`_within_limit`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

import grpc

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.api import convert
from seq2serve.server.config import ServerConfig
from seq2serve.server.core.errors import ResourceExhausted
from seq2serve.server.core.requests import Call
from seq2serve.server.core.translator import Translator
from seq2serve.server.metrics import Metrics, RequestTracker


class _Message(Protocol):
    def ByteSize(self) -> int: ...  # protobuf's name


M = TypeVar("M", bound=_Message)


class TranslatorService(pb_grpc.TranslatorServicer):
    def __init__(self, translator: Translator, config: ServerConfig, metrics: Metrics):
        self.translator = translator
        self.max_message_bytes = config.max_message_bytes
        self.metrics = metrics

    async def Translate(self, request: pb.TranslateRequest,
                        context: grpc.aio.ServicerContext) -> pb.TranslateResponse:
        with self.metrics.track("Translate") as track:
            result = await self.translator.translate(convert.translate_request_from_pb(request),
                                                     _call(context, track))
            response = await _off_loop(lambda: self._within_limit(
                convert.translate_response_to_pb(result, request.options)))
            track.ok()
            return response

    async def Summarize(self, request: pb.SummarizeRequest,
                        context: grpc.aio.ServicerContext) -> pb.SummarizeResponse:
        with self.metrics.track("Summarize") as track:
            result = await self.translator.summarize(convert.summarize_request_from_pb(request),
                                                     _call(context, track))
            response = await _off_loop(lambda: self._within_limit(
                convert.summarize_response_to_pb(result, request.options)))
            track.ok()
            return response

    async def TranslateStream(self, request: pb.TranslateRequest,
                              context: grpc.aio.ServicerContext
                              ) -> AsyncIterator[pb.TranslateChunk]:
        with self.metrics.track("TranslateStream") as track:
            chunks = self.translator.stream(convert.translate_request_from_pb(request),
                                            _call(context, track))
            # Closed as soon as this handler stops (a chunk too big, the client gone),
            # so that the request's pieces leave their batches at once.
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    yield self._within_limit(convert.chunk_to_pb(chunk, request.options))
            track.ok()

    async def ListModels(self, request: pb.ListModelsRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListModelsResponse:
        with self.metrics.track("ListModels") as track:
            response = convert.list_models_to_pb(self.translator.list_models())
            track.ok()
            return response

    def _within_limit(self, message: M) -> M:
        """Refuse an answer gRPC would refuse to send, with a message saying why."""
        size = message.ByteSize()
        limit = self.max_message_bytes
        if size > limit:
            raise ResourceExhausted(
                f"the answer would be {size} bytes, above this server's limit of {limit} "
                "(--max-message-bytes): send fewer or shorter texts, or ask for fewer "
                "hypotheses, token ids or alignments")
        return message


def _call(context: grpc.aio.ServicerContext, track: RequestTracker) -> Call:
    """The core's view of this RPC: its deadline, cancelled when the client cancels;
    the metrics learn the model that serves it."""
    call = Call(context.time_remaining(), on_model=track.bind)
    track.deadline = call.deadline

    def on_done(_: Any) -> None:
        # Called when the RPC ends for any reason; only a client cancel matters here.
        if context.cancelled():
            call.cancel()

    context.add_done_callback(on_done)
    return call


T = TypeVar("T")


async def _off_loop(work: Callable[[], T]) -> T:
    """Build (and measure) a big answer on the default executor, off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, work)
