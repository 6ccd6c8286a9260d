"""CTranslate2's vocabulary map built from a package's shortlist table (issue 35:
CTranslate2 reported with and without a map of the same shortlist): the map's
lines are the table's, CTranslate2 with `use_vmap` outputs only a source's
candidates (the engine's candidates for it), a map of every piece changes
nothing, and `seq2serve bench --model` adds `ctranslate2-vmap` rows for a
package with a shortlist. A tiny random checkpoint: it never ends early, so
every step is a draw from the whole vocabulary unless the map restricts it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS
from test_ctranslate2_model import tiny_checkpoint

from seq2serve.bench.engine import ctranslate2_model as ct2_model
from seq2serve.bench.engine import harness
from seq2serve.bench.engine.systems import CTRANSLATE2_VMAP, CheckpointCTranslate2
from seq2serve.export.exporter import export
from seq2serve.model.package import shortlist as lexical
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import package_tokenizer

SETTINGS = lexical.ShortlistSettings(first=8, best=6)  # candidates a strict subset


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models folder as `bench --model` reads one: the int8 package `tiny` with a
    shortlist on by default, its checkpoint checkpoints/tiny, and beside them
    ct2 (the conversion) and ct2-vmap (the conversion with the package's map)."""
    root = tmp_path_factory.mktemp("vmap")
    corpus = root / "corpus"
    corpus.mkdir()
    lines = "\n".join(CORPUS * 3) + "\n"
    (corpus / "train.src").write_text(lines, encoding="utf-8")
    (corpus / "train.tgt").write_text(lines, encoding="utf-8")
    (corpus / "test.src").write_text("\n".join(CORPUS[:3]) + "\n", encoding="utf-8")
    checkpoint = root / "checkpoints" / "tiny"
    checkpoint.parent.mkdir()
    shutil.move(tiny_checkpoint(root / "build"), checkpoint)
    export(checkpoint, root / "tiny", precision="int8", name="tiny", progress=False,
           shortlist_from=corpus, shortlist=SETTINGS, shortlist_default=True)
    ct2_model.convert(checkpoint, root / "ct2")
    assert ct2_model.main([str(checkpoint), str(root / "ct2-vmap"),
                           "--vmap-from", str(root / "tiny")]) == 0
    return root


def read_vmap(path: Path) -> dict[str, list[str]]:
    """source piece ("" for the always line) -> target pieces, as vocabulary_map.cc reads it."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, targets = line.partition("\t")
        assert key not in out
        out[key] = targets.split(" ")
    return out


def table_of(package: Path) -> lexical.LexicalTable:
    return lexical.load(load_package(package).shortlist_table_path, SETTINGS).table


def eos_id(models: Path) -> int:
    return load_package(models / "tiny").manifest.special_tokens.eos


def sources(models: Path) -> list[list[int]]:
    """The engine's source ids (EOS last) of the fixture sentences."""
    tokenizer = package_tokenizer(load_package(models / "tiny"))
    return [tokenizer.encode(text) for text in CORPUS]


def test_the_map_holds_the_tables_lines(models: Path) -> None:
    table, eos = table_of(models / "tiny"), eos_id(models)
    pieces = ct2_model.spm_pieces(models / "ct2-vmap" / ct2_model.TOKENIZER_FILE)
    vmap = read_vmap(models / "ct2-vmap" / ct2_model.VMAP_FILE)
    ids = {p: i for i, p in enumerate(pieces)}
    # The always line: the specials, the `first` most frequent, the EOS every source ends with.
    always = {ids[p] for p in vmap[""]}
    assert always == set(table.candidates([eos], SETTINGS).tolist())
    assert {*table.special.tolist(), *table.frequent[:SETTINGS.first].tolist()} <= always
    # One line per source piece with translations: its `best` targets, specials aside.
    for s in range(table.source_vocab):
        row = table.targets[table.indptr[s]:table.indptr[s + 1]][:SETTINGS.best]
        want = sorted(set(row.tolist()) - set(table.special.tolist()))
        assert [ids[p] for p in vmap.get(pieces[s], [])] == want
    assert len(vmap) > 10  # pieces of the fixture corpus have lines
    # A threshold drops the targets scoring under it, as in the engine's candidates.
    strict = dataclasses.replace(SETTINGS, threshold=0.9)
    pruned = read_vmap_text(ct2_model.vocabulary_map(table, strict, pieces, [eos]))
    assert sum(map(len, pruned.values())) < sum(map(len, vmap.values()))
    for s in range(table.source_vocab):
        start, stop = table.indptr[s], min(table.indptr[s + 1], table.indptr[s] + SETTINGS.best)
        kept = table.targets[start:stop][table.scores[start:stop] >= 0.9]
        want = sorted(set(kept.tolist()) - set(table.special.tolist()))
        assert [ids[p] for p in pruned.get(pieces[s], [])] == want
    # For any source, the map's candidates are the engine's.
    for source in sources(models):
        mapped = always.union(*({ids[p] for p in vmap.get(pieces[i], [])} for i in source))
        assert mapped == set(table.candidates(source, SETTINGS).tolist())


def read_vmap_text(text: str) -> dict[str, list[str]]:
    return {key: targets.split(" ") for key, _, targets in
            (line.partition("\t") for line in text.splitlines())}


def ct2_outputs(model_dir: Path, package: Path, batches: list[list[list[int]]], beam: int,
                vmap: bool) -> list[list[int]]:
    system = CheckpointCTranslate2(model_dir, package, "fp32", 1, vmap=vmap)
    system.load()
    try:
        return [t for batch in batches
                for t in system.generate(system.prepare(batch), beam, 24)]
    finally:
        system.close()


@pytest.mark.parametrize("beam", [1, 4])
def test_ctranslate2_with_the_map_outputs_only_the_sources_candidates(models: Path,
                                                                      beam: int) -> None:
    package, table = models / "tiny", table_of(models / "tiny")
    ids = sources(models)
    one_at_a_time = [[s] for s in ids]
    restricted = ct2_outputs(models / "ct2-vmap", package, one_at_a_time, beam, vmap=True)
    full = ct2_outputs(models / "ct2", package, one_at_a_time, beam, vmap=False)
    candidates = [set(table.candidates(s, SETTINGS).tolist()) for s in ids]
    assert all(len(out) == 24 for out in restricted)  # a random model: every step a draw
    assert all(set(out) <= allowed for out, allowed in zip(restricted, candidates, strict=True))
    # Without the map the same model leaves the candidates: the map did the restricting.
    assert any(not set(out) <= allowed for out, allowed in zip(full, candidates, strict=True))
    # CTranslate2 takes the union over a batch (the engine would not).
    batched = ct2_outputs(models / "ct2-vmap", package, [ids[:3]], beam, vmap=True)
    union = set().union(*candidates[:3])
    assert all(set(out) <= union for out in batched)


def test_a_map_of_every_piece_changes_nothing(models: Path, tmp_path: Path) -> None:
    package, table = models / "tiny", table_of(models / "tiny")
    pieces = ct2_model.spm_pieces(models / "ct2" / ct2_model.TOKENIZER_FILE)
    everything = dataclasses.replace(table, frequent=np.arange(len(pieces), dtype=np.int32))
    vmap = tmp_path / ct2_model.VMAP_FILE
    vmap.write_text(ct2_model.vocabulary_map(
        everything, dataclasses.replace(SETTINGS, first=len(pieces)), pieces, [eos_id(models)]),
        encoding="utf-8")
    assert len(read_vmap(vmap)[""]) == len(pieces)
    ct2_model.convert(models / "checkpoints" / "tiny", tmp_path / "ct2-all", vmap=vmap)
    batches = [sources(models)[i:i + 3] for i in (0, 3)]
    for beam in (1, 4):
        assert ct2_outputs(tmp_path / "ct2-all", package, batches, beam, vmap=True) == \
            ct2_outputs(models / "ct2", package, batches, beam, vmap=False)


def test_the_map_refuses_pieces_it_cannot_hold(models: Path) -> None:
    table = table_of(models / "tiny")
    pieces = ct2_model.spm_pieces(models / "ct2" / ct2_model.TOKENIZER_FILE)
    with pytest.raises(ValueError, match="cannot hold"):
        ct2_model.vocabulary_map(table, SETTINGS, [*pieces[:-1], "a b"], [eos_id(models)])
    with pytest.raises(ValueError, match="pieces"):
        ct2_model.vocabulary_map(table, SETTINGS, pieces[:10], [eos_id(models)])
    with pytest.raises(ValueError, match="no vocabulary map"):
        CheckpointCTranslate2(models / "ct2", models / "tiny", "fp32", 1, vmap=True)


def test_bench_model_runs_ctranslate2_with_the_map(models: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "records.json"
    work = tmp_path / "work"
    assert harness.main(["--model", "tiny", "--models-dir", str(models), "--data",
                         str(models / "corpus"), "--sentences", "3", "--repeats", "1",
                         "--warmup", "0", "--work", str(work), "--batch-sizes", "2",
                         "--decodings", "greedy", "--threads", "1", "--precisions", "int8",
                         "--json", str(out)]) == 0
    records = {r["system"]: r for r in json.loads(out.read_text())}
    assert set(records) == {"seq2serve@tiny", "ctranslate2", CTRANSLATE2_VMAP}
    cached = next(work.iterdir())
    assert (cached / "ctranslate2-vmap" / ct2_model.VMAP_FILE).read_text(encoding="utf-8") == \
        (models / "ct2-vmap" / ct2_model.VMAP_FILE).read_text(encoding="utf-8")
    printed = capsys.readouterr().out
    assert "shortlist first 8, best 6, threshold 0: int8 seq2serve over it" in printed
    assert f"| {CTRANSLATE2_VMAP} | int8 | greedy | 2 |" in printed
    assert f"| seq2serve / {CTRANSLATE2_VMAP} |" in printed
    assert f"| {CTRANSLATE2_VMAP} / CTranslate2 |" in printed
