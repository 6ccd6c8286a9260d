"""Who may call, and how often: API keys and per-client rate limits.

Keys come from a file (one per line, `#` comments), are compared in constant
time and never logged. Limits use a moving window (the `limits` library, as
LibreTranslate's Flask-Limiter does): one budget per valid key, else one per
client address; a list request costs its length. The client address is the
peer's, or the last untrusted hop of X-Forwarded-For when the peer is a trusted
proxy.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from limits import RateLimitItem, RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from seq2serve.server.config import Network


class AccessDenied(Exception):
    """403: a wrong key, or none where one is required."""


class RateLimited(Exception):
    """429: over the client's budget; the message is LibreTranslate's."""


def read_api_keys(path: Path) -> tuple[str, ...]:
    keys = []
    for line in path.read_text(encoding="utf-8").splitlines():
        key = line.split("#", 1)[0].strip()
        if key:
            keys.append(key)
    return tuple(keys)


@dataclass(frozen=True)
class Caller:
    address: str
    key: str | None  # a valid key, never an invalid one


class Access:
    def __init__(self, keys: Sequence[str] = (), require_key: bool = False,
                 per_minute: int = 0, trusted_proxies: Sequence[Network] = ()) -> None:
        self._keys = tuple(key.encode() for key in keys)
        self.require_key = require_key
        self.trusted_proxies = tuple(trusted_proxies)
        self.limit: RateLimitItem | None = (RateLimitItemPerMinute(per_minute)
                                            if per_minute > 0 else None)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    @property
    def uses_keys(self) -> bool:
        return bool(self._keys)

    def valid_key(self, key: str) -> bool:
        given = key.encode()
        found = False
        for known in self._keys:  # every key is compared: the time says nothing
            found |= hmac.compare_digest(given, known)
        return found

    def admit(self, peer: str, forwarded_for: str | None, key: str | None,
              cost: int = 1) -> Caller:
        """The caller of one request, or AccessDenied / RateLimited."""
        if key:
            if not self.valid_key(key):
                raise AccessDenied("Invalid API key")
        elif self.require_key:
            raise AccessDenied("Please contact the server operator to get an API key")
        caller = Caller(address=self.client_address(peer, forwarded_for), key=key or None)
        if self.limit is not None:
            bucket = f"key:{caller.key}" if caller.key else f"ip:{caller.address}"
            if not self._limiter.hit(self.limit, bucket, cost=max(1, cost)):
                raise RateLimited(f"Slowdown: {self.limit}")
        return caller

    def client_address(self, peer: str, forwarded_for: str | None) -> str:
        if not forwarded_for or not self._trusted(peer):
            return peer
        hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
        for hop in reversed(hops):  # the nearest hop a trusted proxy did not add
            if not self._trusted(hop):
                return hop
        return hops[0] if hops else peer

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.trusted_proxies)
