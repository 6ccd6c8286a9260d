"""Quality of model packages through the serving engine (ONNX Runtime).

    python -m seq2serve.bench.quality models/en-de models/en-de-int8 --data data/ddtp/en-de \
        --split valid --beam 4 --json quality.json

Decodes a corpus split with each package exactly as the server would (same
tokenizer, same Engine) and scores it like `seq2serve train --score` does
(sacreBLEU/chrF, or ROUGE for summarization), so precision variants can be
compared: the BLEU change of int8 and fp16 against fp32.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from seq2serve.bench.inputs import source_ids
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import package_tokenizer
from seq2serve.model.train.batching import read_split
from seq2serve.model.train.evaluate import score_with_signatures
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import RunnerConfig
from seq2serve.server.engine.search import Result


def generate_sorted(engine: Engine, ids: Sequence[Sequence[int]], options: DecodingOptions,
                    batch_size: int) -> list[Result]:
    """Each source's n-best, in the order of `ids`, decoded in batches of `batch_size`
    sources sorted by length (as the server's scheduler forms them)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    results: dict[int, Result] = {}
    for k in range(0, len(order), batch_size):
        chunk = order[k:k + batch_size]
        results.update(zip(chunk, engine.generate([ids[i] for i in chunk], options),
                           strict=True))
    return [results[i] for i in range(len(ids))]


def decode(package_dir: Path, sources: list[str], beam: int, threads: int,
           batch_size: int) -> tuple[list[str], float]:
    package = load_package(package_dir)
    tokenizer = package_tokenizer(package)
    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=threads),
                    default_limits())
    ids = source_ids(tokenizer, sources, package.manifest.max_source_length)
    options = DecodingOptions(beam_size=beam, num_hypotheses=1, max_length_ratio=2.0,
                              max_length=256)
    start = time.perf_counter()
    results = generate_sorted(engine, ids, options, batch_size)
    seconds = time.perf_counter() - start
    return [tokenizer.decode(result[0].token_ids) for result in results], seconds


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.bench.quality",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--data", type=Path, required=True, help="corpus directory")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="0 = physical cores")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-sentences", type=int, default=0, help="0 = the whole split")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    corpus = json.loads((args.data / "corpus.json").read_text(encoding="utf-8"))
    sources, references = read_split(args.data, args.split)
    if args.max_sentences:
        sources, references = sources[: args.max_sentences], references[: args.max_sentences]
    records = []
    for package in args.packages:
        hyps, seconds = decode(package, sources, args.beam, args.threads, args.batch_size)
        scores, _ = score_with_signatures(corpus["task"], hyps, references)
        manifest = load_package(package).manifest
        size = sum(f.stat().st_size for f in package.iterdir() if f.is_file())
        records.append({"package": str(package), "precision": manifest.precision,
                        "segments": len(sources), "beam": args.beam,
                        "seconds": round(seconds, 2), **scores,
                        "size_mib": round(size / 2**20, 1)})
        print(json.dumps(records[-1]), file=sys.stderr)
    names = [k for k in records[0] if k not in ("package", "precision", "segments", "beam",
                                                "seconds", "size_mib")]
    print("| package | precision | " + " | ".join(names) + " | seconds |")
    print("|---|---|" + "---:|" * (len(names) + 1))
    for r in records:
        print(f"| {r['package']} | {r['precision']} | "
              + " | ".join(f"{r[n]:.2f}" for n in names) + f" | {r['seconds']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
