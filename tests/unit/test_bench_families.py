"""`seq2serve bench --family` on the tiny shape of each Hugging Face family (BART,
Pegasus, T5, Flan-T5 style): the folder builds, our packages export, CTranslate2's
own converter converts it, every system generates exactly the requested tokens,
and the fp32 systems give generate()'s greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_systems import assert_systems_agree

from seq2serve.bench.engine import families, harness, systems

TINY = ["tiny-bart", "tiny-pegasus", "tiny-t5", "tiny-flan-t5"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-families")


def test_real_shapes_are_the_public_ones() -> None:
    bart, pegasus = families.FAMILY_SHAPES["bart"], families.FAMILY_SHAPES["pegasus"]
    assert {k: bart.config[k] for k in ("d_model", "encoder_layers", "decoder_layers",
                                        "encoder_attention_heads", "encoder_ffn_dim",
                                        "vocab_size")} == {
        "d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
        "encoder_attention_heads": 12, "encoder_ffn_dim": 3072, "vocab_size": 50265}
    assert pegasus.config["d_model"] == 768 and pegasus.config["vocab_size"] == 96103
    t5, flan = families.FAMILY_SHAPES["t5"].config, families.FAMILY_SHAPES["flan-t5"].config
    assert (t5["d_model"], t5["num_heads"], t5["num_layers"], t5["d_ff"],
            t5["feed_forward_proj"]) == (512, 8, 6, 2048, "relu")
    assert (flan["num_heads"], flan["num_layers"], flan["d_ff"], flan["feed_forward_proj"],
            flan["tie_word_embeddings"]) == (6, 8, 1024, "gated-gelu", False)


@pytest.mark.parametrize("name", TINY)
def test_every_system_loads_and_agrees(name: str, work: Path) -> None:
    shape = families.FAMILY_SHAPES[name]
    models = families.prepare_family(work, shape, 0, {"fp32", "int8"}, True)
    assert models.ctranslate2 is not None
    # the converted vocabulary has one distinct piece per model row
    pieces = systems.converted_vocabulary(models.ctranslate2)
    assert len(pieces) == len(set(pieces)) == shape.config["vocab_size"]
    # CTranslate2 read a patched copy; the folder itself is as transformers wrote it
    config = json.loads((models.marian / "config.json").read_text())
    assert not set(families.CT2_LEGACY_KEYS.get(shape.family, {})) & set(config)
    ids = families.source_ids(models.marian, shape)
    sources = families.random_sources(ids, 3, 6, seed=0)
    assert all(len(s) == 6 and s[-1] == ids.eos for s in sources)
    assert all(ids.low <= i < ids.high for s in sources for i in s[:-1])
    assert_systems_agree(models, sources)


def test_harness_runs_a_family(work: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = harness.main(["--family", "tiny-t5", "--threads", "1", "--repeats", "1",
                       "--new-tokens", "4", "--source-length", "5", "--decodings", "beam4",
                       "--batch-sizes", "1", "2", "--work", str(work), "--json", str(out)])
    assert rc == 0
    records = json.loads(out.read_text())
    assert {(r["system"], r["precision"]) for r in records} == {
        ("seq2serve", "fp32"), ("seq2serve", "int8"), ("transformers", "fp32"),
        ("ctranslate2", "fp32"), ("ctranslate2", "int8")}
    assert len(records) == 5 * 2
    text = capsys.readouterr()
    assert "**tiny-t5, random weights: 5 source tokens, 4 new tokens per source**" in text.out
    assert "MISMATCH" not in text.out


def test_a_mismatching_ctranslate2_is_reported_not_timed(
        capsys: pytest.CaptureFixture[str]) -> None:
    class Fixed(systems.System):
        def __init__(self, name: str, precision: str, tokens: list[list[int]]):
            self.name, self.precision, self.tokens = name, precision, tokens

        def generate(self, prepared: object, beam: int,
                     new_tokens: int | None) -> list[list[int]]:
            return self.tokens

    class FixedCT2(systems.CTranslate2, Fixed):
        def __init__(self, precision: str, tokens: list[list[int]]):
            Fixed.__init__(self, "ctranslate2", precision, tokens)

        def load(self) -> None:
            pass

        def prepare(self, sources: object) -> object:
            return sources

        def generate(self, prepared: object, beam: int,
                     new_tokens: int | None) -> list[list[int]]:
            return self.tokens

    right, wrong = [[5, 6]], [[5, 7]]
    every = [Fixed("seq2serve", "fp32", right), Fixed("transformers", "fp32", right),
             FixedCT2("fp32", wrong), FixedCT2("int8", wrong)]
    kept = harness.agreeing_systems(every, [[3, 1]], 2)
    assert [s.name for s in kept] == ["seq2serve", "transformers"]
    assert "MISMATCH: ctranslate2 fp32 greedy tokens differ from transformers's on 1 of 1 " \
        "sources; not timed" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-flan-t5"])
def test_ctranslate2_scales_t5_outputs_as_transformers(name: str, work: Path) -> None:
    """CTranslate2's T5 conversion scales the decoder output where transformers does
    (T5, tied) and only there (Flan-T5, its own output matrix): its beam-4 tokens are
    generate()'s, which they would not be with every output scaled."""
    shape = families.FAMILY_SHAPES[name]
    models = families.prepare_family(work, shape, 0, {"fp32", "int8"}, True)
    config = json.loads((models.marian / "config.json").read_text())
    assert config["tie_word_embeddings"] == (name == "tiny-t5")
    sources = families.random_sources(families.source_ids(models.marian, shape), 8, 8, seed=1)
    beams = {}
    for system in (systems.Transformers(models.marian, 1),
                   systems.CTranslate2(models.ctranslate2, models.marian, "fp32", 1)):
        system.load()
        try:
            beams[system.name] = system.generate(system.prepare(sources), 4, 7)
        finally:
            system.close()
    assert beams["ctranslate2"] == beams["transformers"]
