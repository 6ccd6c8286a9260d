"""Ship a trained model: the run's best checkpoint as a compact checkpoint, and its card.

    python -m seq2serve.model.train.release checkpoint runs/en-de models/checkpoints/en-de \
        --name en-de
    python -m seq2serve.model.train.release average runs/en-de/averaged \
        runs/en-de/checkpoints/step-*
    python -m seq2serve.model.train.release card models/checkpoints/en-de \
        --report models/checkpoints/en-de/test-scores.json [--packages quality.json]

`average` writes the mean of several checkpoints' weights (the last ones of a run:
a cheap gain over any one of them), which `checkpoint` then ships like a best/.
`checkpoint` copies `RUN/best` (or a checkpoint directory) with fp16 weights (half
the size, and the model is trained and served in fp32: the loader casts back) and
records in its config.json how long training took to reach it. `card` writes MODEL_CARD.md
beside the checkpoint from what was measured: the checkpoint's config, the
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
from seq2serve.model.train.evaluate import training_time

CARD_FILE = "MODEL_CARD.md"
RESERVED = {"format", "format_version", "model", "weights", "tokenizer"}


def average_checkpoints(sources: Sequence[str | os.PathLike[str]],
                        dest: str | os.PathLike[str]) -> dict[str, Any]:
    """The mean of the sources' weights (one architecture and tokenizer) in float32 at
    `dest`, with the newest source's meta, its training time and the steps averaged."""
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
    model.load_state_dict({k: torch.stack([state[k].float() for state in states]).mean(0)
                           if v.is_floating_point() else v for k, v in states[-1].items()})
    # The newest source's validation scores are not the average's: not carried.
    extra = {k: v for k, v in meta.items() if k not in RESERVED and k != "valid"}
    extra["averaged_steps"] = [m.get("step") for _, m, _, _ in loaded]
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
        if "train_repeat" in base_meta:
            extra["base"]["train_repeat"] = base_meta["train_repeat"]
        if "vocabulary_extension" in base_meta:
            extra["base"]["vocabulary_extension"] = base_meta["vocabulary_extension"]
        record = Path(str(extra["train_args"].get("tokenizer", ""))).with_suffix(".json")
        if base_meta["model"]["src_vocab_size"] != meta["model"]["src_vocab_size"] \
                and record.is_file():  # the `extend-vocab` that made this run's tokenizer
            extra["vocabulary_extension"] = json.loads(record.read_text(encoding="utf-8"))
        if "base" in base_meta:  # a released checkpoint that went on from another
            extra["earlier"] = [*base_meta.get("earlier", []), base_meta["base"]]
        if seconds is not None and base_seconds is not None:
            extra["finetune_seconds"] = round(seconds, 1)
            seconds += base_seconds
    if seconds is not None:
        extra["elapsed_seconds"] = round(seconds, 1)
    if repeats := _train_repeat(extra.get("train_args", {}).get("data")):
        extra["train_repeat"] = repeats
    save_checkpoint(dest, model, tokenizer.path, meta=extra, save_dtype=save_dtype)
    return read_meta(dest)


def _corpus_repeats(corpus: dict[str, Any] | None) -> dict[str, int]:
    """How many times each corpus of a training mix appears in it (corpus folder ->
    repeat), from the mix's corpus.json; empty for a corpus that is not a mix."""
    source = (corpus or {}).get("source")
    parts = source.get("mix") if isinstance(source, dict) else None
    if not corpus or not parts:
        return {}
    if corpus.get("train_repeat"):
        return {str(part): int(n) for part, n in corpus["train_repeat"].items()}
    # The DDTP + messages mix records DDTP's repeat alone.
    return {str(part): int(corpus.get("ddtp_repeat", 1)) if k == 0 else 1
            for k, part in enumerate(parts)}


def _train_repeat(data: str | None) -> dict[str, int] | None:
    """`_corpus_repeats` of the corpus folder a run trained on, None when there is none.
    Kept in each released phase's record, so that a card can rebuild the mix an earlier
    phase trained on when today's `seq2serve data` writes another."""
    corpus_file = Path(data) / "corpus.json" if data else None
    if corpus_file is None or not corpus_file.is_file():
        return None
    return _corpus_repeats(json.loads(corpus_file.read_text(encoding="utf-8"))) or None


def _two_corpus_ddtp_repeat(repeats: dict[str, int] | None) -> int | None:
    """DDTP's repeat in a DDTP + messages mix, None for any other corpus."""
    ddtp = [n for part, n in (repeats or {}).items() if Path(part).parent.name == "ddtp"]
    return ddtp[0] if ddtp and len(repeats or {}) == 2 else None


def _mix_commands(phases: list[tuple[str, int | None]],
                  built: dict[str, int]) -> dict[int, str]:
    """The `seq2serve data --corpora mix` command to run before each phase (by index)
    whose DDTP + messages mix is not what the commands before it wrote. phases: each
    phase's data folder and DDTP repeat (None: no recorded DDTP + messages mix), oldest
    first; built: mix folder -> DDTP repeat as the first `seq2serve data` wrote them."""
    commands: dict[int, str] = {}
    for k, (data, ddtp) in enumerate(phases):
        folder = Path(data).parent.as_posix()
        if ddtp is not None and built.get(folder) != ddtp:
            commands[k] = (f"seq2serve data --corpora mix --mixed-out {folder} "
                           f"--ddtp-repeat {ddtp}" + (" --force" if folder in built else ""))
            built[folder] = ddtp
    return commands


def _has_byte_fallback(checkpoint: Path) -> bool:
    """Whether the checkpoint's tokenizer spells pieceless characters in bytes."""
    import sentencepiece as spm

    tokenizer = checkpoint / "tokenizer.model"
    if not tokenizer.is_file():
        return False
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    return sp.piece_to_id("<0x41>") != sp.unk_id()


def _nth(phase: int) -> str:
    return {2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth", 7: "seventh",
            8: "eighth", 9: "ninth"}.get(phase, f"{phase}th")


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _score_table(report: dict[str, Any]) -> list[str]:
    names = list(report["scores"]["model"])
    lines = ["| segments | " + " | ".join(f"{n} model | {n} copy-source" for n in names) + " |",
             "|---|" + "---:|---:|" * len(names)]
    rows = [("all", report["segments"], report["scores"]["model"],
             report["scores"]["copy_source"])]
    rows += [(k, v["segments"], v["model"], v["copy_source"])
             for k, v in report["by_kind"].items()]
    for label, n, model, copy in rows:
        lines.append(f"| {label} ({n}) | " + " | ".join(
            f"**{model[m]:.2f}** | {copy[m]:.2f}" for m in names) + " |")
    return lines


def _train_command(args: dict[str, Any], cfg: dict[str, Any], data: str, run: str,
                   byte_fallback: bool) -> str:
    """byte_fallback: what the run's tokenizer has (`train` decides when the flag is
    not given, and its default has changed)."""
    return (
        f"seq2serve train --data {data} --out {run} --threads {args.get('threads', 1)} "
        f"--vocab-size {args.get('vocab_size', cfg['src_vocab_size'])} "
        f"--d-model {cfg['d_model']} "
        + (f"--layers {cfg['encoder_layers']} " if cfg["encoder_layers"] == cfg["decoder_layers"]
           else f"--encoder-layers {cfg['encoder_layers']} "
                f"--decoder-layers {cfg['decoder_layers']} ")
        + f"--heads {cfg['encoder_heads']} --ffn {cfg['encoder_ffn_dim']}"
        + (" --pre-norm" if cfg["pre_norm"] else "")
        + ("" if byte_fallback else " --no-byte-fallback")
        + f" --max-tokens {args.get('max_tokens')} --warmup {args.get('warmup')} "
        f"--max-tgt-len {args.get('max_tgt_len')} --eval-every {args.get('eval_every')} "
        f"--eval-max-sentences {args.get('eval_max_sentences')} "
        f"--max-minutes {args.get('max_minutes')}" + _autocast_flag(args) + " --no-progress")


_CORPUS_LABELS = {"ddtp": "DDTP", "messages": "program messages", "everyday": "everyday"}


def _autocast_flag(args: dict[str, Any]) -> str:
    autocast = args.get("autocast")
    return f" --autocast {autocast}" if autocast and autocast != "none" else ""


def _test_set_name(data: str) -> str:
    """A test set's short name from its corpus folder: data/messages/en-de ->
    messages, data/everyday/en-de-handwritten -> everyday-handwritten."""
    folder = Path(data)
    variant = folder.name.split("-", 2)[2:]  # what follows the pair, if anything
    return "-".join([folder.parent.name, *variant])


def _finetune_command(args: dict[str, Any], data: str, run: str, init: str,
                      tokenizer: str) -> str:
    return (
        f"seq2serve train --data {data} --out {run} --init-from {init} "
        f"--tokenizer {tokenizer} --threads {args.get('threads', 1)} "
        f"--max-tokens {args.get('max_tokens')} --lr {args.get('lr')} "
        f"--warmup {args.get('warmup')} --max-tgt-len {args.get('max_tgt_len')} "
        f"--eval-every {args.get('eval_every')} "
        f"--eval-max-sentences {args.get('eval_max_sentences')} "
        f"--max-minutes {args.get('max_minutes')}"
        + _autocast_flag(args) + " --no-progress")


def _curve(log: list[dict[str, Any]], metric: str) -> list[str]:
    lines = ["| step | training time | validation loss | " + metric + " |",
             "|---:|---:|---:|---:|"]
    for entry in log:
        if metric in entry:
            lines.append(f"| {entry['step']} | {_hms(entry['elapsed_s'])} | "
                         f"{entry['valid_loss']:.3f} | {entry[metric]:.2f} |")
    return lines


def model_card(checkpoint: str | os.PathLike[str],
               reports: dict[str, Any] | Sequence[dict[str, Any]],
               packages: list[dict[str, Any]] | None = None,
               corpus: dict[str, Any] | None = None,
               logs: dict[str, list[dict[str, Any]]] | None = None,
               notes: str | None = None) -> str:
    """MODEL_CARD.md for a released checkpoint, from the measured records only.
    reports: `seq2serve train --score` reports, one per test split (the first is
    the training corpus's own, or the one the scoring command names first)."""
    reports = [reports] if isinstance(reports, dict) else list(reports)
    report = reports[0]
    directory = Path(checkpoint)
    meta = read_meta(directory)
    cfg, args = meta["model"], meta.get("train_args", {})
    name = meta.get("name", directory.name)
    task = meta.get("task", report["task"])
    langs = (f"{meta['src_lang']}→{meta['tgt_lang']}" if task == "translate"
             else meta.get("src_lang") or "en")
    title = "translation" if task == "translate" else "summarization (description → synopsis)"
    rel = directory.as_posix()
    data = args.get("data", report["data"])
    run = f"runs/{name}"
    ck = report["checkpoint"]
    trained = ck.get("training_seconds") or meta.get("elapsed_seconds")
    hw = report["speed"]["cpu"]
    threads = ck["trained_with"].get("threads")
    params = ck["parameters"]
    base = meta.get("base")
    bytes_ = _has_byte_fallback(directory)  # the base run's too: the same or extended
    mixed = bool(corpus and "mix" in corpus.get("source", {}))
    # Each part's repeat by corpus name (ddtp, messages, everyday); empty if no mix.
    repeats = {Path(part).parent.name: n for part, n in _corpus_repeats(corpus).items()}
    everyday = "everyday" in repeats
    # Every earlier phase, oldest first (each a record of its released step, cumulative
    # time, arguments and model); `base` is the one this run went on from.
    chain = [*meta.get("earlier", []), base] if base else []
    # The same vocabulary: the run went on from the base run's checkpoint (other data
    # or schedule). A phase that `release extend-vocab` grew the vocabulary for records
    # how; without the record, a grown vocabulary is the older fine-tune of a scratch
    # base run whose tokenizer got the characters it had mapped to <unk> (`extended`).
    grown = [(k, phase["vocabulary_extension"]) for k, phase in enumerate([*chain[1:], meta],
                                                                          start=1)
             if phase.get("vocabulary_extension")]
    extended = (bool(base) and not grown
                and base["model"]["src_vocab_size"] != cfg["src_vocab_size"])
    base_data = chain[0]["train_args"].get("data", data) if base else data
    # Each phase's decoder depth, oldest first: `--decoder-layers` grew it where it changes.
    depths = [phase["model"]["decoder_layers"] for phase in chain] + [cfg["decoder_layers"]]
    this_phase = "fine-tune" if extended else f"{_nth(len(chain) + 1)} phase"
    by_phase = [c["train_args"].get("threads", threads) for c in chain] + [threads]
    repeat = repeats.get("ddtp", 1)
    commands = ([f"seq2serve data --corpora ddtp,messages,everyday --ddtp-repeat {repeat} "
                 "--everyday-repeat " + str(repeats["everyday"]) + "   # the three corpora "
                 "and their mix via apt-get"] if everyday else
                ["seq2serve data                         # DDTP, program messages and their "
                 "mix via apt-get"] if mixed else
                ["seq2serve data --out data/ddtp          # Debian's translation indexes via "
                 "apt-get"])
    if mixed and not everyday and repeat > 1:
        commands.append(f"seq2serve data --corpora mix --mixed-out {Path(data).parent} "
                        f"--ddtp-repeat {repeat}")
    if base and extended:
        base_args, base_cfg = base["train_args"], base["model"]
        commands += [
            _train_command(base_args, base_cfg, base_data, f"runs/{name}", bytes_),
            f"python -m seq2serve.model.train.release extend-vocab runs/{name}/tokenizer.model "
            f"{data} runs/{name}-vocab.model",
            _finetune_command(args, data, f"runs/{name}-ft", f"runs/{name}/best",
                              f"runs/{name}-vocab.model"),
        ]
        run = f"runs/{name}-ft"
    elif base:  # went on from the base run's checkpoint, maybe through earlier phases
        # An earlier phase may have trained on a DDTP + messages mix that the first
        # command no longer writes (another DDTP repeat, another folder).
        mixes = _mix_commands(
            [(c["train_args"].get("data", data), _two_corpus_ddtp_repeat(c.get("train_repeat")))
             for c in chain] + [(data, repeat if mixed and not everyday else None)],
            {"data/mixed": repeat if everyday else 1,
             **({Path(data).parent.as_posix(): repeat} if mixed and not everyday else {})})
        commands += [mixes[0]] if 0 in mixes else []
        commands.append(_train_command(chain[0]["train_args"], chain[0]["model"], base_data,
                                       f"runs/{name}", bytes_)
                        + f" --max-steps {chain[0]['step']}")
        runs = [f"runs/{name}"] + [f"runs/{name}-{k + 1}" for k in range(1, len(chain) + 1)]
        tokenizer = f"runs/{name}/tokenizer.model"
        for k in range(1, len(chain) + 1):
            phase_args = chain[k]["train_args"] if k < len(chain) else args
            previous = chain[k - 1]
            if previous.get("released"):  # it went on from the shipped (released) weights
                release_dir = f"{runs[k - 1]}-release"
                commands.append(f"python -m seq2serve.model.train.release checkpoint {runs[k - 1]} "
                                f"{release_dir} --name {name}")
                init, tokenizer = release_dir, f"{release_dir}/tokenizer.model"
            else:
                init = f"{runs[k - 1]}/checkpoints/step-{int(previous['step']):09d}"
            for _, ext in (g for g in grown if g[0] == k):
                commands.append(f"python -m seq2serve.model.train.release extend-vocab "
                                f"{tokenizer} {ext['data']} runs/{name}-{k + 1}-vocab.model "
                                f"--words {ext['words']}")
                tokenizer = f"runs/{name}-{k + 1}-vocab.model"
            commands += [mixes[k]] if k in mixes else []
            commands.append(_finetune_command(phase_args, phase_args.get("data", data), runs[k],
                                              init, tokenizer)
                            + (f" --decoder-layers {depths[k]}"
                               if depths[k] != depths[k - 1] else "")
                            + (f" --max-steps {chain[k]['step']}" if k < len(chain) else ""))
        run = runs[-1]
    else:
        commands.append(_train_command(args, cfg, data, run, bytes_))
    averaged = meta.get("averaged_steps")
    if averaged:  # the mean of the last run's resume checkpoints: keep them all
        commands[-1] += " --keep 0"
        commands.append(f"python -m seq2serve.model.train.release average {run}/averaged "
                        + " ".join(f"{run}/checkpoints/step-{int(step):09d}"
                                   for step in averaged))
        run = f"{run}/averaged"
    score_files = ([f"{rel}/test-scores.json"] if len(reports) == 1 else
                   [f"{rel}/test-{_test_set_name(r['data'])}.json" for r in reports])
    score_cmds = [f"seq2serve train --score {rel} --data {r['data']} --split {r['split']} "
                  f"--score-out {out}" for r, out in zip(reports, score_files, strict=True)]
    domains = ("Debian package descriptions (DDTP), program messages (the gettext "
               "catalogs of Debian packages) and everyday text (game dialogue and "
               "narratives, manuals, dictionary examples)" if everyday else
               "Debian package descriptions (DDTP) and program messages (the gettext "
               "catalogs of Debian packages)" if mixed else
               "Debian package descriptions (DDTP)")
    out = [
        f"# {name}: {langs} {title}",
        "",
        f"A {params / 1e6:.2f}M-parameter encoder-decoder transformer trained "
        + (f"in {len(chain) + 1} phases (from scratch, then each from the one before: "
           "Model and training) " if base and not extended else "from scratch ")
        + f"on {domains}, shipped with seq2serve as "
        f"`{rel}` (checkpoint, {meta['weights']['dtype']} weights) and exported as the "
        f"model package `models/{name}`.",
        "",
        "## Data",
        "",
        (f"`{data}`, built by `seq2serve data`: DDTP (Debian bookworm's translation "
         "indexes, [docs/data-card.md](../../../docs/data-card.md))"
         + (", " if everyday else " and ")
         + "program messages ([docs/data-card-messages.md](../../../docs/data-card-messages.md))"
         + (" and everyday text ([docs/data-card-everyday.md]"
            "(../../../docs/data-card-everyday.md))" if everyday else "")
         + ", valid and test being each corpus's own"
         + ("; training pairs appear " + ", ".join(
             f"{_CORPUS_LABELS.get(part, part)} x{n}" for part, n in repeats.items())
            if everyday else
            f"; DDTP's training pairs appear {repeat} times" if repeat > 1 else "")
         + (f". The base run trained on `{base_data}`" if base and base_data != data else "")
         + "." if mixed else
         f"`{data}`, built by `seq2serve data` from Debian bookworm's translation indexes "
         "(see [docs/data-card.md](../../../docs/data-card.md) for counts, splits and the "
         "licence situation of package descriptions).")
        + (" Segments per split: " + "; ".join(
            (f"{split} {sum(kinds.values()):,} ("
             + ", ".join(f"{n:,} {k}" for k, n in kinds.items()) + ")"
             if isinstance(kinds, dict) else f"{split} {kinds:,}")
            for split, kinds in corpus["counts"].items()) + "."
           if corpus and "counts" in corpus else ""),
        "",
        "## Model and training",
        "",
        "| | |", "|---|---|",
        f"| architecture | {cfg['encoder_layers']}+{cfg['decoder_layers']} layers, d_model "
        f"{cfg['d_model']}, {cfg['encoder_heads']} heads, FFN {cfg['encoder_ffn_dim']}, "
        f"{cfg['activation']}, {'pre' if cfg['pre_norm'] else 'post'}-norm, sinusoidal "
        "positions, shared source/target/output embeddings |",
        f"| vocabulary | SentencePiece {args.get('spm_type', 'unigram')}, "
        f"{cfg['src_vocab_size']} pieces"
        + (" (joint source/target)" if task == "translate" else "")
        + (f"; the base run's {base['model']['src_vocab_size']} plus "
           f"{cfg['src_vocab_size'] - base['model']['src_vocab_size']} single characters "
           "that it had mapped to <unk> (`release extend-vocab`)" if extended else "")
        + "".join(f"; the {_nth(k + 1)} phase added the {ext['words']} words of `{ext['data']}` "
                  "that the tokenizer spelled with the most pieces"
                  + (f" and {ext['characters']} characters it had mapped to <unk>"
                     if ext.get("characters") else "")
                  + " (`release extend-vocab --words`), their embedding rows starting as "
                  "the mean of those pieces' rows" for k, ext in grown)
        + ("; byte fallback (a character without a piece is spelled in bytes)"
           if bytes_ else "") + " |",
        f"| training | Adam (0.9, 0.98), inverse-square-root schedule with "
        f"{(chain[0]['train_args'] if chain else args).get('warmup')} warm-up steps, label "
        "smoothing "
        f"{args.get('label_smoothing')}, dropout {args.get('dropout')}, gradient clipping "
        f"{args.get('clip')}, batches of ≤{args.get('max_tokens')} tokens, seed "
        f"{args.get('seed')}"
        + (f"; then fine-tuned from the base run's best checkpoint (step {base['step']}) "
           f"with the extended vocabulary, peak learning rate {args.get('lr')} after "
           f"{args.get('warmup')} warm-up steps" if extended else "")
        + ("".join(
            f"; then continued from {'the base run' if k == 1 else f'the {_nth(k)} phase'}'s "
            f"{'released ' if chain[k - 1].get('released') else ''}checkpoint at step "
            f"{chain[k - 1]['step']} on `{phase.get('data', data)}`"
            + (" with the grown vocabulary" if any(g[0] == k for g in grown) else "")
            + (f" with the decoder grown from {depths[k - 1]} to {depths[k]} layers (the new "
               "ones on top, starting as the identity)" if depths[k] != depths[k - 1] else "")
            + f", a fresh Adam with peak learning rate {phase.get('lr')} after "
            f"{phase.get('warmup')} warm-up steps"
            for k, phase in enumerate(
                [c["train_args"] for c in chain[1:]] + [args], start=1))
           if base and not extended else "") + " |",
        (f"| checkpoint | the mean of the weights at steps "
         f"{', '.join(map(str, averaged[:-1]))} and {averaged[-1]}"
         f"{f' of the {this_phase}' if base else ''} (`release average`) |" if averaged else
         f"| checkpoint | step {meta.get('step')}"
         f"{f' of the {this_phase}' if base else ''}, the "
         f"best validation {'BLEU' if task == 'translate' else 'ROUGE-L'} of the run |"),
        f"| training time | {_hms(trained) if trained else 'unknown'} wall clock"
        + (f" ({_hms(chain[0]['elapsed_seconds'])} from scratch + "
           + "".join(f"{_hms(b['elapsed_seconds'] - a['elapsed_seconds'])} "
                     f"{_nth(k)} phase + " for k, (a, b) in enumerate(
                         zip(chain, chain[1:], strict=False), start=2))
           + f"{_hms(meta['finetune_seconds'])} "
           f"{'fine-tuning' if extended else this_phase})"
           if base and meta.get("finetune_seconds")
           and all(c.get("elapsed_seconds") is not None for c in chain) else "")
        + (f" on {threads} thread{'s' if threads != 1 else ''}" if len(set(by_phase)) < 2
           else f" on {', '.join(map(str, by_phase))} threads by phase")
        + f" of an {hw} (no GPU) |",
    ]
    metric = "bleu" if task == "translate" else "rougeL"
    for label, entries in (logs or {}).items():
        out += ["", f"Validation {metric} during {label} (first "
                f"{args.get('eval_max_sentences')} segments of the valid split, greedy):", "",
                *_curve(entries, metric)]
    out += [
        "",
        "## Test-split scores",
        "",
        f"Greedy decoding with PyTorch ({report['decoding']['max_len_rule']}). "
        "*copy-source* scores the untranslated source as the output, the floor any "
        "model must beat.",
    ]
    for r in reports:
        out += ["", f"`{r['data']}`, {r['segments']} segments of the `{r['split']}` split:",
                "", *_score_table(r)]
    out += [
        "",
        "Metric signatures: " + "; ".join(
            f"{k}: `{v}`" for k, v in report["signatures"].items()),
    ]
    if packages:
        out += ["", "## Model packages (ONNX Runtime, CPU)", "",
                f"Validation split, beam {packages[0]['beam']}, through the serving engine "
                "(`python -m seq2serve.bench.quality`):", ""]
        names = [k for k in packages[0] if k not in (
            "package", "precision", "segments", "beam", "seconds", "size_mib")]
        out.append("| precision | size (MiB) | " + " | ".join(names) + " |")
        out.append("|---|---:|" + "---:|" * len(names))
        for p in packages:
            size = f"{p['size_mib']:.1f}" if "size_mib" in p else "?"
            out.append(f"| {p['precision']} | {size} | "
                       + " | ".join(f"{p[n]:.2f}" for n in names) + " |")
    if notes:
        out += ["", "## Limitations", "", notes.strip()]
    for r in reports:
        out += ["", f"## {len(r['samples'])} samples from `{r['data']}` (test split)", ""]
        for s in r["samples"]:
            kind = f" ({s['kind']})" if s.get("kind") else ""
            out += [f"- line {s['line']}{kind}",
                    f"  - source: {s['source']}",
                    f"  - reference: {s['reference']}",
                    f"  - output: {s['hypothesis']}"]
    out += [
        "", "## Reproduce", "",
        "From a clean checkout (`pip install -e '.[train]'`):", "",
        "```sh",
        *commands,
        f"python -m seq2serve.model.train.release checkpoint {run} {rel} --name {name}",
        *score_cmds,
        f"seq2serve export {rel} models/{name} --precision int8 --name {name}",
        "```", "",
        "The scoring commands alone reproduce the tables above from the shipped checkpoint "
        "(scores are deterministic: greedy decoding in fp32 on CPU)."
        + (" Resume checkpoints are saved by the clock (`--save-every-minutes`), so a "
           "rerun averages the ones it saved over the same range of steps." if averaged
           else ""),
        "",
    ]
    return "\n".join(out)


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
            meta = average_checkpoints(args.checkpoints, args.dest)
        except (OSError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(json.dumps({"dest": str(args.dest), "averaged_steps": meta["averaged_steps"],
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
