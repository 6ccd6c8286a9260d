"""Load test: throughput and latency of a running seq2serve server under N
concurrent clients, with dynamic batching on and off.

    python -m seq2serve.bench.load --models-dir models --texts data/ddtp/en-de/test.src \
        --concurrency 1,8,32,64 --unbatched 32 --requests 256 --json load.json

Starts `seq2serve serve` itself (once with the configured batching, once with
--max-batch-size 1 for the unbatched levels) on loopback, sends one text per
request from an asyncio gRPC client, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import grpc
import numpy as np

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

from .serving import served


async def run_level(target: str, model: str, texts: list[str], concurrency: int,
                    requests: int, options: pb.DecodingOptions) -> dict[str, float]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        for text in texts[:concurrency]:  # warm-up, also fills the connection
            await stub.Translate(pb.TranslateRequest(model=model, texts=[text],
                                                     options=options))
        counter = itertools.count()
        latencies: list[float] = []
        tokens = 0

        async def client() -> None:
            nonlocal tokens
            while (i := next(counter)) < requests:
                start = time.perf_counter()
                reply = await stub.Translate(pb.TranslateRequest(
                    model=model, texts=[texts[i % len(texts)]], options=options))
                latencies.append(time.perf_counter() - start)
                tokens += len(reply.translations[0].hypotheses[0].token_ids) + 1  # + EOS

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    ms = np.array(latencies) * 1000
    return {"requests_per_second": requests / wall, "tokens_per_second": tokens / wall,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": statistics.fmean(ms)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-dir", type=Path, help="default: the shipped models/")
    parser.add_argument("--model", default="", help="model name (default: the only "
                        "translation model)")
    parser.add_argument("--texts", type=Path, required=True, help="one source text per line")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--unbatched", default="32",
                        help="concurrency levels to repeat with --max-batch-size 1")
    parser.add_argument("--requests", type=int, default=256, help="requests per level")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--port", type=int, default=50151)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    texts = [t for t in args.texts.read_text(encoding="utf-8").splitlines() if t.strip()]
    options = pb.DecodingOptions(beam_size=args.beam, max_length=args.max_length,
                                 return_token_ids=True)
    plans = [(args.max_batch_size, [int(c) for c in args.concurrency.split(",") if c]),
             (1, [int(c) for c in args.unbatched.split(",") if c])]
    records = []
    for max_batch, levels in plans:
        if not levels:
            continue
        with served(args.models_dir, args.port,
                    {"max_batch_size": str(max_batch), "provider": args.provider}) as (_, target):
            for level in levels:
                result = asyncio.run(run_level(target, args.model, texts, level, args.requests,
                                               options))
                record = {"concurrency": level, "max_batch_size": max_batch, **result}
                records.append(record)
                print(json.dumps(record), file=sys.stderr)
    print("| concurrency | max batch | requests/s | tokens/s | p50 ms | p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in records:
        print(f"| {r['concurrency']} | {r['max_batch_size']} | {r['requests_per_second']:.2f} "
              f"| {r['tokens_per_second']:.1f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
