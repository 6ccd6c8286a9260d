"""Reading gettext `.po` files into the same `Catalog` that `gettext.read_mo` returns.

Many games and manuals ship their translations as `.po` source files rather
than compiled `.mo` (Pingus, Flare, Singularity, ikiwiki's base wiki). Unlike
a `.mo`, a `.po` also holds fuzzy entries (a translation not yet reviewed
after its English changed) and obsolete ones (`#~`): both are left out, which
is what `msgfmt` would do.
"""

from __future__ import annotations

import re

from seq2serve.model.data.gettext import Catalog, Entry, MoError

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v"}
_KEYWORD = re.compile(r'^(msgctxt|msgid_plural|msgid|msgstr(?:\[(\d+)\])?)\s*(".*")\s*$')


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise MoError(f"not a quoted .po string: {text[:40]!r}")
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[1]), text[1:-1])


class _Builder:
    def __init__(self) -> None:
        self.header: dict[str, str] = {}
        self.entries: list[Entry] = []
        self.fields: dict[str, str] = {}
        self.flags: set[str] = set()
        self.last: str | None = None

    def flush(self) -> None:
        fields, fuzzy = self.fields, "fuzzy" in self.flags
        self.fields, self.flags, self.last = {}, set(), None
        if "msgid" not in fields:
            return
        forms = sorted((k for k in fields if k.startswith("msgstr")),
                       key=lambda k: int(k[7:-1]))
        msgstrs = tuple(fields[k] for k in forms) or ("",)
        if fields["msgid"] == "" and "msgctxt" not in fields:
            for line in msgstrs[0].split("\n"):
                key, sep, value = line.partition(":")
                if sep:
                    self.header[key.strip().lower()] = value.strip()
        elif not fuzzy:
            self.entries.append(Entry(fields.get("msgctxt"), fields["msgid"],
                                      fields.get("msgid_plural"), msgstrs))


def read_po(text: str) -> Catalog:
    """Parse the text of a `.po` file (already decoded; `.po` files of the
    packages we read are UTF-8). Fuzzy and obsolete entries are skipped."""
    build = _Builder()
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line.startswith("#~"):
            continue
        if line.startswith("#"):
            if build.last is not None and build.last.startswith("msgstr"):
                build.flush()  # a comment opens the next entry
            if line.startswith("#,"):
                build.flags |= {flag.strip() for flag in line[2:].split(",")}
            continue
        match = _KEYWORD.match(line)
        if match:
            key = match[1] if match[1] != "msgstr" else "msgstr[0]"
            starts_entry = key in ("msgctxt", "msgid")
            if starts_entry and build.last is not None and build.last.startswith("msgstr"):
                build.flush()
            build.fields[key] = _unquote(match[3])
            build.last = key
        elif line.startswith('"') and build.last is not None:
            build.fields[build.last] += _unquote(line)
        else:
            raise MoError(f"unexpected .po line: {line[:40]!r}")
    build.flush()
    return Catalog(build.header, build.entries)
