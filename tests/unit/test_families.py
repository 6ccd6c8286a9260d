"""The table of families (model/families/registry.py) and the tasks a folder names
(model/families/tasks.py), issue 51 items 7 and 10: one record per architecture that
the help texts, the bench and README read; `--task` forms, the choice refused with the
list where a folder names several, the task's parameters applied as transformers'
pipeline applied them (GenerationConfig.update), checked against transformers itself."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import transformers

from seq2serve.export import exporter, hub
from seq2serve.export.sources import load_source
from seq2serve.model.families.registry import FAMILIES, FAMILY_LIST, read_model_type
from seq2serve.model.families.source import SourceError, folder_name
from seq2serve.model.families.tasks import SUMMARIZE, TRANSLATE, TaskRequest, resolve

ROOT = Path(__file__).resolve().parents[2]

# google-t5/t5-small's config.json task_specific_params, as the hub holds them.
T5_SMALL_TASKS: dict[str, Any] = {
    "summarization": {"early_stopping": True, "length_penalty": 2.0, "max_length": 200,
                      "min_length": 30, "no_repeat_ngram_size": 3, "num_beams": 4,
                      "prefix": "summarize: "},
    "translation_en_to_de": {"early_stopping": True, "max_length": 300, "num_beams": 4,
                             "prefix": "translate English to German: "},
    "translation_en_to_fr": {"early_stopping": True, "max_length": 300, "num_beams": 4,
                             "prefix": "translate English to French: "},
    "translation_en_to_ro": {"early_stopping": True, "max_length": 300, "num_beams": 4,
                             "prefix": "translate English to Romanian: "},
}
BOTH = (SUMMARIZE, TRANSLATE)


def test_task_forms() -> None:
    assert TaskRequest.parse("summarize") == TaskRequest(SUMMARIZE)
    assert TaskRequest.parse("translate") == TaskRequest(TRANSLATE)
    assert TaskRequest.parse("translate:en-fr") == TaskRequest(TRANSLATE, "en", "fr")
    assert str(TaskRequest.parse("translate:en-fr")) == "translate:en-fr"
    for bad in ("summarise", "summarize:en-fr", "translate:en", "translate:en-fr-ro",
                "translate:EN-FR", "translate:en_to_fr", "translate:en-en", ""):
        with pytest.raises(ValueError, match="--task"):
            TaskRequest.parse(bad)


def test_several_tasks_are_refused_with_the_list() -> None:
    problems: list[str] = []
    assert resolve({"task_specific_params": T5_SMALL_TASKS}, None, BOTH, "T5", problems) is None
    assert problems == ["config.json: task_specific_params names 4 tasks (summarize, "
                        "translate:en-de, translate:en-fr, translate:en-ro): choose one with "
                        "--task"]
    problems.clear()
    asked = TaskRequest(TRANSLATE)
    assert resolve({"task_specific_params": T5_SMALL_TASKS}, asked, BOTH, "T5", problems) is None
    assert "3 translations" in problems[0] and "translate:SRC-TGT" in problems[0], problems


@pytest.mark.parametrize("pair", [("en", "de"), ("en", "fr"), ("en", "ro")])
def test_translate_pair_takes_its_entry(pair: tuple[str, str]) -> None:
    problems: list[str] = []
    task = resolve({"task_specific_params": T5_SMALL_TASKS}, TaskRequest(TRANSLATE, *pair),
                   BOTH, "T5", problems)
    assert task is not None and not problems
    key = f"translation_{pair[0]}_to_{pair[1]}"
    assert (task.kind, task.source_language, task.target_language, task.entry) == (
        TRANSLATE, *pair, key)
    assert task.prefix == T5_SMALL_TASKS[key]["prefix"]
    assert "prefix" not in task.params and task.params["num_beams"] == 4


def test_translate_without_languages_on_a_folder_that_names_none() -> None:
    """mT5's and Pegasus's configs name no translation: --task translate is refused
    (never an en->en translator); with the pair, it is that pair, nothing applied."""
    problems: list[str] = []
    for hf in ({}, {"task_specific_params": {"summarization_xsum": {"max_length": 64}}}):
        problems.clear()
        assert resolve(hf, TaskRequest(TRANSLATE), BOTH, "mT5", problems) is None
        assert "names no translation languages" in problems[0], problems
        assert "translate:SRC-TGT" in problems[0]
        task = resolve(hf, TaskRequest(TRANSLATE, "en", "de"), BOTH, "mT5", problems)
        assert task is not None and (task.source_language, task.target_language) == ("en", "de")
        assert task.entry is None and not task.params and task.prefix == ""


def test_only_the_pipelines_own_entry_is_applied() -> None:
    """The summarization pipeline applied "summarization" alone: "summarization_xsum"
    says the task, its settings stay out (as pegasus-xsum under the pipeline)."""
    problems: list[str] = []
    hf = {"task_specific_params": {"summarization_xsum": {"max_length": 64, "num_beams": 8}}}
    task = resolve(hf, None, BOTH, "Pegasus", problems)
    assert task is not None and task.kind == SUMMARIZE and task.entry is None and not task.params


def test_task_parameters_replace_generation_config_as_update_does() -> None:
    """The entry over the folder's generation settings equals transformers'
    GenerationConfig.update (the pipeline's step), max_new_tokens staying in force."""
    problems: list[str] = []
    task = resolve({"task_specific_params": T5_SMALL_TASKS}, TaskRequest(SUMMARIZE), BOTH,
                   "T5", problems)
    assert task is not None and task.entry == "summarization"
    for folder in ({"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0},
                   {"num_beams": 2, "max_new_tokens": 50, "length_penalty": 0.5,
                    "decoder_start_token_id": 0}):
        reference = transformers.GenerationConfig(**folder)
        unused = reference.update(**dict(task.params))
        assert not unused  # every one of t5-small's parameters is a generation key
        ours = transformers.GenerationConfig(**task.generation_settings(folder))
        assert ours.to_diff_dict() == reference.to_diff_dict()


def test_manifest_says_what_was_applied() -> None:
    problems: list[str] = []
    task = resolve({"task_specific_params": T5_SMALL_TASKS}, TaskRequest(SUMMARIZE), BOTH,
                   "T5", problems)
    assert task is not None
    said = task.origin()
    assert said["task"] == "summarize"
    assert said["task_specific_params"]["entry"] == "summarization"
    assert said["task_specific_params"]["applied"] == {
        k: v for k, v in T5_SMALL_TASKS["summarization"].items() if k != "prefix"}


# -- config.json's problems, said as they are -----------------------------------------


@pytest.mark.parametrize("content,said", [
    (None, "config.json: missing"),
    ("{not json", "config.json: unreadable (JSONDecodeError"),
    (json.dumps({"d_model": 8}), "config.json: no model_type"),
    (json.dumps({"model_type": "llama"}), "config.json: model_type 'llama' is an "
                                          "architecture export "
                                          "does not take"),
])
def test_unsupported_folder_says_which(content: str | None, said: str, tmp_path: Path) -> None:
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(SourceError) as info:
        load_source(tmp_path)
    [problem] = info.value.problems
    assert problem.startswith(said), problem
    assert "missing, unreadable, or" not in problem
    if content is None:
        assert read_model_type(tmp_path) == (None, "config.json: missing")


def test_a_path_that_is_neither_folder_nor_hub_id() -> None:
    with pytest.raises(SourceError, match="not a directory"):
        load_source(Path("/nonexistent/./a//b"))


# -- one table --------------------------------------------------------------------------


def test_every_family_once_with_transformers_classes() -> None:
    assert set(FAMILIES) == {t for f in FAMILY_LIST for t in f.model_types}
    assert len(FAMILIES) == sum(len(f.model_types) for f in FAMILY_LIST)  # no type twice
    for family in FAMILY_LIST:
        config_class, model_class = family.transformers_classes
        assert hasattr(transformers, config_class) and hasattr(transformers, model_class)
        assert getattr(transformers, config_class).model_type in family.model_types
        if family.layout is not None:
            assert family.layout.model_type in family.model_types
            assert model_class in family.layout.architectures


def test_export_help_lists_the_table() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    exporter.configure(parser)
    text = " ".join(parser.format_help().split())
    for family in FAMILY_LIST:
        assert " ".join(family.help().split()) in text, family.name
    main = (ROOT / "server" / "cli" / "main.py").read_text(encoding="utf-8")
    assert "Pegasus" not in main  # the family list has one home


def test_readme_family_table_is_the_registry() -> None:
    """README's table of families: one row per record, by its name, with its
    model_types."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| family | `model_type` |"):]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")][:len(FAMILY_LIST)]
    assert len(rows) == len(FAMILY_LIST)
    for family, row in zip(FAMILY_LIST, rows, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0].startswith(family.name), (family.name, cells[0])
        assert re.findall(r"`([a-z0-9_]+)`", cells[1]) == list(family.model_types), cells[1]


def test_bench_builds_folders_from_the_table() -> None:
    from seq2serve.bench.engine import families as bench

    for shape in bench.FAMILY_SHAPES.values():
        family = FAMILIES[bench.MODEL_TYPES[shape.family]]
        assert bench.model_classes(shape.family) == family.transformers_classes


# -- names --------------------------------------------------------------------------------


def test_default_name_carries_a_precision_other_than_fp32() -> None:
    assert exporter.default_name("bart-large-cnn", "fp32") == "bart-large-cnn"
    assert exporter.default_name("bart-large-cnn", "int8") == "bart-large-cnn-int8"
    assert exporter.default_name("bart-large-cnn", "fp16") == "bart-large-cnn-fp16"


def test_a_hub_snapshot_is_named_by_its_repository(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--facebook--bart-large-cnn" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    assert folder_name(snapshot) == "bart-large-cnn"
    assert folder_name(tmp_path / "models--facebook--bart-large-cnn") == \
        "models--facebook--bart-large-cnn"


def test_hub_downloads_one_copy_of_the_weights() -> None:
    both = ["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5",
            "onnx/encoder_model.onnx", "tokenizer.json"]
    patterns = hub.allow_patterns(both)
    assert "model.safetensors" in patterns and "pytorch_model.bin" not in patterns
    torch_only = hub.allow_patterns(["config.json", "pytorch_model-00001-of-00002.bin"])
    assert "pytorch_model-*-of-*.bin" in torch_only
    assert not any("safetensors" in p for p in torch_only)
    assert not any(p.endswith((".h5", ".onnx", ".msgpack")) for p in patterns)
    assert hub.is_hub_id("facebook/bart-large-cnn") and hub.is_hub_id("t5-small")
    assert not hub.is_hub_id("/abs/path") and not hub.is_hub_id("a/b/c")
