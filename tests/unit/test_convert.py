"""protobuf <-> internal conversion: presence semantics, requested extras only, round trips."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from seq2serve.protos import translator_pb2 as pb
from seq2serve.server.api import convert
from seq2serve.server.core.errors import InvalidArgument
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.pieces import Joined
from seq2serve.server.core.requests import (
    ModelInfo,
    ModelLimits,
    StreamChunk,
    SummarizeResult,
    Summary,
    TranslateRequest,
    TranslateResult,
    Translation,
)
from seq2serve.server.core.segment import Splitting


@dataclass(frozen=True)
class _Hyp:  # the engine's Hypothesis, as far as conversion cares
    token_ids: list[int]
    score: float | None
    alignment: list[int] | None = None


def test_unset_options_stay_none() -> None:
    assert convert.options_from_pb(pb.DecodingOptions()) == DecodingOptions(
        return_scores=False, return_alignment=False)


@pytest.mark.parametrize("name", convert.OPTIONAL_FIELDS)
def test_zero_is_a_value_not_unset(name: str) -> None:
    options = convert.options_from_pb(pb.DecodingOptions(**{name: 0}))
    assert getattr(options, name) == 0
    others = [n for n in convert.OPTIONAL_FIELDS if n != name]
    assert all(getattr(options, n) is None for n in others)


def test_zero_beam_size_reaches_validation() -> None:
    # Sent as 0, it must fail as 0, not quietly become the model's default.
    options = convert.options_from_pb(pb.DecodingOptions(beam_size=0))
    with pytest.raises(ValueError, match="beam_size must be in"):
        options.resolve(None, LIMITS)


def test_floats_arrive_as_the_client_wrote_them() -> None:
    options = convert.options_from_pb(pb.DecodingOptions(
        sampling_top_p=0.9, length_penalty=0.6, sampling_temperature=1.5))
    assert (options.sampling_top_p, options.length_penalty, options.sampling_temperature) == (
        0.9, 0.6, 1.5)


def test_return_flags_are_always_set() -> None:
    options = convert.options_from_pb(pb.DecodingOptions(return_scores=True,
                                                         return_token_ids=True))
    assert options.return_scores is True
    assert options.return_alignment is False


def test_options_round_trip() -> None:
    message = pb.DecodingOptions(beam_size=5, num_hypotheses=2, length_penalty=0.6,
                                 max_length=0, min_length=3, seed=2**64 - 1,
                                 sampling_top_k=0, return_scores=True)
    back = convert.options_to_pb(convert.options_from_pb(message))
    assert back == message
    assert back.HasField("max_length") and not back.HasField("max_length_ratio")


def test_options_to_pb_from_a_manifest_mapping() -> None:
    generation = {"beam_size": 4, "length_penalty": 1, "max_length_ratio": 2.0,
                  "early_stopping": True, "seed": None}
    message = convert.options_to_pb(generation)
    assert [f.name for f, _ in message.ListFields()] == [
        "beam_size", "length_penalty", "max_length_ratio"]


def test_hypothesis_extras_only_when_requested() -> None:
    args = ("Hallo", -1.25, [5, 6, 7], [0, 0, 1])
    bare = convert.hypothesis_to_pb(*args, pb.DecodingOptions(), finish_reason="eos")
    assert bare == pb.Hypothesis(text="Hallo", finish_reason=pb.FINISH_REASON_EOS)
    full = convert.hypothesis_to_pb(*args, pb.DecodingOptions(
        return_scores=True, return_token_ids=True, return_alignment=True),
        finish_reason="length")
    assert full == pb.Hypothesis(text="Hallo", score=-1.25, token_ids=[5, 6, 7],
                                 alignment=[0, 0, 1], finish_reason=pb.FINISH_REASON_LENGTH)
    ids_only = convert.hypothesis_to_pb(*args, pb.DecodingOptions(return_token_ids=True),
                                        finish_reason="eos")
    assert list(ids_only.token_ids) == [5, 6, 7] and ids_only.score == 0
    assert not ids_only.alignment


def test_finish_reasons_are_the_engines() -> None:
    with pytest.raises(KeyError):
        convert.hypothesis_to_pb("x", None, None, None, pb.DecodingOptions(),
                                 finish_reason="stop")
    assert set(convert.FINISH_REASONS) == {"eos", "length"}


def test_extras_that_were_not_computed_stay_unset() -> None:
    everything = pb.DecodingOptions(return_scores=True, return_token_ids=True,
                                    return_alignment=True)
    assert convert.hypothesis_to_pb("x", None, None, None, everything, finish_reason="eos") == \
        pb.Hypothesis(text="x", finish_reason=pb.FINISH_REASON_EOS)


def test_numpy_ids_convert() -> None:
    np = pytest.importorskip("numpy")
    message = convert.hypothesis_to_pb("x", np.float32(-0.5), np.array([3, 4]), None,
                                       pb.DecodingOptions(return_scores=True,
                                                          return_token_ids=True),
                                       finish_reason="eos")
    assert list(message.token_ids) == [3, 4] and message.score == -0.5


def test_requests_from_pb() -> None:
    request = convert.translate_request_from_pb(pb.TranslateRequest(
        texts=["a", "b"], model="m", source_language="en", target_language="de",
        options=pb.DecodingOptions(beam_size=2)))
    assert request == TranslateRequest(texts=("a", "b"), model="m", source_language="en",
                                       target_language="de",
                                       options=DecodingOptions(beam_size=2, return_scores=False,
                                                               return_alignment=False))
    summarize = convert.summarize_request_from_pb(pb.SummarizeRequest(texts=["a"],
                                                                      truncate=True))
    assert summarize.texts == ("a",) and summarize.truncate and summarize.model == ""


def test_results_carry_each_joined_hypothesis_with_the_requested_extras() -> None:
    joined = (Joined("a b", -1.5, [3, 4], [0, 2], "length"), Joined("a", None, [3], None, "eos"))
    options = pb.DecodingOptions(return_scores=True, return_alignment=True)
    translation = convert.translation_to_pb(joined, options)
    assert translation == pb.Translation(hypotheses=[
        pb.Hypothesis(text="a b", score=-1.5, alignment=[0, 2],
                      finish_reason=pb.FINISH_REASON_LENGTH),
        pb.Hypothesis(text="a", finish_reason=pb.FINISH_REASON_EOS)])
    response = convert.translate_response_to_pb(
        TranslateResult("m", (Translation(joined),)), options)
    assert response.model == "m" and list(response.translations) == [translation]
    summaries = convert.summarize_response_to_pb(
        SummarizeResult("m", (Summary(joined[:1], True),)),
        pb.DecodingOptions(return_token_ids=True))
    assert summaries.model == "m"
    assert list(summaries.summaries) == [pb.Summary(truncated=True, hypotheses=[pb.Hypothesis(
        text="a b", token_ids=[3, 4], finish_reason=pb.FINISH_REASON_LENGTH)])]


def test_only_the_chunk_with_the_translation_is_final() -> None:
    growing = convert.chunk_to_pb(StreamChunk("Hal"), pb.DecodingOptions())
    assert growing.text_delta == "Hal" and not growing.final
    assert not growing.HasField("translation")
    translation = Translation((Joined("Hallo", -0.5, [7], None, "eos"),))
    last = convert.chunk_to_pb(StreamChunk("lo", translation), pb.DecodingOptions())
    assert last.final and last.text_delta == "lo"
    assert last.translation == pb.Translation(hypotheses=[pb.Hypothesis(
        text="Hallo", finish_reason=pb.FINISH_REASON_EOS)])


LIMITS = ModelLimits(max_length=200, max_positions=256, max_beam_size=8,
                     max_texts_per_request=32, max_text_chars=5000)


def test_model_info() -> None:
    info = ModelInfo(name="opus-mt-en-de", task="translate", source_language="en",
                     target_language="de", precision="int8", provider="CPUExecutionProvider",
                     max_source_length=512,
                     defaults={"beam_size": 4, "num_hypotheses": 1, "max_length_ratio": 2.0,
                               "early_stopping": True, "seed": None},
                     limits=LIMITS)
    message = convert.model_info_to_pb(info)
    assert (message.name, message.task, message.source_language, message.target_language,
            message.precision, message.provider, message.max_source_length) == (
        "opus-mt-en-de", "translate", "en", "de", "int8", "CPUExecutionProvider", 512)
    # early_stopping is not in the contract, an unset seed stays unset
    assert message.defaults == pb.DecodingOptions(beam_size=4, num_hypotheses=1,
                                                  max_length_ratio=2.0)
    assert (message.max_length, message.max_positions, message.max_beam_size,
            message.max_texts_per_request, message.max_text_chars, message.min_length_penalty,
            message.max_length_penalty) == (200, 256, 8, 32, 5000, -1.0, 10.0)
    assert convert.list_models_to_pb([info]).models == [message]


@pytest.mark.parametrize(("value", "splitting"), [
    (pb.SENTENCE_SPLITTING_UNSPECIFIED, Splitting.ON), (pb.SENTENCE_SPLITTING_ON, Splitting.ON),
    (pb.SENTENCE_SPLITTING_NO_NEWLINES, Splitting.NO_NEWLINES),
    (pb.SENTENCE_SPLITTING_OFF, Splitting.OFF)])
def test_sentence_splitting_reaches_both_core_requests(value: int, splitting: Splitting) -> None:
    request = pb.TranslateRequest(texts=["a"], source_language="en", target_language="de",
                                  sentence_splitting=value)  # type: ignore[arg-type]
    assert convert.translate_request_from_pb(request).splitting is splitting
    request.format = pb.TEXT_FORMAT_HTML
    texts = convert.texts_request_from_pb(request)
    assert texts is not None and texts.splitting is splitting


def test_an_unknown_sentence_splitting_is_refused_naming_the_field() -> None:
    request = pb.TranslateRequest(texts=["a"], sentence_splitting=9)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="sentence_splitting .*got 9"):
        convert.translate_request_from_pb(request)
