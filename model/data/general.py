"""`seq2serve data --corpora general`: the general-domain corpus.

Everyday sentences (Tatoeba, as ManyThings.org packages it and as Tatoeba's
test-set union), news (WMT newstest) and descriptions of everyday scenes
(Multi30k), read from a directory of line-aligned gzipped files
`NAME.en-XX.en.gz` / `NAME.en-XX.XX.gz` (`--general-from`, by default
`../shared/corpora/general` when it exists). The files are read where they
are, never copied into the repository.

Cleaning is the other corpora's where it applies: NFC and collapsed
whitespace (`gettext.normalize_text`), then DDTP's rules for a sentence pair
(`ddtp.reject_reason`: empty side, source equals target, over-long, length
ratio), then exact-pair dedupe. Splits go by English sentence, so every
translation of one English sentence lands in one split, and the train split
drops every pair whose English or target side is in another corpus's valid or
test split (or in the hand-written everyday test set).

`--general-expand-contractions` adds, beside each train pair whose English has
contractions of one reading ("I'm", "don't", "we're", "they'll", ...), the pair
with them spelled out ("I am", "do not", ...): ManyThings writes "I'm hungry." and
people type "I am hungry." too. "'s" and "'d" (is or has, had or would) stay. A
spelled-out English that the split rule puts outside train, or that is held out,
is not added, so no valid or test sentence reaches train this way.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from seq2serve.model.data import everyday, messages_data, mix
from seq2serve.model.data.ddtp import reject_reason
from seq2serve.model.data.gettext import NORMALIZATION, normalize_text
from seq2serve.model.data.registry import fail as _fail
from seq2serve.model.data.registry import refuse_overwrite

SPLITS = ("test", "valid", "train")
TEST_PERCENT, VALID_PERCENT = 1, 1  # by English sentence; ~2.4k pairs each for en-de
DEFAULT_DIR = Path("../shared/corpora/general")


@dataclass(frozen=True)
class Source:
    name: str  # file stem, and the pairs' kind
    what: str
    license: str
    commercial_use: bool


SOURCES = (
    Source("manythings", "short everyday sentences: Tatoeba pairs as packaged by ManyThings.org",
           "CC-BY 2.0 FR (tatoeba.org; attribution: www.manythings.org/anki and tatoeba.org)",
           True),
    Source("tatoeba", "short everyday sentences (Tatoeba test sets v2020-07-28, v2021-03-30, "
           "v2021-08-07, their union, a reserved slice removed)",
           "CC-BY 2.0 FR (tatoeba.org)", True),
    Source("newstest", "news (WMT newstest; en-de 2008-2018, en-fr 2008-2014, newssyscomb2009)",
           "WMT test sets, distributed for research and evaluation", False),
    Source("multi30k", "descriptions of everyday scenes (Multi30k task 1, English captions from "
           "Flickr30k)", "Multi30k terms (non-commercial research)", False),
)
KINDS = tuple(s.name for s in SOURCES)

Row = tuple[str, str, str]  # (kind, source, target)


@dataclass
class GeneralCorpus:
    lang: str
    splits: dict[str, list[Row]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    dropped: Counter[str] = field(default_factory=Counter)
    read: Counter[str] = field(default_factory=Counter)  # pairs read per source
    expanded: int = 0  # train pairs added with their contractions spelled out

    @property
    def name(self) -> str:
        return f"en-{self.lang}"

    def counts(self) -> dict[str, dict[str, int]]:
        return {s: dict(sorted(Counter(k for k, _, _ in rows).items()))
                for s, rows in self.splits.items()}


def english_split(english: str) -> str:
    """Deterministic split by English sentence: test, valid or train."""
    bucket = int(hashlib.sha256(english.encode("utf-8")).hexdigest(), 16) % 100
    if bucket < TEST_PERCENT:
        return "test"
    return "valid" if bucket < TEST_PERCENT + VALID_PERCENT else "train"


def read_pairs(directory: Path, source: str, lang: str) -> Iterator[tuple[str, str]]:
    """The aligned raw pairs of `source` for en-`lang`; unequal line counts fail."""
    stem = directory / f"{source}.en-{lang}"
    with gzip.open(f"{stem}.en.gz", "rt", encoding="utf-8", newline="\n") as en, \
            gzip.open(f"{stem}.{lang}.gz", "rt", encoding="utf-8", newline="\n") as other:
        for src, tgt in zip(en, other, strict=True):
            yield src.rstrip("\n"), tgt.rstrip("\n")


# A word and its contraction of one reading; "'s" and "'d" have two and stay.
_CONTRACTION = re.compile(r"\b([A-Za-z]+)(n['\u2019]t|['\u2019](?:re|ve|ll|m))\b")
_NEGATIVE_STEMS = {"ca": "can", "wo": "will", "sha": "shall"}  # can't -> cannot (below)
_SPELLED = {"re": "are", "ve": "have", "ll": "will", "m": "am"}


def _spelled_out(match: re.Match[str], question: bool) -> str:
    word, ending = match.group(1), match.group(2).replace("\u2019", "'")
    if ending == "n't":
        lower = word.lower()
        # ain't has many readings; a question inverts ("Didn't you?" is "Did you
        # not?", never "Did not you?").
        if lower == "ai" or question:
            return match.group(0)
        stem = _NEGATIVE_STEMS.get(lower, lower)
        if word[0].isupper():
            stem = stem[0].upper() + stem[1:]
        return f"{stem}not" if lower == "ca" else f"{stem} not"
    if ending == "'m" and word.lower() != "i":
        return match.group(0)
    return f"{word} {_SPELLED[ending[1:]]}"


def expand_contractions(english: str) -> str:
    """`english` with its contractions of one reading spelled out: "I'm" -> "I am",
    "don't" -> "do not", "Can't" -> "Cannot", "won't" -> "will not", "we're" ->
    "we are", "they've" -> "they have", "you'll" -> "you will"; either apostrophe.
    In a question "n't" stays, as its subject comes after it."""
    question = "?" in english
    return _CONTRACTION.sub(lambda m: _spelled_out(m, question), english)


def available(directory: Path, lang: str) -> list[str]:
    return [s.name for s in SOURCES
            if (directory / f"{s.name}.en-{lang}.en.gz").is_file()
            and (directory / f"{s.name}.en-{lang}.{lang}.gz").is_file()]


def build(directory: Path, lang: str, held_out: set[str],
          expand: bool = False) -> GeneralCorpus:
    """One pair's corpus. `held_out`: sentences (either side) of other corpora's
    valid and test splits and the hand-written set, never trained on. `expand`:
    each train pair's English with its contractions spelled out as one more pair
    (`expand_contractions`), where that English belongs to train."""
    corpus = GeneralCorpus(lang)
    seen: set[tuple[str, str]] = set()
    by_split: dict[str, list[Row]] = {s: [] for s in SPLITS}
    for source in available(directory, lang):
        for raw_src, raw_tgt in read_pairs(directory, source, lang):
            corpus.read[source] += 1
            src, tgt = normalize_text(raw_src), normalize_text(raw_tgt)
            reason = reject_reason("sentence", src, tgt)
            if reason is None and (src, tgt) in seen:
                reason = "duplicate"
            if reason is not None:
                corpus.dropped[reason] += 1
                continue
            seen.add((src, tgt))
            split = english_split(src)
            if split == "train" and (src in held_out or tgt in held_out):
                corpus.dropped["in another corpus's valid/test split"] += 1
                continue
            by_split[split].append((source, src, tgt))
            if expand and split == "train":
                longer = expand_contractions(src)
                if longer != src and english_split(longer) == "train" \
                        and longer not in held_out and (longer, tgt) not in seen \
                        and reject_reason("sentence", longer, tgt) is None:
                    seen.add((longer, tgt))
                    by_split["train"].append((source, longer, tgt))
                    corpus.expanded += 1
    corpus.splits = by_split
    return corpus


def held_out_sentences(corpora: Iterable[Path], lang: str) -> set[str]:
    """Both sides of every valid/test pair of the built corpora, and the
    hand-written everyday test set's English."""
    held: set[str] = set()
    for folder in corpora:
        for split in ("valid", "test"):
            if (folder / f"{split}.src").is_file():
                for _, src, tgt in mix.read_rows(folder, split):
                    held.update((src, tgt))
    if lang in everyday.LANGS:
        held.update(src for src, _ in everyday.handwritten(lang))
    return held


# --------------------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "general corpus (Tatoeba, WMT newstest, Multi30k from a local directory; "
        "see docs/data-card-general.md)")
    group.add_argument("--general-from", type=Path, default=DEFAULT_DIR, metavar="DIR",
                       help="directory of NAME.en-XX.{en,XX}.gz files, read in place "
                       "(default: %(default)s)")
    group.add_argument("--general-out", type=Path, default=Path("data/general"),
                       help="output directory (default: %(default)s)")
    group.add_argument("--general-mix-out", type=Path, default=Path("data/mixed-general"),
                       help="the written DDTP + messages + everyday + general mix, rewritten "
                       "by --corpora general-mix (building the general corpus writes the "
                       "weighted mix, --mix-out) (default: %(default)s)")
    group.add_argument("--general-expand-contractions", action="store_true",
                       help="add each train pair again with its English contractions of "
                       "one reading spelled out (\"I'm\" -> \"I am\", \"don't\" -> "
                       "\"do not\"), where that English is not held out")
    group.add_argument("--general-repeat", type=int, default=3,
                       help="the general corpus's weight in a mix: its training pairs appear "
                       "this many times (default: %(default)s)")


def run(args: argparse.Namespace, langs: list[str]) -> int:
    directory: Path = args.general_from
    if not directory.is_dir():
        return _fail(f"--general-from {directory} is not a directory")
    missing = [lang for lang in langs if not available(directory, lang)]
    if missing:
        return _fail(f"{directory} has no NAME.en-XX files for {', '.join(missing)}")
    out: Path = args.general_out
    if (refused := refuse_overwrite(out, args.force)) is not None:
        return refused
    others = [args.out, args.messages_out, args.everyday_out]
    unbuilt = [str(d) for d in others if not d.is_dir()]
    if unbuilt:
        return _fail(f"build {', '.join(unbuilt)} first: the general train split leaves out "
                     "every sentence of the other corpora's valid and test splits")
    corpora = [build(directory, lang, held_out_sentences(
        (d / f"en-{lang}" for d in others), lang), args.general_expand_contractions)
        for lang in langs]
    messages_data.write_atomically(out, args.force, lambda tmp: write(tmp, corpora, directory))
    for corpus in corpora:
        counts = {s: len(rows) for s, rows in corpus.splits.items()}
        print(f"general {corpus.name}: {counts}")
    print(f"wrote {out}")
    return 0


def write(directory: Path, corpora: list[GeneralCorpus], source_dir: Path) -> None:
    for corpus in corpora:
        folder = directory / corpus.name
        folder.mkdir(parents=True)
        for split, rows in corpus.splits.items():
            for ext, col in (("kind", 0), ("src", 1), ("tgt", 2)):
                (folder / f"{split}.{ext}").write_text("".join(f"{r[col]}\n" for r in rows),
                                                       encoding="utf-8", newline="\n")
        info = {
            "task": "translate", "src_lang": "en", "tgt_lang": corpus.lang,
            "counts": corpus.counts(), "read": dict(corpus.read),
            "dropped": dict(sorted(corpus.dropped.items())),
            "normalization": NORMALIZATION,
            **({"contractions_spelled_out": corpus.expanded,
                "build_flags": ["--general-expand-contractions"]} if corpus.expanded else {}),
            "split_rule": f"int(sha256(English)) % 100: 0-{TEST_PERCENT - 1} test, then "
                          f"{VALID_PERCENT} valid; train without any sentence of another "
                          "corpus's valid/test split",
            "source": {"name": "general-domain parallel text", "directory": str(source_dir),
                       "files": {s.name: {"license": s.license, "what": s.what,
                                          "commercial_use": s.commercial_use}
                                 for s in SOURCES if s.name in corpus.read}},
        }
        (folder / "corpus.json").write_text(json.dumps(info, indent=2, ensure_ascii=False)
                                            + "\n", encoding="utf-8")
