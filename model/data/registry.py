"""The registry of corpus sources: what `seq2serve data` can build, in one place.

A source is a reader (its module's `configure(parser)` adds its flags, its
`run(args, langs)` reads, cleans, splits and writes the corpus with its data
card), its split rule and its card notes (the label and domain prose model
cards use, its data card, its licence). The CLI's `--corpora`, the mixes, the
trainer's `--kind` choices and the model cards' labels all read this table,
as sacrebleu's dataset table or fairseq's `register_task` do.

Adding a source: a module with `configure` and `run` (see `general.py`), one
`register(Source(...))` below, and a data card in docs/. Nothing else.

Standard library only: the trainer imports it without the builders' imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Source:
    name: str  # --corpora name; its corpus folders are <out>/en-<lang>
    label: str  # how model cards name it
    kinds: tuple[str, ...]  # what its `{split}.kind` lines can be
    split_rule: str  # what decides a pair's split (the corpus.json's own text is exact)
    domain: str  # model-card prose: what the text is
    card: str  # its data card, from the repository root
    card_phrase: str  # how a model card's Data names it, {link} its data card's link
    licence: str  # model-card prose: the terms
    module: str  # under seq2serve.model.data: configure(parser), run(args, langs) -> int
    out_flag: str  # the argparse dest of its output directory
    default_out: str
    weight_flag: str  # the argparse dest of its weight in a mix (its train pairs' repeats)
    default: bool = False  # built when --corpora is not given
    after: tuple[str, ...] = ()  # sources that must be built first (in --corpora order)

    def builder(self) -> Callable[[argparse.Namespace, list[str]], int]:
        return importlib.import_module(f"seq2serve.model.data.{self.module}").run  # type: ignore[no-any-return]

    def configure(self, parser: argparse.ArgumentParser) -> None:
        importlib.import_module(f"seq2serve.model.data.{self.module}").configure(parser)


SOURCES: dict[str, Source] = {}


def register(source: Source) -> Source:
    if source.name in SOURCES:
        raise ValueError(f"corpus source {source.name!r} is registered twice")
    unknown = [s for s in source.after if s not in SOURCES]
    if unknown:
        raise ValueError(f"{source.name}: register {unknown} first")
    SOURCES[source.name] = source
    return source


def get(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise KeyError(f"no corpus source {name!r}; known: {', '.join(SOURCES)}") from None


def all_kinds() -> tuple[str, ...]:
    """Every kind any source writes, once, in registry order."""
    return tuple(dict.fromkeys(k for s in SOURCES.values() for k in s.kinds))


def source_of(folder: str | Path) -> Source | None:
    """The source of a corpus folder by its parent's name, as `seq2serve data`
    writes them (data/messages/en-de -> messages); None for anything else."""
    return SOURCES.get(Path(folder).parent.name)


def label_of(folder: str | Path) -> str:
    """A model card's name for a corpus folder: its source's label, else the
    folder's parent name."""
    source = source_of(folder)
    return source.label if source else Path(folder).parent.name


register(Source(
    name="ddtp", label="DDTP", kinds=("synopsis", "paragraph", "sentence", "description"),
    split_rule="by package description: int(sha256(Description-md5)) % 100, 0-1 test, "
               "2-3 valid, else train",
    domain="Debian package descriptions (DDTP)",
    card="docs/data-card.md",
    card_phrase="DDTP (Debian bookworm's translation indexes, {link})",
    licence="Debian package descriptions and their DDTP translations: no single licence",
    module="ddtp_data", out_flag="out", default_out="data/ddtp", weight_flag="ddtp_repeat",
    default=True))
register(Source(
    name="messages", label="program messages", kinds=("message",),
    split_rule="by source package: int(sha256(source package)) % 100, 0-2 test, "
               "3-5 valid, else train",
    domain="program messages (the gettext catalogs of Debian packages)",
    card="docs/data-card-messages.md", card_phrase="program messages ({link})",
    licence="each catalog under its package's licence",
    module="messages_data", out_flag="messages_out", default_out="data/messages",
    weight_flag="messages_repeat", default=True))
register(Source(
    name="everyday", label="everyday", kinds=("sentence", "paragraph", "word"),
    split_rule="catalogs by binary package (named test/valid packages and the messages "
               "corpus's test/valid source packages); entries by sha256(English)",
    domain="everyday text (game dialogue and narratives, manuals, dictionary examples)",
    card="docs/data-card-everyday.md", card_phrase="everyday text ({link})",
    licence="each package's licence",
    module="everyday_data", out_flag="everyday_out", default_out="data/everyday",
    weight_flag="everyday_repeat"))
register(Source(
    name="general", label="general", kinds=("manythings", "tatoeba", "newstest", "multi30k"),
    split_rule="by English sentence: int(sha256(English)) % 100, 0 test, 1 valid; train "
               "without any sentence of another corpus's valid/test split",
    domain="general text (Tatoeba's everyday sentences, WMT news, Multi30k's scene "
           "descriptions)",
    card="docs/data-card-general.md",
    card_phrase="general text: Tatoeba, WMT newstest, Multi30k ({link})",
    licence="Tatoeba CC-BY 2.0 FR; WMT newstest and Multi30k for research only "
            "(no commercial use)",
    module="general", out_flag="general_out", default_out="data/general",
    weight_flag="general_repeat", after=("ddtp", "messages", "everyday")))


def log(message: str) -> None:
    """A line on stderr, as every `seq2serve data` builder writes them."""
    print(f"seq2serve data: {message}", file=sys.stderr)


def fail(message: str) -> int:
    """Log an error and return the CLI's failure status."""
    log(f"error: {message}")
    return 1


def refuse_overwrite(out: Path, force: bool) -> int | None:
    """The failure status (logged) when `out` holds anything and `--force` was not given."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        return fail(f"{out} exists and is not empty; use --force to replace it")
    return None
