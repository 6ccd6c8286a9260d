"""Results from the engine threads to the asyncio loop that awaits them.

A worker thread resolves a work item by calling its `deliver` (and streams its
tokens through `on_token`); for an asyncio caller that hop goes through the
loop's one mailbox, so that a decoder step that finishes or streams to 64 texts
wakes the loop once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)


class LoopMailbox:
    """Hands callables from worker threads to one asyncio loop, coalesced.

    `loop.call_soon_threadsafe` writes to the loop's self-pipe on every call:
    a system call and a loop wake-up per streamed token and per finished text.
    Posts that arrive before the loop has run the previous ones ride along
    with them, so a decoder step that streams a token to 64 texts wakes the
    loop once. Callables run on the loop in the order they were posted."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def post(self, callback: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self._pending.append((callback, args))
            if len(self._pending) > 1:
                return  # a drain is scheduled and has not run yet: it takes this one too
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            with self._lock:
                self._pending.clear()

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for callback, args in pending:
            try:
                callback(*args)
            except Exception:  # one bad callback must not drop the others
                log.exception("a callback from the engine thread failed")


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopMailbox] = \
    weakref.WeakKeyDictionary()
_mailboxes_lock = threading.Lock()


def mailbox(loop: asyncio.AbstractEventLoop) -> LoopMailbox:
    """The loop's one mailbox (one per loop, so that all of its posts coalesce)."""
    with _mailboxes_lock:
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = LoopMailbox(loop)
        return box


def deliver_to_future(loop: asyncio.AbstractEventLoop,
                      future: asyncio.Future[Any]) -> Callable[[Any], None]:
    """A `WorkItem.deliver` for an asyncio handler: hops from the worker thread to
    the handler's loop; an exception result becomes the future's exception."""

    def settle(result: Any) -> None:
        if future.done():  # the handler gave up (deadline, client gone)
            return
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    box = mailbox(loop)

    def deliver(result: Any) -> None:
        box.post(settle, result)

    return deliver


class PieceEvents:
    """What the engine reports about a streamed request's pieces, on the loop, in
    order: (piece, token) as it chooses a token, (piece, None) once the piece's
    future is done (its result comes through the same mailbox, after its tokens)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._queue: asyncio.Queue[tuple[int, int | None]] = asyncio.Queue()
        self._box = mailbox(loop)

    def token_sink(self, index: int) -> Callable[[int], None]:
        """A `WorkItem.on_token` for piece `index`."""

        def on_token(token: int) -> None:  # runs on the engine's thread
            self._box.post(self._queue.put_nowait, (index, token))

        return on_token

    def watch(self, futures: Sequence[asyncio.Future[Any]]) -> None:
        for i, future in enumerate(futures):
            future.add_done_callback(functools.partial(self._done, i))

    def _done(self, index: int, _: asyncio.Future[Any]) -> None:
        self._queue.put_nowait((index, None))

    async def arrived(self) -> list[tuple[int, int | None]]:
        """Everything that arrived since the last call, waiting for at least one."""
        events = [await self._queue.get()]
        while not self._queue.empty():
            events.append(self._queue.get_nowait())
        return events
