"""Load test: batching off, request-level and iteration-level side by side in one run.

    python -m seq2serve.bench.server.load --texts data/ddtp/en-de/test.src \
        --modes iteration,request,off --beams 1,4 --concurrency 8,32,64 \
        --rates auto --requests 256 --json load.json

Each mode is a fresh `seq2serve serve` on loopback (bench/server/serving.py), with a
metrics port:

- `off`: SEQ2SERVE_MAX_BATCH_SIZE=1, one text at a time;
- `request`: SEQ2SERVE_MAX_RUNNING_ROWS=0, a batch runs to its end before the next;
- `iteration`: SEQ2SERVE_MAX_RUNNING_ROWS=256 (`--iteration-rows`), new work joins
  the running batch at step boundaries.

Workloads (the loops of bench/server/clients.py), for each decoding in `--beams`
(1 is greedy):

- closed loop: N clients, each sends its next request when its last one is answered;
- open loop: Poisson arrivals at R requests/s (exponential inter-arrival times
  from a numpy Generator seeded by `--seed`), each arrival its own task whether
  or not earlier ones were answered. `--rates auto` takes `--fractions` (0.3, 0.5,
  0.7, 0.9) of the saturation throughput: the requests/s of `iteration` mode's
  closed loop at the highest concurrency, per decoding. The same absolute rates
  are offered to every mode, so `auto` runs `iteration` first.

Every level is bounded: at most `--requests` requests, none sent after
`--level-seconds`, and what is still unanswered `--drain-seconds` later is
cancelled and reported as `unfinished` (an overloaded mode shows up there, not
as an endless run). Throughput counts answered requests over the time from the
first send to the last answer.

Every request is one text (texts cycle through `--texts`, shuffled by `--seed`
so that lengths mix) sent with TranslateStream. Latency is the time to the
final chunk. Time to first token (TTFT) is the time to the first chunk with a
non-empty `text_delta`, or to the final chunk if that comes first: with greedy
decoding that is the first generated token; beam search streams per finished
sentence, so for beam it is the time to the first finished sentence of the text
(the whole answer for a one-sentence text). Tokens are the best hypothesis's
token ids (EOS not counted). Decoder rows per step (occupancy) is the mean of the
server's `seq2serve_decoder_rows` histogram over the level: /metrics scraped
before and after it, (sum after - sum before) / (count after - count before).

`--pairs de-en,de-fr` asks by language instead of by model (the request names
`source_language` and `target_language`, as LibreTranslate's clients do), each pair
in turn on the same server and the same texts (so they must share a source
language): a pair without a direct model is served through English, which is how
a chained request's cost is set beside a direct one's. Tokens are then the last
leg's.

Prints one Markdown table; `--json` writes the records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from seq2serve.bench.inputs import numbers, read_sentences
from seq2serve.bench.server.clients import Run, closed_loop, open_loop
from seq2serve.bench.server.serving import free_port, served
from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.config import MAX_BEAM_SIZE

MODES: dict[str, dict[str, str]] = {
    "off": {"max_batch_size": "1"},
    "request": {"max_running_rows": "0"},
    "iteration": {"max_running_rows": "256", "max_running_beam": str(MAX_BEAM_SIZE)},
}
ROWS_METRIC = "seq2serve_decoder_rows"
WARMUP_REQUESTS = 4  # per server and decoding, before anything is measured


@dataclass
class Outcome:
    """What the client saw of one request."""

    latency_s: float
    ttft_s: float
    tokens: int


@dataclass
class Record:
    mode: str
    target: str  # the model, or the language pair asked for (--pairs)
    beam: int
    workload: str  # "closed" or "poisson"
    level: float  # clients (closed) or offered requests/s (poisson)
    sent: int
    completed: int
    unfinished: int  # cancelled at the level's time limit
    errors: int
    wall_s: float
    requests_per_second: float
    tokens_per_second: float
    p50_ms: float
    p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    rows_per_step: float  # mean decoder rows per step during the level (nan: no step)

    @property
    def decoding(self) -> str:
        return "greedy" if self.beam == 1 else f"beam {self.beam}"


# -- pure parts (unit-tested) -------------------------------------------------------------

def arrival_times(rate: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """Seconds from the start at which each of `count` Poisson arrivals at `rate`/s
    comes: the running sum of exponential gaps with mean 1/rate, strictly increasing."""
    if rate <= 0 or count < 0:
        raise ValueError(f"rate must be > 0 and count >= 0, got {rate} and {count}")
    gaps = rng.exponential(1.0 / rate, count)
    # A zero gap (probability 2**-53 per draw) would make two arrivals one.
    return np.cumsum(np.maximum(gaps, np.finfo(np.float64).tiny))


def histogram_totals(exposition: str, name: str) -> tuple[float, float]:
    """(sum, count) of histogram `name` over all its label sets in /metrics text."""
    total = count = 0.0
    for family in text_string_to_metric_families(exposition):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    return total, count


def mean_between(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The mean of the observations made between two (sum, count) readings."""
    observations = after[1] - before[1]
    return (after[0] - before[0]) / observations if observations > 0 else float("nan")


def auto_rates(saturation: float, fractions: Sequence[float]) -> list[float]:
    return [round(saturation * f, 3) for f in fractions if saturation * f > 0]


def summarize(mode: str, target: str, beam: int, workload: str, level: float,
              run: Run[Outcome], rows_per_step: float) -> Record:
    outcomes = list(run.answers.values())
    latency = np.array([o.latency_s for o in outcomes]) * 1000
    ttft = np.array([o.ttft_s for o in outcomes]) * 1000

    def pct(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) if len(values) else float("nan")

    wall = max(run.seconds, 1e-9)
    return Record(mode, target, beam, workload, level, run.sent, len(outcomes), run.unfinished,
                  run.errors, run.seconds, len(outcomes) / wall,
                  sum(o.tokens for o in outcomes) / wall, pct(latency, 50), pct(latency, 99),
                  pct(ttft, 50), pct(ttft, 99), rows_per_step)


def table(records: Sequence[Record]) -> str:
    """Markdown, the modes of one decoding and workload level next to each other."""
    order = {m: i for i, m in enumerate(MODES)}
    rows = sorted(records, key=lambda r: (r.beam, r.workload, r.level, order[r.mode],
                                          r.target))
    lines = ["| decoding | workload | mode | model or pair | done/sent | requests/s | tokens/s "
             "| p50 ms | p99 ms | TTFT p50 ms | TTFT p99 ms | rows/step |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        workload = (f"closed {r.level:g} clients" if r.workload == "closed"
                    else f"Poisson {r.level:g}/s")
        lines.append(
            f"| {r.decoding} | {workload} | {r.mode} | {r.target} | {r.completed}/{r.sent} "
            f"| {r.requests_per_second:.2f} | {r.tokens_per_second:.1f} | {r.p50_ms:.0f} "
            f"| {r.p99_ms:.0f} | {r.ttft_p50_ms:.0f} | {r.ttft_p99_ms:.0f} "
            f"| {r.rows_per_step:.1f} |")
    return "\n".join(lines)


# -- talking to a server ------------------------------------------------------------------

@dataclass
class Target:
    """What every request of a level asks for: a model, or a language pair."""

    model: str
    texts: list[str]
    options: pb.DecodingOptions
    pair: tuple[str, str] | None = None  # (source, target) languages instead of a model

    @property
    def label(self) -> str:
        return f"{self.pair[0]}-{self.pair[1]}" if self.pair else self.model

    def request(self, text: str) -> pb.TranslateRequest:
        if self.pair:
            return pb.TranslateRequest(texts=[text], source_language=self.pair[0],
                                       target_language=self.pair[1], options=self.options)
        return pb.TranslateRequest(model=self.model, texts=[text], options=self.options)


async def one_request(stub: pb_grpc.TranslatorStub, target: Target, text: str,
                      timeout_s: float) -> Outcome:
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    call = stub.TranslateStream(target.request(text), timeout=timeout_s)
    async for chunk in call:
        if first is None and (chunk.text_delta or chunk.final):
            first = time.perf_counter() - start
        if chunk.final:
            tokens = len(chunk.translation.hypotheses[0].token_ids)
    latency = time.perf_counter() - start
    return Outcome(latency, latency if first is None else first, tokens)


def pick_model(listed: pb.ListModelsResponse) -> str:
    """en-de when the server has it (the shipped default), else its only translation
    model; several others need --model."""
    names = [m.name for m in listed.models if m.task == "translate"]
    if "en-de" in names:
        return "en-de"
    if len(names) != 1:
        raise SystemExit(f"--model: the server has {len(names)} translation models "
                         f"({', '.join(names)}); name one")
    return names[0]


def scrape(url: str) -> tuple[float, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return histogram_totals(response.read().decode(), ROWS_METRIC)


@dataclass
class Plan:
    beams: list[int]
    concurrency: list[int]
    rates: list[float] | None  # None: auto, from iteration's saturation
    fractions: list[float]
    requests: int
    level_s: float
    drain_s: float
    seed: int
    max_length: int


async def run_mode(mode: str, grpc_target: str, metrics_url: str, model: str,
                   texts: list[str], plan: Plan, saturation: dict[tuple[str, int], float],
                   pairs: Sequence[tuple[str, str]] = ()) -> list[Record]:
    """Every (target, decoding, workload, level) on one server: the model, or each
    language pair. Fills `saturation` in iteration mode and reads it in the others
    when rates are auto."""
    records = []
    async with grpc.aio.insecure_channel(grpc_target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        if not pairs:
            model = model or pick_model(await stub.ListModels(pb.ListModelsRequest()))
        for pair, beam in [(p, b) for p in (pairs or [None]) for b in plan.beams]:
            target = Target(model, texts, pb.DecodingOptions(
                beam_size=beam, max_length=plan.max_length, return_token_ids=True), pair)
            key = (target.label, beam)
            for text in texts[:WARMUP_REQUESTS]:
                await one_request(stub, target, text, plan.level_s + plan.drain_s)

            async def send(i: int, target: Target = target) -> Outcome:
                return await one_request(stub, target, target.texts[i % len(target.texts)],
                                         plan.level_s + plan.drain_s)

            for clients in plan.concurrency:
                before = scrape(metrics_url)
                run = await closed_loop(send, clients, plan.requests, plan.level_s,
                                        plan.drain_s, failures=(grpc.RpcError,))
                record = summarize(mode, target.label, beam, "closed", clients, run,
                                   mean_between(before, scrape(metrics_url)))
                _progress(record)
                records.append(record)
            if mode == "iteration" and records:
                top = [r for r in records if (r.target, r.beam) == key
                       and r.workload == "closed"]
                if top:
                    saturation[key] = max(top, key=lambda r: r.level).requests_per_second
            rates = plan.rates
            if rates is None:
                rates = auto_rates(saturation.get(key, 0.0), plan.fractions)
            for k, rate in enumerate(rates):
                # Same seed per (decoding, rate) in every mode: the same arrival schedule.
                rng = np.random.default_rng([plan.seed, beam, k])
                before = scrape(metrics_url)
                run = await open_loop(send, arrival_times(rate, plan.requests, rng),
                                      plan.level_s, plan.drain_s, failures=(grpc.RpcError,))
                record = summarize(mode, target.label, beam, "poisson", rate, run,
                                   mean_between(before, scrape(metrics_url)))
                _progress(record)
                records.append(record)
    return records


def _progress(record: Record) -> None:
    print(json.dumps(asdict(record)), file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.bench.server.load",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-dir", type=Path, help="default: the shipped models/")
    parser.add_argument("--model", default="",
                        help="model name (default: en-de when served, else the only "
                        "translation model)")
    parser.add_argument("--pairs", default="",
                        help="comma-separated language pairs (de-en,de-fr) to ask for by "
                        "language instead of --model, each in turn on the same texts: a pair "
                        "with no direct model is served through English")
    parser.add_argument("--texts", type=Path, required=True, help="one source text per line")
    parser.add_argument("--modes", default="iteration,request,off",
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--beams", type=numbers(int), default="1,4",
                        help="beam widths (1: greedy)")
    parser.add_argument("--concurrency", type=numbers(int), default="8,32,64",
                        help="closed-loop client counts")
    parser.add_argument("--rates", default="auto",
                        help="Poisson arrival rates in requests/s, or 'auto' (fractions of "
                        "iteration mode's closed-loop throughput at the highest concurrency), "
                        "or '' for none")
    parser.add_argument("--fractions", type=numbers(float), default="0.3,0.5,0.7,0.9",
                        help="for --rates auto")
    parser.add_argument("--requests", type=int, default=256, help="at most, per level")
    parser.add_argument("--level-seconds", type=float, default=120.0,
                        help="no request is sent later than this into a level")
    parser.add_argument("--drain-seconds", type=float, default=60.0,
                        help="then unanswered requests get this long before they are cancelled")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iteration-rows", type=int, default=256,
                        help="max_running_rows of the iteration mode")
    parser.add_argument("--set", action="append", default=[], metavar="SETTING=VALUE",
                        help="a server setting for every mode (repeatable), e.g. threads=1; "
                        "the modes' own settings win")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.set)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes must be some of {', '.join(MODES)}, got {args.modes!r}")
    auto = args.rates.strip() == "auto"
    if auto and "iteration" not in modes:
        parser.error("--rates auto needs the iteration mode (its saturation sets the rates)")
    if auto:  # the rates come from iteration's closed loop
        modes = ["iteration"] + [m for m in modes if m != "iteration"]
    plan = Plan(beams=args.beams, concurrency=args.concurrency,
                rates=None if auto else numbers(float)(args.rates),
                fractions=args.fractions, requests=args.requests,
                level_s=args.level_seconds, drain_s=args.drain_seconds, seed=args.seed,
                max_length=args.max_length)
    if auto and not plan.concurrency:
        parser.error("--rates auto needs a closed-loop level (--concurrency)")
    pairs = [tuple(p.strip().split("-")) for p in args.pairs.split(",") if p.strip()]
    if any(len(p) != 2 or not all(p) for p in pairs) or len({p[0] for p in pairs}) > 1:
        parser.error("--pairs must be SOURCE-TARGET language pairs with one source language "
                     f"(the texts'), got {args.pairs[:80]!r}")
    if pairs and args.model:
        parser.error("--pairs and --model: name one")
    lines = read_sentences(args.texts)
    if not lines:
        parser.error(f"{args.texts} holds no text")
    texts = [lines[i] for i in np.random.default_rng(args.seed).permutation(len(lines))]

    records: list[Record] = []
    saturation: dict[tuple[str, int], float] = {}
    for mode in modes:
        metrics_port = free_port()
        own = MODES[mode]
        if mode == "iteration":
            own = {**own, "max_running_rows": str(args.iteration_rows)}
        settings = {**extra, **own, "metrics_port": str(metrics_port)}
        with served(args.models_dir, settings=settings) as (_, target):
            records += asyncio.run(run_mode(
                mode, target, f"http://127.0.0.1:{metrics_port}/metrics", args.model, texts,
                plan, saturation, [(p[0], p[1]) for p in pairs]))
    print(table(records))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in records], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
