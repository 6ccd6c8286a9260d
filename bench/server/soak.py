"""Soak: many distinct texts at high concurrency against a real server; every
answer is checked against the same text translated alone.

    python -m seq2serve.bench.server.soak --texts data/ddtp/en-de/test.src \
        --texts data/ddtp/en-de/valid.src --concurrency 64 --json soak.json
    python -m seq2serve.bench.server.soak --quick --texts tests/fixtures/ddtp_en_test_sample.txt

Starts `seq2serve serve` (the shipped models unless --models-dir), translates
every text alone, one call at a time (the reference), then sends them all
again in shuffled order from `--concurrency` concurrent callers (the closed loop
of bench/server/clients.py), half greedy and half beam 4, so they share batches
with mates of every length. Each answer of the concurrent phase is one of:
- lost: the call failed or came back without a translation;
- mixed: it equals the reference of another text (an answer delivered to the
  wrong caller);
- batch-dependent: it differs from its own reference (tokens or score), that
  is, its output depended on what it was batched with;
- right: token ids and score equal to the reference.
Also reported: p50/p99 latency of the concurrent phase, and the server's RSS
(start: SERVING, before any call; peak; end: after the last call), sampled
from /proc. Exit status 1 when anything was lost, mixed or batch-dependent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np

from seq2serve.bench.inputs import read_sentences
from seq2serve.bench.server.clients import closed_loop
from seq2serve.bench.server.serving import served
from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

Answer = tuple[tuple[int, ...], float] | None  # (token ids, score); None: lost


@dataclass
class SoakReport:
    texts: int
    concurrency: int
    lost: int
    mixed: int
    batch_dependent: int
    right: int
    p50_ms: float
    p99_ms: float
    seconds: float
    rss_start_mib: float
    rss_peak_mib: float
    rss_end_mib: float

    @property
    def clean(self) -> bool:
        return self.lost == self.mixed == self.batch_dependent == 0


class RssSampler:
    """The server's resident memory, read from /proc every `every_s` seconds."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.pid, self.every_s = pid, every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def read(self) -> float:
        with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB -> MiB
        return 0.0

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.samples.append(self.read())
            except OSError:
                return

    def __enter__(self) -> RssSampler:
        self.samples.append(self.read())
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.read())


def options_for(index: int, max_length: int) -> pb.DecodingOptions:
    return pb.DecodingOptions(beam_size=1 if index % 2 == 0 else 4, max_length=max_length,
                              return_token_ids=True, return_scores=True)


async def translate(stub: pb_grpc.TranslatorStub, model: str, text: str,
                    options: pb.DecodingOptions, timeout_s: float) -> Answer:
    try:
        reply = await stub.Translate(pb.TranslateRequest(model=model, texts=[text],
                                                         options=options), timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return None
    if len(reply.translations) != 1 or not reply.translations[0].hypotheses:
        return None
    best = reply.translations[0].hypotheses[0]
    return tuple(best.token_ids), best.score


async def soak(target: str, model: str, texts: list[str], concurrency: int, max_length: int,
               timeout_s: float, seed: int) -> tuple[list[Answer], list[Answer], list[float]]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        alone = [await translate(stub, model, t, options_for(i, max_length), timeout_s)
                 for i, t in enumerate(texts)]
        order = list(range(len(texts)))
        random.Random(seed).shuffle(order)

        async def send(k: int) -> Answer:
            i = order[k]
            return await translate(stub, model, texts[i], options_for(i, max_length), timeout_s)

        run = await closed_loop(send, concurrency, len(texts))
    together: list[Answer] = [None] * len(texts)
    for k, answer in run.answers.items():
        together[order[k]] = answer
    return alone, together, run.latencies


def classify(alone: list[Answer], together: list[Answer]) -> dict[str, int]:
    owner = {a: i for i, a in enumerate(alone) if a is not None}
    counts = {"lost": 0, "mixed": 0, "batch_dependent": 0, "right": 0}
    for i, answer in enumerate(together):
        if answer is None:
            counts["lost"] += 1
        elif answer == alone[i]:
            counts["right"] += 1
        elif owner.get(answer, i) != i:
            counts["mixed"] += 1
        else:
            counts["batch_dependent"] += 1
    return counts


def run(texts: list[str], *, models_dir: Path | None = None, model: str = "",
        concurrency: int = 64, max_length: int = 128, timeout_s: float = 300.0,
        seed: int = 0, settings: dict[str, str] | None = None) -> SoakReport:
    """Texts must be distinct (a repeated text would count as mixed up)."""
    if len(set(texts)) != len(texts):
        raise ValueError("texts must be distinct")
    start = time.perf_counter()
    with served(models_dir, settings=settings) as (proc, target), RssSampler(proc.pid) as rss:
        alone, together, latencies = asyncio.run(
            soak(target, model, texts, concurrency, max_length, timeout_s, seed))
    if any(a is None for a in alone):
        raise RuntimeError(f"{sum(a is None for a in alone)} texts failed even alone")
    ms = np.array(latencies) * 1000
    return SoakReport(texts=len(texts), concurrency=concurrency, **classify(alone, together),
                      p50_ms=float(np.percentile(ms, 50)), p99_ms=float(np.percentile(ms, 99)),
                      seconds=time.perf_counter() - start, rss_start_mib=rss.samples[0],
                      rss_peak_mib=max(rss.samples), rss_end_mib=rss.samples[-1])


def read_texts(paths: list[Path], count: int) -> list[str]:
    """The first `count` (0: all) distinct lines of `paths`."""
    texts = list(dict.fromkeys(line for path in paths for line in read_sentences(path)))
    return texts[:count] if count else texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.bench.server.soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=Path, action="append", required=True,
                        help="one source text per line (repeatable); repeated lines are "
                        "kept once")
    parser.add_argument("--count", type=int, default=0, help="texts to use (0 = all)")
    parser.add_argument("--quick", action="store_true", help="96 texts (the CI form)")
    parser.add_argument("--models-dir", type=Path, help="default: the shipped models/")
    parser.add_argument("--model", default="en-de")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="SETTING=VALUE",
                        help="a server setting (repeatable), e.g. max_running_rows=256 "
                        "for iteration-level batching")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    texts = read_texts(args.texts, 96 if args.quick else args.count)
    report = run(texts, models_dir=args.models_dir, model=args.model,
                 concurrency=args.concurrency, max_length=args.max_length, seed=args.seed,
                 settings=settings)
    print("| texts | concurrency | lost | mixed | batch-dependent | p50 ms | p99 ms | "
          "RSS start / peak / end MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    print(f"| {report.texts} | {report.concurrency} | {report.lost} | {report.mixed} | "
          f"{report.batch_dependent} | {report.p50_ms:.0f} | {report.p99_ms:.0f} | "
          f"{report.rss_start_mib:.0f} / {report.rss_peak_mib:.0f} / "
          f"{report.rss_end_mib:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
