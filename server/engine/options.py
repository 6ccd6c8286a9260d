"""The engine's decoding options: ResolvedOptions, every field decided and checked
(by the application core's `core/options.py` from a request's DecodingOptions), and
the server's caps, OptionLimits. The engine takes anything `Resolvable` (a request's
options) and resolves it with its model's defaults and limits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class OptionLimits:
    """Server-side caps; the engine lowers `max_length` to the model's position count.
    No defaults here: the server's are ServerConfig's (assembly.py `option_limits`)."""

    max_beam_size: int
    max_length: int


@dataclass(frozen=True)
class ResolvedOptions:
    """Options with every field decided (request, model default or built-in) and
    checked against the server's limits: what the engine and the scheduler take."""

    beam_size: int
    num_hypotheses: int
    length_penalty: float
    early_stopping: bool | str
    max_length: int
    max_length_ratio: float
    min_length: int
    no_repeat_ngram_size: int
    repetition_penalty: float
    sampling_temperature: float
    sampling_top_k: int
    sampling_top_p: float
    seed: int | None
    return_scores: bool
    return_alignment: bool
    shortlist: bool = False

    @property
    def sampling(self) -> bool:
        """Whether these options sample instead of searching."""
        return self.sampling_temperature > 0

    @property
    def decoding(self) -> str:
        """'sampling', 'greedy' or 'beam'."""
        if self.sampling:
            return "sampling"
        return "greedy" if self.beam_size == 1 else "beam"

    def max_new_tokens(self, source_length: int) -> int:
        """The generated-token limit for one source."""
        limit = self.max_length
        if self.max_length_ratio > 0:
            limit = min(limit, max(1, math.ceil(self.max_length_ratio * source_length)))
        return limit


class Resolvable(Protocol):
    """A request's options (core/options.py's DecodingOptions): the engine resolves
    them with its model's defaults and its limits."""

    def resolve(self, defaults: Mapping[str, Any] | None,
                limits: OptionLimits) -> ResolvedOptions: ...


class SourceError(ValueError):
    """A source (token ids) the model cannot take; `field` names it ("source")."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)
