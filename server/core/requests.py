"""The application core's requests, results and calls: plain values, no transport.

A front door (gRPC, HTTP) turns its messages into these, hands them to
`translator.Translator` and turns the results back into its own messages.
Results carry everything the engine computed (scores, token ids, alignment
where asked for); which extras go on the wire is the front door's business.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.pieces import Joined
from seq2serve.server.core.segment import Splitting

# A decoding option's value as a model's defaults show it.
OptionValue = int | float | bool | str | None


class Call:
    """Deadline and cancellation of one client request, shared by all of its pieces.

    `timeout` is the seconds the client still waits (None: no deadline). The front
    door calls `cancel()` when its client goes away; a piece whose call is
    cancelled or past its deadline leaves the queue and its batch. `on_model`
    hears the name of the model chosen to serve the request, as soon as it is
    chosen (for per-model metrics)."""

    def __init__(self, timeout: float | None = None,
                 on_model: Callable[[str], None] | None = None) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.model: str | None = None
        self._on_model = on_model
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled or (self.deadline is not None and time.monotonic() > self.deadline)

    def serve_with(self, model: str) -> None:
        """Record the model that serves this call (called by the core)."""
        self.model = model
        if self._on_model is not None:
            self._on_model(model)


@dataclass(frozen=True)
class TranslateRequest:
    """Texts to translate, by model name or by language pair (empty: any)."""

    texts: tuple[str, ...]
    model: str = ""
    source_language: str = ""
    target_language: str = ""
    options: DecodingOptions = field(default_factory=DecodingOptions)  # unset: the model's
    # Software text (core/placeholders.py): placeholders, inline tags, URLs, paths and
    # accelerators masked and put back; a named glossary (--glossary-dir), term pairs
    # (source term -> target term) and terms never translated.
    protect_placeholders: bool = True
    glossary: str = ""
    terms: tuple[tuple[str, str], ...] = ()
    do_not_translate: tuple[str, ...] = ()
    # Where a text is cut into pieces (core/segment.py): sentence ends and line breaks,
    # sentence ends only, or nowhere (a text the model cannot read whole is refused).
    splitting: Splitting = Splitting.ON


@dataclass(frozen=True)
class Translation:
    """One text's n-best, best first, each joined from the text's pieces."""

    hypotheses: tuple[Joined, ...]


@dataclass(frozen=True)
class TranslateResult:
    # The model that served the request; a chain's models joined by "+"
    # ("de-en+en-fr"); "" when source and target are the same language.
    model: str
    translations: tuple[Translation, ...]  # one per text, in request order
    # The models that served it, in order: one, two for a chain through English,
    # none for a text given back unchanged (source and target the same language).
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class SummarizeRequest:
    """Texts to summarize; `truncate` lets a text above the model's source length
    be cut to it rather than refused."""

    texts: tuple[str, ...]
    model: str = ""
    options: DecodingOptions = field(default_factory=DecodingOptions)
    truncate: bool = False


@dataclass(frozen=True)
class Summary:
    hypotheses: tuple[Joined, ...]
    truncated: bool  # the text was cut to the model's source length
    # The text's tokens as the model's tokenizer counts them (its special tokens
    # included), and how many of them the model read: all, unless `truncated`.
    source_tokens: int = 0
    kept_tokens: int = 0


@dataclass(frozen=True)
class SummarizeResult:
    model: str
    summaries: tuple[Summary, ...]  # one per text, in request order


@dataclass(frozen=True)
class StreamChunk:
    """Text added since the previous chunk; the last chunk also carries the whole
    translation (whose best text the deltas add up to)."""

    text_delta: str
    translation: Translation | None = None
    models: tuple[str, ...] = ()  # on the final chunk: as TranslateResult.models

    @property
    def final(self) -> bool:
        return self.translation is not None


@dataclass(frozen=True)
class RouteInfo:
    """A served translation pair and the models that serve it, in order: one
    (a direct model) or two (a chain through English)."""

    source_language: str
    target_language: str
    models: tuple[str, ...]

    @property
    def chained(self) -> bool:
        return len(self.models) > 1


@dataclass(frozen=True)
class ModelLimits:
    """The limits applied to one model's requests."""

    max_length: int  # the server's cap, lowered to max_positions
    max_positions: int
    max_beam_size: int
    max_texts_per_request: int
    max_text_chars: int


@dataclass(frozen=True)
class ModelInfo:
    """One served model: its manifest's facts, where it runs, what unset options
    become on this server (the manifest's defaults as they apply here) and limits."""

    name: str
    task: str  # "translate" | "summarize"
    source_language: str
    target_language: str
    precision: str
    provider: str
    max_source_length: int
    defaults: Mapping[str, OptionValue]
    limits: ModelLimits
    # A multilingual model's languages (every pair served); () for one pair.
    languages: tuple[str, ...] = ()
    # Generation keys exported without being applied (the manifest's
    # generation.ignored_keys): outputs may differ from generate()'s there.
    ignored_generation_keys: tuple[str, ...] = ()
    # Its state here (core/residency.py: available, loading, ready, unloading, failed),
    # why it failed, and the bytes it holds once loaded (its package's cost) of host
    # memory and of the device's (0: not on a device).
    state: str = "ready"
    error: str = ""
    memory_bytes: int = 0
    device_memory_bytes: int = 0
    # An operator unloaded it: refused, and not loaded at a request, until loaded again.
    held_out: bool = False
