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

from seq2serve.server import assembly
from seq2serve.server.cli.main import main

RELEASE = "HELD_SERVE_RELEASE"
HOLD_LIMIT_S = 600.0  # a test that never releases still ends


def hold_after_the_first_model() -> None:
    release = Path(os.environ[RELEASE])
    build = assembly.build_handle
    built = 0

    def held_build(*args: Any, **kwargs: Any) -> Any:
        nonlocal built
        if built:
            print(f"holding the start-up until {release} exists", flush=True)
            end = time.monotonic() + HOLD_LIMIT_S
            while not release.exists() and time.monotonic() < end:
                time.sleep(0.05)
        built += 1
        return build(*args, **kwargs)

    assembly.build_handle = held_build


if __name__ == "__main__":
    hold_after_the_first_model()
    sys.exit(main())
