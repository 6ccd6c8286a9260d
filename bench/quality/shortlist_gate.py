"""`seq2serve shortlist-gate PACKAGE DATA...`: may the vocabulary shortlist be on by default?

Decodes the test split of each corpus directory with the package twice through
the serving engine (beam 4, as the server decodes by default): over the whole
vocabulary and over the shortlist, and reports for each split sacreBLEU's BLEU
and chrF of both and the share of outputs that are identical. The shortlist
passes a split when neither score drops by more than 0.2 and at least 97% of the
outputs are identical (issue 35); it may be the package's default
(`seq2serve export --shortlist-default`) only when it passes every split of
every pair served.

`--first/--best/--threshold` try other settings on the package's table without
re-exporting (Marian's `first best prune`); `--cache DIR` keeps the
full-vocabulary outputs between runs (keyed by the package's digest, the split
and the options), so tuning decodes only the shortlist side again.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.shortlist import ShortlistSettings
from seq2serve.server.assembly import default_limits

# Issue 35's bar for turning the shortlist on by default.
MAX_SCORE_DROP = 0.2
MIN_IDENTICAL = 0.97


@dataclasses.dataclass(frozen=True)
class SplitResult:
    data: str
    segments: int
    bleu_full: float
    bleu_shortlist: float
    chrf_full: float
    chrf_shortlist: float
    identical: float  # share of outputs equal to the full-vocabulary ones
    candidates: float  # mean candidates per sentence

    @property
    def passed(self) -> bool:
        return (self.bleu_full - self.bleu_shortlist <= MAX_SCORE_DROP
                and self.chrf_full - self.chrf_shortlist <= MAX_SCORE_DROP
                and self.identical >= MIN_IDENTICAL)


def read_test(data: Path, limit: int) -> tuple[list[str], list[str]]:
    sides = []
    for ext in ("src", "tgt"):
        lines = (data / f"test.{ext}").read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        sides.append(lines[:limit] if limit else lines)
    if len(sides[0]) != len(sides[1]):
        raise ValueError(f"{data}: test.src and test.tgt differ in length")
    return sides[0], sides[1]


def decode(engine: Any, ids: Sequence[Sequence[int]], shortlist: bool, beam: int,
           batch_size: int) -> list[list[int]]:
    """Each source's best hypothesis' ids, decoded in length-sorted batches."""
    from seq2serve.server.core.options import DecodingOptions

    options = engine.resolve(DecodingOptions(beam_size=beam, num_hypotheses=1,
                                             max_length_ratio=2.0, max_length=256,
                                             shortlist=shortlist))
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: dict[int, list[int]] = {}
    for k in range(0, len(order), batch_size):
        chunk = order[k:k + batch_size]
        for i, result in zip(chunk, engine.generate([ids[i] for i in chunk], options),
                             strict=True):
            out[i] = list(result[0].token_ids)
    return [out[i] for i in range(len(ids))]


def gate(package_dir: Path, data_dirs: Sequence[Path], *, beam: int = 4,
         max_sentences: int = 0, batch_size: int = 32, threads: int = 1,
         settings: ShortlistSettings | None = None, cache: Path | None = None,
         progress: bool = True) -> list[SplitResult]:
    from sacrebleu import BLEU, CHRF

    from seq2serve.model.package.tokenizer import package_tokenizer
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    package = load_package(package_dir)
    if package.manifest.shortlist is None:
        raise ValueError(f"{package_dir} has no vocabulary shortlist (export it with "
                         "--shortlist-from)")
    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=threads),
                    default_limits())
    shortlist = engine.runner.shortlist
    assert shortlist is not None
    if settings is not None:
        engine.runner.shortlist = dataclasses.replace(shortlist, settings=settings)
        shortlist = engine.runner.shortlist
    tokenizer = package_tokenizer(package)
    limit = package.manifest.max_source_length
    results = []
    for data in data_dirs:
        sources, references = read_test(data, max_sentences)
        ids = [t if len(t) <= limit else t[:limit - 1] + [tokenizer.eos_id]
               for t in map(tokenizer.encode, sources)]
        key = hashlib.sha256(json.dumps([package.manifest.digest, str(data.resolve()),
                                         len(ids), beam]).encode()).hexdigest()[:16]
        cached = cache / f"full-{key}.json" if cache is not None else None
        if cached is not None and cached.is_file():
            full = json.loads(cached.read_text(encoding="utf-8"))
        else:
            full = decode(engine, ids, False, beam, batch_size)
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps(full), encoding="utf-8")
        short = decode(engine, ids, True, beam, batch_size)
        hyp_full = [tokenizer.decode(t) for t in full]
        hyp_short = [tokenizer.decode(t) for t in short]
        scores = {}
        for name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
            for side, hyps in (("full", hyp_full), ("shortlist", hyp_short)):
                scores[f"{name}_{side}"] = metric.corpus_score(hyps, [references]).score
        result = SplitResult(
            data=str(data), segments=len(ids), **scores,
            identical=float(np.mean([a == b for a, b in zip(full, short, strict=True)])),
            candidates=float(np.mean([shortlist.candidates(s).size for s in ids])))
        if progress:
            print(json.dumps({**dataclasses.asdict(result), "passed": result.passed}),
                  file=sys.stderr, flush=True)
        results.append(result)
    return results


def table(results: Sequence[SplitResult]) -> str:
    lines = ["| test split | sentences | BLEU full | BLEU shortlist | chrF full | "
             "chrF shortlist | identical | candidates | passes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r.data} | {r.segments} | {r.bleu_full:.2f} | {r.bleu_shortlist:.2f} "
                     f"| {r.chrf_full:.2f} | {r.chrf_shortlist:.2f} | {100 * r.identical:.1f}% "
                     f"| {r.candidates:.0f} | {'yes' if r.passed else 'no'} |")
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("package", type=Path, help="a model package with a shortlist "
                        "(format 8)")
    parser.add_argument("data", type=Path, nargs="+", help="corpus directories, each "
                        "with test.src and test.tgt")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-sentences", type=int, default=0,
                        help="the first N of each split (0 = all: the gate's verdict)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--first", type=int, help="try another `first` (default: the "
                        "package's)")
    parser.add_argument("--best", type=int, help="try another `best`")
    parser.add_argument("--threshold", type=float, help="try another `threshold`")
    parser.add_argument("--cache", type=Path, help="keep full-vocabulary outputs here")
    parser.add_argument("--json", type=Path, help="write the results here")


def run(args: argparse.Namespace) -> int:
    settings = None
    spec = load_package(args.package).manifest.shortlist
    if spec is not None and (args.first, args.best, args.threshold) != (None, None, None):
        settings = ShortlistSettings(
            spec.first if args.first is None else args.first,
            spec.best if args.best is None else args.best,
            spec.threshold if args.threshold is None else args.threshold)
        problems = settings.problems()
        if problems:
            print(f"seq2serve shortlist-gate: error: {'; '.join(problems)}", file=sys.stderr)
            return 2
    try:
        results = gate(args.package, args.data, beam=args.beam,
                       max_sentences=args.max_sentences, batch_size=args.batch_size,
                       threads=args.threads, settings=settings, cache=args.cache)
    except (ValueError, OSError) as e:
        print(f"seq2serve shortlist-gate: error: {e}", file=sys.stderr)
        return 2
    print(table(results))
    passed = all(r.passed for r in results)
    whole = not args.max_sentences
    print(f"\n{'PASS' if passed else 'FAIL'}: the shortlist "
          f"{'may' if passed and whole else 'may not'} be on by default"
          + ("" if whole else " (a capped run decides nothing)"))
    if args.json:
        used = settings or (ShortlistSettings(spec.first, spec.best, spec.threshold)
                            if spec is not None else None)
        args.json.write_text(json.dumps({
            "package": str(args.package), "beam": args.beam,
            "max_sentences": args.max_sentences,
            "settings": dataclasses.asdict(used) if used is not None else None,
            "passed": passed,
            "splits": [{**dataclasses.asdict(r), "passed": r.passed} for r in results]},
            indent=2) + "\n", encoding="utf-8")
    return 0 if passed else 1
