"""The one interceptor that maps every handler's exceptions to gRPC status codes.

Handlers raise; they never call `context.abort` themselves. The application's
errors (core.errors.ServiceError, by its ErrorKind, through the one table below:
core.options.InvalidOptions is an InvalidArgument) are the client's; anything
else, a stray ValueError included, is a bug here: logged with its traceback and
the RPC's name, and answered INTERNAL without leaking internals to the client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from seq2serve.server.core.errors import ErrorKind, InvalidArgument, ServiceError

log = logging.getLogger("seq2serve.server")
# gRPC sends the status message as a header; past ~8 KB of headers the client gets
# "Stream removed" (RESOURCE_EXHAUSTED) instead of the status, at random.
MAX_STATUS_MESSAGE = 2000
TRANSLATOR_PREFIX = "/seq2serve.v1.Translator/"

# The one table from the application's error kinds to gRPC status codes.
STATUS: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorKind.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.OVER_BUDGET: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The one table from exceptions to gRPC status codes and client messages."""
    if isinstance(error, ServiceError):
        code, message = STATUS[error.kind], error.message
    elif isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        code, message = grpc.StatusCode.CANCELLED, "the call was cancelled"
    else:
        code, message = grpc.StatusCode.INTERNAL, "internal error (logged on the server)"
    if len(message) > MAX_STATUS_MESSAGE:
        message = message[:MAX_STATUS_MESSAGE] + "..."
    return code, message


def _abort_error_types() -> tuple[type[BaseException], ...]:
    # context.abort() raises this; it must pass through untouched.
    abort = getattr(grpc.aio, "AbortError", None)
    return (abort,) if abort is not None else ()


_PASS_THROUGH = _abort_error_types()


async def _abort(context: grpc.aio.ServicerContext, error: Exception, method: str) -> None:
    code, message = status_of(error)
    if code == grpc.StatusCode.INTERNAL:
        log.error("unhandled error in %s", method, exc_info=error)
    await context.abort(code, message)


# Called with the RPC's method name when its request cannot be decoded, so that
# such calls are counted like any other (the handler, which counts, never runs).
UndecodableHook = Callable[[str, BaseException], None]


class _Parser:
    """Decode here rather than in gRPC core, which answers a bad message (say, a
    string field holding invalid UTF-8) with UNKNOWN instead of INVALID_ARGUMENT."""

    def __init__(self, deserializer: Callable[[bytes], Any] | None, method: str,
                 on_undecodable: UndecodableHook | None) -> None:
        self.deserializer, self.method, self.on_undecodable = (deserializer, method,
                                                               on_undecodable)

    def __call__(self, raw: bytes) -> Any:
        if self.deserializer is None:
            return raw
        try:
            return self.deserializer(raw)
        except DecodeError as e:
            error = InvalidArgument("the request is not a valid message (texts, model and the "
                                    f"other string fields must be valid UTF-8): {e}")
            if self.on_undecodable is not None:
                self.on_undecodable(self.method, error)
            raise error from None


# A handler as gRPC calls it: (request, context). grpc ships no type information,
# so messages and contexts are Any here.
UnaryBehavior = Callable[[Any, Any], Awaitable[Any]]
StreamBehavior = Callable[[Any, Any], AsyncIterator[Any]]


def _wrap_unary(behavior: UnaryBehavior, parse: _Parser) -> UnaryBehavior:
    async def wrapped(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(parse(raw), context)
        except _PASS_THROUGH:
            raise
        except Exception as e:  # noqa: BLE001 - mapped to a status right here
            await _abort(context, e, parse.method)

    return wrapped


def _wrap_stream(behavior: StreamBehavior, parse: _Parser) -> StreamBehavior:
    async def wrapped(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in behavior(parse(raw), context):
                yield item
        except _PASS_THROUGH:
            raise
        except Exception as e:  # noqa: BLE001
            await _abort(context, e, parse.method)

    return wrapped


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Maps every handler's exceptions through `status_of`; `on_undecodable` hears of
    Translator calls whose request could not be decoded."""

    def __init__(self, on_undecodable: UndecodableHook | None = None) -> None:
        self.on_undecodable = on_undecodable

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
            handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        hook = self.on_undecodable if method.startswith(TRANSLATOR_PREFIX) else None
        parse = _Parser(handler.request_deserializer, method, hook)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, parse),
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, parse),
                response_serializer=handler.response_serializer)
        return handler
