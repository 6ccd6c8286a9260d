"""Dynamic batching for one model: a bounded queue of texts and the batches formed from it.

gRPC handlers (an asyncio loop) `submit()` one `WorkItem` per text; the model's
worker thread calls `next_batch()`. Everything here is pure Python and
threading: the scheduler decides, as plain data (`Batch`), and never runs a model.

How a batch is formed (request-level batching):
- The oldest queued item picks the decoding shape (its beam width, and whether
  it decodes over the model's vocabulary shortlist: `group_of`) and is always
  in the batch, so no shape and no long text can starve.
- Once an item is queued, the scheduler waits up to `max_queue_delay_s` after it
  arrived for more work, unless the batch fills first.
- Items of that shape join while the batch stays within `max_batch_size` texts
  and `max_batch_tokens` tokens: in FIFO order, or with `similar_lengths` the
  queued items whose source lengths are nearest the oldest item's first (FIFO
  among equal distances), so that a deep queue of mixed traffic forms batches of
  like lengths (less padding, no batch kept running by one long text while the
  rest of its rows sit finished). The oldest item still leads every batch. Tokens counted are what
  the engine allocates: longest source in the batch x texts x beam width (the
  padded encoder input and the per-beam cross-attention rows). An item that
  would burst the token budget is skipped, not waited for: it becomes the oldest
  at the next batch. A lone item above the budget still runs, alone.
- The chosen items are sorted by source length (shortest first), so the engine
  can compact finished rows and split sub-batches with little padding.
- Items cancelled by their client or past their deadline are dropped before
  batching, get an `ItemDropped` exception delivered, and are reported in the batch.

Iteration-level batching (`joining()`): while a batch runs, queued items of its
beam width join at every step boundary, in FIFO order, while the running batch
stays within `max_batch_size` texts (so 1 still turns batching off),
`max_running_rows` decoder rows (texts x beam width) and `max_cache_tokens`
(rows x the longest output limit among them, the cache length the batch may
reach), and the joining texts within `max_batch_tokens` (they are encoded
together). Only beam widths up to `max_running_beam` run this way; wider beams
form request-level batches (`iterates()`). Joining stops at the first
item that does not fit, and nothing joins while the oldest queued item has
another beam width: the running batch then drains and that item leads the
next batch, so no shape and no long text starves. Nobody waits for a delay:
joining a running batch costs a step of the others, not an idle decoder.

`close()` starts the drain: `submit()` raises `Draining`, queued work is still
batched, without waiting for the delay, and `next_batch()` returns None once empty.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from seq2serve.server.engine.options import ResolvedOptions
from seq2serve.server.engine.search import Result

log = logging.getLogger(__name__)

_ids = itertools.count(1)


# Called once per item with its n-best, or with why there is none (ItemDropped,
# Draining, or the engine's error).
Deliver = Callable[[Result | Exception], None]


class BatchReason(str, Enum):
    """Why the scheduler closed a batch (the label of the batches metric)."""

    FULL = "full"  # max_batch_size texts
    TOKENS = "tokens"  # the next text would pass max_batch_tokens
    DELAY = "delay"  # max_queue_delay passed since the oldest text arrived
    DRAIN = "drain"  # the queue is closing: whatever is there goes
    DROPPED = "dropped"  # every candidate left before running (no items)
    JOIN = "join"  # texts that join a running batch at a step boundary


class DropReason(str, Enum):
    """Why a text left before finishing (the label of the cancelled metric)."""

    DEADLINE = "deadline"
    CANCELLED = "cancelled"


class QueueFull(Exception):
    """The model's queue cannot take the item(s); the service maps it to RESOURCE_EXHAUSTED."""


class Draining(Exception):
    """The server is shutting down and accepts no new work (UNAVAILABLE)."""


class ItemDropped(Exception):
    """Delivered to an item that left the queue or its batch before finishing.
    `reason` says why (the label of the cancelled metric)."""

    def __init__(self, reason: DropReason, item_id: int):
        self.reason = reason
        self.item_id = item_id
        what = ("deadline passed" if reason is DropReason.DEADLINE
                else "cancelled by the client")
        super().__init__(f"work item {item_id} dropped: {what}")


def shape_of(options: ResolvedOptions) -> int:
    """Items batched together share this key, the beam width: the decoder graph
    runs B x K rows with one K. Greedy and sampling share K = 1 (the engine gives
    every sampled source its own random stream, so neighbours do not matter)."""
    return options.beam_size


def group_of(options: ResolvedOptions) -> tuple[int, bool]:
    """What batch-mates share: the shape, and the decoder (over the vocabulary
    shortlist or the whole vocabulary; a batch runs one of the two graphs)."""
    return shape_of(options), options.shortlist


@dataclass(frozen=True)
class BatchLimits:
    """What one model's scheduler enforces. No defaults here: the server's are in
    ServerConfig (assembly.py `batch_limits`), their one home."""

    max_batch_size: int  # texts (sources), not beams
    max_batch_tokens: int  # longest source x texts x beam width
    max_queue_delay_s: float
    max_queue_size: int  # texts
    # Iteration-level batching: decoder rows in the running batch (0 = off:
    # request-level batches run to their end) and cache slots it may reach.
    max_running_rows: int
    max_cache_tokens: int
    # The widest beam that runs iteration-level; wider ones run request-level.
    max_running_beam: int
    # A new batch's mates: the nearest source lengths to its oldest item's first
    # (else FIFO). Iteration-level joiners stay FIFO.
    similar_lengths: bool

    def iterates(self, shape: int) -> bool:
        """Whether batches of this decoding shape (beam width) run iteration-level."""
        return self.max_running_rows > 0 and shape <= self.max_running_beam

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= 1, got {getattr(self, name)}"
                    for name in ("max_batch_size", "max_batch_tokens", "max_queue_size",
                                 "max_cache_tokens")
                    if getattr(self, name) < 1]
        if self.max_running_beam < 1:
            problems.append(f"max_running_beam must be >= 1, got {self.max_running_beam}")
        if self.max_running_rows < 0:
            problems.append(f"max_running_rows must be >= 0 (0 = request-level batching), "
                            f"got {self.max_running_rows}")
        if not self.max_queue_delay_s >= 0:
            problems.append(f"max_queue_delay_s must be >= 0, got {self.max_queue_delay_s}")
        if problems:
            raise ValueError("invalid BatchLimits: " + "; ".join(problems))


@dataclass(eq=False)
class WorkItem:
    """One source text on its way through the queue and the engine.

    `deliver` is called exactly once, from the worker thread, with the engine's
    n-best list for this source or with an exception (`ItemDropped`, or the
    engine's error). An asyncio handler must hop back to its loop in it
    (`core.delivery.deliver_to_future` does).
    """

    source: Sequence[int]  # source token ids, EOS included
    options: ResolvedOptions
    deliver: Deliver
    deadline: float | None = None  # time.monotonic() seconds
    on_token: Callable[..., None] | None = None  # streaming callback, passed to the engine
    # The handler's view of its RPC (e.g. `context.cancelled`), shared by all of a
    # request's items; `cancel()` below works without one.
    cancelled: Callable[[], bool] | None = None
    # Its hypotheses' first token (a multilingual model's target language); None:
    # the package's.
    forced_bos: int | None = None
    id: int = field(default_factory=lambda: next(_ids))
    enqueued_at: float = 0.0  # set by Scheduler.submit (time.monotonic())
    _cancel: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _done: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def shape(self) -> int:
        return shape_of(self.options)

    @property
    def group(self) -> tuple[int, bool]:
        return group_of(self.options)

    @property
    def shortlist(self) -> bool:
        return self.options.shortlist

    @property
    def beam_size(self) -> int:
        return self.options.beam_size

    @property
    def reach(self) -> int:
        """The cache length this text may need: its output limit."""
        return self.options.max_new_tokens(len(self.source))

    def cancel(self) -> None:
        self._cancel.set()

    def drop_reason(self, now: float | None = None) -> DropReason | None:
        """Why the item should leave, or None while it should still run. The
        deadline is checked first: a handler's `cancelled()` may also turn true
        when the deadline passes, and the metric should say which it was."""
        if self.deadline is not None:
            if (time.monotonic() if now is None else now) >= self.deadline:
                return DropReason.DEADLINE
        if self._cancel.is_set() or (self.cancelled is not None and self.cancelled()):
            return DropReason.CANCELLED
        return None

    def should_stop(self) -> bool:
        """The per-source `cancelled()` callable handed to the engine."""
        return self.drop_reason() is not None

    def resolve(self, result: Result | Exception) -> bool:
        """Deliver once; later calls are ignored (a drop racing a result). A raising
        callback is logged, never allowed to take the worker thread down."""
        with self._lock:
            if self._done:
                return False
            self._done = True
        try:
            self.deliver(result)
        except Exception:
            log.exception("delivering the result of work item %s failed", self.id)
        return True

    @property
    def done(self) -> bool:
        return self._done


@dataclass(frozen=True)
class Dropped:
    item_id: int
    reason: DropReason
    waited_s: float  # time in the queue


@dataclass(frozen=True)
class Batch:
    """A scheduling decision. `items` may be empty when every candidate was
    dropped; the drops are still reported so the worker can count them."""

    items: tuple[WorkItem, ...]
    shape: int | None  # beam width; None when items is empty
    tokens: int  # what the budget counted: longest source x len(items) x beam width
    source_tokens: int  # sum of unpadded source lengths
    reason: BatchReason
    dropped: tuple[Dropped, ...] = ()
    formed_at: float = 0.0  # time.monotonic()
    shortlist: bool = False  # its items decode over the vocabulary shortlist

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class Running:
    """What the scheduler needs to know of the running batch."""

    shape: int  # beam width
    sources: int  # texts now
    rows: int  # decoder rows now
    reach: int  # the cache length its rows may reach
    shortlist: bool = False  # it decodes over the vocabulary shortlist

    @property
    def group(self) -> tuple[int, bool]:
        return self.shape, self.shortlist


def padded_tokens(items: Iterable[WorkItem]) -> int:
    items = list(items)
    if not items:
        return 0
    return max(len(i.source) for i in items) * len(items) * items[0].beam_size


class Scheduler:
    def __init__(self, limits: BatchLimits) -> None:
        self.limits = limits
        # time.monotonic throughout: deadlines come from handlers in the same clock.
        self._clock = time.monotonic
        self._queue: list[WorkItem] = []  # FIFO; short (<= max_queue_size), scanned per batch
        self._cond = threading.Condition()
        self._closed = False

    # -- handler side (any thread, including an asyncio loop: never blocks) --

    def submit(self, item: WorkItem) -> None:
        self.submit_many([item])

    def submit_many(self, items: Sequence[WorkItem]) -> None:
        """All or nothing, so a request's texts are never half queued."""
        with self._cond:
            if self._closed:
                raise Draining("the server is draining and accepts no new work")
            size = self.limits.max_queue_size
            if len(self._queue) + len(items) > size:
                raise QueueFull(f"the queue is full ({len(self._queue)} of {size} texts "
                                f"queued, {len(items)} more requested); retry later")
            now = self._clock()
            for item in items:
                item.enqueued_at = now
            self._queue.extend(items)
            self._cond.notify_all()

    @property
    def depth(self) -> int:
        """Queued texts, for the queue-depth gauge (a racy read is fine there)."""
        return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop accepting work; what is queued is still batched."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def abort(self, error: Exception) -> int:
        """Empty the queue, delivering `error` to each item (grace period over)."""
        with self._cond:
            items, self._queue = self._queue, []
        for item in items:
            item.resolve(error)
        return len(items)

    # -- worker side --

    def next_batch(self, timeout: float | None = None) -> Batch | None:
        """Wait up to `timeout` seconds (None: forever) for a first item, then up
        to the queue delay for the batch to fill. None: nothing came, or drained."""
        limit = None if timeout is None else self._clock() + timeout
        dropped: list[tuple[WorkItem, Dropped]] = []
        try:
            with self._cond:
                while True:
                    dropped += self._purge()
                    if self._queue:
                        batch = self._fill(dropped)
                        if batch is not None:
                            return batch
                        continue  # everything queued was dropped while waiting
                    if dropped:
                        return Batch((), None, 0, 0, BatchReason.DROPPED, _plain(dropped),
                                     self._clock())
                    if self._closed:
                        return None
                    remaining = None if limit is None else limit - self._clock()
                    if remaining is not None and remaining <= 0:
                        return None
                    self._cond.wait(remaining)
        finally:
            # Outside the lock: a callback may be slow or submit more work.
            for item, d in dropped:
                item.resolve(ItemDropped(d.reason, item.id))

    def joining(self, running: Running) -> Batch | None:
        """The queued items that join the running batch now (never waits). None
        when nothing joins and nothing was dropped."""
        dropped: list[tuple[WorkItem, Dropped]] = []
        try:
            with self._cond:
                dropped += self._purge()
                chosen = self._joiners(running)
                taken = {id(i) for i in chosen}
                self._queue = [i for i in self._queue if id(i) not in taken]
        finally:
            for item, d in dropped:
                item.resolve(ItemDropped(d.reason, item.id))
        if not chosen and not dropped:
            return None
        return Batch(items=tuple(chosen), shape=running.shape if chosen else None,
                     tokens=padded_tokens(chosen),
                     source_tokens=sum(len(i.source) for i in chosen), reason=BatchReason.JOIN,
                     dropped=_plain(dropped), formed_at=self._clock(),
                     shortlist=running.shortlist)

    # -- internals (called with the lock held) --

    def _joiners(self, running: Running) -> list[WorkItem]:
        limits = self.limits
        if not limits.iterates(running.shape):
            return []
        chosen: list[WorkItem] = []
        rows, reach, longest = running.rows, running.reach, 0
        for item in self._queue:  # FIFO; the first item that cannot join stops it
            if (item.group != running.group
                    or running.sources + len(chosen) >= limits.max_batch_size):
                break
            grown_rows = rows + item.beam_size
            grown_reach = max(reach, item.reach)
            grown_longest = max(longest, len(item.source))
            if (grown_rows > limits.max_running_rows
                    or grown_rows * grown_reach > limits.max_cache_tokens
                    or grown_longest * (len(chosen) + 1) * item.beam_size
                    > limits.max_batch_tokens):
                break
            chosen.append(item)
            rows, reach, longest = grown_rows, grown_reach, grown_longest
        return chosen

    def _purge(self) -> list[tuple[WorkItem, Dropped]]:
        now = self._clock()
        keep: list[WorkItem] = []
        out: list[tuple[WorkItem, Dropped]] = []
        for item in self._queue:
            reason = item.drop_reason(now)
            if reason is None:
                keep.append(item)
            else:
                out.append((item, Dropped(item.id, reason, now - item.enqueued_at)))
        self._queue = keep
        return out

    def _plan(self) -> tuple[list[WorkItem], BatchReason | None]:
        """Items for a batch led by the oldest one, and why it cannot grow
        ("full", "tokens"), or None while more work could still join."""
        limits = self.limits
        head = self._queue[0]
        chosen = [head]
        longest = len(head.source)
        beam = head.beam_size
        budget_hit = False
        rows_budget = limits.max_running_rows if limits.iterates(head.shape) else None
        reach = head.reach if rows_budget else 0
        mates = [item for item in self._queue[1:] if item.group == head.group]
        if limits.similar_lengths:
            mates.sort(key=lambda i: abs(len(i.source) - longest))  # stable: FIFO on ties
        for item in mates:
            if len(chosen) == limits.max_batch_size:
                break
            if rows_budget is not None:
                rows, grown_reach = (len(chosen) + 1) * beam, max(reach, item.reach)
                if rows > rows_budget or rows * grown_reach > limits.max_cache_tokens:
                    budget_hit = True
                    continue
                reach = grown_reach
            grown = max(longest, len(item.source))
            if grown * (len(chosen) + 1) * beam > limits.max_batch_tokens:
                budget_hit = True
                continue
            chosen.append(item)
            longest = grown
        if len(chosen) == limits.max_batch_size:
            return chosen, BatchReason.FULL
        if budget_hit or longest * len(chosen) * beam >= limits.max_batch_tokens:
            return chosen, BatchReason.TOKENS
        return chosen, None

    def _fill(self, dropped: list[tuple[WorkItem, Dropped]]) -> Batch | None:
        """Wait for the batch led by the oldest item to fill or its delay to run
        out, then take it off the queue. None when every queued item was dropped."""
        while True:
            chosen, reason = self._plan()
            if reason is None:
                if self._closed:
                    reason = BatchReason.DRAIN
                else:
                    remaining = self._queue[0].enqueued_at + self.limits.max_queue_delay_s \
                        - self._clock()
                    if remaining <= 0:
                        reason = BatchReason.DELAY
                    else:
                        self._cond.wait(remaining)
                        dropped += self._purge()
                        if not self._queue:
                            return None
                        continue
            taken = {id(i) for i in chosen}
            self._queue = [i for i in self._queue if id(i) not in taken]
            chosen.sort(key=lambda i: len(i.source))  # stable: FIFO among equal lengths
            return Batch(items=tuple(chosen), shape=chosen[0].shape,
                         tokens=padded_tokens(chosen),
                         source_tokens=sum(len(i.source) for i in chosen), reason=reason,
                         dropped=_plain(dropped), formed_at=self._clock(),
                         shortlist=chosen[0].shortlist)


def _plain(dropped: list[tuple[WorkItem, Dropped]]) -> tuple[Dropped, ...]:
    return tuple(d for _, d in dropped)
