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
    alone (check_batch_equals_one_at_a_time through its own engine), and joining a
    running batch (check_joining, defined below). A multilingual package's text i is
    translated along pairs[i % len(pairs)] (request codes), every pair in one batch,
    bit for bit as alone."""
    from seq2serve.server.assembly import default_limits
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    loaded = load_package(package)
    tokenizer = package_tokenizer(loaded)
    languages = loaded.manifest.languages
    if languages is None or not pairs:
        sources = [tokenizer.encode(t) for t in texts]
        check_batch_equals_one_at_a_time(engine, sources, max_new)
        check_joining(engine, sources, max_new, at_steps=(3,))
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
        # `echo "$TEXT" | seq2serve summarize -`: the CLI summarizes the same text.
        piped = [_cli_summary(server.target, name, text + ending) for ending in ("\n", "\r\n")]
    finally:
        server.stop()
    best = response.summaries[0].hypotheses[0]
    assert list(best.token_ids) == expected.token_ids
    assert best.text == tokenizer.decode(expected.token_ids)
    assert answer == {"summary": tokenizer.decode(defaults.token_ids), "truncated": False,
                      "tokensKept": len(source), "tokensDropped": 0}
    assert piped == [answer["summary"]] * 2


def _cli_summary(target: str, model: str, stdin: str) -> str:
    """What `seq2serve summarize --model MODEL -` prints, given `stdin`."""
    import argparse
    import contextlib
    import io
    import sys
    from unittest import mock

    from seq2serve.server.cli import summarize

    parser = argparse.ArgumentParser()
    summarize.configure(parser)
    args = parser.parse_args(["-", "--server", target, "--model", model])
    stream = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8", newline="")
    with mock.patch.object(sys, "stdin", stream), \
            contextlib.redirect_stdout(io.StringIO()) as out:
        assert summarize.run(args) == 0
    printed = out.getvalue()
    assert printed.endswith("\n")
    return printed[:-1]


# -- the engine's properties, for every family ------------------------------------------


def _greedy(max_new: int, **extra: Any) -> Any:
    from seq2serve.server.core.options import DecodingOptions

    return DecodingOptions(beam_size=1, max_length=max_new, max_length_ratio=0, **extra)


def _beam(max_new: int, **extra: Any) -> Any:
    from seq2serve.server.core.options import DecodingOptions

    return DecodingOptions(beam_size=4, num_hypotheses=2, max_length=max_new,
                           max_length_ratio=0, **extra)


def check_streaming(engine: Any, sources: list[list[int]], max_new: int) -> None:
    """Greedy, every source of one running batch streaming, half of them joining it
    after two steps: each live source's on_token is called once per step, and what it
    was called with is, in order, the source's final tokens (then its EOS when it
    ended with one), the same tokens as decoding it alone."""
    options = engine.resolve(_greedy(max_new))
    streams: dict[int, list[int]] = {i: [] for i in range(len(sources))}
    started: dict[int, int] = {}
    results: dict[int, Any] = {}
    batch = engine.start_batch(1)

    def admit(indices: range) -> None:
        batch.admit([engine.request(i, sources[i], options, on_token=streams[i].append)
                     for i in indices])
        started.update({i: batch.steps for i in indices})

    half = len(sources) // 2
    admit(range(half))
    while batch.rows:
        if batch.steps == 2:
            admit(range(half, len(sources)))
        live = [i for i in started if i not in results]
        results.update(batch.step().finished)
        for i in live:  # one token per step, as it is chosen
            assert len(streams[i]) == batch.steps - started[i], (i, batch.steps)
    assert sorted(results) == list(range(len(sources)))
    for i, source in enumerate(sources):
        best = results[i][0]
        eos = [engine.eos_id] if best.finish_reason == "eos" else []
        assert streams[i] == best.token_ids + eos, i
        assert engine.generate([source], options)[0][0].token_ids == best.token_ids, i


def run_joined(engine: Any, first: list[list[int]], joining: list[list[int]],
               options: Any, at_step: int) -> dict[int, Any]:
    """`first` start a running batch; `joining` join it after `at_step` steps.
    Results by index into first + joining."""
    resolved = engine.resolve(options)
    batch = engine.start_batch(resolved.beam_size)
    batch.admit([engine.request(i, s, resolved) for i, s in enumerate(first)])
    results: dict[int, Any] = {}
    for _ in range(at_step):
        results.update(batch.step().finished)
    batch.admit([engine.request(len(first) + i, s, resolved) for i, s in enumerate(joining)])
    while batch.rows:
        results.update(batch.step().finished)
    return results


def check_joining(engine: Any, sources: list[list[int]], max_new: int,
                  at_steps: tuple[int, ...] = (1, 5)) -> None:
    """Iteration-level joining: greedy and beam 4 (n-best 2), with alignments, each
    half of the sources joining a batch the other half started `at_step` steps
    earlier gives every source the tokens and alignments of decoding it alone, its
    scores within 1e-5."""
    half = len(sources) // 2
    for options in (_greedy(max_new, return_alignment=True),
                    _beam(max_new, return_alignment=True)):
        alone = [engine.generate([s], options)[0] for s in sources]
        for at_step in at_steps:
            for first, joining in ((range(half), range(half, len(sources))),
                                   (range(half, len(sources)), range(half))):
                order = [*first, *joining]
                got = run_joined(engine, [sources[i] for i in first],
                                 [sources[i] for i in joining], options, at_step)
                assert sorted(got) == list(range(len(sources)))
                for k, result in got.items():
                    expected = alone[order[k]]
                    where = (options.beam_size, at_step, order[k])
                    assert [(h.token_ids, h.alignment) for h in result] == \
                        [(h.token_ids, h.alignment) for h in expected], where
                    assert [h.score for h in result] == pytest.approx(
                        [h.score for h in expected], abs=1e-5), where


@torch.no_grad()
def check_alignment(engine: Any, hf_model: Any, sources: list[list[int]],
                    max_new: int) -> None:
    """return_alignment (greedy; beam 4, n-best 2) gives every token of every
    hypothesis one source position, inside the source, and it is the position that
    transformers' last decoder layer's cross-attention, averaged over heads, weighs
    most when the model is teacher-forced on that hypothesis (within 1e-5 of the
    largest weight: rounding may break a tie either way). Without it: no alignment,
    the same tokens."""
    start = hf_model.config.decoder_start_token_id
    for options in (_greedy, _beam):
        results = engine.generate(sources, options(max_new, return_alignment=True))
        checked = 0
        for source, result in zip(sources, results, strict=True):
            for hyp in result:
                assert hyp.alignment is not None and len(hyp.alignment) == len(hyp.token_ids)
                assert all(0 <= a < len(source) for a in hyp.alignment), hyp.alignment
                out = hf_model(input_ids=torch.tensor([source]),
                               decoder_input_ids=torch.tensor([[start, *hyp.token_ids]]),
                               output_attentions=True, use_cache=False)
                weights = out.cross_attentions[-1][0].mean(dim=0)[:-1]  # (T, S)
                at = torch.tensor(hyp.alignment, dtype=torch.long)  # empty: EOS first
                ours = weights[torch.arange(len(at)), at]
                assert (ours >= weights.max(dim=-1).values - 1e-5).all(), (
                    hyp.alignment, weights.argmax(dim=-1).tolist())
                checked += len(hyp.token_ids)
        assert checked >= len(sources)
        plain = engine.generate(sources[:2], options(max_new))
        assert [h.alignment for r in plain for h in r] == [None] * sum(map(len, plain))
        assert [[h.token_ids for h in r] for r in plain] == \
            [[h.token_ids for h in r] for r in results[:2]]
