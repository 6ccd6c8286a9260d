"""Who may call, and how often: API keys and per-client rate limits.

Keys come from a file (one per line, `#` comments; a line may add the key's
character limit after the key, `KEY 500000`, which DeepL's API reports and
enforces: /v2/usage, 456), are compared in constant time and never logged;
without the file a request's key is ignored, as LibreTranslate ignores keys
without its key database. Limits use a moving window (the `limits` library,
as LibreTranslate's Flask-Limiter does): one budget per valid key, else one
per client address; a list request costs its length. The client address is
the peer's, or the last untrusted hop of X-Forwarded-For when the peer is a
trusted proxy.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from limits import RateLimitItem, RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from seq2serve.server.config import Network


class AccessDenied(Exception):
    """403: a key that is not one of the server's."""


class KeyRequired(Exception):
    """400: no key where one is required (LibreTranslate's status for it, not 403)."""


class RateLimited(Exception):
    """429: over the client's budget; the message is LibreTranslate's, `retry_after_s`
    when the window frees a hit again (DeepL's answer sends it as Retry-After)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class KeyFileError(ValueError):
    """A key file line that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class KeyFile:
    keys: tuple[str, ...]
    # A key's character limit (its optional second column); keys without one: none.
    char_limits: Mapping[str, int]


def read_key_file(path: Path) -> KeyFile:
    keys: list[str] = []
    limits: dict[str, int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        columns = line.split("#", 1)[0].split()
        if not columns:
            continue
        if len(columns) > 2 or (len(columns) == 2 and not columns[1].isdigit()):
            raise KeyFileError(f"{path}:{number}: expected KEY or KEY CHARACTER_LIMIT (a "
                               f"whole number), got {len(columns)} columns")
        keys.append(columns[0])
        if len(columns) == 2:
            limits[columns[0]] = int(columns[1])
    return KeyFile(tuple(keys), limits)


def read_api_keys(path: Path) -> tuple[str, ...]:
    return read_key_file(path).keys


@dataclass(frozen=True)
class Caller:
    address: str
    key: str | None  # a valid key, never an invalid one


class Access:
    """Keys in LibreTranslate's three modes (its `access_check`): off (`keys` None, no
    --api-keys), where a request's key is never looked at; on, where a key that is not
    one of `keys` is refused and a request without one is let in; required, where a
    request without one is refused too."""

    def __init__(self, keys: Sequence[str] | None = None, require_key: bool = False,
                 per_minute: int = 0, trusted_proxies: Sequence[Network] = (),
                 char_limits: Mapping[str, int] | None = None) -> None:
        self._keys = None if keys is None else tuple(key.encode() for key in keys)
        self.char_limits: Mapping[str, int] = dict(char_limits or {})
        self.require_key = require_key and self._keys is not None
        self.trusted_proxies = tuple(trusted_proxies)
        self.limit: RateLimitItem | None = (RateLimitItemPerMinute(per_minute)
                                            if per_minute > 0 else None)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    @property
    def uses_keys(self) -> bool:
        """Keys are on (an empty file too: then every key is refused, as with
        LibreTranslate's empty key database)."""
        return self._keys is not None

    def valid_key(self, key: str) -> bool:
        given = key.encode()
        found = False
        for known in self._keys or ():  # every key is compared: the time says nothing
            found |= hmac.compare_digest(given, known)
        return found

    def admit(self, peer: str, forwarded_for: str | None, key: str | None,
              cost: int = 1) -> Caller:
        """The caller of one request, or AccessDenied / KeyRequired / RateLimited."""
        caller = Caller(address=self.client_address(peer, forwarded_for),
                        key=self.checked_key(key))
        if self.limit is not None:
            bucket = f"key:{caller.key}" if caller.key else f"ip:{caller.address}"
            if not self._limiter.hit(self.limit, bucket, cost=max(1, cost)):
                reset = self._limiter.get_window_stats(self.limit, bucket).reset_time
                raise RateLimited(f"Slowdown: {self.limit}",
                                  max(1, math.ceil(reset - time.time())))
        return caller

    def checked_key(self, key: str | None) -> str | None:
        """The request's valid key, or None where it has none that counts."""
        if not self.uses_keys:
            # Clients that always send a key (some refuse to run without one) and
            # settings that keep an old one must work on a server without keys.
            return None
        if key:
            if not self.valid_key(key):
                raise AccessDenied("Invalid API key")
            return key
        if self.require_key:
            raise KeyRequired("Please contact the server operator to get an API key")
        return None

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
