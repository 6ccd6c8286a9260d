"""Service errors and the one interceptor that maps them to gRPC status codes.

Handlers raise; they never call `context.abort` themselves. Bad input is
INVALID_ARGUMENT (never INTERNAL); anything unexpected is logged with its
traceback and answered INTERNAL without leaking internals to the client.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

log = logging.getLogger("seq2serve.server")


class ServiceError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(ServiceError):
    code = grpc.StatusCode.CANCELLED


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(error, ServiceError):
        return error.code, error.message
    # Validation errors of option/config dataclasses are ValueErrors naming the field.
    if isinstance(error, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    return grpc.StatusCode.INTERNAL, "internal error (logged on the server)"


def _abort_error_types() -> tuple[type[BaseException], ...]:
    # context.abort() raises this; it must pass through untouched.
    abort = getattr(grpc.aio, "AbortError", None)
    return (abort,) if abort is not None else ()


_PASS_THROUGH = _abort_error_types()


async def _abort(context: grpc.aio.ServicerContext, error: Exception) -> None:
    code, message = status_of(error)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("unhandled error in %s", getattr(context, "_method", "handler"),
                      exc_info=error)
    await context.abort(code, message)


def _parse(deserializer: Callable[[bytes], Any] | None, raw: bytes) -> Any:
    """Decode here rather than in gRPC core, which answers a bad message (say, a
    string field holding invalid UTF-8) with UNKNOWN instead of INVALID_ARGUMENT."""
    if deserializer is None:
        return raw
    try:
        return deserializer(raw)
    except DecodeError as e:
        raise InvalidArgument("the request is not a valid message (texts, model and the other "
                              f"string fields must be valid UTF-8): {e}") from None


def _wrap_unary(behavior: Callable[[Any, Any], Awaitable[Any]],
                deserializer: Callable[[bytes], Any] | None):
    async def wrapped(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(_parse(deserializer, raw), context)
        except _PASS_THROUGH:
            raise
        except Exception as e:  # noqa: BLE001 - mapped to a status right here
            await _abort(context, e)

    return wrapped


def _wrap_stream(behavior: Callable[[Any, Any], AsyncIterator[Any]],
                 deserializer: Callable[[bytes], Any] | None):
    async def wrapped(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in behavior(_parse(deserializer, raw), context):
                yield item
        except _PASS_THROUGH:
            raise
        except Exception as e:  # noqa: BLE001
            await _abort(context, e)

    return wrapped


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, handler.request_deserializer),
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, handler.request_deserializer),
                response_serializer=handler.response_serializer)
        return handler
