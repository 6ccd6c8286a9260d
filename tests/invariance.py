"""What the batch-invariance tests share: a result's key, and sentences joining a
running batch at random steps (iteration-level batching as the server does it)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

Key = list[tuple[list[int], "float | None"]]


def result_key(result: Sequence[Any]) -> Key:
    """A text's hypotheses as (token ids, score): what must not depend on its batch."""
    return [(h.token_ids, h.score) for h in result]


def decode_joining(engine: Any, running: Any, sources: Sequence[Sequence[int]], options: Any,
                   order: Sequence[int], rng: random.Random) -> dict[int, Key]:
    """Decode `sources` (in `order`) on `running`: one, two or five join at random
    steps, whatever else is running. Returns each source's key by its index."""
    waiting, done = list(order), {}
    while waiting or running.rows:
        if waiting and rng.random() < 0.4:
            count = rng.choice([1, 2, 5])
            joining, waiting = waiting[:count], waiting[count:]
            running.admit([engine.request(i, sources[i], options) for i in joining])
        if running.rows:
            done.update((k, result_key(r)) for k, r in running.step().finished)
    return done
