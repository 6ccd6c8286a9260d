"""What an answer says beyond the text: why each hypothesis ended, and the limits
ListModels reports (the ones the server really applies)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import CORPUS
from serving import RunningServer, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.client import Seq2ServeClient

EOS, LENGTH = pb.FINISH_REASON_EOS, pb.FINISH_REASON_LENGTH
SHORT = CORPUS[4]  # the tiny model says "Tools." and ends
LONG = CORPUS[0]  # 23 tokens, then EOS


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models_dir, max_length_cap=64, max_beam_size=8,
                                          max_texts_per_request=16, max_text_chars=2000))
    yield running
    running.stop()


def translate(stub: pb_grpc.TranslatorStub, text: str, **options: object) -> pb.Translation:
    request = pb.TranslateRequest(texts=[text], options=pb.DecodingOptions(
        return_token_ids=True, **options))
    return stub.Translate(request, timeout=120).translations[0]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_finish_reason_says_whether_the_model_ended_or_the_limit_cut(
        stub: pb_grpc.TranslatorStub, beam_size: int) -> None:
    [ended] = translate(stub, CORPUS[0], beam_size=beam_size, max_length=40).hypotheses
    assert ended.finish_reason == EOS and len(ended.token_ids) < 40
    [cut] = translate(stub, CORPUS[0], beam_size=beam_size, max_length=3).hypotheses
    assert cut.finish_reason == LENGTH and len(cut.token_ids) == 3
    nbest = translate(stub, CORPUS[0], beam_size=4, num_hypotheses=4, max_length=3).hypotheses
    assert [h.finish_reason for h in nbest] == [LENGTH] * 4


def test_a_segmented_text_says_length_when_any_segment_was_cut(
        stub: pb_grpc.TranslatorStub) -> None:
    short = translate(stub, SHORT, beam_size=1, max_length=40).hypotheses[0]
    long = translate(stub, LONG, beam_size=1, max_length=40).hypotheses[0]
    assert short.finish_reason == long.finish_reason == EOS
    assert len(long.token_ids) > len(short.token_ids) + 1
    # Room for the short segment and its EOS, not for the long one.
    limit = len(short.token_ids) + 1
    for text in (f"{SHORT} {LONG}", f"{LONG} {SHORT}"):
        [joined] = translate(stub, text, beam_size=1, max_length=limit).hypotheses
        assert joined.finish_reason == LENGTH
    [both] = translate(stub, f"{SHORT} {LONG}", beam_size=1, max_length=40).hypotheses
    assert both.finish_reason == EOS
    chunks = list(stub.TranslateStream(pb.TranslateRequest(
        texts=[f"{SHORT} {LONG}"], options=pb.DecodingOptions(beam_size=1,
                                                                   max_length=limit)),
        timeout=120))
    assert chunks[-1].final and chunks[-1].translation.hypotheses[0].finish_reason == LENGTH


def test_empty_input_and_the_python_client_carry_a_finish_reason(stub: pb_grpc.TranslatorStub,
                                                         server: RunningServer) -> None:
    assert translate(stub, "").hypotheses[0].finish_reason == EOS
    with Seq2ServeClient(server.target, timeout=120) as client:
        [[hyp]] = client.translate([CORPUS[0]], beam_size=1, max_length=3)
    assert hyp.finish_reason == "length"


def test_list_models_shows_the_limits_applied(server: RunningServer, models_dir: Path,
                                              stub: pb_grpc.TranslatorStub) -> None:
    manifest = json.loads((models_dir / "tiny-en-de" / "manifest.json").read_text())
    positions = manifest["config"]["max_positions"]
    assert positions > 64 and manifest["generation"]["max_length"] > 64
    [info] = stub.ListModels(pb.ListModelsRequest(), timeout=30).models
    assert (info.max_length, info.max_positions, info.max_beam_size, info.max_source_length,
            info.max_texts_per_request, info.max_text_chars) == (
        64, positions, 8, manifest["max_source_length"], 16, 2000)
    assert (info.min_length_penalty, info.max_length_penalty) == (-1, 10)
    assert info.defaults.max_length == 64  # the manifest's default, capped as requests are
    # The reported limits are the ones enforced.
    with pytest.raises(grpc.RpcError) as err:
        translate(stub, "Hello", max_length=info.max_length + 1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        translate(stub, "Hello", beam_size=info.max_beam_size + 1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(translate(stub, "Hello", max_length=info.max_length,
                         beam_size=info.max_beam_size).hypotheses) == 1


def test_the_position_count_caps_max_length(models_dir: Path) -> None:
    running = RunningServer(server_config(models_dir, max_length_cap=100_000))
    try:
        with Seq2ServeClient(running.target, timeout=60) as client:
            [info] = client.list_models()
        assert info.limits["max_length"] == info.limits["max_positions"] == 128
    finally:
        running.stop()
