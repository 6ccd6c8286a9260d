"""MODEL_CARD.md of a released checkpoint, from the measured records only.

Four parts, each its own function: the lineage (`lineage`: the phases a
checkpoint went through, oldest first, with their arguments, models, times and
vocabulary growth), the reproduce commands (`reproduce_commands`, rendered
from the trainer's own argument definitions by `trainer_flags`, never copied
strings), the data prose (`data_section`, the corpora's labels, domains and
data cards read from the corpus registry) and the rendering (`model_card`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2serve.model.checkpoint import read_meta
from seq2serve.model.data import registry

CARD_FILE = "MODEL_CARD.md"


def _corpus_repeats(corpus: dict[str, Any] | None) -> dict[str, int]:
    """How many times each corpus of a training mix appears in it (corpus folder ->
    repeat), from the mix's corpus.json; empty for a corpus that is not a mix."""
    if corpus and corpus.get("parts"):  # a weighted mix
        return {str(p["corpus"]): int(p["weight"]) for p in corpus["parts"]}
    source = (corpus or {}).get("source")
    parts = source.get("mix") if isinstance(source, dict) else None
    if not corpus or not parts:
        return {}
    if corpus.get("train_repeat"):
        return {str(part): int(n) for part, n in corpus["train_repeat"].items()}
    # The DDTP + messages mix records DDTP's repeat alone.
    return {str(part): int(corpus.get("ddtp_repeat", 1)) if k == 0 else 1
            for k, part in enumerate(parts)}


def _read_corpus(data: str | None) -> dict[str, Any] | None:
    """The corpus.json of the corpus folder a run trained on, None when there is none."""
    corpus_file = Path(data) / "corpus.json" if data else None
    if corpus_file is None or not corpus_file.is_file():
        return None
    return dict(json.loads(corpus_file.read_text(encoding="utf-8")))


def _train_repeat(data: str | None) -> dict[str, int] | None:
    """`_corpus_repeats` of the corpus folder a run trained on, None when there is none.
    Kept in each released phase's record, so that a card can rebuild the mix an earlier
    phase trained on when today's `seq2serve data` writes another."""
    return _corpus_repeats(_read_corpus(data)) or None


def _train_weighted(data: str | None) -> bool:
    """Whether the corpus folder a run trained on is a weighted mix (`seq2serve data
    --corpora weighted-mix`, repeated when read) rather than written copies. Kept beside
    `train_repeat` in each released phase's record."""
    return bool((_read_corpus(data) or {}).get("parts"))


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


def _weighted_mix_commands(phases: list[tuple[str, dict[str, int] | None]],
                           built: dict[str, dict[str, int]]) -> dict[int, str]:
    """The `seq2serve data --corpora weighted-mix` command to run before each phase (by
    index) whose weighted mix is not what the commands before it wrote. phases: each
    phase's data folder and its weighted mix's weights (source name -> weight; None: not
    a weighted mix), oldest first; built: mix folder -> weights as the first `seq2serve
    data` commands wrote them."""
    commands: dict[int, str] = {}
    for k, (data, weights) in enumerate(phases):
        folder = Path(data).parent.as_posix()
        if weights and built.get(folder) != weights:
            commands[k] = (f"seq2serve data --corpora weighted-mix --mix-of {','.join(weights)} "
                           f"--mix-out {folder} {_weight_flags(weights)}"
                           + (" --force" if folder in built else ""))
            built[folder] = weights
    return commands


def _source_weights(repeats: dict[str, int]) -> dict[str, int]:
    """A phase's `train_repeat` (corpus folder -> weight) by source name, in the registry's
    order (the meta keeps its keys sorted)."""
    weights = {(registry.source_of(part) or registry.get(Path(part).parent.name)).name: n
               for part, n in repeats.items()}
    order = list(registry.SOURCES)
    return dict(sorted(weights.items(), key=lambda item: order.index(item[0])))


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


def _test_set_name(data: str) -> str:
    """A test set's short name from its corpus folder: data/messages/en-de ->
    messages, data/everyday/en-de-handwritten -> everyday-handwritten."""
    folder = Path(data)
    variant = folder.name.split("-", 2)[2:]  # what follows the pair, if anything
    return "-".join([folder.parent.name, *variant])


def _curve(log: list[dict[str, Any]], metric: str) -> list[str]:
    lines = ["| step | training time | validation loss | " + metric + " |",
             "|---:|---:|---:|---:|"]
    # A run resumed from a checkpoint older than its last evaluation evaluates those
    # steps again: the last entry of a step is the run that went on.
    last = {entry["step"]: entry for entry in log if metric in entry}
    for entry in last.values():
        lines.append(f"| {entry['step']} | {_hms(entry['elapsed_s'])} | "
                     f"{entry['valid_loss']:.3f} | {entry[metric]:.2f} |")
    return lines


# --------------------------------------------------------------------------- commands


@functools.cache
def trainer_parser() -> argparse.ArgumentParser:
    """`seq2serve train`'s own parser: the flags, their spellings and defaults."""
    from seq2serve.model.train import trainer

    parser = argparse.ArgumentParser(prog="seq2serve train")
    trainer.configure(parser)
    return parser


def trainer_flags(values: Mapping[str, Any], dests: Sequence[str],
                  if_changed: Collection[str] = ()) -> str:
    """`--flag value` for each argparse dest in `dests`, in that order, as the
    trainer's parser spells it: a store_true flag bare when true, a
    BooleanOptionalAction as `--x`/`--no-x`, a value of None left out (the
    flag's default decides); dests in `if_changed` only when they differ from
    their default. A dest the trainer does not define raises KeyError."""
    parser = trainer_parser()
    actions = {a.dest: a for a in parser._actions}
    out = []
    for dest in dests:
        action = actions[dest]
        value = values.get(dest)
        if value is None or (dest in if_changed and value == action.default):
            continue
        if isinstance(action, argparse._StoreTrueAction):
            out += [action.option_strings[0]] if value else []
        elif isinstance(action, argparse.BooleanOptionalAction):
            out.append(action.option_strings[0 if value else 1])
        else:
            out.append(f"{action.option_strings[0]} {value}")
    return " ".join(out)


def train_command(args: dict[str, Any], cfg: dict[str, Any], data: str, run: str,
                  byte_fallback: bool) -> str:
    """A run from scratch; the architecture from the checkpoint's config. byte_fallback:
    what the run's tokenizer has (`train` decides when the flag is not given, and its
    default has changed)."""
    same = cfg["encoder_layers"] == cfg["decoder_layers"]
    values = {**args, "data": data, "out": run, "threads": args.get("threads", 1),
              "vocab_size": args.get("vocab_size", cfg["src_vocab_size"]),
              "d_model": cfg["d_model"], "layers": cfg["encoder_layers"] if same else None,
              "encoder_layers": None if same else cfg["encoder_layers"],
              "decoder_layers": None if same else cfg["decoder_layers"],
              "heads": cfg["encoder_heads"], "ffn": cfg["encoder_ffn_dim"],
              "pre_norm": cfg["pre_norm"], "byte_fallback": None if byte_fallback else False,
              "no_progress": True}
    return "seq2serve train " + trainer_flags(values, (
        "data", "out", "threads", "vocab_size", "d_model", "layers", "encoder_layers",
        "decoder_layers", "heads", "ffn", "pre_norm", "byte_fallback", "max_tokens", "warmup",
        "max_tgt_len", "eval_every", "eval_max_sentences", "max_minutes", "autocast",
        "no_progress"), if_changed=("autocast",))


def finetune_command(args: dict[str, Any], data: str, run: str, init: str, tokenizer: str,
                     **more: Any) -> str:
    """A run that goes on from `init`; `more`: further flags (decoder_layers,
    max_steps, keep), rendered after the rest."""
    values = {**args, "data": data, "out": run, "init_from": init, "tokenizer": tokenizer,
              "threads": args.get("threads", 1), "no_progress": True, **more}
    return "seq2serve train " + trainer_flags(values, (
        "data", "out", "init_from", "tokenizer", "threads", "max_tokens", "lr", "warmup",
        "max_tgt_len", "eval_every", "eval_max_sentences", "max_minutes", "autocast",
        "no_progress", *more), if_changed=("autocast",))


def score_command(checkpoint: str, data: str, split: str, out: str,
                  reverse: bool = False) -> str:
    values = {"score": checkpoint, "data": data, "split": split, "score_out": out,
              "reverse": reverse}
    return "seq2serve train " + trainer_flags(
        values, ("score", "data", "split", "reverse", "score_out"))


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class TrainingData:
    """What a checkpoint trained on, as its card tells it."""

    data: str  # the corpus folder
    corpus: dict[str, Any] | None  # its corpus.json
    repeats: dict[str, int]  # source name -> weight, in the mix's order; empty: no mix
    weighted: bool  # a weighted mix (corpus.json parts), not a written one

    @property
    def mixed(self) -> bool:
        return bool(self.corpus) and ("mix" in (self.corpus or {}).get("source", {})
                                      or self.weighted)

    @property
    def listed(self) -> bool:
        """A mix whose every part's weight is recorded (not the DDTP + messages mix
        of the first releases, which records DDTP's alone)."""
        return self.mixed and "ddtp_repeat" not in (self.corpus or {})

    @property
    def ddtp_repeat(self) -> int:
        return self.repeats.get("ddtp", 1)

    def sources(self) -> list[registry.Source]:
        if self.mixed:
            return [registry.get(n) for n in self.repeats if n in registry.SOURCES]
        return [registry.source_of(self.data) or registry.get("ddtp")]


def training_data(data: str, corpus: dict[str, Any] | None) -> TrainingData:
    weighted = bool(corpus and corpus.get("parts"))
    names = ({str(p["corpus"]): str(p.get("source") or Path(p["corpus"]).parent.name)
              for p in corpus["parts"]} if corpus and weighted else {})
    repeats = {names.get(part, Path(part).parent.name): n
               for part, n in _corpus_repeats(corpus).items()}
    return TrainingData(data, corpus, repeats, weighted)


def _and(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _card_link(source: registry.Source) -> str:
    return f"[{source.card}](../../../{source.card})"


def data_section(td: TrainingData, base_data: str | None) -> str:
    """The card's Data paragraph: the corpus, its sources with their data cards
    (from the registry), the weights, the counts."""
    corpus = td.corpus
    if td.mixed:
        text = (f"`{td.data}`, built by `seq2serve data`: "
                + _and([s.card_phrase.format(link=_card_link(s)) for s in td.sources()])
                + ", valid and test being each corpus's own"
                + (f", every pair read backwards ({corpus['src_lang']}->{corpus['tgt_lang']} "
                   f"from the {corpus['tgt_lang']}-{corpus['src_lang']} corpora)"
                   if corpus and corpus.get("reverse") else "")
                + ("; training pairs appear " + ", ".join(
                    f"{registry.get(n).label if n in registry.SOURCES else n} x{w}"
                    for n, w in td.repeats.items())
                   + (" (repeated when the trainer reads them)" if td.weighted else "")
                   if td.listed else
                   f"; DDTP's training pairs appear {td.ddtp_repeat} times"
                   if td.ddtp_repeat > 1 else "")
                + (f". The base run trained on `{base_data}`" if base_data else "")
                + ".")
    elif td.sources()[0].name == "ddtp":
        text = (f"`{td.data}`, built by `seq2serve data` from Debian bookworm's translation "
                "indexes (see [docs/data-card.md](../../../docs/data-card.md) for counts, "
                "splits and the licence situation of package descriptions).")
    else:
        source = td.sources()[0]
        text = (f"`{td.data}`, built by `seq2serve data`: "
                f"{source.card_phrase.format(link=_card_link(source))}.")
    if corpus and "counts" in corpus:
        text += " Segments per split: " + "; ".join(
            (f"{split} {sum(kinds.values()):,} ("
             + ", ".join(f"{n:,} {k}" for k, n in kinds.items()) + ")"
             if isinstance(kinds, dict) else f"{split} {kinds:,}")
            for split, kinds in corpus["counts"].items()) + "."
    return text


def data_commands(td: TrainingData) -> list[str]:
    """The `seq2serve data` commands that write the corpus a run trained on."""
    if not td.mixed:
        source = td.sources()[0]
        if source.name == "ddtp":
            return ["seq2serve data --out data/ddtp          # Debian's translation indexes "
                    "via apt-get"]
        return [f"seq2serve data --corpora {','.join(_with_prerequisites([source.name]))}"]
    if not td.listed:
        commands = ["seq2serve data                         # DDTP, program messages and "
                    "their mix via apt-get"]
        if td.ddtp_repeat > 1:
            commands.append(f"seq2serve data --corpora mix --mixed-out {Path(td.data).parent} "
                            f"--ddtp-repeat {td.ddtp_repeat}")
        return commands
    names = _with_prerequisites(list(td.repeats))
    weights = " ".join([_weight_flags(td.repeats), *_part_build_flags(td.corpus)]).strip()
    count = {2: "two", 3: "three", 4: "four", 5: "five"}.get(len(names), str(len(names)))
    commands = [f"seq2serve data --corpora {','.join(names)} {weights}   # the {count} corpora "
                f"and their {'weighted ' if td.weighted else ''}mix via apt-get"]
    folder = Path(td.data).parent.as_posix()
    if td.weighted and (list(td.repeats) != list(registry.SOURCES) or folder != "data/mix"):
        commands.append(f"seq2serve data --corpora weighted-mix --mix-of "
                        f"{','.join(td.repeats)} --mix-out {folder} {weights}")
    elif not td.weighted:  # a written mix: the build writes the three-corpus one alone
        from seq2serve.model.data.corpus import WRITTEN_MIXES

        written = next((m for m in WRITTEN_MIXES.values()
                        if list(m.sources) == list(td.repeats)), None)
        out = {a.dest: a for a in _data_parser()._actions}[written.out_flag] if written \
            else None
        if written and out and not (written.name == "everyday-mix" and folder == out.default
                                    .as_posix()):
            where = "" if folder == out.default.as_posix() else \
                f" {out.option_strings[0]} {folder}"
            commands.append(f"seq2serve data --corpora {written.name}{where} {weights}")
    return commands


def _part_build_flags(corpus: dict[str, Any] | None) -> list[str]:
    """The build flags a weighted mix's parts record (`mix._build_flags`), once each."""
    parts = (corpus or {}).get("parts") or []
    return list(dict.fromkeys(f for p in parts for f in p.get("build_flags", [])))


def _with_prerequisites(names: list[str]) -> list[str]:
    wanted = set(names) | {a for n in names for a in registry.get(n).after}
    return [n for n in registry.SOURCES if n in wanted]


@functools.cache
def _data_parser() -> argparse.ArgumentParser:
    from seq2serve.model.data import corpus

    parser = argparse.ArgumentParser(prog="seq2serve data")
    corpus.configure(parser)
    return parser


def _weight_flags(repeats: dict[str, int]) -> str:
    """`--<source>-repeat N` as `seq2serve data` spells them, for each weight but a
    1 that is its flag's default."""
    parser = _data_parser()
    actions = {a.dest: a for a in parser._actions}
    out = []
    for name, weight in repeats.items():
        action = actions[registry.get(name).weight_flag]
        if weight != 1 or action.default != 1:
            out.append(f"{action.option_strings[0]} {weight}")
    return " ".join(out)


# --------------------------------------------------------------------------- lineage


@dataclass(frozen=True)
class Lineage:
    """The phases a released checkpoint went through, oldest first."""

    name: str
    meta: dict[str, Any]
    args: dict[str, Any]  # the last phase's train_args
    base: dict[str, Any] | None  # the phase this run went on from
    chain: list[dict[str, Any]]  # every earlier phase's record, oldest first
    grown: list[tuple[int, dict[str, Any]]]  # (phase, `release extend-vocab` record)
    extended: bool  # the older fine-tune of a base run, on a vocabulary grown by characters
    base_data: str  # the first phase's corpus
    depths: list[int]  # each phase's decoder depth, this one last
    this_phase: str
    threads: list[Any]  # each phase's threads
    averaged: list[int] | None  # the steps averaged into this checkpoint
    # (phase number or None when no phase of the chain matches, the record of
    # `release average --interpolate-with`) where the mean was moved toward an ancestor
    interpolated: tuple[int | None, dict[str, Any]] | None = None


def lineage(meta: dict[str, Any], name: str, data: str, threads: Any) -> Lineage:
    cfg, args = meta["model"], meta.get("train_args", {})
    base = meta.get("base")
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
    interpolated = None
    if record := meta.get("interpolated_with"):
        phase = next((k for k, c in enumerate(chain, start=1) if c.get("step") == record["step"]
                      and _same_seconds(c.get("elapsed_seconds"), record["elapsed_seconds"])),
                     None)
        interpolated = (phase, record)
    return Lineage(name, meta, args, base, chain, grown, extended, base_data, depths,
                   this_phase, by_phase, meta.get("averaged_steps"), interpolated)


def _same_seconds(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) < 1.0


def _interpolated_text(interpolated: tuple[int | None, dict[str, Any]] | None) -> str:
    if not interpolated:
        return ""
    phase, record = interpolated
    w = record["weight"]
    which = ("the base run's checkpoint" if phase == 1 else
             f"the {_nth(phase)} phase's checkpoint" if phase else "a checkpoint") \
        + f" (step {record['step']})"
    return (f", then moved toward {which}: {1 - w:g} × the mean + {w:g} × that checkpoint "
            "(`release average --interpolate-with`, weight-space ensembling as in WiSE-FT: "
            "it takes back some of the earlier phase's domain)")


def reproduce_commands(lin: Lineage, td: TrainingData, rel: str, bytes_: bool,
                       reports: Sequence[dict[str, Any]]) -> tuple[list[str], list[str], str]:
    """(commands to train, scoring commands, the run the checkpoint is released from)."""
    name, args, cfg, data = lin.name, lin.args, lin.meta["model"], td.data
    base, chain, grown, depths = lin.base, lin.chain, lin.grown, lin.depths
    commands = data_commands(td)
    run = f"runs/{name}"
    if base and lin.extended:
        commands += [
            train_command(base["train_args"], base["model"], lin.base_data, f"runs/{name}",
                          bytes_),
            f"python -m seq2serve.model.train.release extend-vocab runs/{name}/tokenizer.model "
            f"{data} runs/{name}-vocab.model",
            finetune_command(args, data, f"runs/{name}-ft", f"runs/{name}/best",
                             f"runs/{name}-vocab.model"),
        ]
        run = f"runs/{name}-ft"
    elif base:  # went on from the base run's checkpoint, maybe through earlier phases
        # An earlier phase may have trained on a DDTP + messages mix that the first
        # command no longer writes (another DDTP repeat, another folder).
        two = td.mixed and not td.listed
        mixes = _mix_commands(
            [(c["train_args"].get("data", data), _two_corpus_ddtp_repeat(c.get("train_repeat")))
             for c in chain] + [(data, td.ddtp_repeat if two else None)],
            {"data/mixed": td.ddtp_repeat if td.listed else 1,
             **({Path(data).parent.as_posix(): td.ddtp_repeat} if two else {})})
        weighted = _weighted_mix_commands(
            [(c["train_args"].get("data", data), _source_weights(c["train_repeat"])
              if c.get("train_weighted") else None) for c in chain]
            + [(data, td.repeats if td.weighted else None)],
            # the first command writes data/mix, and the last phase's folder where another
            {"data/mix": td.repeats, Path(data).parent.as_posix(): td.repeats}
            if td.weighted else {})
        mixes = {**mixes, **weighted}
        commands += [mixes[0]] if 0 in mixes else []
        commands.append(train_command(chain[0]["train_args"], chain[0]["model"], lin.base_data,
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
            more = {"decoder_layers": depths[k] if depths[k] != depths[k - 1] else None,
                    "max_steps": chain[k]["step"] if k < len(chain) else None}
            commands.append(finetune_command(phase_args, phase_args.get("data", data), runs[k],
                                             init, tokenizer, **more))
        run = runs[-1]
    else:
        commands.append(train_command(args, cfg, data, run, bytes_))
    if lin.averaged:  # the mean of the last run's resume checkpoints: keep them all
        commands[-1] += " " + trainer_flags({"keep": 0}, ("keep",))
        toward = ""
        if lin.interpolated:  # an earlier phase's release, which the commands above write
            phase, record = lin.interpolated
            ancestor = (f"runs/{name}-release" if phase == 1 else
                        f"runs/{name}-{phase}-release") if phase else record.get(
                            "path", "ANCESTOR")
            if phase and not any(c.endswith(f" {ancestor} --name {name}") for c in commands):
                source = f"runs/{name}" if phase == 1 else f"runs/{name}-{phase}"
                commands.append(f"python -m seq2serve.model.train.release checkpoint {source} "
                                f"{ancestor} --name {name}")
            toward = (f" --interpolate-with {ancestor} "
                      f"--interpolate-weight {record['weight']:g}")
        commands.append(f"python -m seq2serve.model.train.release average {run}/averaged "
                        + " ".join(f"{run}/checkpoints/step-{int(step):09d}"
                                   for step in lin.averaged) + toward)
        run = f"{run}/averaged"
    score_files = ([f"{rel}/test-scores.json"] if len(reports) == 1 else
                   [f"{rel}/test-{_test_set_name(r['data'])}.json" for r in reports])
    score_cmds = [score_command(rel, r["data"], r["split"], out, r.get("reverse", False))
                  for r, out in zip(reports, score_files, strict=True)]
    return commands, score_cmds, run


# --------------------------------------------------------------------------- rendering


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
    ck = report["checkpoint"]
    trained = ck.get("training_seconds") or meta.get("elapsed_seconds")
    hw = report["speed"]["cpu"]
    threads = ck["trained_with"].get("threads")
    params = ck["parameters"]
    bytes_ = _has_byte_fallback(directory)  # the base run's too: the same or extended
    td = training_data(data, corpus)
    lin = lineage(meta, name, data, threads)
    base, chain, grown, extended = lin.base, lin.chain, lin.grown, lin.extended
    depths, this_phase, by_phase, averaged = lin.depths, lin.this_phase, lin.threads, lin.averaged
    commands, score_cmds, run = reproduce_commands(lin, td, rel, bytes_, reports)
    domains = _and([s.domain for s in td.sources()])
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
        data_section(td, lin.base_data if base and lin.base_data != data else None),
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
         f"{f' of the {this_phase}' if base else ''} (`release average`)"
         + _interpolated_text(lin.interpolated) + " |" if averaged else
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
