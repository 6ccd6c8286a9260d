"""Debian DDTP package descriptions: parsing the translation indexes, pairing texts.

Debian ships every package description in English (Translation-en) and, where
the DDTP/DDTSS community translated it, in other languages (Translation-de,
Translation-fr, ...). A translated record carries the `Description-md5` of the
English text it translates, which is what lets us pair them without any
fuzzy matching. Everything here is a pure function over text; finding the
files and building the corpora is `corpus.py`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

KINDS = ("synopsis", "paragraph", "sentence", "description")  # what a Pair's kind can be
MAX_TRANSLATION_CHARS = 1000
MAX_LENGTH_RATIO = 3.0
SPLITS = ("test", "valid", "train")  # dedupe priority: earlier splits keep a shared pair


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


# --------------------------------------------------------------------------- the corpus

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


@dataclass
class IndexFile:
    path: Path
    lang: str
    sha256: str
    release: dict[str, str]  # Origin/Suite/Codename/Version/Date from apt's InRelease, if found

    def describe(self) -> dict[str, object]:
        return {"file": self.path.name, "lang": self.lang, "sha256": self.sha256, **self.release}
