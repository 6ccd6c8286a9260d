"""Timing systems side by side (the engine benchmarks' measuring core): a Record per
(system, decoding, batch, threads), round-robin over systems, medians over repeats.
`harness.py` is its command line and tables; `model.py` its per-model rows."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from seq2serve.bench.engine.systems import System


class BenchError(RuntimeError):
    pass


@dataclass
class Record:
    workload: str
    system: str
    precision: str
    decoding: str
    batch_size: int
    tokens_per_second: float
    tokens: int  # per timed pass
    seconds: float  # median wall time of one pass
    threads: int = 0
    sources: int = 0  # per timed pass
    # the best hypothesis of each source of a pass, in order (not in the JSON)
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def sentences_per_second(self) -> float:
        return self.sources / self.seconds

    def as_json(self) -> dict[str, object]:
        return {"system": self.system, "precision": self.precision,
                "decoding": self.decoding, "batch_size": self.batch_size,
                "threads": self.threads,
                "tokens_per_second": round(self.tokens_per_second, 2),
                "sentences_per_second": round(self.sentences_per_second, 2)}


def beam_width(decoding: str) -> int:
    """'greedy' -> 1, 'beam4' -> 4."""
    if decoding == "greedy":
        return 1
    if decoding.startswith("beam") and decoding[4:].isdigit() and int(decoding[4:]) >= 2:
        return int(decoding[4:])
    raise argparse.ArgumentTypeError(f"decoding must be 'greedy' or 'beamK' (K >= 2), "
                                     f"got {decoding!r}")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- measuring -------------------------------------------------------------------------

class Timing(NamedTuple):
    """One system's pass over a workload's batches."""

    seconds: float  # the median over the timed repeats
    tokens: int  # generated in one pass
    outputs: list[list[int]]  # the best hypothesis per source, in order


def _timed(system: System, prepared: object, beam: int, new_tokens: int | None,
           expected: int | None, what: str) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    tokens = system.generate(prepared, beam, new_tokens)
    seconds = time.perf_counter() - start
    if expected is not None:
        wrong = sorted({len(t) for t in tokens if len(t) != expected})
        if wrong:
            raise BenchError(f"{what}: a source got {wrong[0]} tokens, expected exactly "
                             f"{expected}; the systems would not be doing the same work")
    return seconds, tokens


# Before each timed pass: the previous system's idle worker threads (ONNX Runtime,
# OpenMP) spin for a while after a call; let them settle so they take no CPU.
SETTLE_SECONDS = 0.3


def measure(system: System, batches: Sequence[Sequence[Sequence[int]]], beam: int,
            new_tokens: int | None, repeats: int, warmup: int, what: str) -> tuple[float, int]:
    """Median seconds and the tokens generated for one pass over `batches`."""
    timing = measure_round_robin([system], batches, beam, new_tokens, repeats, warmup,
                                 [what])[0]
    return timing.seconds, timing.tokens


def measure_round_robin(systems: Sequence[System], batches: Sequence[Sequence[Sequence[int]]],
                        beam: int, new_tokens: int | None, repeats: int, warmup: int,
                        whats: Sequence[str]) -> list[Timing]:
    """Per system, the median seconds, the tokens generated and the outputs of one
    pass over `batches`; repeat r of every system runs before repeat r + 1 of any."""
    prepared = [[system.prepare(b) for b in batches] for system in systems]
    for system, parts, what in zip(systems, prepared, whats, strict=True):
        for _ in range(warmup):
            _timed(system, parts[0], beam, new_tokens, new_tokens, what)
    times: list[list[float]] = [[] for _ in systems]
    counts: list[set[int]] = [set() for _ in systems]
    outputs: list[list[list[int]]] = [[] for _ in systems]
    for repeat in range(repeats):
        for i, (system, parts, what) in enumerate(zip(systems, prepared, whats, strict=True)):
            if len(systems) > 1:
                time.sleep(SETTLE_SECONDS)
            total_seconds, total_tokens = 0.0, 0
            for part in parts:
                seconds, tokens = _timed(system, part, beam, new_tokens, new_tokens, what)
                total_seconds += seconds
                total_tokens += sum(len(t) for t in tokens)
                if repeat == 0:
                    outputs[i] += tokens
            times[i].append(total_seconds)
            counts[i].add(total_tokens)
    for what, seen in zip(whats, counts, strict=True):
        if len(seen) != 1:  # decoding is deterministic: a change means a bug, not noise
            raise BenchError(f"{what}: token counts differ between repeats: {sorted(seen)}")
    return [Timing(statistics.median(t), c.pop(), o)
            for t, c, o in zip(times, counts, outputs, strict=True)]


def run_systems(systems: Sequence[System], workload: str, settings: list[tuple[str, int]],
                batches_for: dict[int, list[list[list[int]]]], new_tokens: int | None,
                repeats: int, warmup: int, threads: int = 0) -> list[Record]:
    records = []
    try:
        for system in systems:
            start = time.perf_counter()
            system.load()
            log(f"{system.label}: loaded in {time.perf_counter() - start:.1f} s")
        for decoding, batch_size in settings:
            whats = [f"{system.label} {decoding} batch {batch_size}" for system in systems]
            results = measure_round_robin(systems, batches_for[batch_size],
                                          beam_width(decoding), new_tokens, repeats, warmup,
                                          whats)
            for system, what, (seconds, tokens, outputs) in zip(systems, whats, results,
                                                                strict=True):
                sources = sum(len(b) for b in batches_for[batch_size])
                record = Record(workload, system.name, system.precision, decoding, batch_size,
                                tokens / seconds, tokens, seconds, threads, sources, outputs)
                log(f"  {what}: {record.tokens_per_second:.1f} tokens/s "
                     f"({tokens} tokens, median {seconds:.3f} s)")
                records.append(record)
    finally:
        for system in systems:
            system.close()
    return records


# -- reporting -------------------------------------------------------------------------
