"""The document limits: what one file may hold when it is read for translation, the
bounds on the time and memory that reading costs (a 230 KB .docx of two million empty
paragraphs must not hold a process for a minute and gigabytes).

Declared here, once. `seq2serve serve` takes them as settings of its configuration
(config.py) for /translate_file and the document jobs; `seq2serve translate-file` as
options of its own for the files it reads itself, with the same flags, variables,
defaults, validation and words (settings.py); the core's `Limits`
(core/documents/limits.py) is built from them.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from seq2serve.server import settings
from seq2serve.server.problems import Problem, int_problem
from seq2serve.server.settings import meta


@dataclass(frozen=True)
class DocumentLimitSettings:
    # Past one: HTTP 413 on a server, a refusal naming the flag in translate-file. The
    # upload may be larger than a request (images are copied byte for byte); what it
    # unpacks to and asks to translate is bounded by the others, counted while reading.
    max_document_bytes: int = field(default=32 * 1024 * 1024, metadata=meta(
        "largest document file read (an upload's HTTP body to /translate_file may be this "
        "and 64 KiB more)", "BYTES"))
    max_document_members: int = field(default=5000, metadata=meta(
        "most files in a document's archive (.docx, .pptx, .xlsx, .odt, .odp, .ods, .epub)",
        "N"))
    max_document_unpacked_bytes: int = field(default=64 * 1024 * 1024, metadata=meta(
        "most bytes a document's archive may unpack to, all its files together "
        "(declared and counted while inflating)", "BYTES"))
    max_document_elements: int = field(default=500_000, metadata=meta(
        "most XML elements in the parts of a document file read for translation (an "
        "HTML tag or a line of a text file counts as one), counted while reading; about "
        "150 bytes of memory each", "N"))
    max_document_characters: int = field(default=1_000_000, metadata=meta(
        "most characters of text to translate in one document file", "N"))
    max_document_paragraphs: int = field(default=50_000, metadata=meta(
        "most texts (paragraphs, entries, lines) to translate in one document file; a "
        "package's paragraph elements, empty or not, counted while reading; about 2 KB of "
        "memory each while translated", "N"))

    def problems(self) -> list[Problem]:
        """Each limit out of its range, named as config.py names its own."""
        found = (int_problem(f.name, getattr(self, f.name), 1) for f in FIELDS)
        return [p for p in found if p is not None]

    @classmethod
    def of(cls, values: object) -> DocumentLimitSettings:
        """The document limits among `values`' attributes (a ServerConfig's)."""
        return cls(**{f.name: getattr(values, f.name) for f in FIELDS})


FIELDS = dataclasses.fields(DocumentLimitSettings)
_DECLARED = {f.name: f for f in FIELDS}


def declared(name: str) -> Any:
    """The field `name` as declared here, for another settings dataclass to hold
    (ServerConfig lists the limits among its own settings, in its order)."""
    f = _DECLARED[name]
    return field(default=f.default, metadata=f.metadata)


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The limits' flags, as `seq2serve serve` has them."""
    settings.add_arguments(parser, FIELDS, settings.parser_for)


def given(args: argparse.Namespace) -> list[str]:
    """The limits' flags given on the command line, in their order."""
    return [settings.flag_name(f.name) for f in FIELDS if getattr(args, f.name, None)
            is not None]


def from_args(args: argparse.Namespace | None,
              environ: Mapping[str, str]) -> DocumentLimitSettings:
    """Flag > `SEQ2SERVE_MAX_DOCUMENT_…` variable > default, validated; SettingsError
    lists every problem, in the words `seq2serve serve` uses."""
    got = settings.read(FIELDS, args, environ, settings.parser_for)
    limits = DocumentLimitSettings(**got.values)
    problems = got.all_problems(limits.problems())
    if problems:
        raise settings.SettingsError(problems)
    return limits
