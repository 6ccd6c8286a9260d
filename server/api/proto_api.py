"""The .proto's operations on its own messages, for every front door that speaks
them: gRPC (grpc_service.py) and the .proto's JSON over HTTP (http/proto_json.py).
Each converts the request (convert.py), calls the application core and converts
its answer; the message-size limit is applied to every answer."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Callable
from typing import Protocol, TypeVar

from seq2serve.protos import translator_pb2 as pb
from seq2serve.server.api import convert, routing
from seq2serve.server.api.admin import AdminKeys
from seq2serve.server.api.routing import NOTHING, Named
from seq2serve.server.core.errors import InvalidArgument, ResourceExhausted
from seq2serve.server.core.pieces import TooLongForOnePiece
from seq2serve.server.core.requests import Call
from seq2serve.server.core.texts import AUTO, TextService
from seq2serve.server.core.translator import Translator, off_loop


class _Message(Protocol):
    def ByteSize(self) -> int: ...  # protobuf's name


M = TypeVar("M", bound=_Message)


class ProtoApi:
    def __init__(self, translator: Translator, max_message_bytes: int,
                 texts: TextService | None = None, admin: AdminKeys | None = None,
                 rescan: Callable[[], None] | None = None) -> None:
        self.translator = translator
        self.max_message_bytes = max_message_bytes
        self.texts = texts or TextService(translator)
        self.admin = admin or AdminKeys(None)
        self.rescan = rescan  # finds packages added to the models folder

    async def load_model(self, request: pb.ModelControlRequest,
                         admin_key: str | None) -> pb.ModelControlResponse:
        self.admin.check(admin_key)
        info = await self.translator.load_model(request.name, self.rescan)
        return pb.ModelControlResponse(model=convert.model_info_to_pb(info))

    async def unload_model(self, request: pb.ModelControlRequest,
                           admin_key: str | None) -> pb.ModelControlResponse:
        self.admin.check(admin_key)
        info = await self.translator.unload_model(request.name)
        return pb.ModelControlResponse(model=convert.model_info_to_pb(info))

    async def translate(self, request: pb.TranslateRequest, call: Call,
                        named: Named = NOTHING) -> pb.TranslateResponse:
        """`named`: the model or pair the request's headers name (routing.py)."""
        core = routing.translate_request(convert.translate_request_from_pb(request), named)
        meaning = convert.texts_request_from_pb(request)
        if meaning is not None:  # source "auto", HTML or XML: the core's request of texts
            meaning = dataclasses.replace(meaning, model=core.model,
                                          source_language=core.source_language,
                                          target_language=core.target_language)
            try:
                answers = await self.texts.translate(meaning, call)
            except TooLongForOnePiece as e:
                raise convert.too_long_error(e) from None
            return await off_loop(lambda: self.within_limit(convert.texts_response_to_pb(
                answers, request.options, meaning.source_language == AUTO)))
        try:
            result = await self.translator.translate(core, call)
        except TooLongForOnePiece as e:
            raise convert.too_long_error(e) from None
        return await off_loop(lambda: self.within_limit(
            convert.translate_response_to_pb(result, request.options)))

    async def summarize(self, request: pb.SummarizeRequest, call: Call,
                        named: Named = NOTHING) -> pb.SummarizeResponse:
        core = routing.summarize_request(convert.summarize_request_from_pb(request), named)
        result = await self.translator.summarize(core, call)
        return await off_loop(lambda: self.within_limit(
            convert.summarize_response_to_pb(result, request.options)))

    async def stream(self, request: pb.TranslateRequest, call: Call,
                     named: Named = NOTHING) -> AsyncGenerator[pb.TranslateChunk, None]:
        if convert.texts_request_from_pb(request) is not None:
            raise InvalidArgument("TranslateStream takes plain text of a given source "
                                  "language; use Translate for source_language \"auto\", "
                                  "HTML and XML")
        core = routing.translate_request(convert.translate_request_from_pb(request), named)
        chunks = self.translator.stream(core, call)
        # Closed as soon as the caller stops (a chunk too big, the client gone), so
        # that the request's pieces leave their batches at once.
        async with contextlib.aclosing(chunks):
            try:
                async for chunk in chunks:
                    yield self.within_limit(convert.chunk_to_pb(chunk, request.options))
            except TooLongForOnePiece as e:
                raise convert.too_long_error(e) from None

    def list_models(self) -> pb.ListModelsResponse:
        return convert.list_models_to_pb(self.translator.list_models(),
                                         self.translator.list_routes())

    def within_limit(self, message: M) -> M:
        """Refuse an answer gRPC would refuse to send, with a message saying why."""
        size = message.ByteSize()
        limit = self.max_message_bytes
        if size > limit:
            raise ResourceExhausted(
                f"the answer would be {size} bytes, above this server's limit of {limit} "
                "(--max-message-bytes): send fewer or shorter texts, or ask for fewer "
                "hypotheses, token ids or alignments")
        return message
