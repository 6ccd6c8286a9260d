"""Settings declared as dataclass fields: each has a flag (`--max-batch-size`) and an
environment variable (`SEQ2SERVE_MAX_BATCH_SIZE`); a flag beats the variable, which
beats the default. An empty variable counts as unset (`docker run -e X=`).

The one way settings are read: `seq2serve serve`'s (config.py) and the ones a client
command shares with it (document_settings.py's document limits, which `seq2serve
translate-file` reads with), so that a setting is named, parsed and refused in the same
words wherever it is given. Each field's metadata is `meta(help, metavar)`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seq2serve.server.problems import Problem

ENV_PREFIX = "SEQ2SERVE_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
Field = dataclasses.Field[Any]


def meta(help_text: str, metavar: str | None = None) -> dict[str, Any]:
    """A setting field's metadata: its help text and the flag's metavar."""
    return {"help": help_text, "metavar": metavar}


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def default_of(f: Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def parser_for(f: Field, paths: Collection[str] = ()) -> Callable[[str], Any]:
    """How a flag's or a variable's text becomes the field's value (`paths`: the
    fields that are paths)."""
    if f.name in paths:
        return Path
    return {"bool": parse_bool, "int": parse_int, "float": parse_float}.get(str(f.type), str)


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                  fields: Iterable[Field], parse: Callable[[Field], Callable[[str], Any]],
                  default_text: Callable[[Field], Any] = default_of,
                  repeated: Collection[str] = ()) -> None:
    """One flag per field. Flags default to None so `read` can tell a flag given on the
    command line from one left to the environment or the default."""
    for f in fields:
        help_text = (f"{f.metadata['help']} (env {env_name(f.name)}; default "
                     f"{default_text(f)})")
        if f.name in repeated:
            parser.add_argument(flag_name(f.name), dest=f.name, default=None,
                                metavar=f.metadata["metavar"], action="append",
                                help=f"{help_text}; repeatable")
            continue
        if f.type == "bool":
            # --reflection / --no-reflection; the variable takes true/false, 1/0, yes/no.
            parser.add_argument(flag_name(f.name), dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction, help=help_text)
            continue
        parser.add_argument(flag_name(f.name), dest=f.name, default=None,
                            metavar=f.metadata["metavar"], type=_for_argparse(parse(f)),
                            help=help_text)


@dataclass
class Read:
    """The values given by flag or variable (the others are left to their defaults),
    and the variables that could not be parsed."""

    values: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    from_env: set[str] = field(default_factory=set)
    env_bad: set[str] = field(default_factory=set)

    def all_problems(self, found: Iterable[Problem]) -> list[Problem]:
        """The variables' parse problems, then `found` (the values' own): a variable
        that failed to parse already has its message, and its default standing in for
        it must not add a second, misleading one; a value from a variable says so."""
        out = list(self.problems)
        for problem in found:
            if problem.field in self.env_bad:
                continue
            out.append(problem.with_note(f"from {env_name(problem.field)}")
                       if problem.field in self.from_env else problem)
        return out


def read(fields: Iterable[Field], args: argparse.Namespace | None,
         environ: Mapping[str, str], parse: Callable[[Field], Callable[[str], Any]]) -> Read:
    """Flag > `SEQ2SERVE_…` variable; fields given by neither are left out."""
    out = Read()
    for f in fields:
        flag_value = getattr(args, f.name, None) if args is not None else None
        raw = environ.get(env_name(f.name), "")
        if isinstance(flag_value, list):  # a repeated flag: its values in order
            flag_value = ",".join(flag_value)
        if flag_value is not None:
            out.values[f.name] = flag_value
        elif raw.strip():
            out.from_env.add(f.name)
            try:
                out.values[f.name] = parse(f)(raw.strip())
            except ValueError as e:
                out.problems.append(Problem(f.name, f"{env_name(f.name)} {e}"))
                out.env_bad.add(f.name)
    return out


def _for_argparse(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    # argparse words a ValueError as "invalid parse_int value"; keep ours instead.
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def parse_int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"must be an integer, got {text!r}") from None


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"must be true or false (1/0, yes/no, on/off), got {text!r}")


def parse_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {text!r}")
    return value


class SettingsError(ValueError):
    """One or more problems in settings; `problems` lists each on its own."""

    title = "invalid settings"

    def __init__(self, problems: Iterable[Problem]):
        self.problems = list(problems)
        super().__init__(f"{self.title}:\n  " + "\n  ".join(self.messages))

    @property
    def messages(self) -> list[str]:
        return [p.message for p in self.problems]
