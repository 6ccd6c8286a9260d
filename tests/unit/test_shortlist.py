"""The vocabulary shortlist (issue 35): the lexical table, the shortlist decoder
graph against the full one, the engine over candidates, batch invariance, the
request option, and old packages."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS
from invariance import decode_joining, result_key
from test_export import drawn_checkpoint

from seq2serve.export.exporter import export
from seq2serve.export.verify import check_shortlist
from seq2serve.model.package import shortlist as lexical
from seq2serve.model.package.manifest import PackageError, load_package
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions, InvalidOptions
from seq2serve.server.engine.decoding import top_k_exact
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.options import OptionLimits
from seq2serve.server.engine.runner import RunnerConfig
from seq2serve.server.engine.search import Candidates

# -- the table and the pure helpers --------------------------------------------------------


def toy_table() -> lexical.LexicalTable:
    """Source 5 always comes with target 7, source 6 with 8; target 9 in every pair."""
    pairs = [([5, 2], [7, 9, 2])] * 6 + [([6, 2], [8, 9, 2])] * 3 + [([5, 6, 2], [7, 8, 9, 2])]
    return lexical.learn_table(pairs, 10, 12, special=[0, 1, 2, 3])


def test_table_ranks_each_pieces_translation_first() -> None:
    table = toy_table()
    row = table.targets[table.indptr[5]:table.indptr[6]]
    scores = table.scores[table.indptr[5]:table.indptr[6]]
    # p(t | 5): 7 and 9 in all 7 of its sentences (ties to the lower id), 2 too, 8 once.
    assert row.tolist() == [2, 7, 9] and np.allclose(scores, 1.0)  # 8: below MIN_PAIR_COUNT
    assert table.frequent[:3].tolist() == [2, 9, 7]  # 10, 10 (ties to the lower id), 7
    dice = lexical.learn_table([([5, 2], [7, 9, 2])] * 6 + [([6, 2], [8, 9, 2])] * 3, 10, 12,
                               special=[0], measure="dice")
    assert dice.targets[dice.indptr[6]:dice.indptr[7]].tolist()[0] == 8


def test_candidates_are_specials_frequent_and_best_ascending() -> None:
    table = toy_table()
    got = table.candidates([6, 2], lexical.ShortlistSettings(first=1, best=1))
    # specials 0-3, the most frequent (2), source 6's best (2 and 8 tie at 1.0: 2), source 2's best
    assert got.tolist() == sorted(set(got.tolist())) and {0, 1, 2, 3} <= set(got.tolist())
    wider = table.candidates([6, 2], lexical.ShortlistSettings(first=1, best=3))
    assert 8 in wider and set(got) <= set(wider)
    none = table.candidates([6], lexical.ShortlistSettings(first=0, best=0))
    assert none.tolist() == [0, 1, 2, 3]
    pruned = table.candidates([6], lexical.ShortlistSettings(first=0, best=3, threshold=1.01))
    assert pruned.tolist() == [0, 1, 2, 3]


def test_gather_masks_the_padded_slots() -> None:
    weight = np.arange(3 * 6, dtype=np.float32).reshape(3, 6)  # (D, V)
    projection = lexical.Projection(weight, np.arange(6, dtype=np.float32))
    candidates = lexical.padded_candidates([np.array([1, 4]), np.array([0, 2, 5])])
    assert candidates.shape == (2, lexical.WIDTH_MULTIPLE)
    columns, bias = projection.gather(candidates)
    assert columns.shape == (2, 3, lexical.WIDTH_MULTIPLE)
    assert np.array_equal(columns[0, :, :2], weight[:, [1, 4]])
    assert np.array_equal(columns[1, :, :3], weight[:, [0, 2, 5]])
    assert not columns[0, :, 2:].any() and not columns[1, :, 3:].any()
    assert bias[0, :2].tolist() == [1, 4] and np.all(np.isneginf(bias[0, 2:]))
    assert bias[1, :3].tolist() == [0, 2, 5] and np.all(np.isneginf(bias[1, 3:]))


def test_top_k_exact_is_a_stable_sort() -> None:
    rng = np.random.default_rng(0)
    x = np.round(rng.standard_normal((50, 70)) * 2).astype(np.float32)  # many ties
    x[3] = 0.0
    x[4, :60] = -np.inf
    for k in (1, 5, 8, 20, 70):
        values, cols = top_k_exact(x, k)
        order = np.argsort(-x, axis=1, kind="stable")[:, :k]
        assert np.array_equal(cols, order)
        assert np.array_equal(values, np.take_along_axis(x, order, axis=1))


def test_candidates_view_maps_columns_to_ids() -> None:
    ids = np.array([[0, 1, 2, 5, 9, -1], [0, 1, 2, 4, -1, -1]])
    view = Candidates(ids, vocab=10)
    log_probs = np.log(np.full((4, 6), 0.25, dtype=np.float32))
    log_probs[:, 5] = -np.inf
    log_probs[2:, 4] = -np.inf
    full = view.expand(log_probs, beams=2)
    assert full.shape == (4, 10)
    assert np.isfinite(full[0, [0, 1, 2, 5, 9]]).all() and np.isneginf(full[0, [3, 4, 6]]).all()
    assert np.isfinite(full[3, [0, 1, 2, 4]]).all() and np.isneginf(full[3, [5, 9]]).all()
    assert view.columns_of([2, 0]).tolist() == [2, 0]
    assert view.columns_of([5]) is None  # column 3 in one source, absent in the other
    assert view.tokens(np.array([3, 4, 3, 0]), beams=2).tolist() == [5, 9, 4, 0]


def test_request_option_is_a_validated_bool() -> None:
    limits = OptionLimits(max_beam_size=8, max_length=64)
    assert DecodingOptions().resolve(None, limits).shortlist is False
    assert DecodingOptions().resolve({"shortlist": True}, limits).shortlist is True
    assert DecodingOptions(shortlist=False).resolve({"shortlist": True}, limits).shortlist is False
    with pytest.raises(InvalidOptions, match="shortlist must be true or false"):
        DecodingOptions(shortlist=1).resolve(None, limits)  # type: ignore[arg-type]


def test_proto_carries_the_option() -> None:
    from seq2serve.protos import translator_pb2 as pb
    from seq2serve.server.api.convert import options_from_pb, options_to_pb

    assert options_from_pb(pb.DecodingOptions()).shortlist is None  # the model's default
    assert options_from_pb(pb.DecodingOptions(shortlist=False)).shortlist is False
    assert options_to_pb({"shortlist": True, "beam_size": 4}).shortlist is True


# -- packages of a tiny model with a shortlist ---------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Training pairs for the table: the fixture corpus, translated to itself."""
    out = tmp_path_factory.mktemp("corpus")
    lines = "\n".join(CORPUS * 3) + "\n"
    (out / "train.src").write_text(lines, encoding="utf-8")
    (out / "train.tgt").write_text(lines, encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return drawn_checkpoint(tmp_path_factory.mktemp("drawn") / "model")[0]


@pytest.fixture(scope="module")
def packages(drawn: Path, corpus: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    """fp32 and int8 with a shortlist (format 8), and the int8 without (format 6).
    Settings small enough that the candidates are a strict subset of the vocabulary."""
    root = tmp_path_factory.mktemp("shortlist")
    settings = lexical.ShortlistSettings(first=8, best=6)
    out = {}
    for precision in ("fp32", "int8"):
        out[precision] = export(drawn, root / precision, precision=precision, progress=False,
                                shortlist_from=corpus, shortlist=settings).package
    out["fp16"] = export(drawn, root / "fp16", precision="fp16", progress=False,
                         shortlist_from=corpus, shortlist=settings).package
    out["int8-plain"] = export(drawn, root / "int8-plain", precision="int8",
                               progress=False).package
    out["fp32-fused"] = export(drawn, root / "fp32-fused", precision="fp32", progress=False,
                               attention="fused", shortlist_from=corpus,
                               shortlist=settings).package
    return out


def sources(engine: Engine, count: int = 12, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    vocab = engine.src_vocab_size
    return [[*rng.integers(4, vocab, size=int(rng.integers(3, 12))).tolist(), engine.eos_id]
            for _ in range(count)]


def test_package_is_format_8_and_keeps_the_full_graphs(packages: dict[str, Path]) -> None:
    for precision in ("fp32", "int8"):
        package = load_package(packages[precision])
        m = package.manifest
        assert m.format_version == 8 and m.attention == "plain"
        assert m.shortlist is not None and (m.shortlist.first, m.shortlist.best) == (8, 6)
        assert {"decoder_shortlist.onnx", "shortlist.npz"} <= set(m.files)
        assert m.generation.shortlist is False
    assert load_package(packages["fp32-fused"]).manifest.fused_attention
    # The full-vocabulary graphs are the ones an export without a shortlist writes.
    for name in ("encoder.onnx", "decoder.onnx", "select.onnx"):
        assert (packages["int8"] / name).read_bytes() == \
            (packages["int8-plain"] / name).read_bytes()
    assert load_package(packages["int8-plain"]).manifest.format_version == 6


def test_manifest_format_and_shortlist_go_together(packages: dict[str, Path],
                                                   tmp_path: Path) -> None:
    for name, change in (("no-shortlist", {"shortlist": None}),
                         ("old-format", {"format_version": 7})):
        copy = tmp_path / name
        shutil.copytree(packages["fp32"], copy)
        data = json.loads((copy / "manifest.json").read_text())
        for key, value in change.items():
            if value is None:
                del data[key]
            else:
                data[key] = value
        (copy / "manifest.json").write_text(json.dumps(data))
        with pytest.raises(PackageError, match="shortlist"):
            load_package(copy)


@pytest.mark.parametrize("precision", ["fp32", "int8", "fp32-fused", "fp16"])
def test_shortlist_log_probs_are_the_full_ones_renormalised(packages: dict[str, Path],
                                                            precision: str) -> None:
    """One step of the runner, full and shortlist decoder on the same rows: over a
    source's candidates the shortlist's log-probs are the full log-probs
    renormalised over them, and every padded slot is -inf (fp16: within its
    rounding, the exporter's tolerance)."""
    engine = Engine(packages[precision], RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    runner = engine.runner
    assert runner.shortlist is not None
    srcs = sources(engine, 3, seed=1)
    width = max(map(len, srcs))
    ids = np.zeros((3, width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, s in enumerate(srcs):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    enc = runner.encode(ids, mask)
    vocab = runner.vocab_size
    rng = np.random.default_rng(2)
    chosen = [np.arange(4), np.unique(rng.choice(vocab, vocab // 2, replace=False)),
              np.unique(rng.choice(vocab, vocab // 5, replace=False))]
    columns = runner.shortlist_columns(chosen, lexical.ShortlistSettings(0, 0))
    # shortlist_columns takes the table's candidates of each *source*: build them by hand.
    candidates = lexical.padded_candidates(chosen)
    weight, bias = runner.shortlist.projection.gather(candidates)
    columns = dataclasses.replace(columns, candidates=candidates,
                                  weight=runner.to_device(weight), bias=runner.to_device(bias))
    short_enc = dataclasses.replace(enc, shortlist=columns)
    tokens = np.array([1, 5, 6, 7, 8, 9], dtype=np.int64)
    positions = np.array([0, 0, 1, 2, 0, 3], dtype=np.int64)
    full_lp, _, full_align = runner.step(tokens, positions, runner.empty_cache(6), enc)
    full_lp, full_align = full_lp.copy(), full_align.copy()
    short_lp, _, short_align = runner.step(tokens, positions, runner.empty_cache(6), short_enc)
    assert short_lp.shape == (6, candidates.shape[1])
    assert np.array_equal(full_align, short_align)
    for row in range(6):
        ids_row = chosen[row // 2]
        want = full_lp[row, ids_row].astype(np.float64)
        want -= np.logaddexp.reduce(want)
        tolerance = 0.05 if precision == "fp16" else 1e-4
        assert np.abs(short_lp[row, :ids_row.size] - want).max() < tolerance
        assert np.all(np.isneginf(short_lp[row, ids_row.size:]))


def test_export_check_finds_a_wrong_projection(packages: dict[str, Path]) -> None:
    """The exporter's verification fails when the table's columns are not the
    decoder's projection."""
    with np.load(packages["fp32"] / "shortlist.npz") as data:
        weight, bias = data["weight"], data["bias"]
    check_shortlist(packages["fp32"], lexical.Projection(weight, bias), 1e-4)
    wrong = lexical.Projection(weight[:, ::-1].copy(), bias)
    with pytest.raises(ValueError, match="deviate"):
        check_shortlist(packages["fp32"], wrong, 1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_turning_it_off_gives_the_full_vocabulary_output_exactly(
        packages: dict[str, Path], beam: int) -> None:
    """shortlist=False on a format 8 package is the format 6 package's output, bit for
    bit; an old package ignores shortlist=True; and with every id a candidate the
    shortlist decodes the same tokens (greedy: the same argmax)."""
    with_table = Engine(packages["int8"], RunnerConfig(provider="cpu", intra_op_threads=1),
                        default_limits())
    old = Engine(packages["int8-plain"], RunnerConfig(provider="cpu", intra_op_threads=1),
                 default_limits())
    assert with_table.has_shortlist and not old.has_shortlist
    assert old.resolve(DecodingOptions(shortlist=True)).shortlist is False
    srcs = sources(with_table)

    def key(engine: Engine, shortlist: bool) -> list[list[tuple[list[int], float | None]]]:
        options = engine.resolve(DecodingOptions(beam_size=beam, num_hypotheses=min(beam, 2),
                                                 max_length=20, shortlist=shortlist))
        return [[(h.token_ids, h.score) for h in r] for r in engine.generate(srcs, options)]

    full = key(old, True)
    assert key(with_table, False) == full
    runner = with_table.runner
    assert runner.shortlist is not None
    everything = dataclasses.replace(runner.shortlist.table,
                                     frequent=np.arange(runner.vocab_size, dtype=np.int32))
    runner.shortlist = dataclasses.replace(runner.shortlist, table=everything,
                                           settings=lexical.ShortlistSettings(10**6, 0))
    over_all = key(with_table, True)
    assert [[t for t, _ in r] for r in over_all] == [[t for t, _ in r] for r in full]
    for got, want in zip(over_all, full, strict=True):
        assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-4)


@pytest.mark.parametrize("precision", ["int8", "fp32"])
@pytest.mark.parametrize("beam", [1, 4])
def test_shortlist_output_is_independent_of_the_batch(packages: dict[str, Path],
                                                      precision: str, beam: int) -> None:
    """Each source's candidates are its own: decoded alone, in shuffled batches of
    sources with more or fewer candidates, and joining a running batch at any
    step, its tokens and scores are the same bits. The candidate sets differ in
    size (the axis is padded to the batch's widest) and are a strict subset."""
    engine = Engine(packages[precision], RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    runner = engine.runner
    assert runner.shortlist is not None
    srcs = sources(engine, 16, seed=3)
    sizes = {runner.shortlist.candidates(s).size for s in srcs}
    assert len(sizes) > 1 and max(sizes) < runner.vocab_size
    options = engine.resolve(DecodingOptions(beam_size=beam, num_hypotheses=min(beam, 2),
                                             max_length=20, shortlist=True))


    alone = [result_key(engine.generate([s], options)[0]) for s in srcs]
    chosen = {t for r in alone for h, _ in r for t in h}
    allowed = set().union(*(runner.shortlist.candidates(s).tolist() for s in srcs))
    assert chosen <= allowed  # never a padded slot, never outside the candidates
    rng = random.Random(beam)
    order = list(range(len(srcs)))
    for _ in range(2):
        rng.shuffle(order)
        for start in range(0, len(order), 5):
            batch = order[start:start + 5]
            got = engine.generate([srcs[i] for i in batch], options)
            assert [result_key(r) for r in got] == [alone[i] for i in batch]
    running = engine.start_batch(beam, shortlist=True)
    assert decode_joining(engine, running, srcs, options, order, rng) == dict(enumerate(alone))


def test_shortlist_and_full_requests_in_one_generate(packages: dict[str, Path]) -> None:
    """Mixed in one call, each request decodes with its own choice, as alone."""
    engine = Engine(packages["int8"], RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    srcs = sources(engine, 6, seed=4)
    on = engine.resolve(DecodingOptions(beam_size=2, max_length=16, shortlist=True))
    off = engine.resolve(DecodingOptions(beam_size=2, max_length=16, shortlist=False))
    mixed = engine.generate(srcs, [on if i % 2 else off for i in range(6)])
    for i, s in enumerate(srcs):
        alone = engine.generate([s], on if i % 2 else off)[0]
        assert mixed[i][0].token_ids == alone[0].token_ids
    with pytest.raises(ValueError, match="cannot join"):
        engine.start_batch(2, shortlist=False).admit([engine.request(0, srcs[0], on)])


@pytest.mark.parametrize("beam", [1, 4])
def test_shortlist_applies_the_models_processors_independently_of_the_batch(
        packages: dict[str, Path], tmp_path: Path, beam: int) -> None:
    """A package whose generation suppresses tokens at the first step, raises EOS
    exponentially and renormalizes (generation keys a Hugging Face folder may set):
    over the shortlist each source decodes as alone in any batch and joining at
    any step, its first token never a begin-suppressed one."""
    plain = Engine(packages["fp32"], RunnerConfig(provider="cpu", intra_op_threads=1),
                   default_limits())
    srcs = sources(plain, 12, seed=5)
    options = DecodingOptions(beam_size=beam, num_hypotheses=min(beam, 2), max_length=20,
                              shortlist=True)
    firsts = [h.token_ids[0] for r in plain.generate(srcs, options) for h in r if h.token_ids]
    banned = sorted(set(firsts), key=firsts.count)[-2:]  # the commonest first tokens
    package = tmp_path / "package"
    shutil.copytree(packages["fp32"], package)
    manifest = json.loads((package / "manifest.json").read_text())
    manifest["generation"].update(begin_suppress_tokens=banned, exponential_decay_start=2,
                                  exponential_decay_factor=1.5, renormalize_logits=True)
    (package / "manifest.json").write_text(json.dumps(manifest))
    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    resolved = engine.resolve(options)
    alone = [result_key(engine.generate([s], resolved)[0]) for s in srcs]
    assert all(not h or h[0] not in banned for r in alone for h, _ in r)
    assert alone != [result_key(r) for r in plain.generate(srcs, options)]
    together = engine.generate(srcs, resolved)
    assert [result_key(r) for r in together] == alone
    rng = random.Random(beam)
    order = list(range(len(srcs)))
    rng.shuffle(order)
    running = engine.start_batch(beam, shortlist=True)
    assert decode_joining(engine, running, srcs, resolved, order, rng) == dict(enumerate(alone))
