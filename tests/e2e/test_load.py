"""bench/server/load.py: the arrival schedule, reading /metrics, and a tiny run of every
mode."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from seq2serve.bench.server import load
from seq2serve.protos import translator_pb2 as pb
from seq2serve.server.metrics import Metrics


def test_poisson_arrivals_are_seeded_increasing_with_mean_gap_one_over_rate() -> None:
    rate = 40.0
    times = load.arrival_times(rate, 20_000, np.random.default_rng(7))
    assert len(times) == 20_000 and times[0] > 0
    assert np.all(np.diff(times) > 0)
    gaps = np.diff(times, prepend=0.0)
    # the mean of 20000 exponential gaps has a standard error of 1/rate/sqrt(20000) (0.7%)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    # exponential, not evenly spaced: the standard deviation equals the mean
    assert gaps.std() == pytest.approx(1 / rate, rel=0.05)
    np.testing.assert_array_equal(times, load.arrival_times(rate, 20_000,
                                                            np.random.default_rng(7)))
    assert not np.array_equal(times, load.arrival_times(rate, 20_000, np.random.default_rng(8)))


def test_arrivals_refuse_a_rate_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        load.arrival_times(0.0, 3, np.random.default_rng(0))


def test_rows_per_step_from_the_servers_own_exposition() -> None:
    metrics = Metrics()
    rows = metrics.decoder_rows
    for n in (4, 8, 12):
        rows.labels("en-de").observe(n)
    rows.labels("other").observe(2)
    metrics.decoder_step_duration.labels("en-de").observe(0.5)  # another histogram
    before = load.histogram_totals(metrics.render().decode(), load.ROWS_METRIC)
    assert before == (26.0, 4.0)
    for n in (16, 32):
        rows.labels("en-de").observe(n)
    after = load.histogram_totals(metrics.render().decode(), load.ROWS_METRIC)
    assert after == (74.0, 6.0)
    assert load.mean_between(before, after) == 24.0
    assert math.isnan(load.mean_between(after, after))  # no step in between
    assert load.histogram_totals("", load.ROWS_METRIC) == (0.0, 0.0)


def test_auto_rates_are_fractions_of_saturation() -> None:
    assert load.auto_rates(20.0, [0.3, 0.5, 0.9]) == [6.0, 10.0, 18.0]
    assert load.auto_rates(0.0, [0.5]) == []


def test_every_mode_runs_and_reports(marian_package: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    texts = tmp_path / "texts.src"
    texts.write_text("Hello world.\nThis is a test. It has two sentences.\nShort\n",
                     encoding="utf-8")
    out = tmp_path / "load.json"
    assert load.main(["--models-dir", str(marian_package), "--texts", str(texts),
                      "--modes", "off,request,iteration", "--beams", "1,2",
                      "--concurrency", "2", "--rates", "auto", "--fractions", "0.5",
                      "--requests", "4", "--level-seconds", "60", "--drain-seconds", "60",
                      "--max-length", "8", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    name = json.loads((marian_package / "manifest.json").read_text())["name"]
    assert {r["target"] for r in records} == {name}  # the only model, picked
    seen = {(r["mode"], r["beam"], r["workload"]) for r in records}
    assert seen == {(m, b, w) for m in ("off", "request", "iteration") for b in (1, 2)
                    for w in ("closed", "poisson")}
    for r in records:
        assert r["completed"] == r["sent"] == 4 and r["errors"] == r["unfinished"] == 0, r
        assert r["requests_per_second"] > 0 and r["tokens_per_second"] > 0, r
        assert 0 < r["ttft_p50_ms"] <= r["p99_ms"], r
        assert r["rows_per_step"] >= 1, r  # the server's histogram saw the level's steps
    # the offered rate is half of iteration's closed-loop throughput, in every mode
    for beam in (1, 2):
        closed = next(r for r in records if (r["mode"], r["beam"], r["workload"])
                      == ("iteration", beam, "closed"))
        rates = {r["level"] for r in records if r["beam"] == beam and r["workload"] == "poisson"}
        assert rates == {round(closed["requests_per_second"] * 0.5, 3)}
    table = capsys.readouterr().out
    assert table.count("\n") == 2 + len(records)  # header, rule, one line per record
    assert f"| greedy | closed 2 clients | off | {name} | 4/4 |" in table


def test_the_model_is_en_de_when_served_else_the_only_translation_model() -> None:
    def listed(*models: tuple[str, str]) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=[pb.ModelInfo(name=n, task=t) for n, t in models])

    assert load.pick_model(listed(("en-fr", "translate"), ("en-de", "translate"),
                                  ("summarize-en", "summarize"))) == "en-de"
    assert load.pick_model(listed(("tiny", "translate"), ("sum", "summarize"))) == "tiny"
    with pytest.raises(SystemExit, match="2 translation models"):
        load.pick_model(listed(("a", "translate"), ("b", "translate")))
