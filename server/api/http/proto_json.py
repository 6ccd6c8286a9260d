"""The .proto's own JSON over HTTP: every Translator method with protobuf's
canonical JSON mapping of the same messages (one schema, the .proto), the stream
as Server-Sent Events. Requests accept both lowerCamelCase and the .proto's field
names; answers use lowerCamelCase, as protobuf's JSON mapping does.

    POST /v1/translate         TranslateRequest  -> TranslateResponse
    POST /v1/translate:stream  TranslateRequest  -> text/event-stream of TranslateChunk
    POST /v1/summarize         SummarizeRequest  -> SummarizeResponse
    GET  /v1/models                              -> ListModelsResponse
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from seq2serve.protos import translator_pb2 as pb
from seq2serve.server.api.http.access import Access
from seq2serve.server.api.http.model_headers import door_call, named
from seq2serve.server.api.proto_api import ProtoApi
from seq2serve.server.core.errors import InvalidArgument, ServiceError

P = TypeVar("P", bound=Message)
Handler = Callable[[Request], Awaitable[Response]]
Route = Callable[..., None]


def parse(raw: bytes, message: P) -> P:
    """A request message from its canonical JSON; unknown fields are an error."""
    try:
        text = raw.decode("utf-8")
        json_format.Parse(text or "{}", message)
    except (UnicodeDecodeError, json_format.ParseError, RecursionError) as e:
        raise InvalidArgument(f"invalid {message.DESCRIPTOR.name} JSON: {str(e)[:200]}") from None
    return message


def to_json(message: Message) -> Response:
    return Response(json_format.MessageToJson(message, indent=None),
                    media_type="application/json")


def error_event(error: BaseException) -> str:
    if isinstance(error, ServiceError):
        body = {"code": error.kind.value, "message": error.message}
    else:
        body = {"code": "INTERNAL", "message": "internal error (logged on the server)"}
    return f"event: error\ndata: {json.dumps(body)}\n\n"


class ProtoJsonApi:
    def __init__(self, api: ProtoApi, access: Access) -> None:
        self.api = api
        self.access = access

    def register(self, route: Route) -> None:
        route("/v1/translate", self.translate, ["POST"], doc="Translate (TranslateRequest JSON)")
        route("/v1/translate:stream", self.translate_stream, ["POST"],
              doc="TranslateStream as Server-Sent Events (TranslateChunk JSON per event)")
        route("/v1/summarize", self.summarize, ["POST"], doc="Summarize (SummarizeRequest JSON)")
        route("/v1/models", self.models, ["GET"], doc="ListModels")

    def _admit(self, request: Request, cost: int) -> None:
        key = request.headers.get("authorization", "").removeprefix("Bearer ").strip() or None
        peer = request.client.host if request.client is not None else ""
        self.access.admit(peer, request.headers.get("x-forwarded-for"), key, cost)

    async def translate(self, request: Request) -> Response:
        message = parse(await request.body(), pb.TranslateRequest())
        self._admit(request, max(1, len(message.texts)))
        return to_json(await self.api.translate(message, door_call(), named(request)))

    async def summarize(self, request: Request) -> Response:
        message = parse(await request.body(), pb.SummarizeRequest())
        self._admit(request, max(1, len(message.texts)))
        return to_json(await self.api.summarize(message, door_call(), named(request)))

    async def models(self, request: Request) -> Response:
        self._admit(request, 1)
        return to_json(self.api.list_models())

    async def translate_stream(self, request: Request) -> Response:
        message = parse(await request.body(), pb.TranslateRequest())
        self._admit(request, 1)
        call = door_call()
        chunks = self.api.stream(message, call, named(request))
        # The first chunk is awaited here, so that a bad request is an HTTP error
        # status rather than an error event inside a 200 stream.
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            return JSONResponse({"error": "the stream ended without an answer"}, 500)

        async def events() -> AsyncIterator[str]:
            async with contextlib.aclosing(chunks):
                yield _event(first)
                try:
                    async for chunk in chunks:
                        yield _event(chunk)
                except Exception as error:  # noqa: BLE001 - reported in the stream
                    yield error_event(error)
                finally:
                    call.cancel()  # the client left: the pieces leave their batches

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})


def _event(chunk: pb.TranslateChunk) -> str:
    return f"data: {json_format.MessageToJson(chunk, indent=None)}\n\n"
