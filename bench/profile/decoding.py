"""Where the time of a decoding goes: the encoder, each runner call between steps,
Python, and ONNX Runtime's kernels, on the OPUS-MT shape or on a model package.

    python -m seq2serve.bench.profile --work /tmp/seq2serve-bench --batch-size 16 --beam 4
    python -m seq2serve.bench.profile --package models/en-de --data data/ddtp/en-de \\
        --sentences 256 --batch-size 32 --beam 4 --threads 1
    python -m seq2serve.bench.profile --family nllb --precision int8 --batch-size 16 \\
        --beam 4 --threads 1

The OPUS-MT shape and a `--family` shape (`seq2serve bench --family`, its packages
built or reused under `--work`; a multilingual family's sources with their language
token and the first new token forced to the target's) run `Engine.generate` on the
same random inputs as `seq2serve bench` (exactly `--new-tokens` per source); a
package runs the first
`--sentences` lines of DATA/test.src (only its `sentence` lines when DATA has
test.kind), sorted by length and cut into batches of `--batch-size`, decoding
naturally. Reported:

1. the wall time split into the encoder, each runner call made between decoder
   steps (the decoder graph, select, the cache's move/reorder and resize) and
   the rest (Python and NumPy between steps), from timers around those calls;
2. with `--ctranslate2 DIR` (the package's checkpoint converted by
   `python -m seq2serve.bench.engine.ctranslate2_model`), CTranslate2's whole decoding of
   the same batches at the package's precision and the same beam and threads, in
   the same rounds, beside seq2serve's encoder and decoder graphs alone: the most
   seq2serve could reach against CTranslate2 if nothing at all ran between its
   graph calls (no Python, no select, no cache moves);
3. ONNX Runtime's profiler over the encoder and the decoder graphs: time per
   operator type, grouped, and in the decoder graph the operators whose output
   spans the target vocabulary: the output projection (the matrix product with V
   columns: what a vocabulary shortlist shrinks) and the rest over V rows (bias,
   LogSoftmax), with their share of the whole decoding. The profiler's own cost
   per node inflates small operators; read its shares, not its milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from seq2serve.bench.engine.families import FAMILY_SHAPES, prepare_family
from seq2serve.bench.engine.families import random_sources as family_sources
from seq2serve.bench.engine.families import source_ids as family_ids
from seq2serve.bench.engine.workload import SHAPES, prepare_models, random_sources
from seq2serve.bench.inputs import read_sentences, source_ids
from seq2serve.server.assembly import default_limits

GROUPS = {
    "matrix products": {"MatMul", "Gemm", "FusedMatMul", "MatMulInteger",
                        "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm"},
    "int8 row quantization": {"Abs", "ReduceMax", "QuantizeLinear", "Div", "Max"},
    "copies (cache, heads)": {"Concat", "Gather", "GatherElements", "GatherND", "Split",
                              "Slice", "Transpose", "Expand", "Tile", "ScatterND"},
    "softmax, norm, activations": {"Softmax", "LogSoftmax", "LayerNormalization",
                                   "SkipLayerNormalization", "Relu", "Sigmoid", "Gelu",
                                   "FastGelu", "QuickGelu", "Tanh"},
}
# The runner's calls between decoder steps, timed one by one.
RUNNER_CALLS = {"encode": "encoder", "step": "decoder graph", "top_k": "select (TopK graph)",
                "reorder_cache": "cache rows moved (move/reorder graph)",
                "resize_cache": "cache resized"}


def group_of(op: str) -> str:
    return next((name for name, ops in GROUPS.items() if op in ops), "other")


@contextmanager
def timed_calls(runner: Any) -> Iterator[dict[str, list[float]]]:
    """Wrap the runner's calls with timers; yields {call: [seconds, calls]}. The
    decoder step's time excludes a cache resize it makes (timed on its own)."""
    totals: dict[str, list[float]] = {name: [0.0, 0.0] for name in RUNNER_CALLS}
    originals = {name: getattr(runner, name) for name in RUNNER_CALLS}
    inside: list[str] = []

    def wrap(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            inside.append(name)
            try:
                return call(*args, **kwargs)
            finally:
                inside.pop()
                seconds = time.perf_counter() - start
                totals[name][0] += seconds
                totals[name][1] += 1
                if inside:  # a call made by another timed call: not counted twice
                    totals[inside[-1]][0] -= seconds
        return timed

    for name, call in originals.items():
        setattr(runner, name, wrap(name, call))
    try:
        yield totals
    finally:
        for name in originals:
            delattr(runner, name)  # the instance attribute goes; the method is back


# The decoder graph's operators whose output spans the vocabulary (op_profile's `vocab`).
PROJECTION = "output projection (matrix product to V columns)"
OVER_VOCABULARY = "other operators over V (bias, LogSoftmax, ...)"


def _vocabulary_part(event: dict[str, Any], vocab: int | None) -> str | None:
    """PROJECTION or OVER_VOCABULARY for a node whose first output's last dimension
    is the vocabulary size, else None."""
    if vocab is None:
        return None
    shapes = event["args"].get("output_type_shape") or [{}]
    dims = next(iter(shapes[0].values()), [])
    if not dims or dims[-1] != vocab:
        return None
    return PROJECTION if group_of(event["args"]["op_name"]) == "matrix products" \
        else OVER_VOCABULARY


def op_profile(path: Path, threads: int, run: Callable[[Any], None],
               vocab: int | None = None) -> dict[str, Any]:
    """ONNX Runtime's profiler over one graph: `run(session)` puts the profiled
    session in place and decodes. Returns microseconds by operator and in all,
    and with `vocab` (the target vocabulary size) those of the operators whose
    output spans it (`by_vocabulary_part`: PROJECTION, OVER_VOCABULARY)."""
    from seq2serve.bench.engine.systems import cpu_session

    with tempfile.TemporaryDirectory() as tmp:
        session = cpu_session(path, threads, profile_prefix=str(Path(tmp) / path.stem))
        run(session)
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    by_part: dict[str, float] = {PROJECTION: 0.0, OVER_VOCABULARY: 0.0} if vocab else {}
    runs, run_us = 0, 0.0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
            part = _vocabulary_part(event, vocab)
            if part is not None:
                by_part[part] += event["dur"]
        elif event.get("cat") == "Session" and event["name"] == "model_run":
            run_us += event["dur"]
            runs += 1
    return {"runs": runs, "model_run_us": run_us, "by_op": dict(by_op),
            "vocab": vocab, "by_vocabulary_part": by_part}


def print_op_profile(name: str, profile: dict[str, Any]) -> None:
    run_us = profile["model_run_us"] or 1.0
    by_op: dict[str, float] = profile["by_op"]
    by_group: dict[str, float] = defaultdict(float)
    for op, us in by_op.items():
        by_group[group_of(op)] += us
    by_group["ONNX Runtime between kernels"] = max(run_us - sum(by_op.values()), 0.0)
    print(f"\n{name} under ONNX Runtime's profiler: {run_us / 1e3:.1f} ms in "
          f"{profile['runs']} runs\n\n| group | share |\n|---|---:|")
    for group, us in sorted(by_group.items(), key=lambda kv: -kv[1]):
        print(f"| {group} | {us / run_us:.1%} |")
    print("\n| operator | share |\n|---|---:|")
    for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| {op} | {us / run_us:.1%} |")
    if profile.get("by_vocabulary_part"):
        print(f"\n| over the {profile['vocab']}-row vocabulary | share of the graph |\n"
              "|---|---:|")
        for part, us in profile["by_vocabulary_part"].items():
            print(f"| {part} | {us / run_us:.1%} |")


def workload(args: argparse.Namespace
             ) -> tuple[Path, list[list[list[int]]], Any, str, int | None]:
    """(package, batches of token ids, decoding options, a description, every
    source's forced first token or None)."""
    from seq2serve.model.package.manifest import load_package
    from seq2serve.model.package.tokenizer import package_tokenizer
    from seq2serve.server.core.options import DecodingOptions

    exact = DecodingOptions(beam_size=args.beam, num_hypotheses=1,
                            max_length=args.new_tokens, min_length=args.new_tokens)
    if args.family is not None:
        family = FAMILY_SHAPES[args.family]
        models = prepare_family(args.work, family, 0, {args.precision}, ctranslate2=False)
        ids = family_ids(models.marian, family)
        sources = family_sources(ids, args.batch_size, args.source_length, 0)
        return (models.packages[args.precision], [sources], exact,
                f"{family.name} shape, {args.precision}, batch {args.batch_size}, "
                f"{args.new_tokens} new tokens", ids.target)
    if args.package is None:
        shape = SHAPES["opus-mt"]
        models = prepare_models(args.work, shape, 0, {args.precision}, ctranslate2=False)
        sources = random_sources(shape, args.batch_size, args.source_length, 0)
        return (models.packages[args.precision], [sources], exact,
                f"OPUS-MT shape, {args.precision}, batch {args.batch_size}, "
                f"{args.new_tokens} new tokens", None)
    package = load_package(args.package)
    # DDTP's test split also holds whole descriptions: its sentence lines only.
    texts = read_sentences(args.data, args.sentences,
                           only_sentences=(args.data / "test.kind").is_file())
    ids = sorted(source_ids(package_tokenizer(package), texts,
                            package.manifest.max_source_length), key=len)
    batches = [ids[i:i + args.batch_size] for i in range(0, len(ids), args.batch_size)]
    return (args.package, batches, DecodingOptions(beam_size=args.beam),
            f"{package.manifest.name} ({package.manifest.precision}), {len(ids)} sentences "
            f"of {args.data} by length, batch {args.batch_size}", None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.bench.profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir())
                        / "seq2serve-bench", help="model cache shared with seq2serve bench")
    parser.add_argument("--package", type=Path, help="a model package (else the OPUS-MT shape)")
    parser.add_argument("--family", choices=sorted(FAMILY_SHAPES), default=None,
                        help="instead of the OPUS-MT shape: a Hugging Face family's shape "
                        "(seq2serve bench --family), exported at --precision")
    parser.add_argument("--data", type=Path, help="with --package: a corpus directory with "
                        "test.src (and test.kind), or a text file")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "int8"),
                        help="the OPUS-MT or --family shape's export")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=24)
    parser.add_argument("--threads", type=int, default=0, help="0 = the usable cores")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ctranslate2", type=Path, metavar="DIR",
                        help="with --package: the package's checkpoint as a CTranslate2 "
                        "model, timed on the same batches in the same rounds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if (args.package is None) != (args.data is None):
        parser.error("--package and --data go together")
    if args.ctranslate2 is not None and args.package is None:
        parser.error("--ctranslate2 needs --package")
    if args.family is not None and args.package is not None:
        parser.error("--family is a workload of its own; leave out --package")

    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    package, batches, options, description, forced = workload(args)
    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=args.threads),
                    default_limits())
    runner = engine.runner

    def decode() -> int:
        """Every batch once; returns the decoder steps."""
        return sum(len(engine.generate(batch, options, forced_bos=None if forced is None
                                       else [forced] * len(batch)).stats.steps)
                   for batch in batches)

    peer = None
    prepared: list[Any] = []
    if args.ctranslate2 is not None:
        from seq2serve.bench.engine.systems import CheckpointCTranslate2

        peer = CheckpointCTranslate2(args.ctranslate2, package, engine.package.manifest.precision,
                                     runner.threads)
        peer.load()
        prepared = [peer.prepare(batch) for batch in batches]

    def decode_peer() -> float:
        assert peer is not None
        start = time.perf_counter()
        for batch in prepared:
            peer.generate(batch, args.beam, None)
        return time.perf_counter() - start

    decode()  # warm-up
    if peer is not None:
        decode_peer()
    walls, splits, peer_walls = [], [], []
    for _ in range(args.repeats):  # rounds: seq2serve, then CTranslate2
        with timed_calls(runner) as totals:
            start = time.perf_counter()
            steps = decode()
            wall = time.perf_counter() - start
        split = {RUNNER_CALLS[name]: seconds for name, (seconds, _) in totals.items()}
        split["Python and NumPy between steps"] = wall - sum(split.values())
        walls.append(wall)
        splits.append(split)
        if peer is not None:
            peer_walls.append(decode_peer())
    median = statistics.median_low(walls)  # a real round, whose split is printed
    split = splits[walls.index(median)]
    texts = sum(len(b) for b in batches)
    print(f"{description}, beam {args.beam}, {runner.threads} threads: median of "
          f"{args.repeats} {median * 1e3:.0f} ms ({texts / median:.1f} sources/s), "
          f"{steps} decoder steps")
    print("\n| part | ms | share |\n|---|---:|---:|")
    for name, seconds in split.items():
        print(f"| {name} | {seconds * 1e3:.1f} | {seconds / median:.1%} |")
    bound = None
    if peer is not None:
        peer.close()
        peer_median = statistics.median(peer_walls)
        graphs = split["encoder"] + split["decoder graph"]
        bound = {"ctranslate2_seconds": peer_median, "graphs_seconds": graphs,
                 "now": peer_median / median, "at_most": peer_median / graphs}
        print(f"\n| CTranslate2 beside it (same batches, rounds alternated) | ms | "
              f"seq2serve's speed / CTranslate2's |\n|---|---:|---:|\n"
              f"| CTranslate2, whole decoding | {peer_median * 1e3:.1f} | |\n"
              f"| seq2serve, whole decoding | {median * 1e3:.1f} | {bound['now']:.2f}x |\n"
              f"| seq2serve's encoder and decoder graphs alone | {graphs * 1e3:.1f} | "
              f"{bound['at_most']:.2f}x at most |")

    profiles = {}
    for name in ("encoder", "decoder"):
        path = Path(getattr(engine.package, f"{name}_path"))

        def run(session: Any, name: str = name) -> None:
            kept = getattr(runner, name)
            setattr(runner, name, session)
            try:
                decode()
            finally:
                setattr(runner, name, kept)

        profiles[name] = op_profile(path, runner.threads, run,
                                    engine.tgt_vocab_size if name == "decoder" else None)
        print_op_profile(f"{name} graph", profiles[name])
    decoder = profiles["decoder"]
    for part, us in decoder["by_vocabulary_part"].items():
        # its share of the decoder graph (profiled) times the graph's share of the
        # decoding (timed without the profiler)
        share = us / (decoder["model_run_us"] or 1.0) * split["decoder graph"] / median
        print(f"{part}: {share:.1%} of the whole decoding")
    if args.json:
        args.json.write_text(json.dumps({
            "workload": description, "beam": args.beam, "threads": runner.threads,
            "median_seconds": median, "decoder_steps": steps, "split_seconds": split,
            "ctranslate2": bound, "profiles": profiles}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
