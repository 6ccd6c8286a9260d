"""The typed manifest, and the runner's check of the ONNX Runtime sessions
against the manifest's graph specs (on the shipped packages: no export needed)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from seq2serve.model.config import ModelConfig
from seq2serve.model.package.manifest import (
    READABLE_FORMATS,
    GenerationDefaults,
    PackageError,
    TensorSpec,
    load_package,
    sha256_file,
)
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import Runner, RunnerConfig, RunTerminated

SHIPPED = Path(__file__).resolve().parents[2] / "models"
PACKAGES = sorted(p.name for p in SHIPPED.iterdir() if (p / "manifest.json").is_file())
CPU = RunnerConfig(provider="cpu", intra_op_threads=1, warmup=False)


def linked_copy(name: str, target: Path) -> Path:
    """A shipped package under `target`: its own manifest.json, the rest links."""
    target.mkdir()
    for file in (SHIPPED / name).iterdir():
        if file.name == "manifest.json":
            shutil.copyfile(file, target / file.name)
        else:
            (target / file.name).symlink_to(file)
    return target


def edit_manifest(package: Path, edit) -> None:  # noqa: ANN001 - a function of the JSON
    data = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
    edit(data)
    (package / "manifest.json").write_text(json.dumps(data), encoding="utf-8")


@pytest.mark.parametrize("name", PACKAGES)
def test_shipped_packages_load_typed_and_write_back_unchanged(name: str) -> None:
    text = (SHIPPED / name / "manifest.json").read_text(encoding="utf-8")
    manifest = load_package(SHIPPED / name).manifest
    assert manifest.format_version in READABLE_FORMATS
    assert isinstance(manifest.config, ModelConfig)
    assert isinstance(manifest.generation, GenerationDefaults)
    assert manifest.special_tokens.eos == manifest.config.eos_id
    assert manifest.graphs.decoder.inputs[0] == TensorSpec("tokens", "int64", ("N",))
    assert manifest.to_json() == text  # the package format is the same on disk


def test_values_of_the_wrong_type_are_named(tmp_path: Path) -> None:
    package = linked_copy("en-de", tmp_path / "pkg")

    def damage(data: dict) -> None:  # type: ignore[type-arg]
        data["config"]["decoder_layers"] = "2"
        data["special_tokens"]["suppress"] = [0, "pad"]
        data["generation"]["beam_width"] = 4
        data["graphs"]["select"]["inputs"][1]["shape"] = [1.5]

    edit_manifest(package, damage)
    with pytest.raises(PackageError) as error:
        load_package(package)
    assert error.value.problems == [
        'manifest.json: config.decoder_layers must be an integer, got "2"',
        'manifest.json: special_tokens.suppress[1] must be an integer, got "pad"',
        "manifest.json: generation.beam_width: unknown key",
        "manifest.json: graphs.select.inputs[1].shape[0] must be a string or an integer, "
        "got 1.5",
    ]


def test_a_wrong_input_name_in_the_manifest_is_refused(tmp_path: Path) -> None:
    package = linked_copy("en-de", tmp_path / "pkg")
    edit_manifest(package, lambda d: d["graphs"]["decoder"]["inputs"][0].update(name="tokenz"))
    with pytest.raises(PackageError) as error:
        load_package(package)
    assert error.value.problems == [
        "manifest.json: graphs.decoder.inputs are not those of a format 6 graph for 2 decoder "
        "layers: missing 'tokens'; not expected 'tokenz'"]


def test_a_swapped_decoder_graph_is_refused_naming_the_file_and_tensors(
        tmp_path: Path) -> None:
    """The summarization model's decoder (3 layers) in the translation package (2),
    hashes updated: the manifest is consistent, the graph is not what it lists."""
    package = linked_copy("en-de", tmp_path / "pkg")
    (package / "decoder.onnx").unlink()
    shutil.copyfile(SHIPPED / "summarize-en" / "decoder.onnx", package / "decoder.onnx")
    sha = sha256_file(package / "decoder.onnx")
    edit_manifest(package, lambda d: d["files"].update({"decoder.onnx": sha}))
    loaded = load_package(package)
    with pytest.raises(PackageError) as error:
        Runner(loaded, CPU)
    problems = error.value.problems
    assert "decoder.onnx: the graph's input 'self_k.2' is not listed in manifest.json" in problems
    assert "decoder.onnx: the graph's output 'new_self_v.2' is not listed in manifest.json" \
        in problems
    assert all(p.startswith("decoder.onnx: ") for p in problems)
    assert str(package) in str(error.value)


def test_a_dtype_the_graph_does_not_have_is_refused(tmp_path: Path) -> None:
    package = linked_copy("en-de", tmp_path / "pkg")

    def half_cache(data: dict) -> None:  # type: ignore[type-arg]
        for spec in data["graphs"]["decoder"]["inputs"]:
            if spec["name"] == "self_k.0":
                spec["dtype"] = "float16"

    edit_manifest(package, half_cache)
    with pytest.raises(PackageError) as error:
        Runner(load_package(package), CPU)
    assert error.value.problems == [
        "decoder.onnx: input 'self_k.0' is float32 in the graph but float16 in manifest.json"]


def test_model_sizes_the_graph_fixes_must_be_the_configs(tmp_path: Path) -> None:
    package = linked_copy("en-de", tmp_path / "pkg")
    vocab = load_package(package).manifest.config.tgt_vocab_size
    edit_manifest(package, lambda d: d["config"].update(tgt_vocab_size=vocab + 1000,
                                                        src_vocab_size=vocab + 1000))
    with pytest.raises(PackageError) as error:
        Runner(load_package(package), CPU)
    assert (f"decoder.onnx: output 'log_probs' axis 1 is {vocab} in the graph, expected "
            f"V = {vocab + 1000} in the model config") in error.value.problems


def test_terminate_ends_a_run_in_progress_and_refuses_later_ones() -> None:
    engine = Engine(SHIPPED / "en-de", CPU, default_limits())
    long_text = list(range(10, 250)) + [engine.eos_id]
    outcome: list[BaseException | None] = []

    def decode() -> None:
        try:
            engine.generate([long_text] * 32, DecodingOptions(beam_size=4, min_length=200,
                                                             max_length=256))
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            outcome.append(error)

    thread = threading.Thread(target=decode)
    thread.start()
    time.sleep(1.0)  # well inside a decoding that takes minutes here
    started = time.monotonic()
    engine.runner.terminate()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - started < 5
    assert isinstance(outcome[0], RunTerminated)
    with pytest.raises(RunTerminated, match="server is stopping"):
        engine.runner.top_k(np.zeros((1, 8), dtype=np.float32), 2)
