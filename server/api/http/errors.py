"""The one table from the core's error kinds (core/errors.py) to HTTP status codes,
and the access refusals' codes: every HTTP dialect's error encoder (LibreTranslate's
`{"error"}` in app.py, DeepL's `{"message"}` in deepl_auth.py) reads its status here
and only spells the body its own way."""

from __future__ import annotations

from seq2serve.server.api.http.access import AccessDenied, KeyRequired, RateLimited
from seq2serve.server.core.errors import ErrorKind, ServiceError

HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.RESOURCE_EXHAUSTED: 429,
    ErrorKind.TOO_LARGE: 413,  # Content Too Large (RFC 9110)
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.DEADLINE_EXCEEDED: 504,
    ErrorKind.CANCELLED: 499,
}
# What a 503 (models loading, server draining) tells a client to wait before it asks
# again (Retry-After, RFC 9110): loading takes seconds, a drain hands over in as many.
RETRY_AFTER_S = 2


def status_of(error: BaseException, key_required: int = 400) -> int | None:
    """The HTTP status of a refusal, None for an error that is no refusal (a bug: 500).
    `key_required`: LibreTranslate answers a missing key 400, DeepL 403."""
    if isinstance(error, ServiceError):
        return HTTP_STATUS[error.kind]
    if isinstance(error, AccessDenied):
        return 403
    if isinstance(error, KeyRequired):
        return key_required
    if isinstance(error, RateLimited):
        return 429
    return None


def retry_after(error: BaseException, status: int) -> dict[str, str] | None:
    """Retry-After for a 503 (loading, draining) and a rate limit's 429."""
    if isinstance(error, RateLimited):
        return {"Retry-After": str(error.retry_after_s)}
    return {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
