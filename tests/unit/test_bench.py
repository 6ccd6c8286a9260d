"""The benchmark harness end to end on a tiny Marian shape: every system runs,
each generates exactly the requested tokens, and the records have the issue's keys."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bench_systems import assert_systems_agree

from seq2serve.bench import inputs
from seq2serve.bench.engine import harness, measure, systems, workload

TINY = ["--shape", "tiny", "--threads", "1", "--repeats", "1", "--new-tokens", "5",
        "--source-length", "6"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-work")


@pytest.fixture(scope="module")
def models(work: Path) -> workload.Models:
    return workload.prepare_models(work, workload.SHAPES["tiny"], 0, {"fp32", "int8"}, True)


def test_every_system_generates_the_same_tokens(models: workload.Models) -> None:
    shape = workload.SHAPES["tiny"]
    sources = workload.random_sources(shape, 3, 6, seed=0)
    assert all(len(s) == 6 and s[-1] == workload.EOS_ID for s in sources)
    assert all(1 < i < shape.pad_id for s in sources for i in s[:-1])
    assert len(workload.vocabulary(models.marian)) == shape.vocab_size
    assert_systems_agree(models, sources)


def test_harness_end_to_end(work: Path, models: workload.Models, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = harness.main(TINY + ["--batch-sizes", "1", "2", "--work", str(work),
                              "--json", str(out)])
    assert rc == 0
    records = json.loads(out.read_text())
    assert all(list(r) == list(harness.RECORD_KEYS) for r in records)
    assert {(r["system"], r["precision"]) for r in records} == {
        ("seq2serve", "fp32"), ("seq2serve", "int8"), ("transformers", "fp32"),
        ("ctranslate2", "fp32"), ("ctranslate2", "int8")}
    assert len(records) == 5 * 2 * 2
    for system, precision in {(r["system"], r["precision"]) for r in records}:
        mine = [(r["decoding"], r["batch_size"]) for r in records
                if (r["system"], r["precision"]) == (system, precision)]
        assert sorted(mine) == [("beam4", 1), ("beam4", 2), ("greedy", 1), ("greedy", 2)]
    assert all(isinstance(r["tokens_per_second"], float) and r["tokens_per_second"] > 0
               and math.isfinite(r["tokens_per_second"]) for r in records)
    table = capsys.readouterr().out
    assert ("| system | precision | decoding | batch | threads | sentences/s | tokens/s "
            "| vs seq2serve fp32 |") in table
    assert "| seq2serve | fp32 | beam4 | 2 |" in table and "1.00x" in table


def test_package_run_on_real_sentences(work: Path, models: workload.Models,
                                       tmp_path: Path) -> None:
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "test.src").write_text("Open the file.\n\nSave your changes.\nA library.\n")
    out = tmp_path / "bench.json"
    rc = harness.main(TINY + ["--systems", "seq2serve-fp32", "--decodings", "greedy",
                              "--batch-sizes", "2", "--work", str(work),
                              "--package", str(models.packages["int8"]), "--data", str(data),
                              "--json", str(out)])
    assert rc == 0
    records = json.loads(out.read_text())
    assert [(r["system"], r["precision"]) for r in records] == [
        ("seq2serve", "fp32"), ("seq2serve@marian-int8", "int8")]  # export's default name
    assert inputs.read_sentences(data, 10) == ["Open the file.", "Save your changes.",
                                                 "A library."]


def test_a_wrong_token_count_is_an_error() -> None:
    class Short(systems.System):
        name, precision = "short", "fp32"

        def generate(self, prepared, beam, new_tokens):  # type: ignore[no-untyped-def]
            return [[5] * (new_tokens - 1) for _ in prepared]

    with pytest.raises(measure.BenchError, match="got 4 tokens, expected exactly 5"):
        measure.measure(Short(), [[[3, 0]]], 1, 5, repeats=1, warmup=0, what="short")


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.main(["--package", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "--package needs --data" in err and "not a model package" in err
    with pytest.raises(SystemExit):
        harness.main(["--decodings", "beam1"])
    assert measure.beam_width("greedy") == 1 and measure.beam_width("beam5") == 5


def _has_cuda_provider() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(_has_cuda_provider(), reason="this onnxruntime has CUDA: the GPU test runs")
def test_cuda_bench_without_cuda_says_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.main(["--device", "cuda", "--quick", *TINY]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: this onnxruntime has no CUDAExecutionProvider" in err
    assert "Traceback" not in err


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda_provider(), reason="needs onnxruntime-gpu with CUDA")
def test_cuda_bench_runs_fp32_and_fp16(tmp_path: Path) -> None:
    out = tmp_path / "cuda.json"
    assert harness.main(["--device", "cuda", *TINY, "--decodings", "greedy", "beam4",
                         "--batch-sizes", "1", "8", "--systems", "seq2serve-fp32",
                         "seq2serve-fp16", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    assert {(r["precision"], r["decoding"]) for r in records} == {
        (p, d) for p in ("fp32", "fp16") for d in ("greedy", "beam4")}
    assert all(r["tokens_per_second"] > 0 for r in records)


# -- --model: a shipped-style package beside CTranslate2 on its checkpoint --------------------


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models folder laid out as the shipped one: the int8 package `tiny` and its
    checkpoint checkpoints/tiny (a seeded random d32 model)."""
    import shutil

    from test_ctranslate2_model import tiny_checkpoint

    from seq2serve.export.exporter import export

    root = tmp_path_factory.mktemp("tiny-models")
    checkpoint = root / "checkpoints" / "tiny"
    checkpoint.parent.mkdir()
    shutil.move(tiny_checkpoint(root / "build"), checkpoint)
    export(checkpoint, root / "tiny", precision="int8", name="tiny", progress=False)
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus directory as `seq2serve data` writes one: test.src and test.kind."""
    data = tmp_path_factory.mktemp("corpus")
    lines = [("Open the file.", "sentence"), ("A long description of a whole package, "
             "with many words in it.", "description"), ("Save your changes now.", "sentence"),
             ("A library.", "sentence"), ("Print the page.", "sentence"),
             ("Close the window and quit.", "sentence")]
    (data / "test.src").write_text("".join(f"{t}\n" for t, _ in lines), encoding="utf-8")
    (data / "test.kind").write_text("".join(f"{k}\n" for _, k in lines), encoding="utf-8")
    return data


def model_args(models: Path, data: Path, work: Path, *extra: str) -> list[str]:
    return ["--model", "tiny", "--models-dir", str(models), "--data", str(data),
            "--only-sentences", "--repeats", "1", "--warmup", "0", "--work", str(work),
            *extra]


def agreement_lines(printed: str) -> dict[tuple[str, str], tuple[int, int]]:
    """The agreement table: (precision, decoding) -> (identical, sentences)."""
    found = {}
    for line in printed.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[2].count(" of ") == 1 and cells[2][0].isdigit():
            same, total = cells[2].split(" of ")
            found[(cells[0], cells[1])] = (int(same), int(total))
    return found


def test_model_mode_runs_the_whole_grid(tiny_models: Path, corpus: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "records.json"
    work = tmp_path / "work"
    rc = harness.main(model_args(tiny_models, corpus, work, "--sentences", "4",
                                 "--batch-sizes", "2", "4", "--decodings", "greedy", "beam4",
                                 "--threads", "1", "2", "--json", str(out)))
    assert rc == 0
    records = json.loads(out.read_text())
    assert all(list(r) == list(harness.RECORD_KEYS) for r in records)
    grid = {(system, precision, decoding, batch, threads)
            for system in ("seq2serve@tiny", "ctranslate2") for precision in ("int8", "fp32")
            for decoding in ("greedy", "beam4") for batch in (2, 4) for threads in (1, 2)}
    assert len(records) == len(grid)
    assert {(r["system"], r["precision"], r["decoding"], r["batch_size"], r["threads"])
            for r in records} == grid
    assert all(r["sentences_per_second"] > 0 and r["tokens_per_second"] > 0 for r in records)
    # The package is the shipped int8; the fp32 export and the conversion are cached.
    cached = list(work.iterdir())
    assert len(cached) == 1 and {p.name for p in cached[0].iterdir()} == {
        "package-fp32", "ctranslate2"}

    printed = capsys.readouterr().out
    assert "- instruction sets: " in printed
    assert "- threads: 1, 2 per system" in printed
    per_core = [line for line in printed.splitlines()
                if line.startswith(("| int8 | ", "| fp32 | ")) and line.endswith("x |")]
    assert len(per_core) == 2 * 2 * 2  # precision x decoding x batch
    # Every sentence line is counted (the description is left out), and the exact
    # conversion gives the engine's greedy tokens, EOS and length limit included.
    agreement = agreement_lines(printed)
    assert set(agreement) == {(p, d) for p in ("int8", "fp32") for d in ("greedy", "beam4")}
    assert all(total == 4 and 0 <= same <= 4 for same, total in agreement.values())
    assert agreement["fp32", "greedy"] == (4, 4)


def test_model_mode_agreement_counts_the_timed_outputs(
        tiny_models: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """CTranslate2's fp32 output of the first source of every call changed: exactly
    those sentences stop agreeing, and its token count is what it returned."""
    generate = systems.CheckpointCTranslate2.generate
    changed: list[int] = []

    def altered(self, prepared, beam, new_tokens):  # type: ignore[no-untyped-def]
        out = generate(self, prepared, beam, new_tokens)
        if self.precision == "fp32":
            out[0] = out[0][:-1]
            changed.append(len(out))
        return out

    monkeypatch.setattr(systems.CheckpointCTranslate2, "generate", altered)
    out = tmp_path / "records.json"
    assert harness.main(model_args(tiny_models, corpus, tmp_path / "work", "--sentences", "5",
                                   "--batch-sizes", "2", "--decodings", "greedy",
                                   "--threads", "1", "--json", str(out))) == 0
    assert changed == [2, 2, 1]  # one timed pass: 5 sentences in batches of 2
    agreement = agreement_lines(capsys.readouterr().out)
    assert agreement["fp32", "greedy"] == (5 - len(changed), 5)
    records = {(r["system"], r["precision"]): r for r in json.loads(out.read_text())}
    ours, theirs = records["seq2serve@tiny", "fp32"], records["ctranslate2", "fp32"]
    # The same outputs but one token fewer for each changed sentence.
    ours_tokens = ours["tokens_per_second"] / ours["sentences_per_second"] * 5
    theirs_tokens = theirs["tokens_per_second"] / theirs["sentences_per_second"] * 5
    assert round(ours_tokens) - round(theirs_tokens) == len(changed)


def test_agreement_table_pairs_the_systems_outputs() -> None:
    from seq2serve.bench.engine.model import agreement_table

    def record(system: str, precision: str, batch: int, outputs: list[list[int]]
               ) -> measure.Record:
        return measure.Record("w", system, precision, "greedy", batch, 1.0, 1, 1.0, 1,
                              len(outputs), outputs)

    table = agreement_table([
        record("seq2serve@m", "int8", 1, [[9], [9], [9]]),  # only the largest batch counts
        record("ctranslate2", "int8", 1, [[1], [2], [3]]),
        record("seq2serve@m", "int8", 4, [[5, 2], [6, 2], [7]]),
        record("ctranslate2", "int8", 4, [[5, 2], [6], [7]]),
        record("seq2serve@m", "fp32", 4, [[5, 2], [6, 2], [7]]),
        record("ctranslate2", "fp32", 4, [[5, 2], [6, 2], [7]])])
    assert agreement_lines(table) == {("int8", "greedy"): (2, 3), ("fp32", "greedy"): (3, 3)}


def test_model_mode_with_onnx_runtime_beam_search(tiny_models: Path, corpus: Path,
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`--ort-beam-search` adds ONNX Runtime's BeamSearch operator over the checkpoint
    as a third system, with its own per-core and agreement tables."""
    out = tmp_path / "records.json"
    work = tmp_path / "work"
    assert harness.main(model_args(tiny_models, corpus, work, "--sentences", "4",
                                   "--batch-sizes", "2", "--decodings", "beam4", "--threads",
                                   "1", "--precisions", "int8", "--ort-beam-search",
                                   "--json", str(out))) == 0
    records = {r["system"]: r for r in json.loads(out.read_text())}
    assert set(records) == {"seq2serve@tiny", "ctranslate2", "ort-beamsearch"}
    assert records["ort-beamsearch"]["sentences_per_second"] > 0
    assert (next(work.iterdir()) / "ort-beam-search-int8" / "beam_search.onnx").is_file()
    printed = capsys.readouterr().out
    assert "| ort-beamsearch / CTranslate2 |" in printed
    rows = [line for line in printed.splitlines() if line.startswith("| int8 | beam4 | ")
            and " / " in line and line.endswith(" of 4 |")]
    assert len(rows) == 1  # its agreement with CTranslate2 / with the engine


def test_onnx_runtime_beam_search_needs_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.main(["--ort-beam-search", "--quick"]) != 0
    assert "--ort-beam-search needs --model" in capsys.readouterr().err
