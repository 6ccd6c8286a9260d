"""`seq2serve data`: build the registered corpora and their mixes.

Each source (`registry.py`: DDTP, program messages, everyday, general) is a
module with `configure(parser)` and `run(args, langs)` that reads, cleans,
splits and writes one corpus folder per language pair with its data card.
This module is the CLI over the registry: which sources to build, in which
order, and the mixes of them (`mix.py`):

- the weighted mix (`--corpora weighted-mix`, and after building the general
  corpus): parts and weights in corpus.json, valid/test written, training
  pairs repeated when the trainer reads them; every en-<lang> pair also as
  <lang>-en, the same parts read backwards (the into-English models);
- the written mixes of older releases, kept so that their cards' commands
  still rebuild them: `mix` (DDTP + messages, written when both are built),
  `everyday-mix` (+ everyday, written with the everyday corpus), `general-mix`
  (+ general).

Only the standard library and `lz4` are used, so this runs on a bare machine
before torch is installed.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from seq2serve.model.data import mix, registry

# Re-exported: DDTP's build lived here before the registry.
from seq2serve.model.data.ddtp_data import (  # noqa: F401
    Corpus,
    IndexFile,
    build,
    find_indexes,
    read_index,
    release_info,
    split_of,
)
from seq2serve.model.data.messages_data import write_atomically
from seq2serve.model.data.registry import fail as _fail
from seq2serve.model.data.registry import refuse_overwrite

DEFAULT_LANGS = ("de", "fr")
WEIGHTED = "weighted-mix"


@dataclass(frozen=True)
class WrittenMix:
    """A mix written out with repeated copies (the older releases' data/mixed*)."""

    name: str  # its --corpora word
    sources: tuple[str, ...]
    out_flag: str
    handwritten: bool  # train leaves out the hand-written set's English
    legacy_record: bool  # corpus.json records DDTP's repeat alone (`ddtp_repeat`)


WRITTEN_MIXES = {m.name: m for m in (
    WrittenMix("mix", ("ddtp", "messages"), "mixed_out", False, True),
    WrittenMix("everyday-mix", ("ddtp", "messages", "everyday"), "everyday_mix_out", True,
               False),
    WrittenMix("general-mix", ("ddtp", "messages", "everyday", "general"), "general_mix_out",
               True, False),
)}


def configure(parser: argparse.ArgumentParser) -> None:
    names = ", ".join(registry.SOURCES)
    parser.epilog = (
        "By default this runs `apt-get -c CONF update` (needs root) with CONF setting "
        "Acquire::Languages to en plus --langs, then reads the Translation-* indexes from "
        "apt's lists directory (`apt-config shell`). Output: <out>/en-<lang>/, "
        "<out>/summarize-en/ and <out>/DATA_CARD.md. Program messages: a private apt "
        "state under --deb-cache fetches the Contents indexes and the chosen .debs "
        "(bounded by --max-packages/--max-download-mb, resumable)."
    )
    parser.add_argument("--out", type=Path, default=Path(registry.get("ddtp").default_out),
                        help="output directory, one folder per corpus plus DATA_CARD.md "
                        "(default: %(default)s)")
    parser.add_argument("--langs", default=",".join(DEFAULT_LANGS),
                        help="comma-separated target languages to pair with English "
                        "(default: %(default)s)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--from-dir", type=Path, metavar="DIR",
                        help="read *Translation-<lang>[.lz4|.gz|.xz|.bz2] files from DIR "
                        "instead of apt (offline use, tests)")
    source.add_argument("--no-update", action="store_true",
                        help="read apt's lists directory without running apt-get update first")
    parser.add_argument("--force", action="store_true",
                        help="replace non-empty output directories")
    default = ",".join(s.name for s in registry.SOURCES.values() if s.default)
    parser.add_argument("--corpora", default=default,
                        help=f"which corpora to build, comma-separated from {names} "
                        "(default: %(default)s), built in that order; general needs the "
                        "other three built (its train split leaves out their valid and test "
                        f"sentences) and writes the weighted mix (--mix-of, --mix-out). {WEIGHTED} "
                        "alone writes the weighted mix of the built --mix-of corpora to "
                        "--mix-out. The written mixes of older releases: ddtp with messages "
                        "writes --mixed-out, everyday with them --everyday-mix-out; mix, "
                        "everyday-mix or general-mix alone rewrites that mix from the corpora "
                        "already built")
    group = parser.add_argument_group(
        "weighted mix (the parts and their weights in corpus.json; the trainer repeats "
        "each part's training pairs by its weight, the --*-repeat flags)")
    group.add_argument("--mix-of", default=",".join(registry.SOURCES),
                       help="the corpora of the weighted mix (default: %(default)s)")
    group.add_argument("--mix-out", type=Path, default=Path("data/mix"),
                       help="the weighted mix's directory (default: %(default)s)")
    for src in registry.SOURCES.values():
        src.configure(parser)


def run(args: argparse.Namespace) -> int:
    langs = [lang.strip() for lang in args.langs.split(",") if lang.strip()]
    bad = [lang for lang in langs if not re.fullmatch(r"[a-z]{2,3}(?:_[A-Z]{2})?", lang)
           or lang == "en"]
    if bad or not langs:
        return _fail(f"--langs must be language codes other than en, got {args.langs!r}")
    wanted = _names(args.corpora)
    if args.ddtp_repeat < 1:
        return _fail(f"--ddtp-repeat must be >= 1, got {args.ddtp_repeat}")
    if len(wanted) == 1 and wanted[0] in WRITTEN_MIXES:
        return write_copies(args, WRITTEN_MIXES[wanted[0]])
    if wanted == [WEIGHTED]:
        return write_weighted(args, _names(args.mix_of))
    if not wanted or set(wanted) - set(registry.SOURCES):
        return _fail(f"--corpora must name some of {', '.join(registry.SOURCES)}, or be "
                     f"{WEIGHTED} or one of {', '.join(WRITTEN_MIXES)} alone; "
                     f"got {args.corpora[:80]!r}")
    sources = [s for s in registry.SOURCES.values() if s.name in wanted]  # registry order
    outputs = [getattr(args, s.out_flag) for s in sources]
    if {"ddtp", "messages"} <= set(wanted):
        outputs.append(args.mixed_out)
    for out in outputs:
        if (refused := refuse_overwrite(out, args.force)) is not None:
            return refused
    for source in sources:
        if status := source.builder()(args, langs):
            return status
        if source.name == "messages" and "ddtp" in wanted and (
                status := write_copies(args, WRITTEN_MIXES["mix"])):
            return status
        if source.name == "everyday" and all(
                getattr(args, registry.get(s).out_flag).is_dir() for s in ("ddtp", "messages")
        ) and (status := write_copies(args, WRITTEN_MIXES["everyday-mix"])):
            return status
        if source.name == "general" and (status := write_weighted(args, _names(args.mix_of))):
            return status
    return 0


def reversed_pair(name: str) -> str:
    """en-de -> de-en (a pair folder's name read the other way)."""
    src, _, tgt = name.partition("-")
    return f"{tgt}-{src}"


def _names(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def _parts(args: argparse.Namespace, names: list[str]
           ) -> tuple[list[tuple[registry.Source, Path, int]], list[str]] | str:
    """(source, output directory, weight) of each named corpus and the language
    pairs all of them hold, or what is wrong."""
    unknown = [n for n in names if n not in registry.SOURCES]
    if unknown or not names:
        return f"no corpus source {unknown or names}; known: {', '.join(registry.SOURCES)}"
    parts = [(s, getattr(args, s.out_flag), getattr(args, s.weight_flag))
             for s in map(registry.get, names)]
    for source, built, weight in parts:
        if weight < 1:
            return f"--{source.weight_flag.replace('_', '-')} must be >= 1, got {weight}"
        if not built.is_dir():
            return f"{built} is not a built corpus; run seq2serve data first"
    pairs = sorted(p.name for p in parts[-1][1].iterdir()
                   if all((d / p.name / "corpus.json").is_file() for _, d, _ in parts))
    if not pairs:
        return f"{', '.join(names)} share no language pair"
    return parts, pairs


def write_copies(args: argparse.Namespace, written: WrittenMix) -> int:
    """A written mix of older releases, as they wrote it."""
    found = _parts(args, list(written.sources))
    if isinstance(found, str):
        return _fail(found)
    parts, pairs = found
    if written.legacy_record and any(w != 1 for s, _, w in parts if s.name != "ddtp"):
        return _fail(f"--corpora {written.name} weights DDTP alone (--ddtp-repeat)")
    out: Path = getattr(args, written.out_flag)

    def fill(tmp: Path) -> None:
        for name in pairs:
            folders = [(d / name, w) for _, d, w in parts]
            record = {"ddtp_repeat": folders[0][1]} if written.legacy_record else None
            held = mix.handwritten_sources(name.split("-", 1)[1]) if written.handwritten \
                else set()
            mix.write_copies(tmp / name, folders, held, record)

    try:
        write_atomically(out, args.force, fill)
    except FileExistsError as exc:
        return _fail(str(exc))
    print(f"wrote {out} ({', '.join(pairs)}: "
          + " + ".join(f"{s.label} x{w}" for s, _, w in parts) + ")")
    return 0


def write_weighted(args: argparse.Namespace, names: list[str]) -> int:
    """The weighted mix of the named built corpora at --mix-out."""
    found = _parts(args, names)
    if isinstance(found, str):
        return _fail(found)
    parts, pairs = found

    # every en-<lang> pair also into English: de-en reads en-de's parts backwards
    folders = [(name, name, False) for name in pairs] + [
        (reversed_pair(name), name, True) for name in pairs if name.startswith("en-")]

    def fill(tmp: Path) -> None:
        for folder, name, reverse in folders:
            mix.write_weighted(tmp / folder, [(s.name, d / name, w) for s, d, w in parts],
                               mix.handwritten_sources(name.split("-", 1)[1]), reverse)

    try:
        write_atomically(args.mix_out, args.force, fill)
    except FileExistsError as exc:
        return _fail(str(exc))
    print(f"wrote {args.mix_out} ({', '.join(f for f, _, _ in folders)}: "
          + " + ".join(f"{s.label} x{w}" for s, _, w in parts) + ", weighted when read)")
    return 0
