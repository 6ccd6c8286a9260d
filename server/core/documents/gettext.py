"""Gettext catalogs (.po, .pot), read and written with translate-toolkit's `pypo`.

translate-toolkit keeps each field's original quoted lines and writes a field it
was not asked to change exactly as it read it, whatever the file's line
wrapping; so every entry not filled here (and the header, unless it lacks what
the filled entries need) is byte for byte as it was.

- Filled: entries without any translation (every msgstr empty); with `overwrite`,
  every translated entry too. The header and obsolete (`#~`) entries never.
- Each filled entry is marked `fuzzy`, so that reviewers see it and msgfmt leaves
  it out of the .mo until a person has checked it. Context, comments, flags,
  references and previous msgids (`#|`) stay as they were.
- Plural entries get every form the catalog's `Plural-Forms` asks for: the form
  that n = 1 selects gets the translation of the singular, every other form that
  of the plural (with one form, as in Japanese, that form gets the plural). A
  catalog without `Plural-Forms` (a .pot) gets the target language's standard one
  from translate-toolkit's language data.
- A .pot becomes the target language's .po: `Language`, `Plural-Forms`
  and a UTF-8 `Content-Type` are set in its header.
"""

from __future__ import annotations

import codecs
import gettext
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

from translate.lang import data as language_data
from translate.misc.multistring import multistring
from translate.storage import pypo

from seq2serve.server.core.documents.base import (
    Document,
    DocumentError,
    check_target,
    decode_utf8,
    same_edges,
)

MEDIA_TYPE = "text/x-gettext-translation"
_CHARSET = re.compile(r"charset=\s*([^\s;]+)", re.IGNORECASE)
_PLURAL_FORMS = re.compile(r"^\s*nplurals\s*=\s*(\d+)\s*;\s*plural\s*=\s*(.+?);?\s*$")


@dataclass(frozen=True)
class PluralForms:
    """A catalog's plural rule: how many forms, and which form n = 1 takes."""

    count: int
    expression: str
    singular: int | None  # the form of n = 1; None when one form serves every n

    @classmethod
    def parse(cls, count: int, expression: str) -> PluralForms:
        if count < 1:
            raise DocumentError(f"Plural-Forms must have nplurals >= 1, got {count}")
        if count == 1:
            return cls(1, expression, None)
        try:
            one = gettext.c2py(expression)(1)
        except (ValueError, SyntaxError, RecursionError):
            raise DocumentError(f"Plural-Forms has a plural expression gettext cannot read: "
                                f"{expression[:80]!r}") from None
        return cls(count, expression, one if 0 <= one < count else 0)

    def forms(self, singular: str, plural: str) -> list[str]:
        return [singular if i == self.singular else plural for i in range(self.count)]


def standard_plural_forms(language: str) -> PluralForms | None:
    """The language's usual Plural-Forms (translate-toolkit's data: `pt_BR`, then `pt`)."""
    code = language.replace("-", "_")
    for candidate in (code, code.split("_")[0], code.split("_")[0].lower()):
        known = language_data.languages.get(candidate)
        if known is not None:
            return PluralForms.parse(int(known[1]), str(known[2]))
    return None


class GettextDocument(Document):
    def __init__(self, name: str, data: bytes, target: str, overwrite: bool) -> None:
        path = PurePath(name)
        template = path.suffix.lower() == ".pot"
        super().__init__(f"{path.stem}.{target}.po" if template else name, MEDIA_TYPE)
        try:
            self.store = pypo.pofile(data)
        except Exception as e:  # the parser's errors have no common type
            raise DocumentError(f"{name} is not a readable gettext catalog: {e}") from None
        if _declares_utf8(self.store):
            # translate-toolkit reads bytes that are not UTF-8 as Latin-1 whatever the
            # header says, and would write that mojibake back as a translation.
            decode_utf8(data, name)
        if not template:
            check_target(str(self.store.parseheader().get("Language", "")),  # type: ignore[no-untyped-call]
                         target, name)
        self.target = target
        self.template = template
        self._units: list[pypo.pounit] = []
        self._texts: list[str] = []
        for unit in self.store.units:
            if unit.isheader() or unit.isobsolete() or not unit.source:
                continue
            self.tally.entries += 1
            if any(_strings(unit.target)) and not overwrite:
                self.tally.kept += 1
                continue
            self._units.append(unit)
            strings = _strings(unit.source)
            self._texts.extend(strings[:2] if _plural(unit) else strings[:1])

    @property
    def texts(self) -> Sequence[str]:
        return self._texts

    def write(self, translations: Sequence[str | None]) -> bytes:
        self._check(translations)
        plurals = self._plural_forms() if any(_plural(u) for u in self._units) else None
        if self.template:
            self._template_header(plurals)
        it = iter(translations)
        for unit in self._units:
            sources = _strings(unit.source)
            if _plural(unit):
                singular, plural = next(it), next(it)
                if singular is None or plural is None or plurals is None:
                    self.tally.skipped += 1
                    continue
                unit.target = multistring(plurals.forms(same_edges(sources[0], singular),
                                                        same_edges(sources[1], plural)))
            else:
                text = next(it)
                if text is None or not text.strip():
                    self.tally.skipped += 1
                    continue
                unit.target = same_edges(sources[0], text)
            unit.markfuzzy(True)
            self.tally.filled += 1
        try:
            return bytes(self.store)
        except UnicodeEncodeError as e:
            raise DocumentError(f"the catalog's charset {self.store.encoding} cannot hold the "
                                f"translation {e.object[e.start:e.end]!r}; convert it to UTF-8 "
                                "first (msgconv -t UTF-8)") from None

    def _plural_forms(self) -> PluralForms:
        """The header's Plural-Forms; when it has none, the target language's, added."""
        header = str(self.store.parseheader().get("Plural-Forms", ""))  # type: ignore[no-untyped-call]
        match = _PLURAL_FORMS.match(header) if header else None
        if match and not self.template:
            return PluralForms.parse(int(match[1]), match[2].strip())
        standard = standard_plural_forms(self.target)
        if standard is None:
            if match:  # a .pot that already says, for a language we do not know
                return PluralForms.parse(int(match[1]), match[2].strip())
            raise DocumentError(f"the catalog has plural entries but no Plural-Forms header, "
                                f"and the plural rule of {self.target[:16]!r} is unknown: add "
                                "the header")
        self.store.updateheaderplural(str(standard.count), standard.expression)
        return standard

    def _template_header(self, plurals: PluralForms | None) -> None:
        """A .pot's header as the target language's catalog's (msginit's fields)."""
        self.store.updateheader(  # type: ignore[no-untyped-call]
            add=True, Language=self.target,
                                PO_Revision_Date=time.strftime("%Y-%m-%d %H:%M%z"),
                                Content_Type="text/plain; charset=UTF-8",
                                Content_Transfer_Encoding="8bit")
        if plurals is None:
            standard = standard_plural_forms(self.target)
            if standard is not None:
                self.store.updateheaderplural(str(standard.count), standard.expression)
        self.store.settargetlanguage(self.target)
        self.store.encoding = "UTF-8"
        header = self.store.header()  # type: ignore[no-untyped-call]
        if header is not None:
            header.markfuzzy(False)  # its fields are filled now


def _declares_utf8(store: pypo.pofile) -> bool:
    """Whether the header names UTF-8 as the charset (not left out, not `CHARSET`)."""
    content_type = str(store.parseheader().get("Content-Type", ""))  # type: ignore[no-untyped-call]
    match = _CHARSET.search(content_type)
    try:
        return match is not None and codecs.lookup(match.group(1)).name == "utf-8"
    except LookupError:  # translate-toolkit has refused an unknown charset already
        return False


def _strings(value: str) -> list[str]:
    """A field's strings: a plural entry's are a multistring (singular, plural, ...)."""
    return [str(s) for s in value.strings] if isinstance(value, multistring) else [value]


def _plural(unit: pypo.pounit) -> bool:
    return bool(unit.hasplural())  # type: ignore[no-untyped-call]
