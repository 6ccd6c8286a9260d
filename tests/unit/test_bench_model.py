"""`seq2serve bench --model`: the shipped en-de beside CTranslate2 on the same
checkpoint, on real sentences, at several thread counts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seq2serve.bench.engine import harness

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = ROOT / "tests" / "fixtures" / "ddtp_en_test_sample.txt"


def test_model_mode_times_both_systems_and_compares_their_outputs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "records.json"
    rc = harness.main(["--model", "en-de", "--models-dir", str(ROOT / "models"),
                       "--data", str(SENTENCES), "--sentences", "6", "--batch-sizes", "3",
                       "--decodings", "greedy", "--threads", "1", "2", "--repeats", "1",
                       "--warmup", "0", "--work", str(tmp_path / "work"), "--json", str(out)])
    assert rc == 0
    records = json.loads(out.read_text())
    assert all(list(r) == list(harness.RECORD_KEYS) for r in records)
    seen = {(r["system"], r["precision"], r["threads"]) for r in records}
    assert seen == {(system, precision, threads)
                    for system in ("seq2serve@en-de", "ctranslate2")
                    for precision in ("int8", "fp32") for threads in (1, 2)}
    assert all(r["sentences_per_second"] > 0 for r in records)
    printed = capsys.readouterr().out
    assert "- instruction sets: " in printed
    assert "Per core, each system at its best thread count" in printed
    # The conversion is exact, so fp32 greedy gives CTranslate2's tokens on every
    # sentence; the agreement line is computed from both systems' outputs.
    assert "| fp32 | greedy | 6 of 6 |" in printed
    # The fp32 export and the conversion are cached for the next run.
    cached = list((tmp_path / "work").iterdir())
    assert len(cached) == 1 and {p.name for p in cached[0].iterdir()} == {
        "package-fp32", "ctranslate2"}


def test_model_mode_needs_the_model_and_sentences(tmp_path: Path) -> None:
    assert harness.main(["--model", "nowhere", "--models-dir", str(tmp_path),
                         "--data", str(SENTENCES)]) == 2
    assert harness.main(["--model", "en-de", "--models-dir", str(ROOT / "models")]) == 2


def test_model_mode_refuses_a_package_of_another_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "checkpoints").mkdir()
    shutil.copytree(ROOT / "models" / "en-de", tmp_path / "en-de")
    shutil.copytree(ROOT / "models" / "checkpoints" / "summarize-en",
                    tmp_path / "checkpoints" / "en-de")
    assert harness.main(["--model", "en-de", "--models-dir", str(tmp_path),
                         "--data", str(SENTENCES)]) == 2
    error = capsys.readouterr().err
    assert "is not an export of the checkpoint" in error
    assert "encoder_layers 6 in the package, 3 in the checkpoint" in error
    assert "d_model" not in error  # only the sizes that differ
