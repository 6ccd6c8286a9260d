"""`seq2serve serve` whose start-up is held open: every model package after the first
waits, before it loads, until the file named by HELD_SERVE_RELEASE exists. A test
sends requests while some models are loaded and others are not (as a client does
that calls a server while it starts), then creates the file.

Run as a script: `python tests/held_serve.py serve ...` (ServeProcess(held=True))."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from seq2serve.server.cli.main import main
from seq2serve.server.core.registry import ModelRegistry

RELEASE = "HELD_SERVE_RELEASE"
HOLD_LIMIT_S = 600.0  # a test that never releases still ends


def hold_after_the_first_model() -> None:
    release = Path(os.environ[RELEASE])
    add = ModelRegistry._add
    added = 0

    def held_add(self: ModelRegistry, *args: Any, **kwargs: Any) -> None:
        nonlocal added
        if added:
            print(f"holding the start-up until {release} exists", flush=True)
            end = time.monotonic() + HOLD_LIMIT_S
            while not release.exists() and time.monotonic() < end:
                time.sleep(0.05)
        added += 1
        add(self, *args, **kwargs)

    ModelRegistry._add = held_add  # type: ignore[method-assign]


if __name__ == "__main__":
    hold_after_the_first_model()
    sys.exit(main())
