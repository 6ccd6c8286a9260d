"""A minimal .mo writer for tests (GNU gettext's layout, as Tools/i18n/msgfmt.py writes it)."""

from __future__ import annotations

import struct
from pathlib import Path

HEADER = ("Content-Type: text/plain; charset={charset}\n"
          "Plural-Forms: nplurals={nplurals}; plural=(n != 1);\n")


def mo_bytes(entries: list[tuple[str, str]], charset: str = "UTF-8", nplurals: int = 2,
             big_endian: bool = False) -> bytes:
    """A catalog of (msgid, msgstr) in their raw .mo form: "ctx\\x04id" for a
    context, "one\\x00many" for plural ids and forms."""
    items = [("", HEADER.format(charset=charset, nplurals=nplurals)), *entries]
    items.sort(key=lambda kv: kv[0].encode(charset))
    ids = [k.encode(charset) for k, _ in items]
    strs = [v.encode(charset) for _, v in items]
    order = ">" if big_endian else "<"
    count = len(items)
    key_table, value_table = 28, 28 + 8 * count
    data_start = 28 + 16 * count
    blob, key_index, value_index = b"", [], []
    for text in ids:
        key_index.append((len(text), data_start + len(blob)))
        blob += text + b"\0"
    for text in strs:
        value_index.append((len(text), data_start + len(blob)))
        blob += text + b"\0"
    head = struct.pack(f"{order}7I", 0x950412DE, 0, count, key_table, value_table, 0, 0)
    tables = b"".join(struct.pack(f"{order}2I", *pair) for pair in key_index + value_index)
    return head + tables + blob


def write_tree(root: Path, package: str, lang: str, domain: str,
               entries: list[tuple[str, str]], **kwargs: object) -> Path:
    """`root/<package>/usr/share/locale/<lang>/LC_MESSAGES/<domain>.mo` (as `dpkg-deb -x`)."""
    folder = root / package / "usr/share/locale" / lang / "LC_MESSAGES"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{domain}.mo"
    path.write_bytes(mo_bytes(entries, **kwargs))  # type: ignore[arg-type]
    return path
