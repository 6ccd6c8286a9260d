"""Named glossaries from `--glossary-dir`, chosen by name in a request.

Files, one glossary per name (several files may share a name, one per pair):

- `NAME.tsv` (any language pair) or `NAME.SRC-TGT.tsv` (only SRC -> TGT):
  UTF-8, one term per line, `source<TAB>target`; a line with the source alone
  (or the target equal to it) is a do-not-translate term; blank lines and lines
  starting with `#` are skipped.
- `NAME.tbx`: TermBase eXchange, read with translate-toolkit's TBX storage. Each
  concept gives the first non-deprecated term of the request's source language
  and of its target language; a concept marked "Translation needed: no", or one
  with no term in the target language but the source term itself, is kept as is.

The terms become `placeholders.Terms`: masked in the source and substituted
into the output, whole words, case-sensitive, longest first.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from seq2serve.server.core.errors import InvalidArgument, echo, lone_surrogate
from seq2serve.server.core.placeholders import Terms

SUFFIXES = (".tsv", ".tbx")
_NAME = re.compile(r"^[A-Za-z0-9][\w-]*$")
_PAIR = re.compile(r"^[a-z]{2,3}-[a-z]{2,3}$")
MAX_TERM_CHARS = 200


class GlossaryError(ValueError):
    """A glossary file that cannot be read; the message names the file (and line)."""


@dataclass(frozen=True)
class _Part:
    """One file's terms: for one language pair, or (pair None) any."""

    pair: tuple[str, str] | None
    path: Path


@dataclass
class Glossary:
    name: str
    parts: list[_Part] = field(default_factory=list)
    # (source, target) language -> its terms, read once per pair.
    _terms: dict[tuple[str, str], Terms] = field(default_factory=dict)

    def terms(self, source_language: str, target_language: str) -> Terms:
        key = (source_language, target_language)
        if key not in self._terms:
            pairs: list[tuple[str, str]] = []
            keep: list[str] = []
            for part in self.parts:
                if part.pair is not None and part.pair != key:
                    continue
                found = (read_tsv(part.path) if part.path.suffix == ".tsv"
                         else read_tbx(part.path, *key))
                pairs += found.pairs
                keep += found.keep
            self._terms[key] = Terms(tuple(pairs), tuple(keep))
        return self._terms[key]


class Glossaries:
    """Every glossary of a directory, by name; each file is checked when loaded."""

    def __init__(self, glossaries: Iterable[Glossary] = ()) -> None:
        self.by_name = {g.name: g for g in glossaries}

    @classmethod
    def load(cls, directory: Path | None) -> Glossaries:
        if directory is None:
            return cls()
        glossaries: dict[str, Glossary] = {}
        for path in sorted(Path(directory).iterdir()):
            if path.name.startswith(".") or path.suffix not in SUFFIXES or not path.is_file():
                continue
            name, pair = _name_and_pair(path)
            glossaries.setdefault(name, Glossary(name)).parts.append(_Part(pair, path))
        loaded = cls(glossaries.values())
        for glossary in loaded.by_name.values():  # read now: a broken file stops the start
            for part in glossary.parts:
                if part.path.suffix == ".tsv":
                    read_tsv(part.path)
                else:
                    read_tbx(part.path, "en", "de")
        return loaded

    def names(self) -> list[str]:
        return sorted(self.by_name)

    def get(self, name: str) -> Glossary | None:
        return self.by_name.get(name)


def _name_and_pair(path: Path) -> tuple[str, tuple[str, str] | None]:
    stem = path.name[: -len(path.suffix)]
    name, _, pair = stem.partition(".")
    if not _NAME.match(name):
        raise GlossaryError(f"{path}: a glossary name is letters, digits, _ and -, got "
                            f"{name!r}")
    if not pair or path.suffix == ".tbx":
        return name, None
    if not _PAIR.match(pair):
        raise GlossaryError(f"{path}: expected NAME.tsv or NAME.SRC-TGT.tsv (such as "
                            f"{name}.en-de.tsv), got {path.name!r}")
    source, target = pair.split("-")
    return name, (source, target)


def read_tsv(path: Path) -> Terms:
    pairs: list[tuple[str, str]] = []
    keep: list[str] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise GlossaryError(f"{path}: cannot be read as UTF-8 text ({e})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        columns = line.split("\t")
        if len(columns) > 2:
            raise GlossaryError(f"{path}:{number}: expected source<TAB>target or a source "
                                f"term alone, got {len(columns)} columns")
        source = columns[0].strip()
        target = columns[1].strip() if len(columns) == 2 else ""
        problem = term_problem(source, target)
        if problem:
            raise GlossaryError(f"{path}:{number}: {problem}")
        if target and target != source:
            pairs.append((source, target))
        else:
            keep.append(source)
    return Terms(tuple(pairs), tuple(keep))


def read_tbx(path: Path, source_language: str, target_language: str) -> Terms:
    from lxml import etree
    from translate.storage.tbx import tbxfile

    try:
        store = tbxfile(io.BytesIO(path.read_bytes()), sourcelanguage=source_language,
                        targetlanguage=target_language)
    except (OSError, etree.XMLSyntaxError, ValueError) as e:
        raise GlossaryError(f"{path}: not a readable TBX file ({e})") from None
    pairs: list[tuple[str, str]] = []
    keep: list[str] = []
    for unit in store.units:
        sources = [t.text.strip() for t in unit.get_source_terms() if not t.deprecated]
        if not sources or not sources[0]:
            continue
        targets = [t.text.strip() for t in unit.get_target_terms(target_language)
                   if not t.deprecated and t.text.strip()]
        if not unit.istranslatable() or (not targets and _only_source(unit)):
            keep.append(sources[0])
        elif targets and targets[0] != sources[0]:
            pairs.append((sources[0], targets[0]))
        elif targets:
            keep.append(sources[0])
    return Terms(tuple(pairs), tuple(keep))


def _only_source(unit: object) -> bool:
    """A concept whose only language is the source: nothing to translate it into."""
    nodes: Sequence[object] = unit.getlanguageNodes()  # type: ignore[attr-defined]
    return len(nodes) == 1


def term_problem(source: str, target: str) -> str | None:
    """Why a term pair cannot be used, or None."""
    if not source.strip():
        return "a term's source is empty"
    for what, text in (("source", source), ("target", target)):
        if len(text) > MAX_TERM_CHARS:
            return f"a term's {what} must be at most {MAX_TERM_CHARS} characters, got {len(text)}"
        if "\n" in text or "\t" in text:
            return f"a term's {what} must be one line without tabs, got {text[:40]!r}"
        if (at := lone_surrogate(text)) is not None:  # masked in, written back out
            return (f"a term's {what} must be valid Unicode, got a lone surrogate at "
                    f"character {at}")
    return None


MAX_REQUEST_TERMS = 1000


def request_terms(glossaries: Glossaries, name: str, pairs: Sequence[tuple[str, str]],
                  keep: Sequence[str], source_language: str,
                  target_language: str) -> Terms:
    """A request's terms: its named glossary's for the pair, then its own pairs
    and do-not-translate terms (which win over the glossary's for the same source).
    Raises InvalidArgument naming the field at fault."""
    if len(pairs) + len(keep) > MAX_REQUEST_TERMS:
        raise InvalidArgument(f"terms and do_not_translate must hold at most "
                              f"{MAX_REQUEST_TERMS} entries together, got "
                              f"{len(pairs) + len(keep)}")
    for i, (source, target) in enumerate(pairs):
        if not target.strip():
            raise InvalidArgument(f"terms[{i}]: the target of {echo(source)} is empty (a term "
                                  "to keep as it is belongs in do_not_translate)")
        if problem := term_problem(source, target):
            raise InvalidArgument(f"terms[{i}]: {problem}")
    for i, term in enumerate(keep):
        if problem := term_problem(term, ""):
            raise InvalidArgument(f"do_not_translate[{i}]: {problem}")
    base = Terms()
    if name:
        glossary = glossaries.get(name)
        if glossary is None:
            known = ", ".join(glossaries.names()) or "none (no --glossary-dir)"
            raise InvalidArgument(f"glossary: this server has no glossary named {echo(name)}; "
                                  f"glossaries: {known}")
        base = glossary.terms(source_language, target_language)
    own = {s for s, _ in pairs} | set(keep)
    return Terms(tuple(pairs) + tuple(p for p in base.pairs if p[0] not in own),
                 tuple(keep) + tuple(k for k in base.keep if k not in own))


# -- glossaries created through an API (DeepL's /v2/glossaries, /v3/glossaries) ---------

MAX_STORED_ENTRIES = 10_000


@dataclass(frozen=True)
class Dictionary:
    """One language pair's entries (listed codes) of a stored glossary."""

    source_language: str
    target_language: str
    entries: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class StoredGlossary:
    """A glossary a client created: its id (the name a request gives), the client's
    name for it and its dictionaries, one per pair (DeepL's v2 glossaries have one)."""

    glossary_id: str
    name: str
    created: str  # ISO 8601, UTC
    dictionaries: tuple[Dictionary, ...]

    def dictionary(self, source_language: str, target_language: str) -> Dictionary | None:
        return next((d for d in self.dictionaries if (d.source_language, d.target_language)
                     == (source_language, target_language)), None)


def parse_entries(text: str, entries_format: str) -> list[tuple[str, str]]:
    """DeepL's entry formats: `tsv` (source<TAB>target per line) or `csv` (source,target
    and optionally the two languages, RFC 4180 quoting). Raises InvalidArgument naming
    the line; a source given twice is refused, as DeepL refuses it."""
    import csv

    if entries_format == "tsv":
        rows = [line.split("\t") for line in text.splitlines()]
    elif entries_format == "csv":
        rows = list(csv.reader(io.StringIO(text)))
    else:
        raise InvalidArgument(f"entries_format must be tsv or csv, got {echo(entries_format)}")
    entries: list[tuple[str, str]] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) not in (2, 4) or (entries_format == "tsv" and len(row) != 2):
            how = "separated by a tab" if entries_format == "tsv" else "columns"
            raise InvalidArgument(f"entries line {number}: expected source and target {how}, "
                                  f"got {len(row)} columns")
        source, target = row[0].strip(), row[1].strip()
        if not target:
            raise InvalidArgument(f"entries line {number}: the target of {echo(source)} is "
                                  "empty")
        if problem := term_problem(source, target):
            raise InvalidArgument(f"entries line {number}: {problem}")
        if source in seen:
            raise InvalidArgument(f"entries line {number}: {echo(source)} is given twice")
        seen.add(source)
        entries.append((source, target))
    if not entries:
        raise InvalidArgument("entries must hold at least one source and target term")
    if len(entries) > MAX_STORED_ENTRIES:
        raise InvalidArgument(f"entries must hold at most {MAX_STORED_ENTRIES} terms, got "
                              f"{len(entries)}")
    return entries


class GlossaryStore:
    """Glossaries created through an API, kept in `directory` (ID.json: the facts and
    entries, written whole then renamed, so a restart finds each whole or not at all)
    and served as named glossaries of `glossaries` under their id, so every door can
    use them (a request's `glossary`, DeepL's `glossary_id`)."""

    def __init__(self, directory: Path, glossaries: Glossaries) -> None:
        self.directory = Path(directory)
        self.glossaries = glossaries
        self._stored: dict[str, StoredGlossary] = {}
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.directory.glob("*.json")):
            self._register(_read_stored(path))

    def create(self, name: str, dictionaries: Sequence[Dictionary]) -> StoredGlossary:
        import datetime
        import json
        import uuid

        if not name.strip():
            raise InvalidArgument("name must not be empty")
        if not dictionaries:
            raise InvalidArgument("dictionaries must hold at least one language pair")
        pairs = [(d.source_language, d.target_language) for d in dictionaries]
        if len(set(pairs)) != len(pairs):
            raise InvalidArgument("dictionaries must hold each language pair once")
        stored = StoredGlossary(
            str(uuid.uuid4()), name,
            datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"), tuple(dictionaries))
        path = self.directory / f"{stored.glossary_id}.json"
        partial = path.with_suffix(".json.part")
        partial.write_text(json.dumps({
            "glossary_id": stored.glossary_id, "name": stored.name, "created": stored.created,
            "dictionaries": [{"source_language": d.source_language,
                              "target_language": d.target_language,
                              "entries": [list(e) for e in d.entries]}
                             for d in stored.dictionaries]},
            ensure_ascii=False), encoding="utf-8")
        partial.replace(path)
        self._register(stored)
        return stored

    def get(self, glossary_id: str) -> StoredGlossary | None:
        return self._stored.get(glossary_id)

    def list(self) -> list[StoredGlossary]:
        return sorted(self._stored.values(), key=lambda g: (g.created, g.glossary_id))

    def delete(self, glossary_id: str) -> bool:
        stored = self._stored.pop(glossary_id, None)
        if stored is None:
            return False
        self.glossaries.by_name.pop(glossary_id, None)
        (self.directory / f"{glossary_id}.json").unlink(missing_ok=True)
        return True

    def _register(self, stored: StoredGlossary) -> None:
        self._stored[stored.glossary_id] = stored
        glossary = Glossary(stored.glossary_id)
        for d in stored.dictionaries:
            glossary._terms[(d.source_language, d.target_language)] = Terms(d.entries, ())
        self.glossaries.by_name[stored.glossary_id] = glossary


def _read_stored(path: Path) -> StoredGlossary:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return StoredGlossary(str(data["glossary_id"]), str(data["name"]), str(data["created"]),
                              tuple(Dictionary(str(d["source_language"]),
                                               str(d["target_language"]),
                                               tuple((str(s), str(t)) for s, t in d["entries"]))
                                    for d in data["dictionaries"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise GlossaryError(f"{path}: not a stored glossary ({e})") from None
