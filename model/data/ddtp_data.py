"""DDTP, the first corpus source: translation and summarization pairs from the
English and translated Translation-<lang> indexes of Debian's DDTP (parsed and
paired by `ddtp.py`). Under `--out`:

- `en-<lang>/`: synopsis, paragraph and sentence pairs (translate task);
- `summarize-en/`: long description -> synopsis (summarize task);
- `DATA_CARD.md` (`data_card.py`).

Only the standard library and `lz4` are used, so this runs on a bare machine
before torch is installed.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import hashlib
import json
import lzma
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import lz4.frame

from seq2serve.model.data import messages_data
from seq2serve.model.data.data_card import count_table, data_card
from seq2serve.model.data.ddtp import (
    SPLITS,
    Corpus,
    Description,
    IndexFile,
    Pair,
    align,
    parse_index,
    reject_reason,
    summary_pair,
)
from seq2serve.model.data.registry import fail as _fail
from seq2serve.model.data.registry import log as _log
from seq2serve.model.data.registry import refuse_overwrite

# apt's documented way to fetch extra description languages; `#clear` drops the
# system default ("environment" -> only the locale's language).
APT_LANGUAGES_CONF = '#clear Acquire::Languages;\nAcquire::Languages {{ {langs} }};\n'

_INDEX_NAME = re.compile(
    r"Translation-(?P<lang>[a-z]{2,3}(?:_[A-Z]{2})?)(?P<ext>\.lz4|\.gz|\.xz|\.bz2)?$"
)


# --------------------------------------------------------------------------- corpora


def split_of(md5: str) -> str:
    """Deterministic split by description: ~2% test, ~2% valid, ~96% train."""
    bucket = int(hashlib.sha256(md5.encode("ascii")).hexdigest(), 16) % 100
    return "test" if bucket < 2 else "valid" if bucket < 4 else "train"


def _assemble(corpus: Corpus, candidates: Iterable[tuple[str, Pair]]) -> Corpus:
    """Filter, split and dedupe (md5, pair) candidates into `corpus`.

    An identical (source, target) pair is kept once: in the highest-priority
    split it occurs in (test > valid > train), so evaluation never sees a pair
    that training saw. Kinds do not matter for identity.
    """
    by_split: dict[str, list[Pair]] = {s: [] for s in SPLITS}
    for md5, (kind, src, tgt) in candidates:
        reason = reject_reason(kind, src, tgt)
        if reason:
            corpus.dropped[reason] += 1
        else:
            by_split[split_of(md5)].append((kind, src, tgt))
    seen: set[tuple[str, str]] = set()
    for split in SPLITS:
        for kind, src, tgt in by_split[split]:
            if (src, tgt) in seen:
                corpus.dropped["duplicate"] += 1
                continue
            seen.add((src, tgt))
            corpus.splits[split].append((kind, src, tgt))
    return corpus


def build(english: dict[str, Description], translations: dict[str, dict[str, Description]]
          ) -> list[Corpus]:
    """All corpora: one en-<lang> per translation index, then summarize-en.

    Descriptions are visited in md5 order so the output does not depend on
    file order and is not clustered alphabetically by package name.
    """
    corpora: list[Corpus] = []
    for lang, other in translations.items():
        candidates = (
            (md5, pair)
            for md5 in sorted(other.keys() & english.keys())
            for pair in align(english[md5], other[md5])
        )
        corpora.append(_assemble(Corpus(f"en-{lang}", "translate", "en", lang), candidates))
    summaries = ((md5, summary_pair(english[md5])) for md5 in sorted(english))
    corpora.append(_assemble(Corpus("summarize-en", "summarize", "en", "en"), summaries))
    return corpora


# --------------------------------------------------------------------------- sources


def find_indexes(directory: Path, langs: Iterable[str]) -> dict[str, list[Path]]:
    """Translation index files in `directory`, by language; one file per stem
    (apt may keep both `X` and `X.lz4`, which hold the same records)."""
    wanted = set(langs)
    found: dict[str, dict[str, Path]] = {lang: {} for lang in wanted}
    for path in sorted(directory.iterdir()):
        match = _INDEX_NAME.search(path.name)
        if match and path.is_file() and match["lang"] in wanted:
            stem = path.name[: match.start("ext")] if match["ext"] else path.name
            found[match["lang"]].setdefault(stem, path)
    return {lang: sorted(files.values()) for lang, files in found.items()}


def read_index(path: Path) -> str:
    data = path.read_bytes()
    suffix = path.suffix
    if suffix == ".lz4":
        data = lz4.frame.decompress(data)
    elif suffix == ".gz":
        data = gzip.decompress(data)
    elif suffix == ".xz":
        data = lzma.decompress(data)
    elif suffix == ".bz2":
        data = bz2.decompress(data)
    return data.decode("utf-8", errors="replace")


def release_info(index: Path) -> dict[str, str]:
    """Release fields for an apt lists file `..._dists_<suite>_<comp>_i18n_Translation-xx`,
    read from the sibling `..._dists_<suite>_InRelease` (or `_Release`)."""
    prefix, sep, _ = index.name.partition("_i18n_")
    if not sep or "_" not in prefix:
        return {}
    base = prefix.rsplit("_", 1)[0]
    for name in (f"{base}_InRelease", f"{base}_Release"):
        release = index.with_name(name)
        if release.is_file():
            text = release.read_text("utf-8", errors="replace")
            fields = {}
            for line in text.split("\n"):
                if line[:1].isspace() or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                if key in ("Origin", "Suite", "Codename", "Version", "Date"):
                    fields[key.lower()] = value.strip()
            return fields
    return {}


def apt_lists_dir(config: Path | None = None) -> Path:
    """apt's lists directory, as apt itself resolves it."""
    cmd = ["apt-config", *(["-c", str(config)] if config else []), "shell", "D",
           "Dir::State::lists/d"]
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return Path("/var/lib/apt/lists")
    for token in shlex.split(out):
        if token.startswith("D="):
            return Path(token[2:])
    return Path("/var/lib/apt/lists")


def apt_update(langs: Iterable[str]) -> Path:
    """Run `apt-get -c CONF update` fetching the given description languages;
    return the lists directory. Needs root, as apt-get update always does."""
    quoted = " ".join(f'"{lang}";' for lang in ["en", *langs])
    with tempfile.NamedTemporaryFile("w", suffix=".conf", prefix="seq2serve-apt-") as conf:
        conf.write(APT_LANGUAGES_CONF.format(langs=quoted))
        conf.flush()
        _log(f"running apt-get -c {conf.name} update")
        subprocess.run(["apt-get", "-c", conf.name, "update"], check=True,
                       stdout=sys.stderr)
        return apt_lists_dir(Path(conf.name))


# --------------------------------------------------------------------------- output


def write_corpus(corpus: Corpus, directory: Path, sources: list[dict[str, object]]) -> None:
    directory.mkdir(parents=True)
    for split, pairs in corpus.splits.items():
        for ext, column in (("kind", 0), ("src", 1), ("tgt", 2)):
            lines = "".join(f"{pair[column]}\n" for pair in pairs)
            (directory / f"{split}.{ext}").write_text(lines, encoding="utf-8", newline="\n")
    meta = {
        "task": corpus.task,
        "src_lang": corpus.src_lang,
        "tgt_lang": corpus.tgt_lang,
        "counts": corpus.counts(),
        "dropped": dict(sorted(corpus.dropped.items())),
        "split_rule": "int(sha256(Description-md5)) % 100: 0-1 test, 2-3 valid, else train",
        "source": {"name": "Debian DDTP package-description translations",
                   "indexes": sources},
    }
    (directory / "corpus.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n",
                                           encoding="utf-8")




def write_output(out: Path, corpora: list[Corpus], indexes: list[IndexFile], force: bool) -> None:
    """Write everything into a temp dir beside `out`, then move it into place,
    so an interrupted run never leaves a half-written corpus under `out`."""
    def fill(tmp: Path) -> None:
        sources = [f.describe() for f in indexes]
        for corpus in corpora:
            write_corpus(corpus, tmp / corpus.name, sources)
        (tmp / "DATA_CARD.md").write_text(data_card(corpora, indexes), encoding="utf-8")

    messages_data.write_atomically(out, force, fill)


# --------------------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    """DDTP's flags (--out, --from-dir, --no-update) are the CLI's own: they came first."""


def run(args: argparse.Namespace, langs: list[str]) -> int:
    out: Path = args.out
    if (refused := refuse_overwrite(out, args.force)) is not None:
        return refused

    try:
        if args.from_dir:
            directory = args.from_dir
        elif args.no_update:
            directory = apt_lists_dir()
        else:
            directory = apt_update(langs)
    except (OSError, subprocess.CalledProcessError) as exc:
        return _fail(f"apt-get update failed ({exc}); use --no-update or --from-dir")
    if not directory.is_dir():
        return _fail(f"{directory} is not a directory")
    found = find_indexes(directory, ["en", *langs])
    missing = [lang for lang, files in found.items() if not files]
    if missing:
        return _fail(f"no Translation-{{{','.join(sorted(missing))}}} index in {directory}")

    indexes: list[IndexFile] = []
    parsed: dict[str, dict[str, Description]] = {}
    for lang in ["en", *langs]:
        merged = parsed.setdefault(lang, {})
        for path in found[lang]:
            text = read_index(path)
            records = parse_index(text)
            _log(f"{path.name}: {len(records)} descriptions")
            merged.update(records)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            indexes.append(IndexFile(path, lang, digest, release_info(path)))

    english = parsed.pop("en")
    corpora = build(english, parsed)
    try:
        write_output(out, corpora, indexes, args.force)
    except FileExistsError as exc:
        return _fail(str(exc))
    print(count_table(corpora))
    print(f"wrote {out}")
    return 0
