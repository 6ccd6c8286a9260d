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
from seq2serve.server.core.usage import Reservation, UsageLedger, key_account

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

    Counted per valid key (per client address where keys are off or the request has
    none) in `usage` (core/usage.py): in memory, or kept in --usage-file across
    restarts, per counting period (--usage-period)."""

    def __init__(self, access: Access, usage: UsageLedger | None = None) -> None:
        self.access = access
        self.ledger = usage if usage is not None else UsageLedger()

    def admit(self, request: Request, fields: Fields | None = None,
              cost: int = 1) -> Caller:
        peer = request.client.host if request.client is not None else ""
        return self.access.admit(peer, request.headers.get("x-forwarded-for"),
                                 request_key(request, fields), cost)

    def usage(self, caller: Caller) -> UsageCount:
        return UsageCount(self.ledger.used(account(caller)), self._limit(caller))

    def reserve(self, caller: Caller, characters: int) -> Reservation:
        """Count `characters` against the caller's limit, or QuotaExceeded (nothing
        counted) when they would pass it."""
        limit = self._limit(caller)
        reservation = self.ledger.reserve(account(caller), characters, limit)
        if reservation is None:
            raise QuotaExceeded(
                f"Quota exceeded: this key has used {self.ledger.used(account(caller))} of "
                f"its {limit} characters; this request has {characters}")
        return reservation

    def refund(self, reservation: Reservation) -> None:
        """Give back what a request that failed had reserved."""
        self.ledger.refund(reservation)

    def charge(self, account_id: str, characters: int) -> None:
        """Count work already done on `account_id` (`account`'s): all of it, up to the
        limit its key has now (the key file may have changed since the work began)."""
        limit = next((limit for key, limit in self.access.char_limits.items()
                      if key_account(key) == account_id), UNLIMITED)
        left = max(0, limit - self.ledger.used(account_id))
        self.ledger.reserve(account_id, min(characters, left), limit)

    def _limit(self, caller: Caller) -> int:
        return self.access.char_limits.get(caller.key, UNLIMITED) if caller.key else UNLIMITED


def account(caller: Caller) -> str:
    """The caller's account in the usage counts: its key's (core/usage.py keeps those
    in the file), else its address's (memory only)."""
    if caller.key:
        return key_account(caller.key)
    return f"ip:{caller.address}"
