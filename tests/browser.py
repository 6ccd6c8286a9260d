"""Debian's chromium as the browser tests launch it (Playwright drives it; it cannot
download a browser here)."""

from __future__ import annotations

import system_tools


def chromium() -> str:
    """Debian's chromium, for a test marked `needs("chromium")`."""
    return system_tools.path("chromium")


# Chromium as CI runs it: headless, no sandbox (root in a container), and nothing of
# its own on the network (updates, sync, QUIC probes), so that every request seen
# is the page's.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
