"""A request's decoding options: one validated dataclass (vLLM's SamplingParams style).

A request sets only what it cares about; every field left as None takes the
model's default from the package manifest (`manifest.generation`), then the
built-in default below. `resolve()` returns the engine's ResolvedOptions with every
field set and checked; each error is an InvalidOptions (INVALID_ARGUMENT) that names
the field and its valid range.

Which decoding runs:
- sampling when `sampling_temperature > 0`, or when `sampling_top_k` or
  `sampling_top_p` is set and the temperature is not (it then defaults to 1.0).
  Sampling draws one hypothesis per source, so it needs `beam_size` 1 (a
  beam size left unset resolves to 1) and `num_hypotheses` 1;
- otherwise greedy search when `beam_size` is 1, beam search when it is more.

Lengths count generated tokens (the decoder start token is not one; EOS is).
The limit for one source is `max_length`, lowered to
`ceil(max_length_ratio * source length)` when the ratio is > 0, and never
above the server's cap (`OptionLimits.max_length`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seq2serve.server.core.errors import InvalidArgument
from seq2serve.server.engine.options import OptionLimits, ResolvedOptions
from seq2serve.server.problems import int_problem

EARLY_STOPPING = (False, True, "never")
# Beam search ranks finished hypotheses by sum(log p) / length ** length_penalty in
# float32 and marks empty or blocked slots with -1e9 (Hugging Face's convention,
# decoding.UNREACHABLE). Below 0 the penalty multiplies instead: at -6 a 20-token
# hypothesis scores ~-4e7 per nat and sinks below the -1e9 marks, so the n-best
# comes back short or empty. At -1 even 512 tokens of log p -11 (a uniform guess
# over 64k words) score -2.9e6, far from -1e9; at -2 they would reach -1.5e9.
# Above 0 the denominator grows: past ~10, 512 ** penalty leaves float32's range
# and every score rounds to 0, so the ranking means nothing.
LENGTH_PENALTY_RANGE = (-1.0, 10.0)


class InvalidOptions(InvalidArgument, ValueError):
    """A decoding option is out of range; `field` names it. A ValueError too, as a
    bad value is to any Python caller (the benchmarks, a test)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


# Used for fields that neither the request nor the manifest sets.
BUILTIN_DEFAULTS: dict[str, Any] = {
    "beam_size": 4,
    "num_hypotheses": 1,
    "length_penalty": 1.0,
    "early_stopping": False,  # Hugging Face's default
    "max_length": 256,
    "max_length_ratio": 0.0,
    "min_length": 0,
    "no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "sampling_temperature": 0.0,
    "sampling_top_k": 0,
    "sampling_top_p": 1.0,
    "seed": None,
    "return_scores": True,
    "return_alignment": False,
    "shortlist": False,
}


@dataclass(frozen=True)
class DecodingOptions:
    """A request's decoding options: None = the model's default (then the built-in)."""

    beam_size: int | None = None
    num_hypotheses: int | None = None  # n-best size, <= beam_size
    length_penalty: float | None = None  # beam score = sum log-probs / length ** length_penalty
    early_stopping: bool | str | None = None  # False, True or "never", as in Hugging Face
    max_length: int | None = None  # new tokens
    max_length_ratio: float | None = None  # to the source length; 0 = no relative limit
    min_length: int | None = None  # new tokens before EOS may be generated
    no_repeat_ngram_size: int | None = None  # 0 = off
    repetition_penalty: float | None = None  # 1 = off
    sampling_temperature: float | None = None  # 0 = no sampling
    sampling_top_k: int | None = None  # 0 = off
    sampling_top_p: float | None = None  # 1 = off
    seed: int | None = None  # None = a fresh random seed per request
    return_scores: bool | None = None
    return_alignment: bool | None = None
    # Decode over the model's vocabulary shortlist (where its package has one);
    # False: over the whole vocabulary. None: the model's default.
    shortlist: bool | None = None

    def resolve(self, defaults: Mapping[str, Any] | None,
                limits: OptionLimits) -> ResolvedOptions:
        """Fill unset fields (request, then `defaults`, then built-ins) and validate."""
        defaults = defaults or {}
        values = dataclasses.asdict(self)
        sampling_requested = (
            (self.sampling_temperature is not None and self.sampling_temperature != 0)
            or self.sampling_top_k not in (None, 0) or self.sampling_top_p not in (None, 1.0))
        if sampling_requested:
            # A model's default beam size must not turn a sampling request into an error.
            if values["beam_size"] is None:
                values["beam_size"] = 1
            if values["sampling_temperature"] is None:
                values["sampling_temperature"] = 1.0
        for name, value in values.items():
            if value is None:
                values[name] = defaults.get(name, BUILTIN_DEFAULTS[name])
        if self.max_length is None and isinstance(values["max_length"], int):
            # A manifest default beyond the server's cap is lowered, not an error.
            values["max_length"] = min(values["max_length"], limits.max_length)
        if (self.min_length is None and isinstance(values["min_length"], int)
                and isinstance(values["max_length"], int)):
            # So is a manifest's min_length (generation_config's) above the limit in
            # force: the limit wins, as in generate().
            values["min_length"] = min(values["min_length"], values["max_length"])
        _check_types(values)
        resolved = ResolvedOptions(**values)
        validate(resolved, limits)
        return resolved


def validate(options: ResolvedOptions, limits: OptionLimits) -> None:
    """Raise InvalidOptions for the first field out of range."""
    _int_in("beam_size", options.beam_size, 1, limits.max_beam_size)
    if options.num_hypotheses < 1:
        raise InvalidOptions("num_hypotheses",
                             f"num_hypotheses must be >= 1, got {options.num_hypotheses}")
    if options.num_hypotheses > options.beam_size:
        raise InvalidOptions("num_hypotheses", f"num_hypotheses must be <= beam_size "
                             f"({options.beam_size}), got {options.num_hypotheses}")
    low, high = LENGTH_PENALTY_RANGE
    if not low <= options.length_penalty <= high:
        raise InvalidOptions("length_penalty", f"length_penalty must be in [{low:g}, "
                             f"{high:g}], got {options.length_penalty}")
    if options.early_stopping not in EARLY_STOPPING:
        raise InvalidOptions("early_stopping", "early_stopping must be one of False, True, "
                             f"'never', got {options.early_stopping!r}")
    _int_in("max_length", options.max_length, 1, limits.max_length)
    if options.max_length_ratio < 0:
        raise InvalidOptions("max_length_ratio", "max_length_ratio must be >= 0 (0 = no "
                             f"relative limit), got {options.max_length_ratio}")
    _int_in("min_length", options.min_length, 0, options.max_length,
            upper_name=f"max_length ({options.max_length})")
    _int_in("no_repeat_ngram_size", options.no_repeat_ngram_size, 0, options.max_length + 1,
            upper_name=f"max_length + 1 ({options.max_length + 1})")
    if options.repetition_penalty <= 0:
        raise InvalidOptions("repetition_penalty", "repetition_penalty must be in (0, inf) "
                             f"(1 = off), got {options.repetition_penalty}")
    if options.sampling_temperature < 0:
        raise InvalidOptions("sampling_temperature", "sampling_temperature must be >= 0 "
                             f"(0 = no sampling), got {options.sampling_temperature}")
    if options.sampling_top_k < 0:
        raise InvalidOptions("sampling_top_k", "sampling_top_k must be >= 0 (0 = off), "
                             f"got {options.sampling_top_k}")
    if not 0 < options.sampling_top_p <= 1:
        raise InvalidOptions("sampling_top_p",
                             f"sampling_top_p must be in (0, 1], got {options.sampling_top_p}")
    if not options.sampling and (options.sampling_top_k != 0 or options.sampling_top_p != 1):
        raise InvalidOptions("sampling_temperature", "sampling_top_k and sampling_top_p "
                             "need sampling_temperature > 0, got "
                             f"{options.sampling_temperature}")
    if options.sampling and options.beam_size != 1:
        raise InvalidOptions("beam_size", "beam_size must be 1 when sampling "
                             f"(sampling_temperature > 0), got {options.beam_size}")
    if options.seed is not None:
        _int_in("seed", options.seed, 0, 2**64 - 1)


# The type each field must have once resolved; checked before ResolvedOptions is
# built, so that a wrong type is an InvalidOptions naming the field, never a crash.
_INTEGERS = ("beam_size", "num_hypotheses", "max_length", "min_length", "no_repeat_ngram_size",
             "sampling_top_k")
_FLOATS = ("length_penalty", "max_length_ratio", "repetition_penalty", "sampling_temperature",
           "sampling_top_p")


def _check_types(values: dict[str, Any]) -> None:
    for name in _INTEGERS:
        _integer(name, values[name])
    for name in _FLOATS:
        _finite(name, values[name])
    if values["seed"] is not None:
        _integer("seed", values["seed"])
    if isinstance(values["early_stopping"], int) and not isinstance(values["early_stopping"],
                                                                   bool):
        raise InvalidOptions("early_stopping", "early_stopping must be one of False, True, "
                             f"'never', got {values['early_stopping']!r}")
    for name in ("return_scores", "return_alignment", "shortlist"):
        if not isinstance(values[name], bool):
            raise InvalidOptions(name, f"{name} must be true or false, got {values[name]!r}")


def _integer(name: str, value: Any) -> None:
    # bool is an int subclass; a JSON `true` for beam_size is a client bug, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidOptions(name, f"{name} must be an integer, got {value!r}")


def _int_in(name: str, value: Any, low: int, high: int, upper_name: str | None = None) -> None:
    problem = int_problem(name, value, low, high, high_name=upper_name)
    if problem is not None:
        raise InvalidOptions(problem.field, problem.message)


def _finite(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidOptions(name, f"{name} must be a finite number, got {value!r}")
