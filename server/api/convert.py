"""The one place where protobuf messages become internal values and back (TGI's from_pb/to_pb).

Handlers and the engine never read or build a `translator_pb2` message field
by field; they call these functions, so a change to the contract is a change
here and in the tests beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from seq2serve.protos import translator_pb2 as pb
from seq2serve.server.core.errors import InvalidArgument
from seq2serve.server.core.markup import HTML_RULES, xml_rules
from seq2serve.server.core.options import LENGTH_PENALTY_RANGE, DecodingOptions
from seq2serve.server.core.pieces import Joined, TooLongForOnePiece
from seq2serve.server.core.requests import (
    ModelInfo,
    RouteInfo,
    StreamChunk,
    SummarizeRequest,
    SummarizeResult,
    TranslateRequest,
    TranslateResult,
)
from seq2serve.server.core.segment import Splitting
from seq2serve.server.core.texts import AUTO, TextAnswer, TextFormat, TextsRequest

# The proto3 `optional` fields: set or not is part of the request (0 beam
# sizes and 0.0 temperatures are values a client can mean), so HasField decides.
OPTIONAL_FIELDS: tuple[str, ...] = (
    "beam_size", "num_hypotheses", "length_penalty", "max_length", "max_length_ratio",
    "min_length", "no_repeat_ngram_size", "repetition_penalty", "sampling_temperature",
    "sampling_top_k", "sampling_top_p", "seed", "shortlist",
)
# Plain bools: unset and false are the same thing on the wire.
RETURN_FIELDS: tuple[str, ...] = ("return_scores", "return_alignment", "return_token_ids")
_FLOAT_FIELDS = frozenset(
    f.name for f in pb.DecodingOptions.DESCRIPTOR.fields if f.type == f.TYPE_FLOAT)
_PB_FIELDS = frozenset(OPTIONAL_FIELDS + RETURN_FIELDS)
FINISH_REASONS: dict[str, pb.FinishReason] = {"eos": pb.FINISH_REASON_EOS,
                                              "length": pb.FINISH_REASON_LENGTH}


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


_SPLITTINGS = {pb.SENTENCE_SPLITTING_UNSPECIFIED: Splitting.ON,
               pb.SENTENCE_SPLITTING_ON: Splitting.ON,
               pb.SENTENCE_SPLITTING_NO_NEWLINES: Splitting.NO_NEWLINES,
               pb.SENTENCE_SPLITTING_OFF: Splitting.OFF}


def splitting_from_pb(value: pb.SentenceSplitting) -> Splitting:
    splitting = _SPLITTINGS.get(value)
    if splitting is None:
        raise InvalidArgument("sentence_splitting must be one of SENTENCE_SPLITTING_ON, "
                              "SENTENCE_SPLITTING_NO_NEWLINES, SENTENCE_SPLITTING_OFF, "
                              f"got {value}")
    return splitting


def too_long_error(error: TooLongForOnePiece) -> InvalidArgument:
    """The core's refusal of an unsplit text, worded with the .proto's field."""
    what = (f"its intermediate translation into {error.pivot} (the second leg's input) is"
            if error.pivot else "it is")
    return InvalidArgument(
        f"sentence_splitting SENTENCE_SPLITTING_OFF cannot be kept for texts[{error.index}]: "
        f"{what} {error.tokens} tokens and one piece may have at most {error.limit} (what "
        "the model reads, within its output limit, so that the answer is whole); send "
        "SENTENCE_SPLITTING_ON or SENTENCE_SPLITTING_NO_NEWLINES, or a shorter text")


def translate_request_from_pb(request: pb.TranslateRequest) -> TranslateRequest:
    return TranslateRequest(texts=tuple(request.texts), model=request.model,
                            source_language=request.source_language,
                            target_language=request.target_language,
                            options=options_from_pb(request.options),
                            # unset means on: software text is what the models serve
                            protect_placeholders=(request.protect_placeholders
                                                  if request.HasField("protect_placeholders")
                                                  else True),
                            glossary=request.glossary,
                            terms=tuple((t.source, t.target) for t in request.terms),
                            do_not_translate=tuple(request.do_not_translate),
                            splitting=splitting_from_pb(request.sentence_splitting))


_FORMATS = {pb.TEXT_FORMAT_UNSPECIFIED: TextFormat.TEXT, pb.TEXT_FORMAT_PLAIN: TextFormat.TEXT,
            pb.TEXT_FORMAT_HTML: TextFormat.HTML, pb.TEXT_FORMAT_XML: TextFormat.XML}


def texts_request_from_pb(request: pb.TranslateRequest) -> TextsRequest | None:
    """The request as the core's request of texts (core/texts.py) when it needs that
    meaning (source "auto", HTML or XML); None for a plain request of a given pair,
    which goes to the Translator as it is (n-best, scores, streaming)."""
    text_format = _FORMATS.get(request.format)
    if text_format is None:
        raise InvalidArgument(f"format must be one of TEXT_FORMAT_PLAIN, TEXT_FORMAT_HTML, "
                              f"TEXT_FORMAT_XML, got {request.format}")
    if request.source_language != AUTO and text_format is TextFormat.TEXT:
        return None
    plain = translate_request_from_pb(request)
    tags = request.xml_tags
    markup = (xml_rules(frozenset(tags.ignore_tags), frozenset(tags.non_splitting_tags),
                        frozenset(tags.splitting_tags),
                        tags.outline_detection if tags.HasField("outline_detection")
                        else True)
              if text_format is TextFormat.XML else HTML_RULES)
    return TextsRequest(texts=plain.texts, source_language=plain.source_language,
                        target_language=plain.target_language, text_format=text_format,
                        markup=markup, protect_placeholders=plain.protect_placeholders,
                        glossary=plain.glossary, terms=plain.terms,
                        do_not_translate=plain.do_not_translate, model=plain.model,
                        options=plain.options, splitting=plain.splitting)


def texts_response_to_pb(answers: Sequence[TextAnswer], options: pb.DecodingOptions,
                         detected: bool) -> pb.TranslateResponse:
    """The answers of a request of texts; `detected`: the source was "auto"."""
    translations = []
    for answer in answers:
        translation = translation_to_pb(answer.hypotheses, options)
        if detected:
            translation.detected_language = answer.source_language
            translation.detected_confidence = answer.confidence
            translation.models.extend(answer.models)
        translations.append(translation)
    models = {a.models for a in answers}
    same = models.pop() if len(models) == 1 else ()
    return pb.TranslateResponse(model="+".join(same), models=same, translations=translations)


def summarize_request_from_pb(request: pb.SummarizeRequest) -> SummarizeRequest:
    return SummarizeRequest(texts=tuple(request.texts), model=request.model,
                            options=options_from_pb(request.options), truncate=request.truncate)


def options_to_pb(options: Mapping[str, object] | DecodingOptions) -> pb.DecodingOptions:
    """Set every contract field that has a value; None stays unset.

    Keys the contract does not have (`early_stopping`, a manifest's extras) are
    skipped: ListModels shows the defaults a client can override.
    """
    values = dataclasses.asdict(options) if isinstance(options, DecodingOptions) else options
    # Each field's type is the contract's; the pb constructor checks the values.
    fields: dict[str, Any] = {name: value for name, value in values.items()
                              if name in _PB_FIELDS and value is not None}
    return pb.DecodingOptions(**fields)


def hypothesis_to_pb(text: str, score: float | None, token_ids: Sequence[int] | None,
                     alignment: Sequence[int] | None, options: pb.DecodingOptions, *,
                     finish_reason: str, repaired: bool = False) -> pb.Hypothesis:
    """One hypothesis with only the extras the request's `options` asked for.

    The request's message, not the resolved options, decides: the response
    carries what the client asked to see. An extra that is None (not computed)
    stays unset. `finish_reason` ("eos" or "length") is always set, and so is
    `placeholders_repaired`.
    """
    hypothesis = pb.Hypothesis(text=text, finish_reason=FINISH_REASONS[finish_reason],
                               placeholders_repaired=repaired)
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
                         finish_reason=j.finish_reason, repaired=j.repaired) for j in joined])


def translate_response_to_pb(result: TranslateResult,
                             options: pb.DecodingOptions) -> pb.TranslateResponse:
    return pb.TranslateResponse(model=result.model, models=result.models, translations=[
        translation_to_pb(t.hypotheses, options) for t in result.translations])


def chunk_to_pb(chunk: StreamChunk, options: pb.DecodingOptions) -> pb.TranslateChunk:
    """A TranslateStream chunk; the one carrying the whole translation is the final one."""
    if chunk.translation is None:
        return pb.TranslateChunk(text_delta=chunk.text_delta)
    return pb.TranslateChunk(text_delta=chunk.text_delta, final=True,
                             translation=translation_to_pb(chunk.translation.hypotheses,
                                                           options), models=chunk.models)


def summarize_response_to_pb(result: SummarizeResult,
                             options: pb.DecodingOptions) -> pb.SummarizeResponse:
    return pb.SummarizeResponse(model=result.model, summaries=[
        pb.Summary(hypotheses=translation_to_pb(s.hypotheses, options).hypotheses,
                   truncated=s.truncated) for s in result.summaries])


def list_models_to_pb(models: Sequence[ModelInfo],
                      routes: Sequence[RouteInfo] = ()) -> pb.ListModelsResponse:
    return pb.ListModelsResponse(models=[model_info_to_pb(m) for m in models], routes=[
        pb.Route(source_language=r.source_language, target_language=r.target_language,
                 models=r.models) for r in routes])


def model_info_to_pb(info: ModelInfo) -> pb.ModelInfo:
    """A ListModels entry: `defaults` are what unset request fields become, the
    limits those the server applies to this model's requests."""
    return pb.ModelInfo(
        name=info.name,
        task=info.task,
        source_language=info.source_language,
        target_language=info.target_language,
        precision=info.precision,
        provider=info.provider,
        max_source_length=info.max_source_length,
        defaults=options_to_pb(info.defaults),
        min_length_penalty=LENGTH_PENALTY_RANGE[0],
        max_length_penalty=LENGTH_PENALTY_RANGE[1],
        languages=info.languages,
        ignored_generation_keys=info.ignored_generation_keys,
        state=info.state,
        error=info.error,
        memory_bytes=info.memory_bytes,
        device_memory_bytes=info.device_memory_bytes,
        held_out=info.held_out,
        **dataclasses.asdict(info.limits),
    )


def _float32_as_written(value: float) -> float:
    # A proto `float` is float32: 0.9 arrives as 0.8999999761581421. The shortest
    # decimal that is the same float32 is what the client wrote, and what an
    # error message ("sampling_top_p must be in (0, 1], got 1.5") should echo.
    return float(str(np.float32(value)))
