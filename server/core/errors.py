"""The application's errors, transport-neutral: what went wrong, as an `ErrorKind`.

Each front door maps the kinds with its own one table (gRPC status codes in
api/grpc_errors.py, HTTP status codes in the HTTP door). Messages are written
for the client and echo client values only bounded (`echo`).
"""

from __future__ import annotations

from enum import Enum

# A status message travels as a header: client values in it stay short.
ECHO_CHARS = 64


class ErrorKind(str, Enum):
    """Why a request was refused or not finished (names as gRPC's status codes, but
    TOO_LARGE, which gRPC calls RESOURCE_EXHAUSTED and HTTP 413)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # the client's input: fix it, do not retry
    NOT_FOUND = "NOT_FOUND"  # no served model fits
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # the queue or the answer is too big
    TOO_LARGE = "TOO_LARGE"  # the input is past a size limit: send less, do not retry
    UNAVAILABLE = "UNAVAILABLE"  # loading or stopping: retry, elsewhere if need be
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    PERMISSION_DENIED = "PERMISSION_DENIED"  # a control call without a valid admin key
    # The memory budget is held by busy models: retry (gRPC RESOURCE_EXHAUSTED, HTTP 503).
    OVER_BUDGET = "OVER_BUDGET"


class ServiceError(Exception):
    """A request the service refuses or could not finish, with a message for the client."""

    def __init__(self, kind: ErrorKind, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


class InvalidArgument(ServiceError):
    def __init__(self, message: str):
        super().__init__(ErrorKind.INVALID_ARGUMENT, message)


class NotFound(ServiceError):
    def __init__(self, message: str):
        super().__init__(ErrorKind.NOT_FOUND, message)


class ResourceExhausted(ServiceError):
    def __init__(self, message: str):
        super().__init__(ErrorKind.RESOURCE_EXHAUSTED, message)


class TooLarge(ServiceError):
    def __init__(self, message: str):
        super().__init__(ErrorKind.TOO_LARGE, message)


class Unavailable(ServiceError):
    def __init__(self, message: str):
        super().__init__(ErrorKind.UNAVAILABLE, message)


class DeadlineExceeded(ServiceError):
    def __init__(self, message: str):
        super().__init__(ErrorKind.DEADLINE_EXCEEDED, message)


class OverBudget(ServiceError):
    def __init__(self, message: str):
        super().__init__(ErrorKind.OVER_BUDGET, message)


class PermissionDenied(ServiceError):
    def __init__(self, message: str):
        super().__init__(ErrorKind.PERMISSION_DENIED, message)


class Cancelled(ServiceError):
    def __init__(self, message: str):
        super().__init__(ErrorKind.CANCELLED, message)


def lone_surrogate(text: str) -> int | None:
    """Where `text` stops being valid Unicode, or None: a surrogate code point
    (U+D800..U+DFFF) standing alone. JSON's `\\ud800` escape and a few decoders let
    one into a Python string; nothing can encode it, so it would fail deep in
    segmentation, tokenization or the answer's encoding as an internal error."""
    try:
        text.encode("utf-8")  # in C, and a copy at most: cheap beside a translation
    except UnicodeEncodeError as e:
        return e.start
    return None


def check_unicode(name: str, text: str) -> None:
    """Refuse `text`, naming the field `name`, unless it is valid Unicode."""
    at = lone_surrogate(text)
    if at is not None:
        raise InvalidArgument(f"{name} must be valid Unicode, got a lone surrogate "
                              f"U+{ord(text[at]):04X} at character {at}")


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """A client's value for an error message: repr'd, cut to `limit` characters."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        return repr(text[:limit]) + f"... ({len(text)} characters)"
    return repr(text)
