"""What every document format shares: the texts a file asks to have translated, and
the file written back with their translations.

A format module reads a file into a `Document`: the texts to translate, in file
order (`texts`), and how to write the file with their translations (`write`). A
translation of None leaves its entry as it was (the text was over the server's
limit, or its inline markup did not come back well-formed). Everything the
document does not translate is written back byte for byte.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from seq2serve.server.core.errors import ErrorKind, InvalidArgument


class DocumentError(InvalidArgument):
    """A file that cannot be read or written as its format says (the client's input)."""


class DocumentTooLarge(DocumentError):
    """A file past a limit on what it may unpack to or ask to have translated (`Limits`):
    a DocumentError still, of the kind TOO_LARGE (HTTP 413, not 400). `bound` names the
    `Limits` field passed ("characters"), so that a caller can name the setting that
    raises it (`Limits.SETTINGS`)."""

    def __init__(self, message: str, bound: str):
        super().__init__(message)
        self.kind = ErrorKind.TOO_LARGE
        self.bound = bound


@dataclass
class Tally:
    """What a translation did to a file's entries, for the caller to report."""

    entries: int = 0  # translatable entries in the file
    filled: int = 0  # machine-translated now (marked for review where the format can)
    kept: int = 0  # already translated, left byte for byte
    skipped: int = 0  # to translate, but left as they were (see `Document`)
    notes: list[str] = field(default_factory=list)  # why entries were skipped

    def describe(self) -> str:
        text = (f"{self.filled} of {self.entries} entries translated, {self.kept} already "
                f"translated kept, {self.skipped} skipped")
        return text + "".join(f"; {note}" for note in self.notes[:3])


class Document(ABC):
    """A file read for translation. `name` is the file name to write it under."""

    def __init__(self, name: str, media_type: str) -> None:
        self.name = name
        self.media_type = media_type
        self.tally = Tally()
        self.source_language = ""  # what the file says its source language is, if anything

    @property
    @abstractmethod
    def texts(self) -> Sequence[str]:
        """The texts to translate, in file order."""

    @abstractmethod
    def write(self, translations: Sequence[str | None]) -> bytes:
        """The file with `translations` (one per text; None: leave that entry) filled in."""

    def _check(self, translations: Sequence[str | None]) -> None:
        if len(translations) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts to translate, got {len(translations)} "
                             "translations")


def check_target(declared: str | None, target: str, name: str) -> None:
    """Refuse to fill a file made for another language (`Language: fr`, `trgLang="fr"`)
    with `target`: only the primary language is compared (`de_DE` is `de`)."""
    primary = (declared or "").replace("_", "-").split("-")[0].strip().lower()
    wanted = target.replace("_", "-").split("-")[0].lower()
    if primary and primary != wanted:
        raise DocumentError(f"{name} is for language {declared!r}, not {target[:16]!r}")


def decode_utf8(data: bytes, name: str) -> str:
    """A text file's content; a UTF-8 byte order mark is kept (written back as it came)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(f"{name} is not UTF-8 text (byte {e.start})") from None


def same_edges(source: str, translation: str) -> str:
    """`translation` with the source's leading and trailing whitespace: a message that
    ends in a newline keeps it (msgfmt --check insists), an indented one its indent."""
    core = translation.strip()
    if not core:
        return translation
    stripped = source.strip()
    if not stripped:
        return source
    start = source.index(stripped[0])
    end = len(source.rstrip())
    return source[:start] + core + source[end:]
