"""`seq2serve bench`: this engine side by side with Hugging Face `generate()` and
CTranslate2, in one run, on the same inputs and thread count.

Workloads:
- the OPUS-MT en-de shape with seeded random weights (workload.py): every
  system generates exactly `--new-tokens` tokens per source, checked on every
  call, so tokens/s = batch * new tokens / wall time compares like with like;
- with `--package DIR --data DIR`: this engine on a shipped model package and
  the first `--sentences` lines of DIR/test.src, decoding naturally (EOS and
  the package's length limit); its records are named `seq2serve@<model>`;
- with `--model NAME --data DIR` (the shipped models, `model.py`): instead of the
  OPUS-MT shape, the package models/NAME (int8) and an fp32 export of its
  checkpoint models/checkpoints/NAME beside CTranslate2 on the same checkpoint
  (int8 and float32), on real sentences sorted by length, decoding naturally;
  sentences/s per thread count, the best per core, and how many outputs agree;
  where models/NAME has a vocabulary shortlist, CTranslate2 also with a
  vocabulary map of the same table (`ctranslate2-vmap` rows).

`--threads` takes several counts: the whole run is repeated for each.

Each (system, decoding, batch) is warmed up, then timed `--repeats` times; the
median wall time counts. All systems of a workload are loaded at once and the
timed repeats go round-robin over them (system A, B, C, A, B, C, ...), so a
drift of the machine's speed during the run touches every system alike and the
ratios between them hold; measuring one system after the other, the same
ratio moved by up to 40% between runs on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from seq2serve.bench.engine.families import (
    FAMILY_SHAPES,
    config_vocab,
    prepare_family,
    vocabulary_map,
    with_vocabulary_map,
)
from seq2serve.bench.engine.families import random_sources as family_sources
from seq2serve.bench.engine.families import source_ids as family_ids
from seq2serve.bench.engine.measure import (
    BenchError,
    Record,
    beam_width,
    log,
    run_systems,
)
from seq2serve.bench.engine.model import (
    agreement_table,
    model_benchmark,
    model_problems,
    per_core_table,
)
from seq2serve.bench.engine.systems import (
    CTRANSLATE2_VMAP,
    CTranslate2,
    Seq2Serve,
    System,
    Transformers,
)
from seq2serve.bench.engine.workload import SHAPES, prepare_models, random_sources
from seq2serve.bench.inputs import read_sentences, source_ids
from seq2serve.model.package.session import cpuinfo
from seq2serve.model.package.shortlist import ShortlistSettings

SYSTEMS = ("seq2serve-fp32", "seq2serve-int8", "transformers", "ctranslate2-fp32",
           "ctranslate2-int8", "seq2serve-fp16", "ctranslate2-fp16", "ctranslate2-vmap-fp32",
           "ctranslate2-vmap-int8")
# With --family only: CTranslate2 over a vocabulary map of a random shortlist table of the
# engine's default shortlist sizes (families.vocabulary_map), the vocabulary shortlist's peer.
VMAP_SYSTEMS = ("ctranslate2-vmap-fp32", "ctranslate2-vmap-int8")
# What each device compares by default: int8 is the CPU's reduced precision, fp16 the GPU's.
DEVICE_SYSTEMS = {
    "cpu": SYSTEMS[:5],
    "cuda": ("seq2serve-fp32", "seq2serve-fp16", "transformers", "ctranslate2-fp32",
             "ctranslate2-fp16"),
}
RECORD_KEYS = ("system", "precision", "decoding", "batch_size", "threads", "tokens_per_second",
               "sentences_per_second")
BASELINE = ("seq2serve", "fp32")  # the ratio column divides by this system's figure


def _decoding(value: str) -> str:
    beam_width(value)
    return value


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def _baseline(records: list[Record], r: Record) -> Record | None:
    for b in records:
        if (b.workload, b.decoding, b.batch_size, b.threads) == \
                (r.workload, r.decoding, r.batch_size, r.threads) \
                and b.system.split("@")[0] == BASELINE[0] and b.precision == BASELINE[1]:
            return b
    return None


def markdown_table(records: list[Record]) -> str:
    lines = []
    for workload in dict.fromkeys(r.workload for r in records):
        lines += [f"**{workload}**", "",
                  "| system | precision | decoding | batch | threads | sentences/s | tokens/s "
                  "| vs seq2serve fp32 |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        rows = sorted((r for r in records if r.workload == workload),
                      key=lambda r: (r.threads, beam_width(r.decoding), r.batch_size))
        for r in rows:
            base = _baseline(records, r)
            ratio = f"{r.tokens_per_second / base.tokens_per_second:.2f}x" if base else "-"
            lines.append(f"| {r.system} | {r.precision} | {r.decoding} | {r.batch_size} | "
                         f"{r.threads} | {r.sentences_per_second:.1f} | "
                         f"{r.tokens_per_second:.1f} | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def instruction_sets() -> str:
    """The vector instruction sets of this CPU that the engines' kernels use."""
    found = cpuinfo("flags")
    if found is None:
        return "unknown"
    flags = set(found.split())
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
              "avx512_bf16", "amx_int8", "amx_bf16")
    return ", ".join(f for f in wanted if f in flags) or "none of AVX2/AVX-512/VNNI/AMX"


def machine_description(threads: Sequence[int]) -> list[str]:
    from seq2serve.server.resources import usable_cores

    cpu = cpuinfo("model name") or platform.processor() or platform.machine()
    versions = []
    for module in ("onnxruntime", "torch", "transformers", "ctranslate2"):
        try:
            versions.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    lines = [f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- machine: {cpu}, {os.cpu_count()} logical CPUs, {usable_cores()} usable "
             f"cores; {platform.system()} {platform.release()}; Python "
             f"{platform.python_version()}",
             f"- instruction sets: {instruction_sets()}",
             f"- threads: {', '.join(map(str, threads))} per system (intra-op), 1 inter-op",
             f"- versions: {', '.join(versions)}",
             f"- load average at start: {load:.2f}"]
    if load > 0.5:
        lines.append("- WARNING: other processes were using the CPU; these figures are "
                     "not representative")
    return lines


# -- the command -----------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="only beam4 at batch 16 on the OPUS-MT shape, every system "
                        "(a few minutes)")
    parser.add_argument("--threads", type=_positive, nargs="+", default=None,
                        help="intra-op threads for every system, one or more counts; the run "
                        "is repeated for each (default: the usable cores)")
    parser.add_argument("--repeats", type=_positive, default=3,
                        help="timed runs per setting; the median counts (default 3)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed runs per setting first (default 1)")
    parser.add_argument("--decodings", nargs="+", type=_decoding, default=["greedy", "beam4"],
                        help="greedy and/or beamK (default: greedy beam4)")
    parser.add_argument("--batch-sizes", nargs="+", type=_positive, default=[1, 16, 64],
                        help="sources per call (default: 1 16 64)")
    parser.add_argument("--device", choices=tuple(DEVICE_SYSTEMS), default="cpu",
                        help="cpu (default) or cuda: ONNX Runtime's CUDA provider "
                        "(onnxruntime-gpu), CTranslate2 and PyTorch on the GPU")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=None,
                        metavar="SYSTEM", help="which systems (default for cpu: "
                        f"{' '.join(DEVICE_SYSTEMS['cpu'])}; for cuda: "
                        f"{' '.join(DEVICE_SYSTEMS['cuda'])})")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="opus-mt",
                        help="model shape (default opus-mt: d_model 512, 6+6 layers, 8 heads, "
                        "FFN 2048, vocabulary 58101)")
    parser.add_argument("--family", choices=sorted(FAMILY_SHAPES), default=None,
                        help="instead of --shape: a Hugging Face family at its smallest "
                        "public shape with random weights (bart: bart-base; pegasus: at "
                        "bart-base's size; t5: t5-small; flan-t5: flan-t5-small; m2m100: "
                        "m2m100_418M; nllb: nllb-200-distilled-600M, sources with their "
                        "language token, the first new token forced to the target's; "
                        "tiny-*: test-sized), built as a folder, exported and converted for "
                        "CTranslate2 by its own converter (bench/engine/families.py)")
    parser.add_argument("--new-tokens", type=_positive, default=32,
                        help="tokens every system generates per source (default 32)")
    parser.add_argument("--source-length", type=_positive, default=24,
                        help="source tokens per input, EOS included (default 24)")
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    parser.add_argument("--work", type=Path, default=None,
                        help="cache for the model and its conversions, reused by later runs "
                        "(default: a temporary directory, removed afterwards)")
    parser.add_argument("--package", type=Path, action="append", default=[],
                        help="also run this engine on a model package (repeatable, e.g. its "
                        "fp32 and int8 exports) with the sentences of --data")
    parser.add_argument("--data", type=Path, default=None,
                        help="a corpus directory with test.src (or a text file) for --package")
    parser.add_argument("--sentences", type=_positive, default=128,
                        help="test sentences per --package pass (default 128)")
    parser.add_argument("--model", default=None, metavar="NAME",
                        help="a shipped model (models/NAME and models/checkpoints/NAME) beside "
                        "CTranslate2 on the same checkpoint, on the sentences of --data, "
                        "instead of the OPUS-MT shape")
    parser.add_argument("--models-dir", type=Path, default=Path("models"),
                        help="where --model's package and checkpoints/ are (default: models)")
    parser.add_argument("--precisions", nargs="+", choices=("int8", "fp32"),
                        default=["int8", "fp32"], help="--model's precisions (default: both)")
    parser.add_argument("--ort-beam-search", action="store_true",
                        help="with --model: also ONNX Runtime's BeamSearch operator over the "
                        "checkpoint (bench/engine/ort_beam_search.py), the decoding loop in C++")
    parser.add_argument("--only-sentences", action="store_true",
                        help="with --data DIR: only the lines DIR/test.kind marks `sentence`")
    parser.add_argument("--json", type=Path, default=None, help="write the records here")


def _check(args: argparse.Namespace) -> list[str]:
    problems = []
    if args.systems is None:
        args.systems = list(DEVICE_SYSTEMS[args.device])
    if args.device == "cuda":
        problems += _cuda_problems(args.systems)
    if args.quick and args.package:
        problems.append("--quick runs the OPUS-MT shape only; leave out --package")
    if args.package and args.data is None:
        problems.append("--package needs --data (the test sentences)")
    if args.model is not None:
        problems += model_problems(args)
    elif args.data is not None and not args.package:
        problems.append("--data needs --package or --model")
    if args.family is not None and (args.model is not None or args.quick):
        problems.append("--family is a workload of its own; leave out --model and --quick")
    if set(args.systems) & set(VMAP_SYSTEMS) and args.family is None:
        problems.append(f"{' and '.join(sorted(set(args.systems) & set(VMAP_SYSTEMS)))}: "
                        "with --family only (--model has its own ctranslate2-vmap rows)")
    if args.ort_beam_search and args.model is None:
        problems.append("--ort-beam-search needs --model")
    for p in args.package:
        if not (p / "manifest.json").is_file():
            problems.append(f"--package {p}: not a model package (no manifest.json)")
    if args.data is not None and not (args.data / "test.src" if args.data.is_dir()
                                      else args.data).is_file():
        problems.append(f"--data {args.data}: no test.src there")
    if args.warmup < 0:
        problems.append(f"--warmup must be >= 0, got {args.warmup}")
    if args.source_length < 2:
        problems.append(f"--source-length must be >= 2 (tokens and EOS), got "
                        f"{args.source_length}")
    return problems


def _cuda_problems(systems: list[str]) -> list[str]:
    """--device cuda needs every requested system to reach a GPU; none here is one line."""
    import onnxruntime as ort

    problems = []
    available = ort.get_available_providers()
    if any(s.startswith("seq2serve-") for s in systems) and \
            "CUDAExecutionProvider" not in available:
        problems.append("--device cuda: this onnxruntime has no CUDAExecutionProvider "
                        f"(available: {', '.join(available)}); install onnxruntime-gpu "
                        "in place of onnxruntime")
    if "transformers" in systems:
        import torch

        if not torch.cuda.is_available():
            problems.append("--device cuda: PyTorch sees no CUDA device; leave out "
                            "transformers (--systems) or install a CUDA build of torch")
    if any(s.startswith("ctranslate2-") for s in systems):
        import ctranslate2

        if ctranslate2.get_cuda_device_count() == 0:
            problems.append("--device cuda: CTranslate2 sees no CUDA device")
    if any(s.endswith("-int8") for s in systems):
        problems.append("--device cuda: int8 packages are for the CPU; compare fp32/fp16")
    return problems


def benchmark(args: argparse.Namespace) -> list[Record]:
    """Every requested system and setting; `args.threads` must be set."""
    threads = args.threads
    if args.model is not None:
        return model_benchmark(args, threads)
    if args.quick:
        args.decodings, args.batch_sizes, args.shape = ["beam4"], [16], "opus-mt"
    import torch  # building and converting run on torch; keep it to the same threads

    torch.set_num_threads(threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="seq2serve-bench-"))
    records: list[Record] = []
    try:
        start = time.perf_counter()
        precisions = {s.split("-")[1] for s in args.systems if s.startswith("seq2serve-")}
        with_ct2 = any(s.startswith("ctranslate2-") for s in args.systems)
        forced_bos = None  # a multilingual family's target language token
        vmap_dir = None
        if args.family is not None:
            family = FAMILY_SHAPES[args.family]
            models = prepare_family(work, family, args.seed, precisions, with_ct2)
            ids = family_ids(models.marian, family)
            sources = family_sources(ids, max(args.batch_sizes), args.source_length, args.seed)
            forced_bos = ids.target
            label = family.name
            if set(args.systems) & set(VMAP_SYSTEMS):
                assert models.ctranslate2 is not None
                settings = ShortlistSettings()
                vmap_dir = with_vocabulary_map(
                    models.ctranslate2, models.ctranslate2.parent /
                    f"ctranslate2-vmap-{settings.first}-{settings.best}",
                    vocabulary_map(ids, config_vocab(models.marian), settings, args.seed))
        else:
            shape = SHAPES[args.shape]
            models = prepare_models(work, shape, args.seed, precisions, with_ct2)
            sources = random_sources(shape, max(args.batch_sizes), args.source_length,
                                     args.seed)
            label = f"{shape.name} shape"
        log(f"models ready in {work} ({time.perf_counter() - start:.1f} s)")
        batches_for = {b: [sources[:b]] for b in args.batch_sizes}
        settings = [(d, b) for d in args.decodings for b in args.batch_sizes]
        workload = (f"{label}, random weights: {args.source_length} source tokens, "
                    f"{args.new_tokens} new tokens per source")
        systems: list[System] = []
        for name in args.systems:
            if name.startswith("seq2serve-"):
                systems.append(Seq2Serve(models.packages[name.split("-")[1]], threads,
                                         device=args.device, forced_bos=forced_bos))
            elif name == "transformers":
                systems.append(Transformers(models.marian, threads, device=args.device,
                                            forced_bos=forced_bos))
            elif name in VMAP_SYSTEMS:
                assert vmap_dir is not None
                systems.append(CTranslate2(vmap_dir, models.marian, name.split("-")[-1],
                                           threads, device=args.device,
                                           forced_bos=forced_bos, vmap=True))
            else:
                assert models.ctranslate2 is not None
                systems.append(CTranslate2(models.ctranslate2, models.marian,
                                           name.split("-")[1], threads, device=args.device,
                                           forced_bos=forced_bos))
        if args.family is not None:
            systems = agreeing_systems(systems, sources, args.new_tokens)
        records += run_systems(systems, workload, settings, batches_for, args.new_tokens,
                               args.repeats, args.warmup, threads)
        records += _package_runs(args, threads, settings)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return records


def agreeing_systems(systems: list[System], sources: list[list[int]],
                     new_tokens: int) -> list[System]:
    """Before timing a family: each fp32 system's greedy tokens on `sources` against
    generate()'s. Our engine is timed either way (a mismatch there is a bug to fix,
    reported); CTranslate2, when its fp32 does not compute the same tokens, is not:
    its mismatch is reported in place of a figure (its int8 is the same conversion)."""
    reference = next((s for s in systems if s.name == "transformers"), None)
    if reference is None:
        return systems
    outputs: dict[str, list[list[int]]] = {}
    for system in systems:
        if isinstance(system, CTranslate2) and (system.precision != "fp32" or system.vmap):
            continue  # int8: the same conversion; a vocabulary map restricts the output
        system.load()
        try:
            if system.precision == "fp32":
                outputs[system.name] = system.generate(system.prepare(sources), 1, new_tokens)
        finally:
            system.close()
    expected = outputs[reference.name]
    wrong = set()
    for name, got in outputs.items():
        same = sum(a == b for a, b in zip(got, expected, strict=True))
        log(f"greedy fp32 check: {name} gives {reference.name}'s tokens for {same} of "
            f"{len(expected)} sources")
        if same != len(expected):
            print(f"MISMATCH: {name} fp32 greedy tokens differ from {reference.name}'s on "
                  f"{len(expected) - same} of {len(expected)} sources"
                  + ("; not timed" if name == "ctranslate2" else ""))
            wrong.add(name)
    return [s for s in systems if not (s.name == "ctranslate2" and s.name in wrong)]


def _package_runs(args: argparse.Namespace, threads: int,
                  settings: list[tuple[str, int]]) -> list[Record]:
    from seq2serve.model.package.manifest import load_package
    from seq2serve.model.package.tokenizer import package_tokenizer

    # Packages that see the same token ids (one model in several precisions) are
    # timed round-robin together, like the peers on the OPUS-MT shape.
    groups: dict[tuple[str, str], tuple[list[list[int]], list[System]]] = {}
    sentences = (read_sentences(args.data, args.sentences, args.only_sentences)
                 if args.package else [])
    for path in args.package:
        package = load_package(path)
        ids = source_ids(package_tokenizer(package), sentences,
                         package.manifest.max_source_length)
        key = (package.manifest.name, json.dumps(ids))
        system = Seq2Serve(path, threads, name=f"seq2serve@{package.manifest.name}",
                           device=args.device)
        groups.setdefault(key, (ids, []))[1].append(system)
    records: list[Record] = []
    for (name, _), (ids, systems) in groups.items():
        batches_for = {b: [ids[i: i + b] for i in range(0, len(ids), b)]
                       for b in args.batch_sizes}
        workload = f"{name} package, {len(ids)} sentences of {args.data}, natural length"
        records += run_systems(systems, workload, settings, batches_for, None, args.repeats,
                               args.warmup, threads)
    return records


def run(args: argparse.Namespace) -> int:
    from seq2serve.server.resources import usable_cores

    problems = _check(args)
    if problems:
        for p in problems:
            print(f"seq2serve bench: error: {p}", file=sys.stderr)
        return 2
    counts = args.threads or [usable_cores()]
    header = machine_description(counts)  # before the run: its load average
    records: list[Record] = []
    # One cache for every thread count's pass: the models are built (exported,
    # converted) once per run even without --work.
    work = args.work or Path(tempfile.mkdtemp(prefix="seq2serve-bench-"))
    try:
        for threads in counts:
            run_args = argparse.Namespace(**{**vars(args), "threads": threads, "work": work})
            records += benchmark(run_args)
    except BenchError as e:
        print(f"seq2serve bench: error: {e}", file=sys.stderr)
        return 1
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(header) + "\n")
    print(markdown_table(records))
    if args.model is not None:
        others = {r.system.split("@")[0] for r in records} - {"ctranslate2", "seq2serve"}
        for system in ["seq2serve", *sorted(others)]:
            print(per_core_table(records, system))
            if system == "seq2serve" and CTRANSLATE2_VMAP in others:  # the same shortlist table
                print(per_core_table(records, system, CTRANSLATE2_VMAP))
            print(agreement_table(records, system))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.as_json() for r in records], indent=2) + "\n",
                             encoding="utf-8")
        log(f"wrote {len(records)} records to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.bench",
                                     description=__doc__.splitlines()[0])
    configure(parser)
    return run(parser.parse_args(argv))
