"""One mix of registered corpora, weighted when it is read.

A weighted mix is a folder per language pair holding `corpus.json` whose
`parts` name the corpus folders and their weights
(`[{"corpus": "data/ddtp/en-de", "source": "ddtp", "weight": 4}, ...]`), the
valid and test splits written out (every part's own, concatenated in part
order, so scoring and the trainer's validation read them as files), and
`exclude.src`: English sentences whose pairs training never sees (the
hand-written everyday test set). Its training pairs are never written: the
trainer tokenizes each part on its own and repeats its examples `weight` times
in every epoch (`batching.tokenize_mix`), as OpenNMT-py weights its corpora.

A reversed mix (`"reverse": true`, the `<lang>-en` folders) reads the same
English-first parts the other way round: every row's source and target swap
(valid and test are written swapped, train is swapped when read), while what
train leaves out is decided on the parts' own rows, so de-en holds out exactly
the pairs en-de holds out.

Train drops every pair (exact source and target) of any part's valid or test
split and every pair whose English is in `exclude.src`, which is what the
written mixes of older releases did (`write_copies`, kept to rebuild them):
`train_rows` of a weighted mix is the same multiset of pairs as the train
split of the written mix with the same parts and repeats.

Standard library only (the trainer imports it).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

Row = tuple[str, str, str]  # (kind, source, target)
EXCLUDE_FILE = "exclude.src"
SPLIT_RULE = "each corpus's own; train without any valid/test pair"


def read_rows(corpus: Path, split: str) -> list[Row]:
    """(kind, source, target) lines of a corpus split; a missing split is empty."""
    if not (corpus / f"{split}.src").is_file():
        return []
    read = [(corpus / f"{split}.{ext}").read_text("utf-8").split("\n")[:-1]
            for ext in ("kind", "src", "tgt")]
    return list(zip(*read, strict=True))


def _write_rows(folder: Path, split: str, rows: list[Row]) -> dict[str, int]:
    for ext, col in (("kind", 0), ("src", 1), ("tgt", 2)):
        (folder / f"{split}.{ext}").write_text("".join(f"{r[col]}\n" for r in rows),
                                               encoding="utf-8", newline="\n")
    counts: dict[str, int] = {}
    for kind, _, _ in rows:
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def held_pairs(parts: Iterable[Path]) -> set[tuple[str, str]]:
    """Every (source, target) of the parts' valid and test splits."""
    return {(s, t) for corpus in parts for split in ("test", "valid")
            for _, s, t in read_rows(corpus, split)}


def handwritten_sources(lang: str) -> set[str]:
    """The hand-written everyday test set's English, for a pair it exists for."""
    from seq2serve.model.data import everyday

    return {src for src, _ in everyday.handwritten(lang)} if lang in everyday.LANGS else set()


# --------------------------------------------------------------------------- weighted


def swapped(rows: Iterable[Row]) -> list[Row]:
    """Rows with source and target exchanged (a reversed mix's view of a part)."""
    return [(kind, tgt, src) for kind, src, tgt in rows]


def write_weighted(folder: Path, parts: list[tuple[str, Path, int]],
                   held_sources: set[str] | frozenset[str] = frozenset(),
                   reverse: bool = False) -> dict[str, Any]:
    """One pair's weighted mix from (source name, corpus folder, weight) parts;
    returns its corpus.json. `reverse`: translate the parts' targets into their
    sources (de-en from the en-de corpora)."""
    if any(weight < 1 for _, _, weight in parts):
        raise ValueError(f"weights must be >= 1, got {[w for _, _, w in parts]}")
    folder.mkdir(parents=True)
    turn = swapped if reverse else list
    counts = {split: _write_rows(folder, split, turn([row for _, corpus, _ in parts
                                                      for row in read_rows(corpus, split)]))
              for split in ("test", "valid")}
    (folder / EXCLUDE_FILE).write_text("".join(f"{s}\n" for s in sorted(held_sources)),
                                       encoding="utf-8", newline="\n")
    info = json.loads((parts[0][1] / "corpus.json").read_text("utf-8"))
    info = {k: info[k] for k in ("task", "src_lang", "tgt_lang") if k in info}
    if reverse:
        info.update(src_lang=info["tgt_lang"], tgt_lang=info["src_lang"], reverse=True)
    info["parts"] = [{"corpus": str(corpus), "source": name, "weight": weight,
                      **_build_flags(corpus)} for name, corpus, weight in parts]
    train: dict[str, int] = {}
    for kind, _, _ in train_rows(folder, info):
        train[kind] = train.get(kind, 0) + 1
    info.update(counts={**counts, "train": train}, split_rule=SPLIT_RULE,
                exclude=f"{EXCLUDE_FILE}: pairs with this English are not trained on")
    if reverse:
        info["reverse_rule"] = ("every part's rows read target -> source; train leaves out "
                                "what the forward mix leaves out")
    (folder / "corpus.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    return info


def _build_flags(corpus: Path) -> dict[str, list[str]]:
    """A part's `seq2serve data` flags that changed what it holds (its corpus.json's
    build_flags), so that a model card's commands rebuild the same part."""
    path = corpus / "corpus.json"
    flags = json.loads(path.read_text("utf-8")).get("build_flags") if path.is_file() else None
    return {"build_flags": list(flags)} if flags else {}


def read_info(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "corpus.json").read_text("utf-8"))  # type: ignore[no-any-return]


def is_weighted(folder: str | Path) -> bool:
    """Whether a corpus folder is a weighted mix (its corpus.json has parts)."""
    path = Path(folder) / "corpus.json"
    return path.is_file() and "parts" in read_info(folder)


def is_reversed(info: dict[str, Any]) -> bool:
    """Whether a weighted mix reads its parts target -> source."""
    return bool(info.get("reverse", False))


def parts_of(info: dict[str, Any]) -> list[tuple[Path, int]]:
    """A weighted mix's (corpus folder, weight) parts."""
    return [(Path(p["corpus"]), int(p["weight"])) for p in info["parts"]]


def exclusions(folder: str | Path, info: dict[str, Any] | None = None
               ) -> tuple[set[tuple[str, str]], set[str]]:
    """What a weighted mix's train leaves out: the parts' valid/test pairs and
    the English of `exclude.src`."""
    info = info or read_info(folder)
    exclude = Path(folder) / EXCLUDE_FILE
    sources = set(exclude.read_text("utf-8").split("\n")[:-1]) if exclude.is_file() else set()
    return held_pairs(p for p, _ in parts_of(info)), sources


def part_train_rows(corpus: Path, pairs: set[tuple[str, str]], sources: set[str],
                    reverse: bool = False) -> list[Row]:
    """A part's train rows that a mix keeps (each once), swapped for a reversed
    mix (what is kept is decided on the part's own rows)."""
    kept = [r for r in read_rows(corpus, "train")
            if (r[1], r[2]) not in pairs and r[1] not in sources]
    return swapped(kept) if reverse else kept


def train_rows(folder: str | Path, info: dict[str, Any] | None = None) -> Iterator[Row]:
    """The training pairs a weighted mix stands for, each part's `weight` times."""
    info = info or read_info(folder)
    pairs, sources = exclusions(folder, info)
    for corpus, weight in parts_of(info):
        rows = part_train_rows(corpus, pairs, sources, is_reversed(info))
        for _ in range(weight):
            yield from rows


@contextlib.contextmanager
def train_text(folder: str | Path, scratch: Path) -> Iterator[list[Path]]:
    """The train.src and train.tgt files of a corpus folder; of a weighted mix,
    its training pairs written once into a temporary folder under `scratch`,
    line for line what the written mix's files would be (tokenizer training
    and `release extend-vocab` read the text)."""
    folder = Path(folder)
    if not is_weighted(folder):
        yield [folder / "train.src", folder / "train.tgt"]
        return
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".mix-text-", dir=scratch) as tmp:
        files = [Path(tmp) / "train.src", Path(tmp) / "train.tgt"]
        with files[0].open("w", encoding="utf-8", newline="\n") as src, \
                files[1].open("w", encoding="utf-8", newline="\n") as tgt:
            for _, s, t in train_rows(folder):
                src.write(f"{s}\n")
                tgt.write(f"{t}\n")
        yield files


# --------------------------------------------------------------------------- written


def write_copies(folder: Path, parts: list[tuple[Path, int]],
                 held_sources: set[str] | frozenset[str] = frozenset(),
                 record: dict[str, Any] | None = None) -> None:
    """One pair's written mix (the older releases' data/mixed*) from (corpus
    folder, train repeat) parts: train holds each part's train pairs `repeat`
    times, without valid/test pairs and pairs whose English is in
    `held_sources`. `record`: what corpus.json says of the repeats (default:
    `train_repeat`, folder -> repeat)."""
    folder.mkdir(parents=True)
    rows: dict[str, list[Row]] = {}
    for split in ("test", "valid", "train"):
        rows[split] = [row for corpus, repeat in parts
                       for row in read_rows(corpus, split)
                       * (repeat if split == "train" else 1)]
    held = {(s, t) for split in ("test", "valid") for _, s, t in rows[split]}
    rows["train"] = [r for r in rows["train"]
                     if (r[1], r[2]) not in held and r[1] not in held_sources]
    counts = {split: _write_rows(folder, split, split_rows) for split, split_rows in rows.items()}
    info = json.loads((parts[0][0] / "corpus.json").read_text("utf-8"))
    info.update(counts=counts, source={"mix": [str(c) for c, _ in parts]},
                split_rule=SPLIT_RULE,
                **(record if record is not None else
                   {"train_repeat": {str(c): r for c, r in parts}}))
    info.pop("dropped", None)
    (folder / "corpus.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
