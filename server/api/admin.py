"""The model-control calls' keys (--admin-keys), apart from the translation keys:
both doors ask `AdminKeys.check` before LoadModel and UnloadModel. Without a key
file the control calls are refused, so a server never hands control to anyone by
default."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from seq2serve.server.core.errors import PermissionDenied

# gRPC metadata key and HTTP header of the admin key.
ADMIN_KEY_HEADER = "x-admin-key"


class AdminKeys:
    def __init__(self, keys: Sequence[str] | None) -> None:
        self._keys = None if keys is None else tuple(key.encode() for key in keys)

    def check(self, key: str | None) -> None:
        """Raise PermissionDenied unless `key` is one of the admin keys."""
        if self._keys is None:
            raise PermissionDenied("model control is off on this server (start it with "
                                   "--admin-keys FILE)")
        if not key:
            raise PermissionDenied(f"model control needs an admin key ({ADMIN_KEY_HEADER})")
        given = key.encode()
        # Compared in constant time, every key, so timing tells nothing of the keys.
        if not any([hmac.compare_digest(given, k) for k in self._keys]):
            raise PermissionDenied(f"the admin key ({ADMIN_KEY_HEADER}) is not valid")
