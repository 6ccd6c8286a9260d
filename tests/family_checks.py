"""Checks every family's parity tests share: our model against transformers' on
one batch (encoder, teacher-forced logits, every cached decoder step), and a package
served by a real server answering a summarize request over gRPC and HTTP with the
engine's own text."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import torch
from conftest import CORPUS
from serving import RunningServer, free_port, server_config
from torch import Tensor

from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import package_tokenizer


def max_diff(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item()


@torch.no_grad()
def assert_parity(hf_model: Any, ours: Any, src: Tensor, mask: Tensor, tgt: Tensor,
                  tol: float) -> dict[str, float]:
    """Max abs differences of the encoder's output (real positions), the logits and
    each decode_step's log-probs (rows at the same position, the cache growing), all
    within `tol`."""
    hf_memory = hf_model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    hf_logits = hf_model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    memory, cross_k, cross_v = ours.encode(src, mask)
    diffs = {"encoder": max_diff(memory[mask.bool()], hf_memory[mask.bool()]),
             "logits": max_diff(ours(src, mask, tgt), hf_logits)}
    hf_log_probs = hf_logits.log_softmax(-1)
    rows = src.shape[0]
    self_k, self_v = ours.empty_cache(rows)
    step = 0.0
    for t in range(tgt.shape[1]):
        log_probs, self_k, self_v, _ = ours.decode_step(tgt[:, t], torch.full((rows,), t),
                                                     self_k, self_v, cross_k, cross_v, mask)
        step = max(step, max_diff(log_probs, hf_log_probs[:, t]))
    diffs["decode_step"] = step
    assert all(d <= tol for d in diffs.values()), diffs
    return diffs


def assert_same_nbest(ref: list[list[tuple[list[int], float]]], results: Any,
                      tol: float) -> float:
    """The engine's n-best lists equal generate()'s token for token, scores within
    `tol`; the largest score difference."""
    assert [[h.token_ids for h in r] for r in results] == [[t for t, _ in r] for r in ref]
    diff = max(abs(h.score - s) for r, o in zip(ref, results, strict=True)
               for (_, s), h in zip(r, o, strict=True))
    assert diff <= tol, diff
    return float(diff)


def check_batch_equals_one_at_a_time(engine: Any, sources: list[list[int]], max_new: int,
                                     forced_bos: list[int | None] | None = None,
                                     exact: bool = False) -> None:
    """Beam 4, n-best 2: each source's answer in the batch equals its answer alone
    (scores within 1e-5, or bit for bit where `exact`). forced_bos: per source, a
    multilingual model's target language token."""
    from seq2serve.server.core.options import DecodingOptions

    options = DecodingOptions(beam_size=4, num_hypotheses=2, max_length=max_new)
    forced = forced_bos or [None] * len(sources)
    together = engine.generate(sources, options, forced_bos=forced)
    for src, bos, result in zip(sources, forced, together, strict=True):
        alone = engine.generate([src], options, forced_bos=[bos])[0]
        assert [h.token_ids for h in alone] == [h.token_ids for h in result]
        if exact:
            assert [h.score for h in alone] == [h.score for h in result]
        else:
            assert [h.score for h in alone] == pytest.approx([h.score for h in result],
                                                             abs=1e-5)


def check_package_batch_invariance(package: Path, texts: list[str], max_new: int,
                                   pairs: list[tuple[str, str]] | None = None) -> None:
    """An exported package (any precision) decodes each text in a batch exactly as
    alone (check_batch_equals_one_at_a_time through its own engine). A multilingual
    package's text i is translated along pairs[i % len(pairs)] (request codes), every
    pair in one batch, bit for bit as alone."""
    from seq2serve.server.assembly import default_limits
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    loaded = load_package(package)
    tokenizer = package_tokenizer(loaded)
    languages = loaded.manifest.languages
    if languages is None or not pairs:
        check_batch_equals_one_at_a_time(engine, [tokenizer.encode(t) for t in texts], max_new)
        return
    chosen = [pairs[i % len(pairs)] for i in range(len(texts))]
    sources = [tokenizer.encode(t, languages.token(src))
               for t, (src, _) in zip(texts, chosen, strict=True)]
    check_batch_equals_one_at_a_time(engine, sources, max_new,
                                     [languages.token(tgt) for _, tgt in chosen], exact=True)


def check_served_summarize(package: Path, name: str, engine: Any, tmp_path: Path,
                           max_new: int) -> None:
    """gRPC Summarize (beam 2, max_new tokens) returns the engine's tokens and their
    text; HTTP /summarize, which decodes with the package's defaults, the engine's
    text under those defaults."""
    from seq2serve.protos import translator_pb2 as pb
    from seq2serve.protos import translator_pb2_grpc as pb_grpc
    from seq2serve.server.core.options import DecodingOptions

    models = tmp_path / "models"
    shutil.copytree(package, models / name)
    manifest = load_package(package).manifest
    tokenizer = package_tokenizer(load_package(package))
    text = CORPUS[0]
    # The server reads the text after the package's input prefix (T5's "summarize: ").
    source = tokenizer.encode(manifest.input_prefix + text)
    if manifest.input_prefix:  # the check below tells a server that adds it apart
        bare = engine.generate([tokenizer.encode(text)],
                               DecodingOptions(beam_size=2, max_length=max_new))[0][0]
        prefixed = engine.generate([source],
                                   DecodingOptions(beam_size=2, max_length=max_new))[0][0]
        assert bare.token_ids != prefixed.token_ids
    expected = engine.generate([source], DecodingOptions(beam_size=2, max_length=max_new))[0][0]
    defaults = engine.generate([source], DecodingOptions())[0][0]
    server = RunningServer(server_config(models, http_port=free_port()))
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            response = stub.Summarize(pb.SummarizeRequest(
                model=name, texts=[text],
                options=pb.DecodingOptions(beam_size=2, max_length=max_new,
                                           return_token_ids=True)), timeout=60)
        answer = httpx.post(f"{server.http_url}/summarize", data={"q": text},
                            timeout=60).json()
    finally:
        server.stop()
    best = response.summaries[0].hypotheses[0]
    assert list(best.token_ids) == expected.token_ids
    assert best.text == tokenizer.decode(expected.token_ids)
    assert answer == {"summary": tokenizer.decode(defaults.token_ids)}
