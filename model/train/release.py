"""Ship a trained model: the run's best checkpoint as a compact checkpoint, and its card.

    python -m seq2serve.model.train.release checkpoint runs/en-de models/checkpoints/en-de \
        --name en-de
    python -m seq2serve.model.train.release average runs/en-de/averaged \
        runs/en-de/checkpoints/step-*
    python -m seq2serve.model.train.release card models/checkpoints/en-de \
        --report models/checkpoints/en-de/test-scores.json [--packages quality.json]

`average` writes the mean of several checkpoints' weights (the last ones of a run:
a cheap gain over any one of them), which `checkpoint` then ships like a best/;
with `--interpolate-with` the mean is moved part of the way toward an earlier phase's
release (to take back some of that phase's domain).
`checkpoint` copies `RUN/best` (or a checkpoint directory) with fp16 weights (half
the size, and the model is trained and served in fp32: the loader casts back) and
records in its config.json how long training took to reach it. `card` writes MODEL_CARD.md
(`card.py`) beside the checkpoint from what was measured: the checkpoint's config, the
test-split report of `seq2serve train --score` (scores, copy baseline,
samples) and optionally the package-quality records of
`python -m seq2serve.bench.quality`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2serve.model.checkpoint import load_checkpoint, read_meta, save_checkpoint
from seq2serve.model.data import mix
from seq2serve.model.tokenizer import (
    Tokenizer,
    extend_vocabulary,
    frequent_split_words,
    unknown_characters,
)
from seq2serve.model.train.card import (  # noqa: F401 (model_card: the card's old home)
    CARD_FILE,
    _has_byte_fallback,
    _nth,
    _train_repeat,
    _train_weighted,
    model_card,
)
from seq2serve.model.train.evaluate import training_time

RESERVED = {"format", "format_version", "model", "weights", "tokenizer"}


def average_checkpoints(sources: Sequence[str | os.PathLike[str]],
                        dest: str | os.PathLike[str],
                        interpolate_with: str | os.PathLike[str] | None = None,
                        weight: float = 0.0) -> dict[str, Any]:
    """The mean of the sources' weights (one architecture and tokenizer) in float32 at
    `dest`, with the newest source's meta, its training time and the steps averaged.

    `interpolate_with`: an ancestor checkpoint (an earlier phase's release) that the mean
    is then moved toward, `(1 - weight) * mean + weight * ancestor` (weight-space
    ensembling as in WiSE-FT, Wortsman et al. 2022: it takes back some of what a fine-tune
    lost on the ancestor's domain at a cost on the fine-tune's); the meta records it."""
    import torch

    loaded = sorted((load_checkpoint(source) + (Path(source),) for source in sources),
                    key=lambda entry: entry[1].get("step") or 0)
    if len(loaded) < 2:
        raise ValueError(f"averaging needs two checkpoints or more, got {len(loaded)}")
    model, meta, tokenizer, newest = loaded[-1]
    states = [m.state_dict() for m, *_ in loaded]
    if any(state.keys() != states[0].keys() or any(
            state[k].shape != states[0][k].shape for k in state) for state in states):
        raise ValueError("the checkpoints differ in architecture")
    mean = {k: torch.stack([state[k].float() for state in states]).mean(0)
            if v.is_floating_point() else v for k, v in states[-1].items()}
    # The newest source's validation scores are not the average's: not carried.
    extra = {k: v for k, v in meta.items() if k not in RESERVED and k != "valid"}
    extra["averaged_steps"] = [m.get("step") for _, m, _, _ in loaded]
    if interpolate_with is not None:
        if not 0.0 < weight < 1.0:
            raise ValueError(f"the interpolation weight must be in (0, 1), got {weight}")
        other, other_meta, other_tokenizer = load_checkpoint(interpolate_with)
        state = other.state_dict()
        if state.keys() != mean.keys() or any(state[k].shape != mean[k].shape for k in mean):
            raise ValueError(f"{interpolate_with} differs in architecture from the checkpoints")
        if Path(other_tokenizer.path).read_bytes() != Path(tokenizer.path).read_bytes():
            raise ValueError(f"{interpolate_with} has another tokenizer than the checkpoints")
        mean = {k: (1.0 - weight) * v + weight * state[k].float() if v.is_floating_point()
                else v for k, v in mean.items()}
        other_seconds, _ = training_time(Path(interpolate_with), other_meta)
        extra["interpolated_with"] = {"step": other_meta.get("step"),
                                      "elapsed_seconds": other_seconds, "weight": weight,
                                      "path": Path(interpolate_with).as_posix()}
    model.load_state_dict(mean)
    seconds, _ = training_time(newest, meta)
    if seconds is not None:
        extra["elapsed_seconds"] = round(seconds, 1)
    save_checkpoint(dest, model, tokenizer.path, meta=extra)
    return read_meta(dest)


def release_checkpoint(run_dir: str | os.PathLike[str], dest: str | os.PathLike[str],
                       name: str, save_dtype: str = "float16",
                       base: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Copy `run_dir/best` (or `run_dir` itself when it is a checkpoint, e.g. an
    average) to `dest` with `save_dtype` weights; returns the new meta. `base`: where
    the checkpoint the run started from is now (default: the run's --init-from),
    for a release written over that directory since, or moved."""
    best = Path(run_dir) / "best"
    if not best.is_dir() and (Path(run_dir) / "config.json").is_file():
        best = Path(run_dir)
    model, meta, tokenizer = load_checkpoint(best)
    seconds, _ = training_time(best, meta)
    extra = {k: v for k, v in meta.items() if k not in RESERVED}
    extra["name"] = name
    init = base or extra.get("train_args", {}).get("init_from")
    if init:  # a fine-tune: keep what the base run was, for the card and the total time
        base_meta = read_meta(init)
        base_seconds, _ = training_time(Path(init), base_meta)
        extra["base"] = {"step": base_meta.get("step"), "elapsed_seconds": base_seconds,
                         "train_args": base_meta.get("train_args", {}),
                         "model": base_meta["model"], "released": "name" in base_meta}
        for key in ("train_repeat", "train_weighted"):
            if key in base_meta:
                extra["base"][key] = base_meta[key]
        if "vocabulary_extension" in base_meta:
            extra["base"]["vocabulary_extension"] = base_meta["vocabulary_extension"]
        record = Path(str(extra["train_args"].get("tokenizer", ""))).with_suffix(".json")
        if base_meta["model"]["src_vocab_size"] != meta["model"]["src_vocab_size"] \
                and record.is_file():  # the `extend-vocab` that made this run's tokenizer
            extra["vocabulary_extension"] = json.loads(record.read_text(encoding="utf-8"))
        if "base" in base_meta:  # a released checkpoint that went on from another
            extra["earlier"] = [*base_meta.get("earlier", []), base_meta["base"]]
        for phase in [*extra.get("earlier", []), extra["base"]]:
            # releases before `train_weighted` was kept: read the mix where it still is
            if "train_repeat" in phase and "train_weighted" not in phase \
                    and _train_weighted(phase["train_args"].get("data")):
                phase["train_weighted"] = True
        if seconds is not None and base_seconds is not None:
            extra["finetune_seconds"] = round(seconds, 1)
            seconds += base_seconds
    if seconds is not None:
        extra["elapsed_seconds"] = round(seconds, 1)
    if repeats := _train_repeat(extra.get("train_args", {}).get("data")):
        extra["train_repeat"] = repeats
        if _train_weighted(extra["train_args"]["data"]):
            extra["train_weighted"] = True
    save_checkpoint(dest, model, tokenizer.path, meta=extra, save_dtype=save_dtype)
    return read_meta(dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.model.train.release",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ck = sub.add_parser("checkpoint", help="copy RUN/best as a compact shipping checkpoint")
    ck.add_argument("run", type=Path, help="training run directory (holds best/), or a "
                    "checkpoint directory (e.g. written by `average`)")
    avg = sub.add_parser("average", help="the mean of several checkpoints' weights")
    avg.add_argument("dest", type=Path)
    avg.add_argument("checkpoints", type=Path, nargs="+")
    avg.add_argument("--interpolate-with", type=Path, metavar="CHECKPOINT",
                     help="an earlier phase's released checkpoint (same architecture and "
                     "tokenizer) to move the mean toward: (1 - W) * mean + W * CHECKPOINT")
    avg.add_argument("--interpolate-weight", type=float, default=0.0, metavar="W",
                     help="W of --interpolate-with, in (0, 1)")
    ck.add_argument("dest", type=Path)
    ck.add_argument("--name", required=True)
    ck.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    ck.add_argument("--base", type=Path, help="where the checkpoint the run started from is "
                    "now (default: the run's --init-from; give it when a release has been "
                    "written over that directory since)")
    ext = sub.add_parser("extend-vocab", help="add the characters a tokenizer maps to <unk> "
                         "in a corpus's training split as new pieces, and with --words the "
                         "words it splits most (for fine-tuning)")
    ext.add_argument("tokenizer", type=Path, help="SentencePiece model")
    ext.add_argument("data", type=Path, help="corpus directory (train.src, train.tgt)")
    ext.add_argument("out", type=Path, help="the extended SentencePiece model to write")
    ext.add_argument("--words", type=int, default=0, metavar="N",
                     help="also add the N words of the split that save the most tokens as "
                          "pieces of their own (default 0)")
    card = sub.add_parser("card", help=f"write {CARD_FILE} beside a released checkpoint")
    card.add_argument("checkpoint", type=Path)
    card.add_argument("--report", type=Path, required=True, action="append",
                      help="JSON report of `seq2serve train --score ... --score-out`; "
                           "repeat for each test split (the training corpus's first)")
    card.add_argument("--packages", type=Path,
                      help="JSON records of `python -m seq2serve.bench.quality --json`")
    card.add_argument("--log", type=Path, action="append", default=[],
                      help="a run's log.jsonl (validation curve); repeat for base run and "
                           "fine-tune, in order, or as N:PATH, the log of phase N (1: the "
                           "run from scratch), for some phases of a longer chain")
    card.add_argument("--notes", type=Path, help="Markdown for a Limitations section")
    args = parser.parse_args(argv)
    if args.command == "average":
        try:
            if (args.interpolate_with is None) != (args.interpolate_weight == 0.0):
                raise ValueError("--interpolate-with and --interpolate-weight go together")
            meta = average_checkpoints(args.checkpoints, args.dest, args.interpolate_with,
                                       args.interpolate_weight)
        except (OSError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(json.dumps({"dest": str(args.dest), "averaged_steps": meta["averaged_steps"],
                          "interpolated_with": meta.get("interpolated_with"),
                          "elapsed_seconds": meta.get("elapsed_seconds")}))
        return 0
    if args.command == "checkpoint":
        if not (args.run / "best").is_dir() and not (args.run / "config.json").is_file():
            print(f"error: {args.run} holds neither best/ nor a checkpoint", file=sys.stderr)
            return 2
        meta = release_checkpoint(args.run, args.dest, args.name, args.dtype, args.base)
        print(json.dumps({"dest": str(args.dest), "step": meta.get("step"),
                          "elapsed_seconds": meta.get("elapsed_seconds"),
                          "valid": meta.get("valid")}))
        return 0
    if args.command == "extend-vocab":
        tokenizer = Tokenizer(args.tokenizer)
        with mix.train_text(args.data, args.out.parent) as split:  # a weighted mix's too
            unknown = unknown_characters(tokenizer, split)
            words = frequent_split_words(tokenizer, split, args.words) if args.words > 0 else {}
        extended = extend_vocabulary(args.tokenizer, args.out, unknown, words)
        # Beside the model, for `release checkpoint` (the card's commands) to find.
        record = {"tokenizer": str(args.tokenizer), "data": str(args.data),
                  "words": args.words, "characters": len(unknown),
                  "vocab_size": extended.vocab_size}
        args.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n",
                                                 encoding="utf-8")
        print(json.dumps({**record, "out": str(args.out), "added": unknown,
                          "added_words": list(words)}, ensure_ascii=False))
        return 0
    reports = [json.loads(path.read_text(encoding="utf-8")) for path in args.report]
    packages = (json.loads(args.packages.read_text(encoding="utf-8"))
                if args.packages else None)
    # The training corpus (what the checkpoint says it trained on) for the data
    # section, else the first report's.
    meta = read_meta(args.checkpoint)
    trained_on = meta.get("train_args", {}).get("data")
    corpus_file = Path(trained_on or reports[0]["data"]) / "corpus.json"
    if not corpus_file.is_file():
        corpus_file = Path(reports[0]["data"]) / "corpus.json"
    corpus = (json.loads(corpus_file.read_text(encoding="utf-8"))
              if corpus_file.is_file() else None)
    base = meta.get("base")
    continued = bool(base) and base["model"]["src_vocab_size"] == meta["model"]["src_vocab_size"]
    later = ([f"the {_nth(k)} phase" for k in range(2, len(args.log) + 1)] if continued
             else ["fine-tuning"])
    labels = (["training from scratch", *later] if len(args.log) == len(later) + 1 > 1
              else [f"training ({path.name})" for path in args.log])
    if len(args.log) == 1:
        labels = ["training"]
    phases = [re.fullmatch(r"(\d+):(.+)", str(path)) for path in args.log]
    if args.log and all(phases):
        labels = ["training from scratch" if int(m[1]) == 1 else f"the {_nth(int(m[1]))} phase"
                  for m in phases if m]
        args.log = [Path(m[2]) for m in phases if m]
    logs = {label: [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                    if line.strip()] for label, path in zip(labels, args.log, strict=True)}
    notes = args.notes.read_text(encoding="utf-8") if args.notes else None
    (args.checkpoint / CARD_FILE).write_text(
        model_card(args.checkpoint, reports, packages, corpus, logs, notes), encoding="utf-8")
    print(args.checkpoint / CARD_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
