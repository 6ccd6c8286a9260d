"""`seq2serve data`: translation and summarization corpora from Debian's DDTP.

Debian ships every package description in English (Translation-en) and, where
the DDTP/DDTSS community translated it, in other languages (Translation-de,
Translation-fr, ...). A translated record carries the `Description-md5` of the
English text it translates, which is what lets us pair them without any
fuzzy matching. From those indexes we build:

- `en-<lang>/`: synopsis, paragraph and sentence pairs (translate task);
- `summarize-en/`: long description -> synopsis (summarize task).

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
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import lz4.frame

SPLITS = ("test", "valid", "train")  # dedupe priority: earlier splits keep a shared pair
KINDS = ("synopsis", "paragraph", "sentence", "description")
MAX_TRANSLATION_CHARS = 1000
MAX_LENGTH_RATIO = 3.0
DEFAULT_LANGS = ("de", "fr")

# apt's documented way to fetch extra description languages; `#clear` drops the
# system default ("environment" -> only the locale's language).
APT_LANGUAGES_CONF = '#clear Acquire::Languages;\nAcquire::Languages {{ {langs} }};\n'

_INDEX_NAME = re.compile(
    r"Translation-(?P<lang>[a-z]{2,3}(?:_[A-Z]{2})?)(?P<ext>\.lz4|\.gz|\.xz|\.bz2)?$"
)


# --------------------------------------------------------------------------- parsing


class Paragraph(NamedTuple):
    text: str  # whitespace-normalised, one line
    preformatted: bool  # Debian's "two leading spaces": lists, tables, code


@dataclass
class Description:
    md5: str
    package: str
    synopsis: str
    paragraphs: list[Paragraph] = field(default_factory=list)

    @property
    def long_text(self) -> str:
        """The long description as one line, paragraphs joined by a space."""
        return " ".join(p.text for p in self.paragraphs)


def normalize(text: str) -> str:
    """Collapse every run of Unicode whitespace (line separators included) to one space."""
    return " ".join(text.split())


def parse_index(text: str) -> dict[str, Description]:
    """Parse one Translation-<lang> index (deb822 stanzas) into {md5: Description}.

    The `Description-<lang>` field's first line is the synopsis; continuation
    lines (leading space) form the long description, ` .` separating
    paragraphs. A paragraph with any line starting with two spaces is Debian's
    verbatim text (usually a list): it is kept, flagged `preformatted`.
    Stanzas without an md5 or a description are skipped.
    """
    result: dict[str, Description] = {}
    for stanza in _stanzas(text):
        fields: dict[str, str] = {}
        body: list[str] = []
        in_description = False
        for line in stanza:
            if line.startswith((" ", "\t")):
                if in_description:
                    body.append(line)
                continue
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
            in_description = name.lower().startswith("description-") and name.lower() != (
                "description-md5"
            )
            if in_description:
                fields["synopsis"] = value
        md5 = fields.get("description-md5", "")
        if not md5 or "synopsis" not in fields:
            continue
        result[md5] = Description(
            md5=md5,
            package=fields.get("package", ""),
            synopsis=normalize(fields["synopsis"]),
            paragraphs=_paragraphs(body),
        )
    return result


def _stanzas(text: str) -> Iterator[list[str]]:
    stanza: list[str] = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if line.strip():
            stanza.append(line)
        elif stanza:
            yield stanza
            stanza = []
    if stanza:
        yield stanza


def _paragraphs(body: list[str]) -> list[Paragraph]:
    paragraphs: list[Paragraph] = []
    lines: list[str] = []
    preformatted = False

    def flush() -> None:
        text = normalize(" ".join(lines))
        if text:  # a stray leading/trailing " ." gives no empty paragraph
            paragraphs.append(Paragraph(text, preformatted))

    for line in body:
        if line.strip() == ".":
            flush()
            lines, preformatted = [], False
            continue
        preformatted = preformatted or line[1:2] in (" ", "\t")
        lines.append(line)
    flush()
    return paragraphs


# --------------------------------------------------------------------------- sentences

# Lowercased tokens after which a full stop never ends a sentence. Dotted
# single-letter runs ("z.B.", "A.D.", "i.e.") are caught by a pattern instead.
ABBREVIATIONS = frozenset(
    """
    etc. vs. cf. approx. incl. esp. resp. e.g. i.e. mr. mrs. ms. dr. prof. st. no. nos.
    vol. fig. al. inc. ltd. co. corp. jr. sr. ca. dept. est. eg. ie. viz.
    bzw. usw. ggf. evtl. vgl. bspw. inkl. zzgl. sog. nr. abs. dt. engl. mind. z.b. d.h.
    u.a. z.t. o.ä. u.ä. s.o. s.u. u.v.m. bzgl. ggü. hrsg.
    p.ex. c.-à-d. c.à.d. env. ex. m. mme. mlle. av. apr. j.-c. cf. nº
    """.split()
)
_DOTTED = re.compile(r"(?:[^\W\d_]\.)+")  # "A.", "z.B.", "A.D.": initials and dotted abbreviations
_ORDINAL = re.compile(r"\d+\.")  # German "3. Mai", numbered lists "1. foo"
_OPENERS = "\"'“‘«([¿¡"
_CLOSERS = "\"'”’»)]"


def split_sentences(text: str, lang: str = "en") -> list[str]:
    """Split one paragraph into sentences with a deliberately simple rule.

    A boundary is whitespace after a token ending in `.`, `!`, `?` or `…`
    (closing quotes/brackets allowed) when the next token starts with an
    uppercase letter (after opening quotes/brackets). A full stop does not end
    a sentence after a known abbreviation (ABBREVIATIONS), a dotted run of
    single letters ("A.D.", "z.B.", initials) or a bare integer ("3. Mai").
    Version numbers never split because boundaries are only ever whitespace.
    `lang` is accepted for the API's sake; the rule is the same for en/de/fr.
    """
    del lang  # one rule serves en/de/fr; kept so callers need not change later
    tokens = text.split()
    sentences: list[str] = []
    start = 0
    for i in range(len(tokens) - 1):
        if _ends_sentence(tokens[i], tokens[i + 1 : i + 3]):
            sentences.append(" ".join(tokens[start : i + 1]))
            start = i + 1
    if start < len(tokens):
        sentences.append(" ".join(tokens[start:]))
    return sentences


def _ends_sentence(token: str, following: list[str]) -> bool:
    core = token.rstrip(_CLOSERS)
    if not core or core[-1] not in ".!?…":
        return False
    # French sets guillemets apart ("« Bien »"): look past a lone opener
    nxt = "".join(following).lstrip(_OPENERS)
    if not nxt or not nxt[0].isupper():
        return False
    if core[-1] != ".":
        return True
    word = core.lstrip(_OPENERS)
    if word.lower() in ABBREVIATIONS:
        return False
    return not (_DOTTED.fullmatch(word) or _ORDINAL.fullmatch(word))


# --------------------------------------------------------------------------- pairing

Pair = tuple[str, str, str]  # (kind, source, target)


def align(en: Description, other: Description) -> list[Pair]:
    """Translation pairs from one English description and its translation.

    The synopsis always pairs. Paragraphs pair only when both sides have the
    same number; sentences pair only inside such a paragraph pair when both
    sides split into the same number. A paragraph that is one sentence on
    both sides is emitted once, as a "sentence" (so `paragraph` means a
    multi-sentence or preformatted block). Preformatted paragraphs are never
    sentence-split.
    """
    pairs: list[Pair] = [("synopsis", en.synopsis, other.synopsis)]
    if len(en.paragraphs) != len(other.paragraphs):
        return pairs
    for src, tgt in zip(en.paragraphs, other.paragraphs, strict=True):
        if src.preformatted or tgt.preformatted:
            pairs.append(("paragraph", src.text, tgt.text))
            continue
        src_sents, tgt_sents = split_sentences(src.text, "en"), split_sentences(tgt.text)
        if len(src_sents) == len(tgt_sents) == 1:
            pairs.append(("sentence", src.text, tgt.text))
            continue
        pairs.append(("paragraph", src.text, tgt.text))
        if len(src_sents) == len(tgt_sents):
            pairs.extend(("sentence", s, t) for s, t in zip(src_sents, tgt_sents, strict=True))
    return pairs


def summary_pair(desc: Description) -> Pair:
    return ("description", desc.long_text, desc.synopsis)


def reject_reason(kind: str, src: str, tgt: str) -> str | None:
    """Why a pair is degenerate, or None when it is kept."""
    if not src or not tgt:
        return "empty side"
    if kind == "description":
        return "synopsis not shorter" if len(tgt) >= len(src) else None
    if src == tgt:
        return "source equals target"
    if max(len(src), len(tgt)) > MAX_TRANSLATION_CHARS:
        return f"longer than {MAX_TRANSLATION_CHARS} chars"
    if kind != "synopsis" and max(len(src), len(tgt)) > MAX_LENGTH_RATIO * min(len(src), len(tgt)):
        return f"length ratio > {MAX_LENGTH_RATIO:g}"
    return None


def split_of(md5: str) -> str:
    """Deterministic split by description: ~2% test, ~2% valid, ~96% train."""
    bucket = int(hashlib.sha256(md5.encode("ascii")).hexdigest(), 16) % 100
    return "test" if bucket < 2 else "valid" if bucket < 4 else "train"


@dataclass
class Corpus:
    name: str  # output folder: "en-de", "summarize-en"
    task: str  # "translate" | "summarize"
    src_lang: str
    tgt_lang: str
    splits: dict[str, list[Pair]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    dropped: Counter[str] = field(default_factory=Counter)

    def counts(self) -> dict[str, dict[str, int]]:
        counts = {s: Counter(k for k, _, _ in self.splits[s]) for s in SPLITS}
        return {s: {k: c[k] for k in KINDS if c[k]} for s, c in counts.items()}

    def source_overlap(self) -> dict[str, int]:
        """Test/valid pairs whose source also occurs in train (with another target):
        exact-pair dedupe cannot remove these, so the data card reports them."""
        train = {src for _, src, _ in self.splits["train"]}
        return {s: sum(src in train for _, src, _ in self.splits[s]) for s in ("test", "valid")}


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


@dataclass
class IndexFile:
    path: Path
    lang: str
    sha256: str
    release: dict[str, str]  # Origin/Suite/Codename/Version/Date from apt's InRelease, if found

    def describe(self) -> dict[str, object]:
        return {"file": self.path.name, "lang": self.lang, "sha256": self.sha256, **self.release}


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


def count_table(corpora: list[Corpus]) -> str:
    rows = [("corpus", "split", "kind", "pairs")]
    for corpus in corpora:
        for split, kinds in corpus.counts().items():
            for kind in KINDS:
                if kind in kinds:
                    rows.append((corpus.name, split, kind, str(kinds[kind])))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def data_card(corpora: list[Corpus], indexes: list[IndexFile]) -> str:
    source_rows = "\n".join(
        f"| `{f.path.name}` | {f.lang} | {f.release.get('codename', '?')} "
        f"{f.release.get('suite', '')} {f.release.get('version', '')} | "
        f"{f.release.get('date', 'unknown')} | `{f.sha256[:16]}…` |"
        for f in indexes
    )
    dropped = "\n".join(
        f"- `{c.name}`: " + (", ".join(f"{r}: {n}" for r, n in sorted(c.dropped.items())) or "none")
        for c in corpora
    )
    overlap = "\n".join(
        f"  - `{c.name}`: " + ", ".join(f"{s} {n}" for s, n in c.source_overlap().items())
        for c in corpora
    )
    apt_langs = " ".join(f'"{lang}";' for lang in dict.fromkeys(f.lang for f in indexes))
    return f"""# Data card: Debian DDTP corpora

Generated by `seq2serve data`. Parallel translation corpora (English to other
languages) and an English summarization corpus, built from the package
descriptions in Debian's archive and their translations by the Debian
Description Translation Project (DDTP/DDTSS).

## Source

Debian archive translation indexes (`dists/<suite>/<component>/i18n/Translation-<lang>`),
as fetched by `apt-get update` with `Acquire::Languages {{ {apt_langs} }}`.
Release fields come from apt's `InRelease` file next to each index.

| index file | lang | release | date | sha256 |
|---|---|---|---|---|
{source_rows}

## Contents and counts

One folder per corpus; in each `{{train,valid,test}}.src`, `.tgt` and `.kind`
(UTF-8, one segment per line, line *i* of `.src` pairs with line *i* of
`.tgt`; `.kind` is `synopsis`, `paragraph`, `sentence` or `description`), and
`corpus.json` with these counts.

```
{count_table(corpora)}
```

## Processing

1. Parse each index (deb822): `Description-<lang>` gives the synopsis, the
   continuation lines the long description, ` .` lines separate paragraphs.
   Paragraphs containing a verbatim line (two leading spaces, Debian's
   convention for lists and preformatted text) are **kept** as paragraphs, with
   whitespace collapsed, but are never split into sentences.
2. Match translations to English records by `Description-md5` (the md5 of the
   English text a translation was made from; stale translations match nothing
   and are ignored). English records from all suites are merged.
3. Translation pairs: the synopsis always; paragraphs only when both sides
   have the same number of paragraphs; sentences only inside an aligned,
   non-verbatim paragraph when both sides split into the same number of
   sentences. A paragraph that is a single sentence on both sides is labelled
   `sentence` only (not also `paragraph`), so `paragraph` rows are
   multi-sentence or verbatim blocks. The sentence splitter is a simple rule:
   break after `.`, `!`, `?`, `…` when the next token starts with an
   uppercase letter (looking past an opening quote or guillemet), except after
   known abbreviations (e.g., i.e., etc., z.B., d.h., bzw., usw., p.ex.,
   c.-à-d., ...), dotted single-letter runs (A.D., U.S., initials) and bare
   integers ("3. Mai", "1. item"). Sentence ends after such tokens are
   therefore missed on purpose (both sides usually miss them alike).
4. Summarization pairs (English only): the long description, paragraphs
   joined with a single space, -> its synopsis.
5. Whitespace is normalised (runs collapsed, ends stripped). Dropped:
   pairs with an empty side; translation pairs whose source equals the
   target, with a side longer than {MAX_TRANSLATION_CHARS} characters, or (paragraphs and
   sentences) a character length ratio above {MAX_LENGTH_RATIO:g}; summarization
   pairs whose synopsis is not shorter than the description.
6. Split by description: `int(sha256(Description-md5), 16) % 100`, 0-1 test,
   2-3 valid, else train (~2/2/96%). All pairs of one description land in
   one split. An identical (source, target) pair is kept only once, in the
   first split of test > valid > train, so evaluation pairs never occur in
   training. Within a split, order follows the md5.

Dropped pairs:

{dropped}

## Licence and caveats

- **No single licence.** Package descriptions are written by the package
  maintainers (often taken from upstream) and are distributed as part of
  Debian's archive, under the terms of each package's licence; the
  translations are contributed by the DDTP/DDTSS community. Debian considers
  them freely redistributable as part of the archive, but there is no
  single licence statement covering this corpus. Users redistributing the
  data or models trained on it should check this themselves.
- The text is technical and repetitive: many descriptions share boilerplate
  ("This package contains the development files..."). Exact pairs are
  deduplicated across splits, but the same source sentence can still appear
  with a different translation in train and test. Pairs in test/valid whose
  source also occurs in train:
{overlap}
- Translations are by volunteers and are reviewed in DDTSS but not
  guaranteed; some are partial or lag behind the English text (those have a
  different md5 and are not used).
- Sentence alignment is by count only; a mis-split on one side that happens
  to keep counts equal yields a misaligned pair (rare, not measured).
"""


def write_output(out: Path, corpora: list[Corpus], indexes: list[IndexFile], force: bool) -> None:
    """Write everything into a temp dir beside `out`, then move it into place,
    so an interrupted run never leaves a half-written corpus under `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        sources = [f.describe() for f in indexes]
        for corpus in corpora:
            write_corpus(corpus, tmp / corpus.name, sources)
        (tmp / "DATA_CARD.md").write_text(data_card(corpora, indexes), encoding="utf-8")
        if out.exists():
            if any(out.iterdir()) and not force:
                raise FileExistsError(f"{out} is not empty (use --force)")
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


# --------------------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "By default this runs `apt-get -c CONF update` (needs root) with CONF setting "
        "Acquire::Languages to en plus --langs, then reads the Translation-* indexes from "
        "apt's lists directory (`apt-config shell`). Output: <out>/en-<lang>/, "
        "<out>/summarize-en/ and <out>/DATA_CARD.md."
    )
    parser.add_argument("--out", type=Path, default=Path("data/ddtp"),
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
                        help="replace a non-empty --out directory")


def run(args: argparse.Namespace) -> int:
    langs = [lang.strip() for lang in args.langs.split(",") if lang.strip()]
    bad = [lang for lang in langs if not re.fullmatch(r"[a-z]{2,3}(?:_[A-Z]{2})?", lang)
           or lang == "en"]
    if bad or not langs:
        return _fail(f"--langs must be language codes other than en, got {args.langs!r}")
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.force:
        return _fail(f"{out} exists and is not empty; use --force to replace it")

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


def _log(message: str) -> None:
    print(f"seq2serve data: {message}", file=sys.stderr)


def _fail(message: str) -> int:
    _log(f"error: {message}")
    return 1
