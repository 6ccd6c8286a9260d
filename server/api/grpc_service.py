"""The gRPC front door: each handler counts the call and hands its message to the
.proto's operations (proto_api.py: convert, call the application core, convert
back, within the message-size limit). Errors are raised as core ServiceErrors (or
InvalidOptions) and mapped to status codes by the interceptor in grpc_errors.py.
What is gRPC's own stays here: the call's deadline and cancellation (`_call`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.api import grpc_metrics
from seq2serve.server.api.admin import ADMIN_KEY_HEADER
from seq2serve.server.api.grpc_metrics import RequestTracker
from seq2serve.server.api.proto_api import ProtoApi
from seq2serve.server.core.requests import Call
from seq2serve.server.metrics import Metrics


class TranslatorService(pb_grpc.TranslatorServicer):
    def __init__(self, api: ProtoApi, metrics: Metrics):
        self.api = api
        self.metrics = metrics

    async def Translate(self, request: pb.TranslateRequest,
                        context: grpc.aio.ServicerContext) -> pb.TranslateResponse:
        with grpc_metrics.track(self.metrics, "Translate") as track:
            response = await self.api.translate(request, _call(context, track))
            track.ok()
            return response

    async def Summarize(self, request: pb.SummarizeRequest,
                        context: grpc.aio.ServicerContext) -> pb.SummarizeResponse:
        with grpc_metrics.track(self.metrics, "Summarize") as track:
            response = await self.api.summarize(request, _call(context, track))
            track.ok()
            return response

    async def TranslateStream(self, request: pb.TranslateRequest,
                              context: grpc.aio.ServicerContext
                              ) -> AsyncIterator[pb.TranslateChunk]:
        with grpc_metrics.track(self.metrics, "TranslateStream") as track:
            chunks = self.api.stream(request, _call(context, track))
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

    async def LoadModel(self, request: pb.ModelControlRequest,
                        context: grpc.aio.ServicerContext) -> pb.ModelControlResponse:
        with grpc_metrics.track(self.metrics, "LoadModel") as track:
            response = await self.api.load_model(request, _admin_key(context))
            track.ok()
            return response

    async def UnloadModel(self, request: pb.ModelControlRequest,
                          context: grpc.aio.ServicerContext) -> pb.ModelControlResponse:
        with grpc_metrics.track(self.metrics, "UnloadModel") as track:
            response = await self.api.unload_model(request, _admin_key(context))
            track.ok()
            return response


def _admin_key(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == ADMIN_KEY_HEADER:
            return str(value)
    return None


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
