"""Where the time of a decoding goes: ONNX Runtime kernels, ONNX Runtime overhead,
and the engine's Python (beam search bookkeeping), on the benchmark's OPUS-MT shape.

    python -m seq2serve.bench.profile --work /tmp/seq2serve-bench --batch-size 16 --beam 4

Runs `Engine.generate` on the same random inputs as `seq2serve bench` and reports
(1) the engine's own split of wall time (encoder, decoder graph runs, host
work between steps), then (2) ONNX Runtime's profiler over the decoder graph:
time per operator type, grouped into matrix products, tensor copies (the KV
cache's Gather/Concat, head Split/Transpose) and the rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from seq2serve.bench.workload import SHAPES, prepare_models, random_sources

GROUPS = {
    "matrix products": {"MatMul", "Gemm", "FusedMatMul", "MatMulInteger",
                        "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm"},
    "copies (cache, heads)": {"Concat", "Gather", "GatherElements", "Split", "Slice",
                              "Transpose", "Expand", "Tile"},
    "softmax, norm, activations": {"Softmax", "LogSoftmax", "LayerNormalization",
                                   "SkipLayerNormalization", "Relu", "Sigmoid", "Gelu",
                                   "FastGelu", "QuickGelu", "Tanh"},
}


def group_of(op: str) -> str:
    return next((name for name, ops in GROUPS.items() if op in ops), "other")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.bench.profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir())
                        / "seq2serve-bench", help="model cache shared with seq2serve bench")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "int8"))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=24)
    parser.add_argument("--threads", type=int, default=0, help="0 = physical cores")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import onnxruntime as ort

    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.options import DecodingOptions
    from seq2serve.server.engine.runner import CPU, RunnerConfig

    shape = SHAPES["opus-mt"]
    models = prepare_models(args.work, shape, 0, {args.precision}, ctranslate2=False)
    package = models.packages[args.precision]
    sources = random_sources(shape, args.batch_size, args.source_length, 0)
    options = DecodingOptions(beam_size=args.beam, num_hypotheses=1,
                              max_length=args.new_tokens, min_length=args.new_tokens)
    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=args.threads))
    engine.generate(sources, options)  # warm-up

    walls, splits = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        stats = engine.generate(sources, options).stats
        wall = time.perf_counter() - start
        decoder = sum(s.ort_seconds for s in stats.steps)
        walls.append(wall)
        splits.append({"encoder": stats.encode_seconds, "decoder graph": decoder,
                       "host (Python, NumPy) between steps": stats.host_seconds,
                       "unaccounted": wall - stats.ort_seconds - stats.host_seconds})
    median = statistics.median(walls)
    split = splits[walls.index(median)]
    steps = len(stats.steps)
    print(f"{package.name}: batch {args.batch_size}, beam {args.beam}, {args.new_tokens} new "
          f"tokens, {engine.runner.threads} threads; median of {args.repeats}: "
          f"{median * 1e3:.0f} ms, {args.batch_size * args.new_tokens / median:.1f} tokens/s, "
          f"{steps} decoder steps")
    print("\n| part | ms | share |\n|---|---:|---:|")
    for name, seconds in split.items():
        print(f"| {name} | {seconds * 1e3:.1f} | {seconds / median:.1%} |")

    # ONNX Runtime's profiler over the same decoding, decoder graph only.
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = engine.runner.threads
        opts.inter_op_num_threads = 1
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "decoder")
        opts.log_severity_level = 3
        engine.runner.decoder = ort.InferenceSession(str(engine.package.decoder_path), opts,
                                                     providers=[CPU])
        engine.generate(sources, options)
        events = json.loads(Path(engine.runner.decoder.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    run_us = 0.0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
        elif event.get("cat") == "Session" and event["name"] == "model_run":
            run_us += event["dur"]
    kernels = sum(by_op.values())
    by_group: dict[str, float] = defaultdict(float)
    for op, us in by_op.items():
        by_group[group_of(op)] += us
    by_group["ONNX Runtime overhead (binding, allocation, scheduling)"] = max(
        run_us - kernels, 0.0)
    print(f"\ndecoder graph under ONNX Runtime's profiler: {run_us / 1e3:.1f} ms in "
          f"{steps} runs\n\n| group | ms | share |\n|---|---:|---:|")
    for name, us in sorted(by_group.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {us / 1e3:.1f} | {us / run_us:.1%} |")
    print("\n| operator | ms | share |\n|---|---:|---:|")
    for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| {op} | {us / 1e3:.1f} | {us / run_us:.1%} |")
    if args.json:
        args.json.write_text(json.dumps({
            "package": str(package), "batch_size": args.batch_size, "beam": args.beam,
            "new_tokens": args.new_tokens, "threads": engine.runner.threads,
            "median_seconds": median, "split_seconds": split,
            "decoder_profile_us": {"model_run": run_us, "by_op": by_op,
                                   "by_group": by_group}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
