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
