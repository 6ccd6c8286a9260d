"""The one place where protobuf messages become internal values and back (TGI's from_pb/to_pb).

Handlers and the engine never read or build a `translator_pb2` message field
by field; they call these functions, so a change to the contract is a change
here and in the tests beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seq2serve.export.package import Manifest
from seq2serve.protos import translator_pb2 as pb
from seq2serve.server.core.pieces import Joined
from seq2serve.server.engine.options import LENGTH_PENALTY_RANGE, DecodingOptions

# The proto3 `optional` fields: set or not is part of the request (0 beam
# sizes and 0.0 temperatures are values a client can mean), so HasField decides.
OPTIONAL_FIELDS: tuple[str, ...] = (
    "beam_size", "num_hypotheses", "length_penalty", "max_length", "max_length_ratio",
    "min_length", "no_repeat_ngram_size", "repetition_penalty", "sampling_temperature",
    "sampling_top_k", "sampling_top_p", "seed",
)
# Plain bools: unset and false are the same thing on the wire.
RETURN_FIELDS: tuple[str, ...] = ("return_scores", "return_alignment", "return_token_ids")
_FLOAT_FIELDS = frozenset(
    f.name for f in pb.DecodingOptions.DESCRIPTOR.fields if f.type == f.TYPE_FLOAT)
_PB_FIELDS = frozenset(OPTIONAL_FIELDS + RETURN_FIELDS)
FINISH_REASONS: dict[str, int] = {"eos": pb.FINISH_REASON_EOS,
                                  "length": pb.FINISH_REASON_LENGTH}


@dataclass(frozen=True)
class ModelLimits:
    """What ListModels reports as the limits applied to one model's requests."""

    max_length: int  # the server's cap, lowered to max_positions
    max_positions: int
    max_beam_size: int
    max_texts_per_request: int
    max_text_chars: int


def options_from_pb(options: pb.DecodingOptions) -> DecodingOptions:
    """Request options with every unset field left None (the model's default applies).

    `return_token_ids` is not a decoding option: `hypothesis_to_pb` reads it
    from the request's message directly.
    """
    fields: dict[str, Any] = {}
    for name in OPTIONAL_FIELDS:
        if options.HasField(name):
            value = getattr(options, name)
            fields[name] = _float32_as_written(value) if name in _FLOAT_FIELDS else value
    fields["return_scores"] = options.return_scores
    fields["return_alignment"] = options.return_alignment
    return DecodingOptions(**fields)


def options_to_pb(options: Mapping[str, Any] | DecodingOptions) -> pb.DecodingOptions:
    """Set every contract field that has a value; None stays unset.

    Keys the contract does not have (`early_stopping`, a manifest's extras) are
    skipped: ListModels shows the defaults a client can override.
    """
    values = dataclasses.asdict(options) if isinstance(options, DecodingOptions) else options
    return pb.DecodingOptions(**{name: value for name, value in values.items()
                                 if name in _PB_FIELDS and value is not None})


def hypothesis_to_pb(text: str, score: float | None, token_ids: Sequence[int] | None,
                     alignment: Sequence[int] | None, options: pb.DecodingOptions, *,
                     finish_reason: str) -> pb.Hypothesis:
    """One hypothesis with only the extras the request's `options` asked for.

    The request's message, not the resolved options, decides: the response
    carries what the client asked to see. An extra that is None (not computed)
    stays unset. `finish_reason` ("eos" or "length") is always set.
    """
    hypothesis = pb.Hypothesis(text=text, finish_reason=FINISH_REASONS[finish_reason])
    if options.return_scores and score is not None:
        hypothesis.score = float(score)
    if options.return_token_ids and token_ids is not None:
        hypothesis.token_ids.extend(int(t) for t in token_ids)  # numpy ints too
    if options.return_alignment and alignment is not None:
        hypothesis.alignment.extend(int(a) for a in alignment)
    return hypothesis


def translation_to_pb(joined: Sequence[Joined], options: pb.DecodingOptions) -> pb.Translation:
    """One text's n-best, each with the extras the request's `options` asked for."""
    return pb.Translation(hypotheses=[
        hypothesis_to_pb(j.text, j.score, j.token_ids, j.alignment, options,
                         finish_reason=j.finish_reason) for j in joined])


def translate_response_to_pb(model: str,
                             translations: Sequence[pb.Translation]) -> pb.TranslateResponse:
    return pb.TranslateResponse(model=model, translations=translations)


def chunk_to_pb(text_delta: str, translation: pb.Translation | None = None) -> pb.TranslateChunk:
    """A TranslateStream chunk; the one carrying the whole translation is the final one."""
    if translation is None:
        return pb.TranslateChunk(text_delta=text_delta)
    return pb.TranslateChunk(text_delta=text_delta, final=True, translation=translation)


def summary_to_pb(hypotheses: Sequence[Joined], truncated: bool,
                  options: pb.DecodingOptions) -> pb.Summary:
    return pb.Summary(hypotheses=translation_to_pb(hypotheses, options).hypotheses,
                      truncated=truncated)


def summarize_response_to_pb(model: str, summaries: Sequence[pb.Summary]) -> pb.SummarizeResponse:
    return pb.SummarizeResponse(model=model, summaries=summaries)


def list_models_to_pb(models: Sequence[pb.ModelInfo]) -> pb.ListModelsResponse:
    return pb.ListModelsResponse(models=models)


def model_info_to_pb(manifest: Manifest, provider: str,
                     defaults: Mapping[str, Any] | DecodingOptions | None = None,
                     limits: ModelLimits | None = None) -> pb.ModelInfo:
    """A ListModels entry. `defaults` are what unset request fields become; the
    manifest's generation settings when not given (pass resolved options to
    show the server's caps and built-ins as well). `limits`, when given, are
    the limits the server applies to this model's requests."""
    limit_fields: dict[str, Any] = {}
    if limits is not None:
        limit_fields = dict(dataclasses.asdict(limits),
                            min_length_penalty=LENGTH_PENALTY_RANGE[0],
                            max_length_penalty=LENGTH_PENALTY_RANGE[1])
    return pb.ModelInfo(
        name=manifest.name,
        task=manifest.task,
        source_language=manifest.source_language,
        target_language=manifest.target_language,
        precision=manifest.precision,
        provider=provider,
        max_source_length=manifest.max_source_length,
        defaults=options_to_pb(manifest.generation if defaults is None else defaults),
        **limit_fields,
    )


def _float32_as_written(value: float) -> float:
    # A proto `float` is float32: 0.9 arrives as 0.8999999761581421. The shortest
    # decimal that is the same float32 is what the client wrote, and what an
    # error message ("sampling_top_p must be in (0, 1], got 1.5") should echo.
    return float(str(np.float32(value)))
