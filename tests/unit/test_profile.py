"""`python -m seq2serve.bench.profile` on a model package: the wall time split into
the runner's calls and Python, and ONNX Runtime's operator profile of both graphs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CORPUS

from seq2serve.bench.profile import decoding as profile


def test_profile_of_a_package_on_sentences(marian_package: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.src").write_text("\n".join(CORPUS) + "\n")
    # Only the `sentence` lines are read when test.kind says which they are.
    kinds = ["sentence" if i % 2 == 0 else "paragraph" for i in range(len(CORPUS))]
    (data / "test.kind").write_text("\n".join(kinds) + "\n")
    out = tmp_path / "profile.json"
    assert profile.main(["--package", str(marian_package), "--data", str(data),
                         "--batch-size", "2", "--beam", "2", "--threads", "1",
                         "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    split = report["split_seconds"]
    assert set(split) == {*profile.RUNNER_CALLS.values(), "Python and NumPy between steps"}
    # Each call counted once (a resize inside a step is the resize's), so no part
    # is negative and Python's share is what the calls leave of the wall time.
    assert all(seconds >= 0 for seconds in split.values()), split
    assert split["decoder graph"] > 0 and split["encoder"] > 0
    assert split["select (TopK graph)"] > 0  # beam search ranks with the select graph
    steps = report["decoder_steps"]
    assert report["profiles"]["decoder"]["runs"] == steps
    assert report["profiles"]["encoder"]["runs"] == len(range(0, (len(CORPUS) + 1) // 2, 2))
    printed = capsys.readouterr().out
    assert f"{(len(CORPUS) + 1) // 2} sentences" in printed
    assert "decoder graph under ONNX Runtime's profiler" in printed


def test_package_and_data_go_together(marian_package: Path) -> None:
    with pytest.raises(SystemExit):
        profile.main(["--package", str(marian_package)])


def test_ctranslate2_needs_a_package() -> None:
    with pytest.raises(SystemExit):
        profile.main(["--ctranslate2", "/nonexistent"])


def test_profile_of_a_family_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A multilingual family's shape (`--family`): its sources and forced target token
    as `seq2serve bench` decodes them, and the decoder graph's operators over the
    vocabulary (the output projection a shortlist would cut) apart."""
    out = tmp_path / "profile.json"
    assert profile.main(["--family", "tiny-nllb", "--work", str(tmp_path / "work"),
                         "--precision", "int8", "--batch-size", "2", "--beam", "2",
                         "--new-tokens", "5", "--source-length", "6", "--threads", "1",
                         "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["decoder_steps"] == 5  # exactly --new-tokens, the forced one included
    decoder = report["profiles"]["decoder"]
    assert decoder["vocab"] == 320
    parts = decoder["by_vocabulary_part"]
    assert set(parts) == {profile.PROJECTION, profile.OVER_VOCABULARY}
    assert parts[profile.PROJECTION] > 0 and parts[profile.OVER_VOCABULARY] > 0
    assert sum(parts.values()) < decoder["model_run_us"]
    assert report["profiles"]["encoder"]["by_vocabulary_part"] == {}
    printed = capsys.readouterr().out
    assert "tiny-nllb shape, int8, batch 2, 5 new tokens" in printed
    assert f"{profile.PROJECTION}: " in printed and "of the whole decoding" in printed


def test_vocabulary_part_of_an_operator() -> None:
    def node(op: str, *shape: int) -> dict[str, object]:
        return {"args": {"op_name": op, "output_type_shape": [{"float": list(shape)}]}}

    assert profile._vocabulary_part(node("MatMulIntegerToFloat", 4, 1, 300), 300) \
        == profile.PROJECTION
    assert profile._vocabulary_part(node("MatMul", 4, 300), 300) == profile.PROJECTION
    assert profile._vocabulary_part(node("LogSoftmax", 4, 300), 300) == profile.OVER_VOCABULARY
    assert profile._vocabulary_part(node("MatMul", 4, 1, 32), 300) is None
    assert profile._vocabulary_part(node("MatMul", 4, 300), None) is None


def test_family_and_package_are_two_workloads(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        profile.main(["--family", "tiny-nllb", "--package", str(tmp_path), "--data",
                      str(tmp_path)])
