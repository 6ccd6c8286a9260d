"""Problems found in configured or requested values, each naming its field.

The one home of the range checks that the server configuration (config.py) and
the decoding options (engine/options.py) share, so a value out of range reads
the same wherever it was given: "beam_size must be in [1, 16], got 0".
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One problem: the field it concerns and a message that names the field and
    its valid range."""

    field: str
    message: str

    def __str__(self) -> str:
        return self.message

    def with_note(self, note: str) -> Problem:
        """The same problem with a note appended, e.g. where the value came from."""
        return Problem(self.field, f"{self.message} ({note})")


def is_int(value: object) -> bool:
    """An int, and not a bool: a JSON `true` for a count is a client's bug, not 1."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_problem(name: str, value: object, low: int, high: int | None = None, *,
                note: str | None = None, high_name: str | None = None) -> Problem | None:
    """None when `value` is an integer in [low, high] (high None: no upper bound).
    `note` explains a special value ("0 = disabled"); `high_name` shows the upper
    bound as the field it comes from ("max_length (10)")."""
    if not is_int(value):
        return Problem(name, f"{name} must be an integer, got {value!r}")
    assert isinstance(value, int)
    extra = f" ({note})" if note else ""
    if high is None:
        if value >= low:
            return None
        return Problem(name, f"{name} must be >= {low}{extra}, got {value!r}")
    if low <= value <= high:
        return None
    return Problem(name, f"{name} must be in [{low}, {high_name or high}]{extra}, got {value!r}")


def float_problem(name: str, value: object, low: float, high: float) -> Problem | None:
    """None when `value` is a finite number in [low, high]."""
    if is_int(value) or isinstance(value, float):
        assert isinstance(value, (int, float))
        if math.isfinite(value) and low <= value <= high:
            return None
    return Problem(name, f"{name} must be in [{low:g}, {high:g}], got {value!r}")
