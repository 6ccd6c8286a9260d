"""The gRPC front door: each handler counts the call and hands its message to the
.proto's operations (proto_api.py: convert, call the application core, convert
back, within the message-size limit). Errors are raised as core ServiceErrors (or
InvalidOptions) and mapped to status codes by the interceptor in grpc_errors.py.
What is gRPC's own stays here: the call's deadline and cancellation (`_call`), the
model or pair named in the request's metadata and the served model's name in the
answer's trailing metadata (routing.py: what a gateway routes on).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.api import grpc_metrics, routing
from seq2serve.server.api.grpc_metrics import RequestTracker
from seq2serve.server.api.proto_api import ProtoApi
from seq2serve.server.api.routing import Named
from seq2serve.server.core.errors import InvalidArgument
from seq2serve.server.core.requests import Call
from seq2serve.server.metrics import Metrics


class TranslatorService(pb_grpc.TranslatorServicer):
    def __init__(self, api: ProtoApi, metrics: Metrics):
        self.api = api
        self.metrics = metrics

    async def Translate(self, request: pb.TranslateRequest,
                        context: grpc.aio.ServicerContext) -> pb.TranslateResponse:
        with grpc_metrics.track(self.metrics, "Translate") as track:
            response = await self.api.translate(request, _call(context, track), _named(context))
            track.ok()
            return response

    async def Summarize(self, request: pb.SummarizeRequest,
                        context: grpc.aio.ServicerContext) -> pb.SummarizeResponse:
        with grpc_metrics.track(self.metrics, "Summarize") as track:
            response = await self.api.summarize(request, _call(context, track), _named(context))
            track.ok()
            return response

    async def TranslateStream(self, request: pb.TranslateRequest,
                              context: grpc.aio.ServicerContext
                              ) -> AsyncIterator[pb.TranslateChunk]:
        with grpc_metrics.track(self.metrics, "TranslateStream") as track:
            chunks = self.api.stream(request, _call(context, track), _named(context))
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    yield chunk
            track.ok()

    async def ListModels(self, request: pb.ListModelsRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListModelsResponse:
        with grpc_metrics.track(self.metrics, "ListModels") as track:
            response = self.api.list_models()
            track.ok()
            return response


def _call(context: grpc.aio.ServicerContext, track: RequestTracker) -> Call:
    """The core's view of this RPC: its deadline, cancelled when the client cancels;
    the metrics and the answer's trailing metadata learn the model that serves it."""

    def serve_with(model: str) -> None:
        track.bind(model)
        context.set_trailing_metadata(((routing.MODEL_KEY, routing.served_value([model])),))

    call = Call(context.time_remaining(), on_model=serve_with)
    track.deadline = call.deadline

    def on_done(_: Any) -> None:
        # Called when the RPC ends for any reason; only a client cancel matters here.
        if context.cancelled():
            call.cancel()

    context.add_done_callback(on_done)
    return call


def _named(context: grpc.aio.ServicerContext) -> Named:
    """The model or pair the call's metadata names."""
    metadata = context.invocation_metadata() or ()

    def get(key: str) -> str | None:
        values = list(dict.fromkeys(str(value) for name, value in metadata if name == key))
        if len(values) > 1:
            raise InvalidArgument(f"the {key} metadata key is sent {len(values)} times "
                                  f"with different values: send one")
        return values[0] if values else None

    return Named.read(get, routing.MODEL_KEY, routing.PAIR_KEY)
