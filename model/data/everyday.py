"""The everyday corpus: en->de and en->fr prose and dialogue from Debian packages.

Program messages (`messages.py`) teach the models software language; this
corpus brings sentences people say and write: game narratives and dialogue
(the Wesnoth campaigns, Widelands, Freedink, Adonthell, and the modern-day
Cataclysm: Dark Days Ahead and FreedroidRPG, ...), manuals
translated through gettext, the short picture captions of Tux Paint's stamps,
the example sentences of the Ding German-English dictionary and the headwords
of FreeDict's English-French one. Which packages, and why, is
docs/data-card-everyday.md; the figures that chose them come from `measure`
below.

Four readers, one cleaning: every pair goes through `gettext.clean_pair`,
the messages corpus's rules. A catalog entry of several sentences is kept
whole (kind `paragraph`) and, when both sides split into the same number of
sentences (`ddtp.split_sentences`), as sentence pairs too (kind `sentence`).
Fetching and writing are `everyday_data.py`'s.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from seq2serve.model.data import messages
from seq2serve.model.data.ddtp import split_sentences
from seq2serve.model.data.gettext import Catalog, MoError, clean_pair, entry_pairs, read_mo
from seq2serve.model.data.po import read_po

LANGS = ("de", "fr")
SPLITS = messages.SPLITS  # train, valid, test: a pair shared with train stays in train

# Binary packages whose gettext catalogs (anywhere in the package, in or out of
# usr/share/locale) are read. Chosen by measuring every Debian package with de/fr
# catalogs outside usr/share/locale, and the games with large catalogs inside it
# (docs/data-card-everyday.md has the table): kept where the English side is mostly
# sentences of ordinary language.
CATALOG_PACKAGES = (
    "wesnoth-1.16-data", "wesnoth-1.16-did", "wesnoth-1.16-dm", "wesnoth-1.16-dw",
    "wesnoth-1.16-ei", "wesnoth-1.16-httt", "wesnoth-1.16-l", "wesnoth-1.16-low",
    "wesnoth-1.16-nr", "wesnoth-1.16-sof", "wesnoth-1.16-sota", "wesnoth-1.16-sotbe",
    "wesnoth-1.16-thot", "wesnoth-1.16-trow", "wesnoth-1.16-tsg", "wesnoth-1.16-ttb",
    "wesnoth-1.16-utbs", "widelands-data", "freedink-data", "adonthell-data", "7kaa-data",
    "singularity", "pingus-data", "tuxpaint-data", "lbreakout2", "freeciv-data",
    "ufoai-misc", "ikiwiki", "publican", "cataclysm-dda-data", "freedroidrpg-data",
)
STAMP_PACKAGES = ("tuxpaint-stamps-default",)  # stamps/**/*.txt: English, then xx.utf8=...
DICTIONARY_PACKAGES = ("trans-de-en",)  # Ding: usr/share/trans/de-en, "de :: en" lines
# FreeDict's small English-French dictionary (dictd format): headwords and their first
# translation, as `word` pairs, training only. The everyday French is scarce, and en-fr
# has no dictionary examples (Ding's are German): a basic French lexicon (8,800
# headwords: beach -> plage, tomorrow -> demain). German has Ding's examples, and
# FreeDict's English-German (Ding's entries again, 460k headwords) adds rare senses first.
WORD_LIST_PACKAGES = ("dict-freedict-eng-fra",)
PACKAGES = CATALOG_PACKAGES + STAMP_PACKAGES + DICTIONARY_PACKAGES + WORD_LIST_PACKAGES

# Catalog packages are split by binary package (each campaign is its own work).
# Evaluation packages are named, not hashed: with ~30 packages a hash gives a
# test split of zero to five works. A package whose source package is in the
# messages corpus's test or valid split goes to that split here too, so no
# package evaluated there is trained on here (adonthell-data is one: test).
TEST_PACKAGES = frozenset({"wesnoth-1.16-dm", "wesnoth-1.16-ei"})
VALID_PACKAGES = frozenset({"wesnoth-1.16-thot"})
# Stamps and dictionary examples are independent entries of one package each:
# they are split per entry by the English text, like the messages corpus's packages.
ENTRY_TEST_PERCENT, ENTRY_VALID_PERCENT = 3, 3
DEFAULT_PER_PACKAGE = 8000  # catalog pairs per package and language (Cataclysm DDA: 19k de)

# A path's language: a whole token `de`, `fr`, `de_DE`, `fr_FR` (+ `.UTF-8`) in one of
# the last three path components: locale/de/LC_MESSAGES/x.mo, l10n/de.po, data.fr.po,
# lang_de_DE/story.po. The rest of the path, the language replaced, names the catalog.
_PATH_LANG = re.compile(r"(?<![A-Za-z0-9])(de|fr)(?:_(?:DE|FR))?(?:\.UTF-8|\.utf8)?(?=[/.-]|$)")
STAMP_PATH = re.compile(r"(?:^|/)usr/share/tuxpaint/stamps/.+\.txt$")
DICTIONARY_PATH = re.compile(r"(?:^|/)usr/share/trans/de-en$")
WORD_LIST_PATH = re.compile(r"(?:^|/)usr/share/dictd/freedict-eng-(deu|fra)\.dict\.dz$")
_WORD_LIST_LANG = {"deu": "de", "fra": "fr"}

Row = tuple[str, str, str, str]  # (package, kind, English, translation)


def catalog_lang(path: str) -> tuple[str, str] | None:
    """(lang, catalog name) of a de/fr `.mo`/`.po` member path, else None."""
    if not path.endswith((".mo", ".po")):
        return None
    parts = path.lstrip("./").split("/")
    head, tail = "/".join(parts[:-3]), "/".join(parts[-3:])
    hits = list(_PATH_LANG.finditer(tail))
    if len(hits) != 1:
        return None
    hit = hits[0]
    return hit[1], f"{head}/{tail[:hit.start()]}{{lang}}{tail[hit.end():]}".lstrip("/")


def wanted(path: str) -> bool:
    """Whether a member of one of PACKAGES' .debs is read at all."""
    return bool(catalog_lang(path) or STAMP_PATH.search(path) or DICTIONARY_PATH.search(path)
                or WORD_LIST_PATH.search(path))


# --------------------------------------------------------------------------- readers


def read_catalog(path: str, data: bytes) -> Catalog:
    if path.endswith(".mo"):
        return read_mo(data)
    try:
        return read_po(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise MoError("a .po file not in UTF-8") from exc


def catalog_pairs(catalog: Catalog, dropped: Counter[str]) -> list[tuple[str, str]]:
    out = []
    for entry in catalog.entries:
        texts = entry_pairs(entry, catalog.nplurals)
        if isinstance(texts, str):
            dropped[texts] += 1
        else:
            out.extend(texts)
    return out


def stamp_pairs(text: str, lang: str) -> list[tuple[str, str]]:
    """Tux Paint's stamp description: its first plain line is the English
    caption, `de.utf8=...` the German one (only the first of each is used)."""
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    english = next((line for line in lines if "=" not in line.split(" ", 1)[0]), None)
    target = next((line.split("=", 1)[1] for line in lines
                   if line.startswith(f"{lang}.utf8=")), None)
    return [(english, target)] if english and target else []


_DING_NOTE = re.compile(r"\s*(?:\{[^}]*\}|\[[^\]]*\]|<[^>]*>|/[A-Z][A-Za-z0-9]*/)")
_SENTENCE = re.compile(r"^[\"'“‘(]*[A-ZÄÖÜÀ-Ý].*[.!?][\"'”’)]*$")


def dictionary_pairs(text: str) -> list[tuple[str, str]]:
    """The example sentences of Ding's `German :: English` lines. Each side lists
    variants separated by ` | ` (aligned by position) and synonyms by `;`; a
    variant pair is kept when it has no synonyms or `/` alternatives and both
    sides are sentences (a capital first, `.`, `!` or `?` last, 3+ English
    words). Grammar notes (`{m}`, `[ugs.]`, `<...>`, `/LOL/`) are removed."""
    out = []
    for line in text.split("\n"):
        if line.startswith("#") or " :: " not in line:
            continue
        german, english = line.split(" :: ", 1)
        variants = german.split(" | "), english.split(" | ")
        if len(variants[0]) != len(variants[1]):
            continue
        for de, en in zip(*variants, strict=True):
            de, en = (" ".join(_DING_NOTE.sub("", s).split()) for s in (de, en))
            if any(c in de + en for c in ";/~") or len(en.split()) < 3:
                continue
            if _SENTENCE.match(de) and _SENTENCE.match(en):
                out.append((en, de))
    return out


# Closed-class English words: a dictionary line gives one of their many renderings
# ("the" -> "à l'", "you" -> "à toi"); sentences teach them better.
_FUNCTION_WORDS = frozenset("""
a an the this that these those i you he she it we they me him her us them my your his its
our their mine yours of to in on at by for with from into onto upon about as and or but if
than so not no yes be am is are was were been do does did have has had will would shall
should can could may might must there here what which who whom whose when where why how
""".split())
_HEADWORD = re.compile(r"^(?P<word>[^\s/][^/]*?) /[^/]*/$")  # "beach /biːtʃ/"
_WORD_NOTE = re.compile(r"\[[^\]]*\]|\([^)]*\)|\{[^}]*\}|<[^>]*>")


def word_list_pairs(text: str) -> list[tuple[str, str]]:
    """(headword, first translation) of a FreeDict dictd file (the .dict text: each
    entry a `headword /pronunciation/` line, then its senses, `1. ...` when several).
    The first sense's first alternative (before `,` or `;`), notes in brackets
    removed; kept when the headword has at most 3 words and the translation 4, and is
    not a function word."""
    out = []
    lines = text.split("\n")
    for i, line in enumerate(lines[:-1]):
        head = _HEADWORD.match(line)
        if head is None or not re.search(r"[A-Za-z]", head["word"]) \
                or head["word"].lower() in _FUNCTION_WORDS:
            continue
        sense = re.sub(r"^\s*\d+\.\s*", "", lines[i + 1])
        if _HEADWORD.match(lines[i + 1]) or "  -  " in sense:  # no sense; an example
            continue
        first = " ".join(re.split(r"[,;]", _WORD_NOTE.sub("", sense))[0].split())
        word = " ".join(head["word"].split())
        if first and len(word.split()) <= 3 and len(first.split()) <= 4:
            out.append((word, first))
    return out


# --------------------------------------------------------------------------- corpus


@dataclass
class EverydayCorpus:
    lang: str
    splits: dict[str, list[Row]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    dropped: Counter[str] = field(default_factory=Counter)
    # (package, source kind) -> pairs kept, after dedupe
    packages: Counter[str] = field(default_factory=Counter)
    catalogs: int = 0

    @property
    def name(self) -> str:
        return f"en-{self.lang}"

    def counts(self) -> dict[str, dict[str, int]]:
        return {s: dict(sorted(Counter(r[1] for r in rows).items()))
                for s, rows in self.splits.items()}

    def source_overlap(self) -> dict[str, int]:
        train = {r[2] for r in self.splits["train"]}
        return {s: sum(r[2] in train for r in self.splits[s]) for s in ("test", "valid")}


def package_split(package: str, source: str) -> str:
    """A catalog package's split: named evaluation packages, else the messages
    corpus's split of its source package when that is test or valid, else train."""
    if package in TEST_PACKAGES:
        return "test"
    if package in VALID_PACKAGES:
        return "valid"
    return messages.split_of_package(source)


def entry_split(english: str) -> str:
    """A stamp caption's or dictionary example's split, by its English text."""
    bucket = int(hashlib.sha256(english.encode("utf-8")).hexdigest(), 16) % 100
    if bucket < ENTRY_TEST_PERCENT:
        return "test"
    return "valid" if bucket < ENTRY_TEST_PERCENT + ENTRY_VALID_PERCENT else "train"


def with_sentences(src: str, tgt: str) -> list[tuple[str, str, str]]:
    """(kind, src, tgt): a one-sentence pair as `sentence`; a longer one as
    `paragraph`, plus its sentences when both sides have the same number."""
    src_sents, tgt_sents = split_sentences(src), split_sentences(tgt)
    if len(src_sents) == 1 and len(tgt_sents) == 1:
        return [("sentence", src, tgt)]
    out = [("paragraph", src, tgt)]
    if len(src_sents) == len(tgt_sents):
        out += [("sentence", s, t) for s, t in zip(src_sents, tgt_sents, strict=True)]
    return out


Member = tuple[str, str, str, bytes]  # (binary package, source package, member path, bytes)


def build(members: Iterable[Member], langs: Iterable[str],
          per_package: int = DEFAULT_PER_PACKAGE) -> list[EverydayCorpus]:
    """Corpora from the wanted members of the chosen packages.

    Per package and language: clean every pair, drop exact repeats, keep at
    most `per_package` catalog pairs (lowest sha256, as the messages corpus
    does); stamp captions and dictionary examples are not capped. Held-out
    packages of the messages corpus, and packages sharing their source, are
    refused. A pair found in several packages or splits is
    kept once, in train if any occurrence is train, else valid, else test.
    """
    corpora = {lang: EverydayCorpus(lang) for lang in langs if lang in LANGS}
    held_sources = set(messages.HELD_OUT_PACKAGES)
    raw: dict[tuple[str, str], dict[tuple[str, str], str]] = {}  # (pkg, lang) -> pair -> split
    uncapped: set[str] = set()  # stamp and dictionary packages: their entries are the point
    words: set[str] = set()  # dictionary headwords: training only, kind `word`
    for package, source, path, data in members:
        if package in messages.HELD_OUT_PACKAGES or source in held_sources:
            for corpus in corpora.values():
                corpus.dropped["held-out package"] += 1
            continue
        for lang, corpus in corpora.items():
            pairs, mode = _member_pairs(path, data, lang, corpus)
            per_entry = mode == "entry"
            if mode != "catalog":
                uncapped.add(package)
            if mode == "word":
                words.add(package)
            kept = raw.setdefault((package, lang), {})
            for src, tgt in pairs:
                result = clean_pair(src, tgt)
                if isinstance(result, str):
                    corpus.dropped[result] += 1
                elif result in kept:
                    corpus.dropped["duplicate"] += 1
                else:
                    inherited = package_split(package, source)
                    kept[result] = ("train" if mode == "word" else
                                    entry_split(result[0]) if per_entry and inherited == "train"
                                    else inherited)
    chosen: dict[str, dict[tuple[str, str, str], dict[str, str]]] = {lang: {} for lang in corpora}
    for (package, lang), kept in sorted(raw.items()):
        ranked = sorted(kept, key=lambda p: hashlib.sha256(f"{p[0]}\t{p[1]}".encode()).digest())
        cap = len(ranked) if package in uncapped else per_package
        if len(ranked) > cap:
            corpora[lang].dropped["over the per-package cap"] += len(ranked) - cap
        for src, tgt in ranked[:cap]:
            for kind, s, t in ([("word", src, tgt)] if package in words
                               else with_sentences(src, tgt)):
                if s == t:
                    continue
                chosen[lang].setdefault((kind, s, t), {})[package] = kept[(src, tgt)]
    for lang, corpus in corpora.items():
        by_text: dict[tuple[str, str], tuple[str, str, str]] = {}
        for (kind, src, tgt), where in chosen[lang].items():
            split = next(s for s in SPLITS if s in where.values())
            owner = next(p for p, sp in sorted(where.items()) if sp == split)
            if (src, tgt) in by_text:  # same text as another kind: keep the first
                corpus.dropped["duplicate"] += 1
                continue
            by_text[(src, tgt)] = (split, owner, kind)
            corpus.dropped["duplicate"] += len(where) - 1
        for (src, tgt), (split, owner, kind) in by_text.items():
            corpus.splits[split].append((owner, kind, src, tgt))
            corpus.packages[owner] += 1
        for rows in corpus.splits.values():
            rows.sort(key=lambda r: (r[0], hashlib.sha256(f"{r[2]}\t{r[3]}".encode()).digest()))
    return list(corpora.values())


def _member_pairs(path: str, data: bytes, lang: str, corpus: EverydayCorpus
                  ) -> tuple[list[tuple[str, str]], str]:
    """(pairs for `lang`, how they are split) of one package member: `catalog` (by
    package, capped), `entry` (per entry) or `word` (dictionary headwords: train)."""
    if DICTIONARY_PATH.search(path):
        if lang != "de":
            return [], "entry"
        return dictionary_pairs(data.decode("utf-8", errors="replace")), "entry"
    if STAMP_PATH.search(path):
        return stamp_pairs(data.decode("utf-8", errors="replace"), lang), "entry"
    word_list = WORD_LIST_PATH.search(path)
    if word_list:
        if _WORD_LIST_LANG[word_list[1]] != lang:
            return [], "word"
        try:
            text = gzip.decompress(data).decode("utf-8", errors="replace")
        except (OSError, EOFError) as exc:
            corpus.dropped[f"unreadable dictionary: {exc}"] += 1
            return [], "word"
        return word_list_pairs(text), "word"
    found = catalog_lang(path)
    if found is None or found[0] != lang:
        return [], "catalog"
    try:
        catalog = read_catalog(path, data)
    except MoError as exc:
        corpus.dropped[f"unreadable catalog: {exc}"] += 1
        return [], "catalog"
    corpus.catalogs += 1
    return catalog_pairs(catalog, corpus.dropped), "catalog"


# --------------------------------------------------------------------------- hand-written test set

HANDWRITTEN = Path(__file__).parent / "testsets" / "everyday.tsv"


def handwritten(lang: str, path: Path = HANDWRITTEN) -> list[tuple[str, str]]:
    """(English, translation) of the hand-written everyday test set: greetings,
    weather, travel, shopping, food, family, time, health, work, home, feelings,
    leisure; the issue's six sentences first. One `en<TAB>de<TAB>fr` line each."""
    column = {"de": 1, "fr": 2}[lang]
    rows = [line.split("\t") for line in path.read_text("utf-8").split("\n")
            if line.strip() and not line.startswith("#")]
    return [(row[0], row[column]) for row in rows]


# --------------------------------------------------------------------------- measuring

# Words of everyday talk (people, family, home, food, time, weather, travel,
# greetings, common verbs and adjectives): the share of English sides holding
# one is the card's "everyday" figure, the share holding I/you/we... its
# "dialogue" figure. A rough gauge to compare sources, not a classifier.
EVERYDAY_WORDS = frozenset("""
    i you we me my your our us he she his her they them their love home house family
    friend friends father mother brother sister son daughter wife husband child children
    boy girl man woman people day night today tomorrow yesterday morning evening week
    year time eat food drink water bread hungry thirsty sleep tired walk go come going
    coming see look know think want need like help good bad nice happy sad beautiful big
    small old young new cold hot warm weather rain sun snow where here there why how what
    who when yes no please thank thanks sorry hello goodbye city town village road street
    river sea beach forest mountain tree horse dog cat money buy sell shop market live
    lives work
""".split())
DIALOGUE_WORDS = frozenset("i you we me my your our us".split())
_WORD = re.compile(r"[A-Za-z']+")


def measure(english: Iterable[str]) -> dict[str, float]:
    """pairs, words, words per pair, and the shares of everyday, dialogue and
    sentence-like (capital first, end punctuation, 4+ words) English sides."""
    n = words = everyday = dialogue = sentences = 0
    for text in english:
        tokens = [w.lower() for w in _WORD.findall(text)]
        n += 1
        words += len(tokens)
        everyday += any(w in EVERYDAY_WORDS for w in tokens)
        dialogue += any(w in DIALOGUE_WORDS for w in tokens)
        sentences += bool(_SENTENCE.match(text)) and len(tokens) >= 4
    share = (lambda k: round(k / n, 2)) if n else (lambda k: 0.0)
    return {"pairs": n, "words": words, "words_per_pair": round(words / n, 1) if n else 0.0,
            "everyday": share(everyday), "dialogue": share(dialogue),
            "sentences": share(sentences)}
