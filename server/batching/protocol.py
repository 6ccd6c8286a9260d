"""What the worker needs of an engine, defined where it is used: the Engine
satisfies it (mypy checks the registry's ModelWorker(engine) calls), and the
tests' fake engines implement the whole of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from seq2serve.server.engine.decode_state import CancelCheck, Request, TokenCallback
from seq2serve.server.engine.engine import Generation, StepOutcome
from seq2serve.server.engine.options import ResolvedOptions


class RunningRows(Protocol):
    """A running batch of one beam width, over the vocabulary shortlist or the
    whole vocabulary, which requests join at step boundaries."""

    beams: int
    shortlist: bool

    @property
    def sources(self) -> int: ...

    @property
    def rows(self) -> int: ...

    @property
    def longest_reach(self) -> int: ...

    def admit(self, requests: Sequence[Request]) -> float:
        """Encode and add the requests; the encoder's seconds."""

    def step(self) -> StepOutcome:
        """One decoder step over every live row; the sources that finished."""


class BatchEngine(Protocol):
    def request(self, key: int, source: Sequence[int], options: ResolvedOptions, *,
                cancelled: CancelCheck | None = None, on_token: TokenCallback | None = None,
                index: int = 0, forced_bos: int | None = None) -> Request:
        """A checked request (InvalidOptions for a bad source); forced_bos: its
        hypotheses' first token (a multilingual model's target language)."""

    def start_batch(self, beams: int, shortlist: bool = False) -> RunningRows: ...

    def generate(self, sources: Sequence[Sequence[int]],
                 options: Sequence[ResolvedOptions], *,
                 cancelled: Sequence[CancelCheck | None] | None = None,
                 on_token: Sequence[TokenCallback | None] | None = None,
                 forced_bos: Sequence[int | None] | None = None) -> Generation:
        """Decode a whole batch (request-level); forced_bos: per source, its
        hypotheses' first token (a multilingual model's target language)."""

    def terminate(self) -> None:
        """End the ONNX Runtime runs in progress; the engine cannot run again."""
