"""Program messages from gettext catalogs: reading `.mo` files and cleaning their entries.

Pure functions over bytes and text; fetching Debian packages and building the
corpus is `messages.py`. The reader follows GNU gettext's documented `.mo`
layout (the same one Python's `gettext.GNUTranslations` parses), kept here
because `GNUTranslations` folds plurals and contexts into a lookup table and
hides what we need: the plural source text, the context and the header.
"""

from __future__ import annotations

import html
import re
import struct
import unicodedata
from collections import Counter
from dataclasses import dataclass

MO_MAGIC = 0x950412DE
MAX_MESSAGE_CHARS = 1000
MAX_LENGTH_RATIO = 3.0
RATIO_MIN_CHARS = 16  # below this "OK" -> "Okay" would count as a bad ratio
NORMALIZATION = "NFC"  # see docs/data-card-messages.md: NFKC would rewrite "…" and "²"

# Entries whose translation is not a translation: translator names and addresses.
CREDIT_IDS = frozenset({
    "translator-credits", "translator_credits", "translator-credits\n", "Your names",
    "Your emails", "NAME OF TRANSLATORS", "EMAIL OF TRANSLATORS", "translators",
})


class MoError(ValueError):
    """Not a readable .mo file."""


@dataclass(frozen=True)
class Entry:
    context: str | None
    msgid: str
    msgid_plural: str | None
    msgstrs: tuple[str, ...]  # one per plural form; one for a plain entry


@dataclass(frozen=True)
class Catalog:
    header: dict[str, str]
    entries: list[Entry]

    @property
    def nplurals(self) -> int | None:
        match = re.search(r"nplurals\s*=\s*(\d+)", self.header.get("plural-forms", ""))
        return int(match[1]) if match else None


def read_mo(data: bytes) -> Catalog:
    """Parse a compiled gettext catalog. msgfmt never writes fuzzy entries unless
    asked to (--use-fuzzy), so what a .mo holds is what translators approved."""
    if len(data) < 20:
        raise MoError("too short for a .mo header")
    for order in ("<", ">"):
        magic, revision, count, orig_at, trans_at = struct.unpack(f"{order}5I", data[:20])
        if magic == MO_MAGIC:
            break
    else:
        raise MoError("bad magic number")
    if revision >> 16 not in (0, 1):
        raise MoError(f"unknown major revision {revision >> 16}")

    def string(table: int, i: int) -> bytes:
        at = table + 8 * i
        if at + 8 > len(data):
            raise MoError("string table runs past the end of the file")
        length, offset = struct.unpack(f"{order}2I", data[at:at + 8])
        if offset + length > len(data):
            raise MoError("string runs past the end of the file")
        return data[offset:offset + length]

    raw = [(string(orig_at, i), string(trans_at, i)) for i in range(count)]
    header: dict[str, str] = {}
    for msgid, msgstr in raw:
        if msgid == b"":
            for line in msgstr.decode("ascii", errors="replace").split("\n"):
                key, sep, value = line.partition(":")
                if sep:
                    header[key.strip().lower()] = value.strip()
    match = re.search(r"charset=([\w.:-]+)", header.get("content-type", ""))
    charset = match[1] if match and match[1].upper() != "CHARSET" else "utf-8"
    try:
        "".encode(charset)
    except LookupError as exc:
        raise MoError(f"unknown charset {charset!r}") from exc
    entries = []
    for msgid, msgstr in raw:
        if msgid == b"":
            continue
        try:
            source, target = msgid.decode(charset), msgstr.decode(charset)
        except UnicodeDecodeError as exc:
            raise MoError(f"entry not in {charset}") from exc
        context, sep, source = source.rpartition("\x04")
        singular, _, plural = source.partition("\x00")
        entries.append(Entry(context if sep else None, singular,
                             plural if "\x00" in source else None,
                             tuple(target.split("\x00"))))
    return Catalog(header, entries)


# --------------------------------------------------------------------------- pairs


def entry_pairs(entry: Entry, nplurals: int | None) -> list[tuple[str, str]] | str:
    """(source, target) texts of one entry, or why it gives none.

    A plural entry pairs its singular with form 0 and its plural with form 1,
    which is right for German (n != 1) and French (n > 1), both nplurals=2;
    catalogs with any other plural scheme give no plural pairs.
    """
    if entry.msgid in CREDIT_IDS or (entry.context or "") in CREDIT_IDS:
        return "translator credits"
    if entry.msgid_plural is None:
        return [(entry.msgid, entry.msgstrs[0])]
    if nplurals != 2 or len(entry.msgstrs) != 2:
        return "plural forms other than 2"
    return [(entry.msgid, entry.msgstrs[0]), (entry.msgid_plural, entry.msgstrs[1])]


# --------------------------------------------------------------------------- cleaning

_PRINTF = re.compile(
    r"%(?:\d+\$)?[-+0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|ll|[hlLqjzt]|I64|I)?"
    r"[diouxXeEfFgGaAcCsSpn]"
    r"|%<PRI\w+>"  # gettext's portable <inttypes.h> macros
    r"|%\(\w+\)[-+0#]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"  # Python %(name)s
    r"|%\{\w+\}"  # Ruby, GNOME Builder
    r"|%\d+"  # Qt / KDE %1
)
_BRACES = re.compile(r"(?<![$%])\{\w*(?:[:!][^{}\s]*)?\}")  # Python/.NET/ICU {0} {name} {:>8}
_SHELL = re.compile(r"\$\{\w+\}|\$[A-Za-z_]\w*")
_POSITION = re.compile(r"(?<=%)\d+\$")

_URL = re.compile(r"\b(?:https?|ftp|file)://[^\s<>\"']+|\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_PATH = re.compile(r"(?<![\w.%/])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+*-]+/?")
_OPTION = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*(?:=\S*)?")
_OPTION_TABLE = re.compile(r"^\s*-{1,2}\w\S*.*?\S\s{2,}\S", re.M)  # `--help` column layout

_TAG = re.compile(r"</?([A-Za-z][\w:-]*)(?:\s[^<>]*)?/?>")
_BREAKING_TAGS = frozenset({"br", "p", "li", "ul", "ol", "div", "tr", "td", "h1", "h2", "h3"})
_AMP_ACCEL = re.compile(r"(?<!&)&(?=[^\W_])(?![A-Za-z]+;|#\d+;)")
_UNDERSCORE_ACCEL = re.compile(r"_(?=[^\W_])")
# "default:LTR", "calendar:week_start:0", "locate_motion_style": ids, not English
_KEY_LIKE = re.compile(r"^(?:[\w.-]+(?::[\w.-]*)+|[a-z\d]+(?:_[a-z\d]+)+)$")
_LETTER = re.compile(r"[^\W\d_]")


def placeholders(text: str) -> Counter[str]:
    """Format placeholders: printf (`%s`, `%1$s`, `%<PRIu64>`, `%(n)d`, Qt `%1`),
    braces (`{0}`, `{name}`) and shell (`$VAR`, `${VAR}`). Positional printf
    indices are dropped so a translation may reorder `%1$s %2$s`."""
    text = text.replace("%%", "")
    found = [_POSITION.sub("", m) for m in _PRINTF.findall(text)]
    rest = _PRINTF.sub(" ", text)  # "%2$s" holds no shell "$s"
    return Counter(found + _BRACES.findall(rest) + _SHELL.findall(rest))


def protected(text: str) -> Counter[str]:
    """Tokens a translation must carry verbatim: URLs, e-mail addresses, file
    paths and command-line options."""
    rest = _URL.sub(" ", text)
    found = _URL.findall(text) + _PATH.findall(rest)
    return Counter(found + _OPTION.findall(_PATH.sub(" ", rest)))


def strip_accelerators(src: str, tgt: str) -> tuple[str, str]:
    """Remove keyboard accelerators: GTK `_File`, Qt/KDE `&File` (`&&` is a
    literal `&`). A side is stripped only if it holds exactly one marker, and
    an underscore word that reappears verbatim on the other side (`file_name`)
    is an identifier, not an accelerator."""
    def amp(text: str) -> str:
        if len(_AMP_ACCEL.findall(text)) == 1:
            text = _AMP_ACCEL.sub("", text)
        return text.replace("&&", "&")

    def underscore(text: str, other: str) -> str:
        if text.count("_") != 1 or not _UNDERSCORE_ACCEL.search(text):
            return text
        word = next(w for w in text.split() if "_" in w)
        return text if word in other else text.replace("_", "", 1)

    src, tgt = amp(src), amp(tgt)
    return underscore(src, tgt), underscore(tgt, src)


def strip_markup(text: str) -> str:
    """Drop inline tags (block-level ones become a space) and, where there was
    markup, resolve the entities it required (`&amp;`, `&lt;`)."""
    if not _TAG.search(text):
        return text
    text = _TAG.sub(lambda m: " " if m[1].lower() in _BREAKING_TAGS else "", text)
    return html.unescape(text)


def tags(text: str) -> Counter[str]:
    return Counter(name.lower() for name in _TAG.findall(text))


def normalize_text(text: str) -> str:
    """One line, NFC, whitespace runs collapsed."""
    return " ".join(unicodedata.normalize(NORMALIZATION, text).split())


def clean_pair(src: str, tgt: str) -> tuple[str, str] | str:
    """The cleaned (source, target) of one message, or why it is dropped."""
    if not src.strip() or not tgt.strip():
        return "empty side"
    if _OPTION_TABLE.search(src) or _OPTION_TABLE.search(tgt):
        return "option table"
    if _KEY_LIKE.match(src.strip()):
        return "key, not text"
    if placeholders(src) != placeholders(tgt):
        return "placeholders differ"
    if tags(src) != tags(tgt):
        return "markup differs"
    src, tgt = strip_accelerators(src, tgt)
    src, tgt = normalize_text(strip_markup(src)), normalize_text(strip_markup(tgt))
    if protected(src) != protected(tgt):
        return "paths/options/URLs differ"
    bare = _URL.sub("", _PATH.sub("", _PRINTF.sub("", _BRACES.sub("", src))))
    if not _LETTER.search(_OPTION.sub("", _SHELL.sub("", bare))):
        return "nothing to translate"
    if src == tgt:
        return "source equals target"
    if max(len(src), len(tgt)) > MAX_MESSAGE_CHARS:
        return f"longer than {MAX_MESSAGE_CHARS} chars"
    short, long = sorted((len(src), len(tgt)))
    if long >= RATIO_MIN_CHARS and long > MAX_LENGTH_RATIO * short:
        return f"length ratio > {MAX_LENGTH_RATIO:g}"
    return src, tgt

