"""The exact response cache: one text's answer, reused bit for bit.

A text's output never depends on what it was batched with, so an answer is a
pure function of (model package, task, text, resolved options): caching it is
exact, scores and alignments included. Entries are evicted least recently used
once the cache holds more than its budget in bytes. A lookup never waits on the
engine: a hit is answered before anything is queued.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")

# What one entry costs beyond its payload: the key tuple, the OrderedDict node,
# the value's dataclass shells (measured with tracemalloc on a one-word answer).
ENTRY_OVERHEAD_BYTES = 512


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    capacity_bytes: int


class ResponseCache(Generic[V]):
    """A thread-safe LRU bounded in bytes; `capacity_bytes` 0 turns it off."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def get(self, key: Hashable) -> V | None:
        if not self.enabled:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return entry[0]

    def put(self, key: Hashable, value: V, size: int) -> None:
        """Store `value`, which takes about `size` bytes; one larger than the whole
        budget is not stored (it would evict everything for one entry)."""
        cost = size + ENTRY_OVERHEAD_BYTES
        if not self.enabled or cost > self.capacity_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, cost)
            self._bytes += cost
            while self._bytes > self.capacity_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted
                self._evictions += 1

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(hits=self._hits, misses=self._misses, evictions=self._evictions,
                              entries=len(self._entries), bytes=self._bytes,
                              capacity_bytes=self.capacity_bytes)
