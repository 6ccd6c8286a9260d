"""SubRip subtitles (.srt): each cue's text translated, its number and timing kept.

A cue is a number line, a timing line (`00:00:01,000 --> 00:00:03,500`, any
position settings after it kept) and text lines up to a blank line. A cue's
lines are one sentence more often than not, so they are translated together and
the translation is broken again into as many lines, of balanced length at spaces;
a cue whose every line starts with a dash is a dialogue, each line translated
alone. Numbers, timings, blank lines, line endings (LF or CRLF) and a byte order
mark stay byte for byte; anything that is not a cue is kept as it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from seq2serve.server.core.documents.base import Document, decode_utf8

MEDIA_TYPE = "application/x-subrip"
_NUMBER = re.compile(r"^\s*\d+\s*$")
_TIMING = re.compile(r"^\s*\d+:\d{2}:\d{2}[,.]\d{1,3}\s*-->\s*\d+:\d{2}:\d{2}[,.]\d{1,3}")


@dataclass(frozen=True)
class _Cue:
    first: int  # index of its first text line in the file's lines
    count: int  # its text lines
    dialogue: bool  # each line one speaker's, translated alone


class SubtitleDocument(Document):
    def __init__(self, name: str, data: bytes) -> None:
        super().__init__(name, MEDIA_TYPE)
        # keepends: each line's own ending (LF, CRLF) goes back with it.
        self.lines = decode_utf8(data, name).splitlines(keepends=True)
        self.cues: list[_Cue] = []
        self._texts: list[str] = []
        i = 0
        while i < len(self.lines):
            if (_NUMBER.match(self.lines[i]) and i + 1 < len(self.lines)
                    and _TIMING.match(self.lines[i + 1])):
                first = end = i + 2
                while end < len(self.lines) and self.lines[end].strip():
                    end += 1
                text = [_body(line) for line in self.lines[first:end]]
                if any(t.strip() for t in text):
                    dialogue = len(text) > 1 and all(t.lstrip().startswith("-") for t in text)
                    self.cues.append(_Cue(first, end - first, dialogue))
                    self._texts.extend(text if dialogue else [" ".join(t.strip() for t in text)])
                i = end
            else:
                i += 1
        self.tally.entries = len(self.cues)

    @property
    def texts(self) -> Sequence[str]:
        return self._texts

    def write(self, translations: Sequence[str | None]) -> bytes:
        self._check(translations)
        lines = list(self.lines)
        it = iter(translations)
        for cue in self.cues:
            old = lines[cue.first:cue.first + cue.count]
            if cue.dialogue:
                done = [next(it) for _ in old]
                new = [_body(o) if t is None else t.strip() for o, t in zip(old, done,
                                                                            strict=True)]
                translated = any(t is not None for t in done)
            else:
                text = next(it)
                translated = text is not None and bool(text.strip())
                new = balanced(text, cue.count) if text is not None and translated else []
            if not translated:
                self.tally.skipped += 1
                continue
            for k, line in enumerate(old):  # a shorter translation: its spare lines go
                lines[cue.first + k] = new[k] + _ending(line) if k < len(new) else ""
            self.tally.filled += 1
        return "".join(lines).encode("utf-8")


def balanced(text: str, count: int) -> list[str]:
    """`text` broken at spaces into `count` lines of about equal length (fewer when it
    has fewer words; never an empty line)."""
    words = text.split()
    if count <= 1 or len(words) <= 1:
        return [" ".join(words)]
    lines: list[str] = []
    rest = words
    for left in range(count, 1, -1):
        if len(rest) <= 1:
            break
        goal = len(" ".join(rest)) / left
        taken, length = 1, len(rest[0])
        # Take words while the line gets closer to its share of the rest.
        while (taken < len(rest) - (left - 1) and
               abs(length + 1 + len(rest[taken]) - goal) <= abs(length - goal)):
            length += 1 + len(rest[taken])
            taken += 1
        lines.append(" ".join(rest[:taken]))
        rest = rest[taken:]
    if rest:
        lines.append(" ".join(rest))
    return lines


def _body(line: str) -> str:
    return line.rstrip("\r\n")


def _ending(line: str) -> str:
    return line[len(_body(line)):]
