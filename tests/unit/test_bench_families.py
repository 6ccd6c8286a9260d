"""`seq2serve bench --family` on the tiny shape of each Hugging Face family (BART,
Pegasus, T5, Flan-T5 style, M2M100, NLLB-200): the folder builds, our packages
export, CTranslate2's own converter converts it, every system generates exactly the
requested tokens (a multilingual family's first one forced to the target language's
token), and the fp32 systems give generate()'s greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_systems import assert_systems_agree

from seq2serve.bench.engine import families, harness, systems
from seq2serve.export.sources import SAMPLE_TEXTS

TINY = ["tiny-bart", "tiny-pegasus", "tiny-t5", "tiny-flan-t5", "tiny-m2m100", "tiny-nllb"]
# each multilingual family's target language token, as CTranslate2's vocabulary names it
TARGET_TOKEN = {"m2m100": "__de__", "nllb": "deu_Latn"}


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
    # facebook/m2m100_418M and facebook/nllb-200-distilled-600M: one shape, two vocabularies
    dims = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
            "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
            "max_position_embeddings", "activation_function", "scale_embedding")
    for name, vocab in (("m2m100", 128112), ("nllb", 256206)):
        config = families.FAMILY_SHAPES[name].config
        assert {k: config[k] for k in dims} == dict(zip(dims, (1024, 12, 12, 16, 16, 4096,
                                                               4096, 1024, "relu", True),
                                                        strict=True))
        assert config["vocab_size"] == vocab


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
    multilingual = shape.family in families.MULTILINGUAL
    assert all(ids.low <= i < ids.high for s in sources for i in s[multilingual:-1])
    if multilingual:
        # each source starts with its language's token, in turn, as the tokenizer puts it
        assert [s[0] for s in sources] == list(ids.source_languages)
        assert pieces[ids.target] == TARGET_TOKEN[shape.family]
        assert ids.target not in ids.source_languages
    else:
        assert ids.target is None
    assert_systems_agree(models, sources, forced_bos=ids.target)


def test_multilingual_sources_are_what_the_tokenizer_makes(work: Path) -> None:
    """A source's language token where the family's own tokenizer puts it (first, as
    M2M100Tokenizer and NllbTokenizer do with src_lang), its pieces (no <unk>: the
    tokenizer's training text), EOS last."""
    import transformers

    for name, code in (("tiny-m2m100", "fr"), ("tiny-nllb", "fra_Latn")):
        shape = families.FAMILY_SHAPES[name]
        folder = families.build_folder(work / f"{shape.key}-seed0" / "hf", shape, 0)
        tok = transformers.AutoTokenizer.from_pretrained(str(folder), src_lang=code)
        made = tok(SAMPLE_TEXTS[0]).input_ids
        ids = families.source_ids(folder, shape)
        assert made[0] == ids.source_languages[1] and made[-1] == ids.eos
        assert all(ids.low <= i < ids.high for i in made[1:-1])


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-nllb"])
def test_harness_runs_a_family(name: str, work: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    # NLLB's with the shortlist's peer too (not checked against generate(): its map
    # restricts the output)
    vmap = ["ctranslate2-vmap-fp32", "ctranslate2-vmap-int8"] if name == "tiny-nllb" else []
    rc = harness.main(["--family", name, "--threads", "1", "--repeats", "1",
                       "--new-tokens", "4", "--source-length", "5", "--decodings", "beam4",
                       "--batch-sizes", "1", "2", "--work", str(work), "--json", str(out),
                       "--systems", *harness.DEVICE_SYSTEMS["cpu"], *vmap])
    assert rc == 0
    records = json.loads(out.read_text())
    assert {(r["system"], r["precision"]) for r in records} == {
        ("seq2serve", "fp32"), ("seq2serve", "int8"), ("transformers", "fp32"),
        ("ctranslate2", "fp32"), ("ctranslate2", "int8"),
        *((systems.CTRANSLATE2_VMAP, p) for p in (("fp32", "int8") if vmap else ()))}
    assert len(records) == (5 + len(vmap)) * 2
    text = capsys.readouterr()
    assert f"**{name}, random weights: 5 source tokens, 4 new tokens per source**" in text.out
    assert "greedy fp32 check: ctranslate2 gives transformers's tokens for 2 of 2" in text.err
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


def test_ctranslate2_over_a_vocabulary_map(work: Path) -> None:
    """The shortlist's peer (`ctranslate2-vmap-*`): a random table of the engine's
    default shortlist sizes as CTranslate2's vocabulary map; CTranslate2 then chooses
    only among a batch's candidates (the always line and its pieces' lines), still
    decoding exactly the requested tokens, the forced one first."""
    from seq2serve.model.package.shortlist import ShortlistSettings

    shape = families.FAMILY_SHAPES["tiny-nllb"]
    models = families.prepare_family(work, shape, 0, set(), True)
    assert models.ctranslate2 is not None
    ids = families.source_ids(models.marian, shape)
    settings = ShortlistSettings(first=20, best=3)
    text = families.vocabulary_map(ids, shape.config["vocab_size"], settings, seed=0)
    lines = [line.split("\t") for line in text.splitlines()]
    always = [int(i) for i in lines[0][1].split()]
    assert lines[0][0] == "" and {ids.eos, ids.target} <= set(always)
    assert len(always) == 20 + 2
    table = {int(src): [int(i) for i in targets.split()] for src, targets in lines[1:]}
    assert set(table) == {*range(ids.low, ids.high), *ids.source_languages}
    assert all(len(targets) == 3 for targets in table.values())
    vmap_dir = families.with_vocabulary_map(models.ctranslate2, work / "ct2-vmap", text)
    assert (vmap_dir / "model.bin").samefile(models.ctranslate2 / "model.bin")
    sources = families.random_sources(ids, 3, 6, seed=0)
    system = systems.CTranslate2(vmap_dir, models.marian, "fp32", 1, forced_bos=ids.target,
                                 vmap=True)
    assert system.name == systems.CTRANSLATE2_VMAP
    system.load()
    try:
        out = system.generate(system.prepare(sources), 4, 6)
    finally:
        system.close()
    allowed = set(always).union(*(table[i] for s in sources for i in s[:-1]))
    assert all(len(t) == 6 and t[0] == ids.target for t in out)
    assert {i for t in out for i in t} <= allowed
    # without the map, the same model chooses outside those candidates
    full = systems.CTranslate2(models.ctranslate2, models.marian, "fp32", 1,
                               forced_bos=ids.target)
    full.load()
    try:
        unrestricted = full.generate(full.prepare(sources), 4, 6)
    finally:
        full.close()
    assert not {i for t in unrestricted for i in t} <= allowed


def test_vmap_rows_are_for_families() -> None:
    assert harness.main(["--systems", "ctranslate2-vmap-int8", "--threads", "1"]) == 2
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
