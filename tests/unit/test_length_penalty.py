"""The valid range of length_penalty, and why it ends where it does.

Beam search marks empty finished slots with -1e9 in the space of length-normalised
scores; a hypothesis whose normalised score falls below that mark is lost. These
tests drive beam search over the longest output the server allows by default
(512 tokens) with log-probs as poor as a uniform guess over 64k words, the worst
a real model does along its best beams.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import LENGTH_PENALTY_RANGE, DecodingOptions, InvalidOptions
from seq2serve.server.engine.decoding import BeamParams, BeamState, EosStop, LengthStop, beam_step

# The server's own caps (ServerConfig is their one home).
LIMITS = default_limits()

EOS = 0
BEAMS = 4
MAX_NEW = 512  # the default max_length_cap
UNIFORM_64K = -math.log(65536)  # -11.09 nats per token


def search(length_penalty: float, sources: int = 2) -> list[int]:
    """Beam search to the length limit (EOS never wins); the n-best size per source."""
    rng = np.random.default_rng(0)
    vocab = 3 * BEAMS
    state = BeamState.start(sources, BEAMS, MAX_NEW)
    params = BeamParams(np.full(sources, length_penalty), np.zeros(sources, bool),
                        np.zeros(sources, bool), np.full(sources, MAX_NEW))
    history = np.full((sources, 1), 1, dtype=np.int64)
    for generated in range(MAX_NEW):
        rows = history.shape[0]
        log_probs = (UNIFORM_64K - rng.random((rows, vocab)) * 0.1).astype(np.float32)
        log_probs[:, EOS] = -np.inf  # the longest outputs score the lowest
        step = beam_step(state, log_probs, history, generated, params,
                         (EosStop(EOS), LengthStop()))
        state = step.state
        history = np.concatenate([history[step.origin], step.tokens[:, None]], axis=1)
        if step.done.all():
            break
    return [len(state.nbest(s, BEAMS)) for s in range(sources)]


@pytest.mark.parametrize("length_penalty", LENGTH_PENALTY_RANGE)
def test_the_ends_of_the_range_keep_every_hypothesis(length_penalty: float) -> None:
    assert search(length_penalty) == [BEAMS, BEAMS]


def test_just_past_the_low_end_hypotheses_are_lost() -> None:
    """Why the range stops at -1: at -2 the same search loses its n-best."""
    assert search(-2.0) != [BEAMS, BEAMS]


@pytest.mark.parametrize("value", [-20.0, -6.0, -1.5, 10.5, 1e6])
def test_values_outside_the_range_are_refused_naming_it(value: float) -> None:
    with pytest.raises(InvalidOptions) as e:
        DecodingOptions(beam_size=4, length_penalty=value).resolve(None, LIMITS)
    assert e.value.field == "length_penalty"
    assert str(e.value) == f"length_penalty must be in [-1, 10], got {value}"


@pytest.mark.parametrize("value", [-1.0, 0.0, 0.6, 1.0, 2.0, 10.0])
def test_values_inside_the_range_are_accepted(value: float) -> None:
    resolved = DecodingOptions(beam_size=4, length_penalty=value).resolve(None, LIMITS)
    assert resolved.length_penalty == value
