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
