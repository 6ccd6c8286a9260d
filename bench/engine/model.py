"""`seq2serve bench --model NAME`: a shipped model beside CTranslate2 on the same weights.

The engine runs the package models/NAME (the shipped int8) and an fp32 export of
its checkpoint models/checkpoints/NAME; CTranslate2 runs the checkpoint's
conversion (bench/engine/ctranslate2_model.py) at `compute_type` int8 and float32. Both
get the same token ids of the same real sentences (the first `--sentences`
lines of --data, sorted by length so that a batch pads little, as a server's
length-sorted batches do), the package's length limits and suppressed tokens, and
decode naturally (EOS). Timing is measure.run_systems's: all systems loaded,
round-robin repeats, the median.

Tokens are each system's own generated target tokens, EOS included (the two
may end a sentence at different places). Reported beside the records: per
(precision, decoding, batch) each system's best sentences/s per core over the
thread counts run (a 2-core server runs two one-thread engines when that is
best; the figure is what one core serves), and how many best hypotheses of the
timed passes agree between the engine and CTranslate2.

With `--ort-beam-search`, ONNX Runtime's BeamSearch operator over the same
checkpoint (bench/engine/ort_beam_search.py) runs as a third system, with its own
per-core and agreement tables.

When models/NAME has a vocabulary shortlist (a format 8 package), CTranslate2 also
runs with a vocabulary map built from that same table and settings
(ctranslate2_model.vocabulary_map, `use_vmap`): records `ctranslate2-vmap`, their
own per-core and agreement tables, and the engine's per-core ratio to them. The
engine decodes over its shortlist where the package's default says so
(`--shortlist-default` at export), and the workload line says which; the fp32
export made here has no shortlist, so compare the shortlist at the package's own
precision (`--precisions`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from seq2serve.bench.engine.measure import Record, run_systems
from seq2serve.bench.engine.systems import CheckpointCTranslate2, Seq2Serve, System
from seq2serve.bench.inputs import read_sentences, source_ids


def model_problems(args: argparse.Namespace) -> list[str]:
    problems = []
    package = args.models_dir / args.model
    checkpoint = args.models_dir / "checkpoints" / args.model
    if not (package / "manifest.json").is_file():
        problems.append(f"--model {args.model}: no package at {package}")
    if not checkpoint.is_dir():
        problems.append(f"--model {args.model}: no checkpoint at {checkpoint}")
    elif not problems:  # CTranslate2 runs the checkpoint, the engine the package
        exported = json.loads((package / "manifest.json").read_text("utf-8"))["config"]
        trained = json.loads((checkpoint / "config.json").read_text("utf-8"))["model"]
        sizes = [(k, exported[k], trained[k]) for k in ("src_vocab_size", "tgt_vocab_size",
                 "d_model", "encoder_layers", "decoder_layers") if exported[k] != trained[k]]
        if sizes:
            problems.append(f"--model {args.model}: the package at {package} is not an export "
                            f"of the checkpoint at {checkpoint}: " + ", ".join(
                                f"{k} {a} in the package, {b} in the checkpoint"
                                for k, a, b in sizes))
    if args.data is None:
        problems.append("--model needs --data (the test sentences)")
    if args.package or args.quick:
        problems.append("--model runs alone: leave out --package and --quick")
    return problems


class Prepared(NamedTuple):
    packages: dict[str, Path]  # the engine's, by precision
    ct2: Path  # CTranslate2's model
    ct2_vmap: Path | None  # the same with the package's shortlist as its vocabulary map
    ids: list[list[int]]  # the sentences' source ids, sorted by length
    shortlist: str  # the shortlist's settings and whether the engine uses it ("": none)


def _prepared(args: argparse.Namespace) -> Prepared:
    """The engine's packages by precision, CTranslate2's models, and the sentences' ids;
    the fp32 export and the conversions are cached in --work by the package's digest
    (with --ort-beam-search, the BeamSearch graphs in WORK/ort-beam-search-PRECISION;
    with a shortlist, the conversion with its vocabulary map in WORK/ctranslate2-vmap)."""
    from seq2serve.bench.engine.ctranslate2_model import VMAP_FILE, convert, convert_with_vmap
    from seq2serve.export.exporter import export
    from seq2serve.model.package.manifest import load_package
    from seq2serve.model.package.tokenizer import package_tokenizer

    shipped = args.models_dir / args.model
    checkpoint = args.models_dir / "checkpoints" / args.model
    package = load_package(shipped)
    key = package.manifest.digest[:12]
    work = args.work / f"{args.model}-{key}"
    work.mkdir(parents=True, exist_ok=True)
    packages = {package.manifest.precision: shipped}
    for precision in args.precisions:
        if precision not in packages:
            out = work / f"package-{precision}"
            if not (out / "manifest.json").is_file():
                shutil.rmtree(out, ignore_errors=True)
                export(checkpoint, out, precision=precision, name=args.model, progress=False)
            packages[precision] = out
    ct2 = work / "ctranslate2"
    if not (ct2 / "model.bin").is_file():
        convert(checkpoint, ct2, force=True)
    ct2_vmap, shortlist = None, ""
    spec = package.manifest.shortlist
    if spec is not None:
        ct2_vmap = work / "ctranslate2-vmap"
        if not (ct2_vmap / VMAP_FILE).is_file():
            convert_with_vmap(checkpoint, shipped, ct2_vmap, force=True)
        used = "over it" if package.manifest.generation.shortlist else \
            "over the whole vocabulary (its default)"
        shortlist = (f"shortlist first {spec.first}, best {spec.best}, threshold "
                     f"{spec.threshold:g}: {package.manifest.precision} seq2serve {used}, "
                     "ctranslate2-vmap over the same table as a vocabulary map")
    if args.ort_beam_search:
        from seq2serve.bench.engine.ort_beam_search import GRAPH_FILE, build

        for precision in args.precisions:
            if not (work / f"ort-beam-search-{precision}" / GRAPH_FILE).is_file():
                build(checkpoint, work / f"ort-beam-search-{precision}", precision)
    texts = read_sentences(args.data, args.sentences, args.only_sentences)
    ids = source_ids(package_tokenizer(package), texts, package.manifest.max_source_length)
    return Prepared(packages, ct2, ct2_vmap, sorted(ids, key=len), shortlist)


def _systems(args: argparse.Namespace, prepared: Prepared, threads: int) -> list[System]:
    packages, ct2 = prepared.packages, prepared.ct2
    systems: list[System] = []
    for precision in args.precisions:
        systems.append(Seq2Serve(packages[precision], threads, name=f"seq2serve@{args.model}"))
        systems.append(CheckpointCTranslate2(ct2, packages[precision], precision, threads))
        if prepared.ct2_vmap is not None:
            systems.append(CheckpointCTranslate2(prepared.ct2_vmap, packages[precision],
                                                 precision, threads, vmap=True))
        if args.ort_beam_search:
            from seq2serve.bench.engine.ort_beam_search import GRAPH_FILE, OrtBeamSearch

            graph = ct2.parent / f"ort-beam-search-{precision}" / GRAPH_FILE  # _prepared's
            systems.append(OrtBeamSearch(graph, packages[precision], precision, threads))
    return systems


def _workload(args: argparse.Namespace, count: int, shortlist: str = "") -> str:
    which = "sentence lines" if args.only_sentences else "lines"
    return (f"{args.model}: {count} {which} of {args.data}, sorted by length, natural length; "
            "tokens: each system's own, EOS included" + (f"; {shortlist}" if shortlist else ""))


def model_benchmark(args: argparse.Namespace, threads: int) -> list[Record]:

    prepared = _prepared(args)
    ids = prepared.ids
    settings = [(d, b) for d in args.decodings for b in args.batch_sizes]
    batches_for = {b: [ids[i: i + b] for i in range(0, len(ids), b)] for b in args.batch_sizes}
    return run_systems(_systems(args, prepared, threads),
                       _workload(args, len(ids), prepared.shortlist), settings, batches_for,
                       None, args.repeats, args.warmup, threads)


def agreement_table(records: Sequence[Record], system: str = "seq2serve") -> str:
    """Per precision and decoding: how many best hypotheses (EOS included) are the
    same token ids in `system` and in CTranslate2 (and, for another system, in the
    engine), from the outputs of the timed passes at the largest batch size and the
    first thread count."""
    timed = [r for r in records if r.outputs]
    peers = ["ctranslate2"] + (["seq2serve"] if system != "seq2serve" else [])
    lines = ["", f"| precision | decoding | identical outputs, {system} and "
             f"{' / '.join(peers)} |", "|---|---|---:|"]
    if not timed:
        return "\n".join(lines)
    batch, threads = max(r.batch_size for r in timed), timed[0].threads
    found: dict[tuple[str, str, str], list[list[int]]] = {}
    for r in timed:
        if (r.batch_size, r.threads) == (batch, threads):
            found[(r.system.split("@")[0], r.precision, r.decoding)] = r.outputs
    for (name, precision, decoding), ours in found.items():
        theirs = [found.get((peer, precision, decoding)) for peer in peers]
        if name != system or any(t is None for t in theirs):
            continue
        same = [str(sum(a == b for a, b in zip(ours, t or [], strict=True))) for t in theirs]
        lines.append(f"| {precision} | {decoding} | {' / '.join(same)} of {len(ours)} |")
    return "\n".join(lines)


def per_core_table(records: Sequence[Record], system: str = "seq2serve",
                   peer: str = "ctranslate2") -> str:
    """Each system's best sentences/s per core over the thread counts, and
    `system`'s ratio to `peer` (CTranslate2, or ctranslate2-vmap) at that best."""
    best: dict[tuple[str, str, str, int], tuple[float, int]] = {}
    for r in records:
        key = (r.system.split("@")[0], r.precision, r.decoding, r.batch_size)
        per_core = r.sentences_per_second / max(r.threads, 1)
        if key not in best or per_core > best[key][0]:
            best[key] = (per_core, r.threads)
    title = "CTranslate2" if peer == "ctranslate2" else peer
    lines = ["", "Per core, each system at its best thread count:", "",
             f"| precision | decoding | batch | {system} sentences/s per core (threads) "
             f"| {title} (threads) | {system} / {title} |",
             "|---|---|---:|---:|---:|---:|"]
    for (name, precision, decoding, batch), (ours, threads) in sorted(best.items()):
        if name != system:
            continue
        theirs = best.get((peer, precision, decoding, batch))
        if theirs is None:
            continue
        lines.append(f"| {precision} | {decoding} | {batch} | {ours:.1f} ({threads}) | "
                     f"{theirs[0]:.1f} ({theirs[1]}) | {ours / theirs[0]:.2f}x |")
    return "\n".join(lines)
