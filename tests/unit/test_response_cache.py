"""The exact response cache: LRU order, a budget in bytes, counters."""

from __future__ import annotations

import threading

import pytest

from seq2serve.server.core.cache import ENTRY_OVERHEAD_BYTES, ResponseCache


def test_a_hit_returns_the_stored_value_and_counts() -> None:
    cache: ResponseCache[str] = ResponseCache(10_000)
    assert cache.get(("m", "hello")) is None
    cache.put(("m", "hello"), "hallo", size=10)
    assert cache.get(("m", "hello")) == "hallo"
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 1, 1)
    assert stats.bytes == 10 + ENTRY_OVERHEAD_BYTES


def test_least_recently_used_goes_first_when_over_budget() -> None:
    cost = 100 + ENTRY_OVERHEAD_BYTES
    cache: ResponseCache[int] = ResponseCache(3 * cost)
    for key in "abc":
        cache.put(key, ord(key), size=100)
    assert cache.get("a") == ord("a")  # a is now the most recent
    cache.put("d", 4, size=100)
    assert cache.get("b") is None and cache.get("a") == ord("a") and cache.get("d") == 4
    stats = cache.stats()
    assert stats.evictions == 1 and stats.bytes <= stats.capacity_bytes


def test_an_entry_larger_than_the_budget_is_not_stored() -> None:
    cache: ResponseCache[str] = ResponseCache(1000)
    cache.put("small", "x", size=10)
    cache.put("huge", "y" * 5000, size=5000)
    assert cache.get("huge") is None and cache.get("small") == "x"


def test_replacing_a_key_does_not_count_it_twice() -> None:
    cache: ResponseCache[str] = ResponseCache(10_000)
    cache.put("k", "one", size=100)
    cache.put("k", "two", size=200)
    assert cache.get("k") == "two"
    assert cache.stats().bytes == 200 + ENTRY_OVERHEAD_BYTES


def test_zero_capacity_turns_it_off() -> None:
    cache: ResponseCache[str] = ResponseCache(0)
    cache.put("k", "v", size=1)
    assert not cache.enabled and cache.get("k") is None and cache.stats().misses == 0
    with pytest.raises(ValueError, match="capacity_bytes must be >= 0"):
        ResponseCache(-1)


def test_threads_keep_the_byte_count_exact() -> None:
    cost = 10 + ENTRY_OVERHEAD_BYTES
    cache: ResponseCache[int] = ResponseCache(50 * cost)

    def work(offset: int) -> None:
        for i in range(500):
            cache.put(offset + i % 80, i, size=10)
            cache.get(offset + (i * 7) % 80)

    threads = [threading.Thread(target=work, args=(t * 1000,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = cache.stats()
    assert stats.bytes == stats.entries * cost <= 50 * cost
