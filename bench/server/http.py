"""seq2serve's HTTP API beside LibreTranslate's, through the same LibreTranslate API.

    python -m seq2serve.bench.server.http --texts data/messages/en-de/test.src \
        --concurrency 1,8,32,64 --batch 1,16 --requests 512 --json http.json

Starts both servers on 127.0.0.1 on the same model (the shipped en-de: seq2serve
serves models/en-de with its cache off, so that every text is translated;
LibreTranslate an Argos package made from the same checkpoint,
bench/server/libretranslate_peer.py, at `--lt-inter-threads` x `--lt-intra-threads`),
or takes running ones with `--seq2serve URL` / `--libretranslate URL`. The
systems: `seq2serve` (its HTTP API), `seq2serve-grpc` (the same server's gRPC
Translate, for what HTTP costs) and `libretranslate`. One closed-loop load
generator (bench/server/clients.py) drives them all: N clients, each sending its
next `POST /translate` (`q` a list of `--batch` texts, source en, target de) when
the last one is answered. Levels run
round robin over the systems, `--repeats` times; the table shows medians.
Every level is bounded: at most `--requests` requests, none sent after
`--level-seconds`.

Reported per system and level: requests/s, texts/s, p50/p99 latency; and how
many of the first `--agree` texts both translate identically (alone, `q` one
text, beam 4 on both sides).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np

from seq2serve.bench.inputs import numbers, read_sentences
from seq2serve.bench.server.clients import closed_loop
from seq2serve.bench.server.libretranslate_peer import PeerSettings, libretranslate
from seq2serve.bench.server.serving import free_port, served
from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Level:
    system: str
    batch: int
    clients: int
    requests: int
    errors: int
    seconds: float
    requests_per_s: float
    texts_per_s: float
    p50_ms: float
    p99_ms: float


class Target:
    """One system under load: sends a list of English texts, returns German ones."""

    def __init__(self, name: str, url: str, clients: int) -> None:
        self.name, self.url, self.clients = name, url, clients

    async def __aenter__(self) -> Target:
        if self.url.startswith("grpc://"):
            self.channel = grpc.aio.insecure_channel(self.url.removeprefix("grpc://"))
            self.stub = pb_grpc.TranslatorStub(self.channel)
        else:
            limits = httpx.Limits(max_connections=self.clients,
                                  max_keepalive_connections=self.clients)
            self.http = httpx.AsyncClient(base_url=self.url, limits=limits, timeout=120.0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.url.startswith("grpc://"):
            await self.channel.close()
        else:
            await self.http.aclose()

    async def translate(self, texts: Sequence[str]) -> list[str]:
        if self.url.startswith("grpc://"):
            answer = await self.stub.Translate(pb.TranslateRequest(
                texts=list(texts), source_language="en", target_language="de"))
            return [t.hypotheses[0].text for t in answer.translations]
        response = await self.http.post("/translate", json={
            "q": list(texts), "source": "en", "target": "de", "format": "text"})
        response.raise_for_status()
        translated = response.json()["translatedText"]
        if not isinstance(translated, list) or len(translated) != len(texts):
            raise RuntimeError(f"{self.url} answered {str(translated)[:80]} for "
                               f"{len(texts)} texts")
        return [str(t) for t in translated]


# What a failed request raises: a transport error, an error status, a malformed answer.
FAILURES = (httpx.HTTPError, grpc.RpcError, RuntimeError, KeyError, ValueError)


async def measure_level(system: str, url: str, texts: Sequence[str], batch: int,
                        clients: int, max_requests: int, max_seconds: float) -> Level:
    """One closed-loop level (bench/server/clients.py): request i sends the `batch`
    texts from text i * batch on; seconds run from the first send to the last answer."""
    async with Target(system, url, clients) as target:

        async def send(i: int) -> None:
            await target.translate([texts[(i * batch + j) % len(texts)] for j in range(batch)])

        run = await closed_loop(send, clients, max_requests, max_seconds, failures=FAILURES)
    done, seconds = len(run.answers), max(run.seconds, 1e-9)
    lat = np.array(run.latencies or [float("nan")]) * 1000
    return Level(system=system, batch=batch, clients=clients, requests=done, errors=run.errors,
                 seconds=round(run.seconds, 3), requests_per_s=round(done / seconds, 2),
                 texts_per_s=round(done * batch / seconds, 2),
                 p50_ms=round(float(np.percentile(lat, 50)), 1),
                 p99_ms=round(float(np.percentile(lat, 99)), 1))


async def agreement(urls: dict[str, str], texts: Sequence[str]) -> tuple[int, int]:
    """How many texts every system translates identically, each text alone."""
    answers = {}
    for name, url in urls.items():
        async with Target(name, url, 1) as target:
            answers[name] = [(await target.translate([t]))[0] for t in texts]
    columns = list(answers.values())
    same = sum(len({column[i] for column in columns}) == 1 for i in range(len(texts)))
    return same, len(texts)


def medians(levels: Sequence[Level]) -> list[Level]:
    groups: dict[tuple[str, int, int], list[Level]] = {}
    for level in levels:
        groups.setdefault((level.system, level.batch, level.clients), []).append(level)
    out = []
    for runs in groups.values():
        med = {name: statistics.median(getattr(r, name) for r in runs)
               for name in ("requests", "errors", "seconds", "requests_per_s", "texts_per_s",
                            "p50_ms", "p99_ms")}
        out.append(Level(system=runs[0].system, batch=runs[0].batch, clients=runs[0].clients,
                         requests=int(med["requests"]), errors=int(med["errors"]),
                         seconds=med["seconds"], requests_per_s=med["requests_per_s"],
                         texts_per_s=med["texts_per_s"], p50_ms=med["p50_ms"],
                         p99_ms=med["p99_ms"]))
    return out


def table(levels: Sequence[Level], reference: str = "seq2serve") -> str:
    rows = ["| q | clients | system | requests/s | texts/s | p50 ms | p99 ms | errors | "
            "texts/s vs others |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    by_level: dict[tuple[int, int], dict[str, Level]] = {}
    for level in levels:
        by_level.setdefault((level.batch, level.clients), {})[level.system] = level
    for (batch, clients), systems in sorted(by_level.items()):
        ours = systems.get(reference)
        for name, level in sorted(systems.items()):
            ratio = ""
            if ours is not None and name != reference and level.texts_per_s > 0:
                ratio = f"{reference} {ours.texts_per_s / level.texts_per_s:.2f}x"
            rows.append(f"| {batch} | {clients} | {name} | {level.requests_per_s:.1f} | "
                        f"{level.texts_per_s:.1f} | {level.p50_ms:.0f} | {level.p99_ms:.0f} | "
                        f"{level.errors} | {ratio} |")
    return "\n".join(rows)


async def run(urls: dict[str, str], texts: Sequence[str], batches: Sequence[int],
              concurrency: Sequence[int], repeats: int, max_requests: int,
              max_seconds: float) -> list[Level]:
    levels = []
    names = list(urls)
    for repeat in range(repeats):
        for batch in batches:
            for clients in concurrency:
                order = names if repeat % 2 == 0 else names[::-1]  # round robin
                for name in order:
                    measured = await measure_level(name, urls[name], texts, batch, clients,
                                                   max_requests, max_seconds)
                    print(f"  {asdict(measured)}", file=sys.stderr, flush=True)
                    levels.append(measured)
    return levels


@contextmanager
def peers(seq2serve: str | None, libre: str | None, checkpoint: Path, models_dir: Path | None,
          work: Path, settings: PeerSettings) -> Iterator[dict[str, str]]:
    """The systems' URLs: seq2serve over HTTP and over gRPC (one server), LibreTranslate;
    those not given are started here, on the same model, and stopped on the way out."""
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        if seq2serve is None:
            if models_dir is None:  # the shipped en-de alone
                models_dir = work / "models"
                models_dir.mkdir(parents=True, exist_ok=True)
                link = models_dir / "en-de"
                if not link.exists():
                    link.symlink_to(Path("models/en-de").resolve())
            http_port = free_port()
            _, target = stack.enter_context(served(models_dir, settings={
                "http_port": str(http_port), "cache_mb": "0"}))
            urls["seq2serve"] = f"http://127.0.0.1:{http_port}"
            urls["seq2serve-grpc"] = f"grpc://{target}"
        else:
            urls["seq2serve"] = seq2serve
        urls["libretranslate"] = libre or stack.enter_context(
            libretranslate(checkpoint, work / "libretranslate", settings=settings))
        yield urls


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.bench.server.http",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=Path, required=True, help="English sentences, one a line")
    parser.add_argument("--seq2serve", help="a running seq2serve HTTP API (else one is started)")
    parser.add_argument("--libretranslate", help="a running LibreTranslate (else one is started)")
    parser.add_argument("--checkpoint", type=Path, default=Path("models/checkpoints/en-de"),
                        help="LibreTranslate's model is made from this checkpoint")
    parser.add_argument("--models-dir", type=Path, default=None,
                        help="seq2serve's packages (default: the shipped models/)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/seq2serve-bench-http"))
    parser.add_argument("--concurrency", type=numbers(int), default=[1, 8, 32, 64])
    parser.add_argument("--batch", type=numbers(int), default=[1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--level-seconds", type=float, default=20.0)
    parser.add_argument("--agree", type=int, default=100)
    parser.add_argument("--lt-inter-threads", type=int, default=2,
                        help="LibreTranslate translations at once (ARGOS_INTER_THREADS); "
                        "2 x 1 thread is its best setting on 2 cores")
    parser.add_argument("--lt-intra-threads", type=int, default=1,
                        help="threads per LibreTranslate translation (ARGOS_INTRA_THREADS)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    texts = read_sentences(args.texts)
    peer = PeerSettings(inter_threads=args.lt_inter_threads,
                        intra_threads=args.lt_intra_threads)
    with peers(args.seq2serve, args.libretranslate, args.checkpoint, args.models_dir,
               args.work, peer) as urls:
        same, total = asyncio.run(agreement(urls, texts[: args.agree]))
        levels = asyncio.run(run(urls, texts, args.batch, args.concurrency, args.repeats,
                                 args.requests, args.level_seconds))
    result = medians(levels)
    print(table(result))
    print(f"\nidentical translations, each text alone: {same} of {total}")
    if args.json:
        args.json.write_text(json.dumps({"levels": [asdict(x) for x in levels],
                                         "agreement": [same, total]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
