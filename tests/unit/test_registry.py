"""The corpus-source registry: what the CLI, the mixes, the trainer and the cards read."""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import pytest

from seq2serve.model.data import corpus, ddtp, general, registry


def test_the_four_sources_in_build_order_with_their_modules_kinds() -> None:
    assert list(registry.SOURCES) == ["ddtp", "messages", "everyday", "general"]
    assert registry.get("ddtp").kinds == ddtp.KINDS
    assert registry.get("general").kinds == general.KINDS
    assert registry.get("messages").kinds == ("message",)
    names = list(registry.SOURCES)
    for source in registry.SOURCES.values():
        assert all(names.index(s) < names.index(source.name) for s in source.after)
        assert callable(source.builder())
        assert Path(source.card).is_file()
    kinds = registry.all_kinds()
    assert len(kinds) == len(set(kinds)) and {"synopsis", "message", "word", "multi30k"} <= set(
        kinds)


def test_labels_and_sources_of_corpus_folders() -> None:
    assert registry.label_of("data/messages/en-de") == "program messages"
    assert registry.label_of("/tmp/x/ddtp/en-fr") == "DDTP"
    assert registry.label_of("data/other/en-de") == "other"
    assert registry.source_of("runs/en-de") is None
    with pytest.raises(ValueError, match="twice"):
        registry.register(registry.get("ddtp"))
    with pytest.raises(KeyError, match="known: ddtp"):
        registry.get("wikipedia")


@pytest.fixture
def toy_source(monkeypatch: pytest.MonkeyPatch) -> list[argparse.Namespace]:
    """A fifth source registered as a new one would be: a module with
    configure/run and one register() call."""
    calls: list[argparse.Namespace] = []
    module = types.ModuleType("seq2serve.model.data.toy")

    def configure(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--toy-out", type=Path, default=Path("data/toy"))
        parser.add_argument("--toy-repeat", type=int, default=2)

    def run(args: argparse.Namespace, langs: list[str]) -> int:
        calls.append(args)
        folder = args.toy_out / "en-de"
        folder.mkdir(parents=True)
        for split, rows in (("train", [("toy", "Hello.", "Hallo.")]), ("valid", []),
                            ("test", [])):
            for ext, col in (("kind", 0), ("src", 1), ("tgt", 2)):
                (folder / f"{split}.{ext}").write_text("".join(f"{r[col]}\n" for r in rows))
        (folder / "corpus.json").write_text(json.dumps(
            {"task": "translate", "src_lang": "en", "tgt_lang": "de"}))
        return 0

    module.configure, module.run = configure, run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "seq2serve.model.data.toy", module)
    monkeypatch.setattr(registry, "SOURCES", dict(registry.SOURCES))
    registry.register(registry.Source(
        name="toy", label="toy text", kinds=("toy",), split_rule="none", domain="toys",
        card="docs/data-card-toy.md", card_phrase="toys ({link})", licence="CC0",
        module="toy", out_flag="toy_out", default_out="data/toy", weight_flag="toy_repeat"))
    return calls


def test_a_registered_source_is_built_mixed_and_labelled(toy_source: list[argparse.Namespace],
                                                         tmp_path: Path) -> None:
    from seq2serve.model.data import mix
    from seq2serve.model.train import trainer

    parser = argparse.ArgumentParser()
    corpus.configure(parser)
    assert "toy" in parser.get_default("mix_of").split(",")
    args = parser.parse_args(["--corpora", "toy", "--toy-out", str(tmp_path / "toy"),
                              "--langs", "de"])
    assert corpus.run(args) == 0 and len(toy_source) == 1
    args = parser.parse_args(["--corpora", "weighted-mix", "--mix-of", "toy",
                              "--toy-out", str(tmp_path / "toy"), "--langs", "de",
                              "--mix-out", str(tmp_path / "mix")])
    assert corpus.run(args) == 0
    rows = list(mix.train_rows(tmp_path / "mix" / "en-de"))
    assert rows == [("toy", "Hello.", "Hallo.")] * 2
    assert registry.label_of(tmp_path / "toy" / "en-de") == "toy text"
    train = argparse.ArgumentParser()
    trainer.configure(train)
    assert train.parse_args(["--kind", "toy"]).kind == "toy"
    with pytest.raises(SystemExit):
        train.parse_args(["--kind", "nonsense"])


def test_cli_refuses_unknown_corpora(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    corpus.configure(parser)
    assert corpus.run(parser.parse_args(["--corpora", "wikipedia"])) == 1
    assert corpus.run(parser.parse_args(["--corpora", "weighted-mix", "--mix-of", "wikipedia",
                                         "--mix-out", str(tmp_path / "m")])) == 1
