"""One module per Hugging Face architecture, behind one table keyed by config.json's
`model_type` (the shape of CTranslate2's `@register_loader` converters and optimum's
per-architecture ONNX configs). Each family module gives the exporter a `Source`
(source.py) from a folder: config -> ModelConfig, the weight mapping, the tokenizer
files, generation defaults, special and language tokens; what families share
(reading config.json and weights) is hf.py.

`FAMILIES` holds one `Family` record per architecture: what `seq2serve export
--help`, the bench's folders (bench/engine/families.py) and README's family table
(checked by tests/unit/test_families.py) read, so that the list is written once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seq2serve.model.families import bart, m2m100, marian, mbart, pegasus, t5
from seq2serve.model.families.hf import CONFIG_FILE
from seq2serve.model.families.source import Source
from seq2serve.model.families.tasks import SUMMARIZE, TRANSLATE, TaskRequest

Loader = Callable[[Path, TaskRequest | None], Source]


@dataclass(frozen=True)
class Family:
    """An architecture the exporter takes.

    name: in help texts, messages and README's table (its first column starts with it);
    model_types: config.json's `model_type` values it is chosen by;
    checkpoints: the hub's checkpoints of it, as examples;
    tokenizer_files: what a folder's tokenizer must be (one "or" another);
    tasks: what a package of it may do (tasks.py: translation of a multilingual model
      is every pair of its languages);
    layout: its `bart.Layout` where it is one of BART's layout (None: T5's own mapping);
    transformers_classes: transformers' config and model class (tests and the bench
      build folders with them);
    load: (folder, the task `export --task` asks or None) -> Source."""

    name: str
    model_types: tuple[str, ...]
    checkpoints: tuple[str, ...]
    tokenizer_files: tuple[str, ...]
    tasks: tuple[str, ...]
    layout: bart.Layout | None
    transformers_classes: tuple[str, str]
    load: Loader

    def help(self) -> str:
        """The family as `export --help` lists it."""
        return f"{self.name} ({' or '.join(self.tokenizer_files)})"


def _layout_loader(layout: bart.Layout) -> Loader:
    return functools.partial(bart.load_source, layout=layout)


FAMILY_LIST: tuple[Family, ...] = (
    Family("Marian", ("marian",), ("Helsinki-NLP/opus-mt-en-de",),
           ("source.spm + target.spm + vocab.json",), (TRANSLATE,), marian.MARIAN,
           ("MarianConfig", "MarianMTModel"), marian.load_source),
    Family("BART", ("bart",), ("facebook/bart-large-cnn", "sshleifer/distilbart-cnn-12-6"),
           ("tokenizer.json", "vocab.json + merges.txt"), (SUMMARIZE, TRANSLATE), bart.BART,
           ("BartConfig", "BartForConditionalGeneration"), _layout_loader(bart.BART)),
    Family("Pegasus", ("pegasus",), ("google/pegasus-xsum", "google/pegasus-cnn_dailymail"),
           ("tokenizer.json", "spiece.model"), (SUMMARIZE, TRANSLATE), pegasus.PEGASUS,
           ("PegasusConfig", "PegasusForConditionalGeneration"),
           _layout_loader(pegasus.PEGASUS)),
    Family("T5", ("t5",), ("google-t5/t5-small", "google/flan-t5-small"),
           ("tokenizer.json", "spiece.model"), (SUMMARIZE, TRANSLATE), None,
           ("T5Config", "T5ForConditionalGeneration"), t5.load_source),
    Family("mT5", ("mt5",), ("google/mt5-small",), ("tokenizer.json", "spiece.model"),
           (SUMMARIZE, TRANSLATE), None, ("MT5Config", "MT5ForConditionalGeneration"),
           t5.load_source),
    Family("M2M100", ("m2m_100",),
           ("facebook/m2m100_418M", "facebook/nllb-200-distilled-600M"),
           ("tokenizer.json (NLLB-200)", "sentencepiece.bpe.model + vocab.json (M2M100)"),
           (TRANSLATE,), m2m100.M2M100,
           ("M2M100Config", "M2M100ForConditionalGeneration"), m2m100.load_source),
    Family("mBART-50", ("mbart",), ("facebook/mbart-large-50-many-to-many-mmt",),
           ("tokenizer.json", "sentencepiece.bpe.model"), (TRANSLATE,), mbart.MBART,
           ("MBartConfig", "MBartForConditionalGeneration"), mbart.load_source),
)

# model_type -> its family.
FAMILIES: dict[str, Family] = {kind: f for f in FAMILY_LIST for kind in f.model_types}


def families_help() -> str:
    """Every family with its tokenizer files, for help texts."""
    return ", ".join(f.help() for f in FAMILY_LIST)


def read_model_type(path: Path) -> tuple[str | None, str]:
    """config.json's model_type, or None with what is wrong: "missing",
    "unreadable (...)", "no model_type"."""
    config = path / CONFIG_FILE
    if not config.is_file():
        return None, f"{CONFIG_FILE}: missing"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{CONFIG_FILE}: unreadable ({type(e).__name__}: {e})"
    value = data.get("model_type") if isinstance(data, dict) else None
    if not isinstance(value, str):
        return None, f"{CONFIG_FILE}: no model_type (a Hugging Face folder's config.json has one)"
    return value, ""


def model_type(path: Path) -> str | None:
    """config.json's model_type, or None (no file, not JSON, no such key)."""
    return read_model_type(path)[0]
