"""DeepL's API: who calls (its `Authorization: DeepL-Auth-Key KEY` header, or the
legacy `auth_key` field), how many characters each key has used against its limit
(the key file's optional second column, access.py), and its error answers: a body
`{"message": ...}` with DeepL's status codes (403 for a bad or missing key, 456 past
the quota, 429 with Retry-After, 413, 503 with Retry-After while loading). The
statuses of the core's errors are the HTTP door's one table (errors.py).

Every DeepL endpoint module (deepl.py, the document endpoints) admits its callers
and encodes its errors here, so the dialect has one door policy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse

from seq2serve.server.api.http.access import Access, Caller
from seq2serve.server.api.http.body import Fields
from seq2serve.server.api.http.errors import retry_after, status_of

log = logging.getLogger("seq2serve.server.http.deepl")

AUTH_SCHEME = "DeepL-Auth-Key"
QUOTA_STATUS = 456  # DeepL's "Quota exceeded" (the official clients' QuotaExceededException)
# What /v2/usage reports for a key without a limit of its own: DeepL Pro's figure for
# an account without a cost limit (the clients need a number to compare against).
UNLIMITED = 1_000_000_000_000


class QuotaExceeded(Exception):
    """456: the key's characters would pass its limit."""


def error_response(error: BaseException) -> JSONResponse:
    """DeepL's error body, `{"message": ...}`, with the status the one table gives."""
    if isinstance(error, QuotaExceeded):
        return JSONResponse({"message": str(error)}, status_code=QUOTA_STATUS)
    status = status_of(error, key_required=403)
    if status is None:
        log.error("unhandled error in a DeepL API request", exc_info=error)
        return JSONResponse({"message": "Internal error (logged on the server)"},
                            status_code=500)
    message = getattr(error, "message", None) or str(error)
    return JSONResponse({"message": message}, status_code=status,
                        headers=retry_after(error, status))


def request_key(request: Request, fields: Fields | None = None) -> str | None:
    """The caller's key: `Authorization: DeepL-Auth-Key KEY`, else the legacy
    `auth_key` field (form, query string or JSON)."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() == AUTH_SCHEME.lower() and value.strip():
        return value.strip()
    if fields is not None:
        field = fields.values.get("auth_key")
        if isinstance(field, list) and field:
            field = field[0]
        if isinstance(field, str) and field.strip():
            return field.strip()
    key = request.query_params.get("auth_key")
    return key.strip() if key and key.strip() else None


@dataclass(frozen=True)
class UsageCount:
    character_count: int
    character_limit: int


class DeepLAccess:
    """The key modes and rate limits of access.py (the same file and settings as
    LibreTranslate's keys), plus each caller's characters against its key's limit.

    Counted in memory since the server started, per valid key (per client address
    where keys are off or the request has none): a restart starts the count again."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self._used: dict[str, int] = {}

    def admit(self, request: Request, fields: Fields | None = None,
              cost: int = 1) -> Caller:
        peer = request.client.host if request.client is not None else ""
        return self.access.admit(peer, request.headers.get("x-forwarded-for"),
                                 request_key(request, fields), cost)

    def usage(self, caller: Caller) -> UsageCount:
        limit = self.access.char_limits.get(caller.key, UNLIMITED) if caller.key else UNLIMITED
        return UsageCount(self._used.get(_account(caller), 0), limit)

    def reserve(self, caller: Caller, characters: int) -> None:
        """Count `characters` against the caller's limit, or QuotaExceeded (nothing
        counted) when they would pass it."""
        usage = self.usage(caller)
        if usage.character_count + characters > usage.character_limit:
            raise QuotaExceeded(
                f"Quota exceeded: this key has used {usage.character_count} of its "
                f"{usage.character_limit} characters; this request has {characters}")
        self._used[_account(caller)] = usage.character_count + characters

    def refund(self, caller: Caller, characters: int) -> None:
        """Give back what a request that failed had reserved."""
        account = _account(caller)
        self._used[account] = max(0, self._used.get(account, 0) - characters)


def _account(caller: Caller) -> str:
    return f"key:{caller.key}" if caller.key else f"ip:{caller.address}"
