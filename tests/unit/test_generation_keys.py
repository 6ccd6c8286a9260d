"""Every GenerationConfig key that changes generate()'s tokens is applied exactly
(a parity test against transformers' generate() on the folder) or refused by name
at export, with --ignore-generation-key to export anyway, which the manifest and
ListModels (gRPC and /v1/models) then say."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import transformers
from conftest import CORPUS, make_marian_dir
from family_checks import check_batch_equals_one_at_a_time, check_joining
from hf_reference import reference_nbest
from serving import RunningServer, free_port, server_config

from seq2serve.export.exporter import export
from seq2serve.model.families.generation_keys import APPLIED, INERT, KNOWN, REFUSED, refused_keys
from seq2serve.model.families.source import SourceError
from seq2serve.model.package.manifest import load_package
from seq2serve.server.assembly import default_limits
from seq2serve.server.client import Seq2ServeClient
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import RunnerConfig

TOL = 1e-4
TEXTS = [*CORPUS, "Save the file.", "The port is in use.", "Tools for the network.",
         "Open the archive and read the documentation.",
         "This package contains Python bindings for reading images.", "A dummy package.",
         "Compressed archives and many formats.",
         "The library could not be started because the file is in use.",
         "Read the file.", "Convert the images.", "The network is in use.",
         "Python tools for the documentation."]


def opus_mt_keys(pad: int, positions: int, eos: int = 0) -> dict[str, Any]:
    """The keys of OPUS-MT's generation_config.json on the hub (Helsinki-NLP/opus-mt-*),
    for a model whose padding is `pad`: max_length is its position count (512 there)."""
    return {"bad_words_ids": [[pad]], "bos_token_id": eos, "decoder_start_token_id": pad,
            "eos_token_id": eos, "forced_eos_token_id": eos, "max_length": positions,
            "num_beams": 4, "pad_token_id": pad, "renormalize_logits": True,
            "transformers_version": "4.27.0.dev0"}


def folder_with(marian_dir: Path, out: Path, **settings: Any) -> Path:
    """A copy of the tiny trained Marian folder whose generation_config.json is
    OPUS-MT's, updated by `settings` (None removes a key)."""
    shutil.copytree(marian_dir, out)
    model = json.loads((out / "config.json").read_text())
    config = {**opus_mt_keys(model["pad_token_id"], model["max_position_embeddings"]),
              **settings}
    (out / "generation_config.json").write_text(
        json.dumps({k: v for k, v in config.items() if v is not None}))
    return out


@dataclass
class Folder:
    hf: Any
    batch: dict[str, torch.Tensor]
    sources: list[list[int]]
    engine: Engine


def exported(path: Path, package: Path, **export_args: Any) -> Folder:
    export(path, package, progress=False, **export_args)
    tok = transformers.MarianTokenizer.from_pretrained(path)
    batch = dict(tok(TEXTS, return_tensors="pt", padding=True))
    sources = [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
               for i in range(len(TEXTS))]
    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    return Folder(transformers.MarianMTModel.from_pretrained(path).eval(), batch, sources,
                  engine)


def same_nbest(folder: Folder, ref: list[list[tuple[list[int], float]]],
               options: DecodingOptions) -> tuple[list[int], float]:
    """(the sources whose n-best tokens differ from `ref`, the largest score
    difference over the others)."""
    got = folder.engine.generate(folder.sources, options)
    differ, diff = [], 0.0
    for i, (r, g) in enumerate(zip(ref, got, strict=True)):
        if [t for t, _ in r] != [h.token_ids for h in g]:
            differ.append(i)
        else:
            diff = max(diff, *(abs(s - float(h.score or 0.0))
                               for (_, s), h in zip(r, g, strict=True)))
    return differ, diff


# -- renormalize_logits: OPUS-MT's own generation_config.json -----------------------------


@pytest.fixture(scope="module")
def opus(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Folder:
    root = tmp_path_factory.mktemp("opus-keys")
    return exported(folder_with(marian_dir, root / "opus-mt-en-de"), root / "package")


@pytest.fixture(scope="module")
def opus_untrained(tmp_path_factory: pytest.TempPathFactory) -> Folder:
    """OPUS-MT's keys on an untrained model, whose padding has real mass: banning it
    and renormalizing reorders beams (generate() with and without the key differ in
    tokens), and outputs run to the length limit."""
    root = tmp_path_factory.mktemp("opus-untrained")
    random_dir = root / "random"
    random_dir.mkdir()
    make_marian_dir(random_dir, seed=1)
    return exported(folder_with(random_dir, root / "opus-mt-en-de"), root / "package")


def test_opus_mt_keys_are_applied_not_ignored(opus: Folder) -> None:
    g = opus.engine.package.manifest.generation
    assert g.renormalize_logits is True and g.ignored_keys is None
    assert (g.beam_size, g.forced_eos_token_id) == (4, 0)


@pytest.mark.parametrize(("beams", "nbest"), [(4, 1), (4, 2), (5, 1), (5, 3)])
@pytest.mark.parametrize("model", ["opus", "opus_untrained"])
def test_renormalized_beams_equal_generate(model: str, beams: int, nbest: int,
                                           request: pytest.FixtureRequest) -> None:
    folder: Folder = request.getfixturevalue(model)
    ref = reference_nbest(folder.hf, folder.batch, num_beams=beams,
                          num_return_sequences=nbest)
    options = DecodingOptions(beam_size=beams, num_hypotheses=nbest, return_scores=True)
    differ, diff = same_nbest(folder, ref, options)
    assert differ == [] and diff <= TOL, (differ, diff)
    # The key matters on these folders: generate() without it scores every beam
    # otherwise, and on the untrained one it ranks some otherwise.
    plain = reference_nbest(folder.hf, folder.batch, num_beams=beams,
                            num_return_sequences=nbest, renormalize_logits=False)
    assert all(abs(s - t) > TOL for p, r in zip(plain, ref, strict=True)
               for (_, s), (_, t) in zip(p, r, strict=True))
    if model == "opus_untrained":
        assert sum([t for t, _ in p] != [t for t, _ in r]
                   for p, r in zip(plain, ref, strict=True)) >= 3


def test_renormalized_greedy_equals_generate(opus: Folder) -> None:
    ref = reference_nbest(opus.hf, opus.batch, num_beams=1)
    differ, diff = same_nbest(opus, ref, DecodingOptions(beam_size=1, return_scores=True))
    assert differ == [] and diff <= TOL, (differ, diff)


def test_renormalized_rows_do_not_depend_on_batch_mates(opus: Folder) -> None:
    check_batch_equals_one_at_a_time(opus.engine, opus.sources, 20, exact=True)
    check_joining(opus.engine, opus.sources[:8], 20, at_steps=(2,))


# -- begin_suppress_tokens and exponential_decay_length_penalty ---------------------------


def first_tokens(folder: Folder) -> list[int]:
    """The tokens generate() starts most outputs with on this folder, most common first."""
    ref = reference_nbest(folder.hf, folder.batch, begin_suppress_tokens=None)
    counts: dict[int, int] = {}
    for (tokens, _), *_ in ref:
        if tokens:
            counts[tokens[0]] = counts.get(tokens[0], 0) + 1
    return sorted(counts, key=lambda t: -counts[t])


@pytest.fixture(scope="module")
def begin_suppress(marian_dir: Path, opus: Folder, tmp_path_factory: pytest.TempPathFactory
                   ) -> tuple[Folder, list[int]]:
    """OPUS-MT's keys plus begin_suppress_tokens: the two tokens generate() most often
    starts with here, so the suppression changes outputs."""
    banned = first_tokens(opus)[:2]
    root = tmp_path_factory.mktemp("begin-suppress")
    folder = folder_with(marian_dir, root / "opus-mt-en-de", begin_suppress_tokens=banned)
    return exported(folder, root / "package"), banned


@pytest.mark.parametrize("case", ["beam4", "beam4_nbest2", "greedy", "forced_bos_beam4"])
def test_begin_suppress_tokens_equal_generate(begin_suppress: tuple[Folder, list[int]],
                                              case: str) -> None:
    folder, banned = begin_suppress
    beams = 1 if case == "greedy" else 4
    nbest = 2 if case.endswith("nbest2") else 1
    forced = {"forced_bos_token_id": 5} if case.startswith("forced_bos") else {}
    assert folder.engine.package.manifest.generation.begin_suppress_tokens == tuple(
        sorted(banned))
    ref = reference_nbest(folder.hf, folder.batch, num_beams=beams, num_return_sequences=nbest,
                          **forced)
    options = DecodingOptions(beam_size=beams, num_hypotheses=nbest, return_scores=True)
    if forced:  # a request's forced first token, as a multilingual target language
        got = folder.engine.generate(folder.sources, options,
                                     forced_bos=[5] * len(folder.sources))
    else:
        got = folder.engine.generate(folder.sources, options)
    assert [[h.token_ids for h in r] for r in got] == [[t for t, _ in r] for r in ref]
    assert max(abs(float(h.score or 0.0) - s) for r, g in zip(ref, got, strict=True)
               for (_, s), h in zip(r, g, strict=True)) <= TOL
    # After a forced BOS the second token is the one suppressed, as in generate().
    at = 1 if forced else 0
    assert all(len(h.token_ids) <= at or h.token_ids[at] not in banned for r in got for h in r)


@pytest.fixture(scope="module")
def decay(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Folder:
    root = tmp_path_factory.mktemp("decay")
    folder = folder_with(marian_dir, root / "opus-mt-en-de",
                         exponential_decay_length_penalty=[3, 1.6])
    return exported(folder, root / "package")


@pytest.mark.parametrize(("beams", "nbest"), [(4, 1), (5, 2)])
def test_exponential_decay_equals_generate(decay: Folder, beams: int, nbest: int) -> None:
    g = decay.engine.package.manifest.generation
    assert (g.exponential_decay_start, g.exponential_decay_factor) == (3, 1.6)
    ref = reference_nbest(decay.hf, decay.batch, num_beams=beams, num_return_sequences=nbest)
    differ, diff = same_nbest(decay, ref, DecodingOptions(beam_size=beams,
                                                          num_hypotheses=nbest,
                                                          return_scores=True))
    assert differ == [] and diff <= TOL, (differ, diff)
    plain = reference_nbest(decay.hf, decay.batch, num_beams=beams, num_return_sequences=nbest,
                            exponential_decay_length_penalty=None)
    assert plain != ref  # the key shortens some outputs here


@pytest.fixture(scope="module")
def source_ngrams(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Folder:
    root = tmp_path_factory.mktemp("encoder-ngrams")
    folder = folder_with(marian_dir, root / "opus-mt-en-de", encoder_no_repeat_ngram_size=2)
    return exported(folder, root / "package")


@pytest.mark.parametrize(("beams", "nbest"), [(1, 1), (4, 1), (5, 2)])
def test_encoder_no_repeat_ngram_size_equals_generate(source_ngrams: Folder, beams: int,
                                                      nbest: int) -> None:
    """The tiny model learned to copy: banning its sources' bigrams changes every
    output, and each equals generate()'s (whose padded batch adds n-grams of padding,
    a bad word here as in OPUS-MT)."""
    folder = source_ngrams
    assert folder.engine.package.manifest.generation.encoder_no_repeat_ngram_size == 2
    ref = reference_nbest(folder.hf, folder.batch, num_beams=beams, num_return_sequences=nbest)
    differ, diff = same_nbest(folder, ref, DecodingOptions(beam_size=beams,
                                                           num_hypotheses=nbest,
                                                           return_scores=True))
    assert differ == [] and diff <= TOL, (differ, diff)
    plain = reference_nbest(folder.hf, folder.batch, num_beams=beams,
                            num_return_sequences=nbest, encoder_no_repeat_ngram_size=0)
    assert sum([t for t, _ in p] != [t for t, _ in r]
               for p, r in zip(plain, ref, strict=True)) >= len(TEXTS) // 2


def test_source_ngrams_do_not_depend_on_batch_mates(source_ngrams: Folder) -> None:
    check_batch_equals_one_at_a_time(source_ngrams.engine, source_ngrams.sources, 20,
                                     exact=True)
    check_joining(source_ngrams.engine, source_ngrams.sources[:8], 20, at_steps=(2,))


# -- refused keys -----------------------------------------------------------------------

REFUSED_VALUES: dict[str, dict[str, Any]] = {
    "max_time": {"max_time": 2.0},
    "stop_strings": {"stop_strings": ["."]},
    "sequence_bias": {"sequence_bias": [[[5], 2.0]]},
    "encoder_repetition_penalty": {"encoder_repetition_penalty": 1.3},
    "encoder_no_repeat_ngram_size": {"encoder_no_repeat_ngram_size": "3"},
    "remove_invalid_values": {"remove_invalid_values": True},
    "guidance_scale": {"guidance_scale": 1.5},
    "watermarking_config": {"watermarking_config": {"greenlist_ratio": 0.25}},
    "num_beam_groups": {"num_beam_groups": 2, "diversity_penalty": 0.5},
    "constraints": {"constraints": [[5]]},
    "force_words_ids": {"force_words_ids": [[5]]},
    "penalty_alpha": {"penalty_alpha": 0.6, "num_beams": 1, "top_k": 4},
    "dola_layers": {"dola_layers": "high"},
    "low_memory": {"low_memory": True},
    "token_healing": {"token_healing": True},
    "use_mtp": {"use_mtp": True},
    "assistant_ensemble_weight": {"assistant_ensemble_weight": 0.5},
    "speculation_type": {"speculation_type": "dflash"},
    "do_sample": {"do_sample": True},  # with num_beams 4: beam sampling
    "repetition_penalty": {"repetition_penalty": 1.2, "num_beams": 1},
    "exponential_decay_length_penalty": {"exponential_decay_length_penalty": [3, 1.5],
                                         "num_beams": 1},
    "begin_suppress_tokens": {"begin_suppress_tokens": "5"},
    "min_p": {"do_sample": True, "num_beams": 1, "min_p": 0.1},
    "top_h": {"do_sample": True, "num_beams": 1, "top_h": 0.4},
    "typical_p": {"do_sample": True, "num_beams": 1, "typical_p": 0.9},
    "epsilon_cutoff": {"do_sample": True, "num_beams": 1, "epsilon_cutoff": 3e-4},
    "eta_cutoff": {"do_sample": True, "num_beams": 1, "eta_cutoff": 3e-4},
    "decoder_start_token_id": {"decoder_start_token_id": 3},
    "bos_token_id": {"decoder_start_token_id": None, "bos_token_id": 3},
    "eos_token_id": {"eos_token_id": [0, 3]},
    "not_a_key": {"not_a_key": 1},
}


def test_every_refused_key_has_a_case() -> None:
    assert set(REFUSED) <= set(REFUSED_VALUES)
    assert not set(APPLIED) & INERT and not (set(REFUSED) - set(APPLIED)) & INERT


@pytest.mark.parametrize("key", sorted(REFUSED_VALUES))
def test_export_names_each_refused_key(marian_dir: Path, tmp_path: Path, key: str) -> None:
    folder = folder_with(marian_dir, tmp_path / "opus-mt-en-de", **REFUSED_VALUES[key])
    with pytest.raises(SourceError) as info:
        export(folder, tmp_path / "package", progress=False)
    named = [p for p in info.value.problems if f"--ignore-generation-key {key})" in p]
    assert len(named) == 1 and named[0].startswith(f"generation settings: {key}"), \
        info.value.problems
    assert not (tmp_path / "package").exists()


def test_transformers_defaults_refuse_nothing() -> None:
    """Every key of a GenerationConfig at transformers' defaults, and the no-op values
    the hub's files carry (renormalize_logits false, one beam group, no diversity,
    sampling cut-offs without do_sample), is known and refused by none."""
    config = transformers.GenerationConfig(decoder_start_token_id=7, eos_token_id=0)
    everything = {**config.to_dict(), **config._get_default_generation_params()}
    assert set(everything) - KNOWN == set()
    assert refused_keys(everything, 7, 0) == {}
    noop = {"renormalize_logits": False, "num_beam_groups": 1, "diversity_penalty": 0.0,
            "encoder_no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
            "repetition_penalty": 1.0, "remove_invalid_values": False, "guidance_scale": 1.0,
            "do_sample": False, "temperature": 0.7, "top_k": 5, "typical_p": 0.5,
            "min_p": 0.1, "epsilon_cutoff": 0.1, "eta_cutoff": 0.1, "top_h": 0.3,
            "num_beams": 4, "sequence_bias": None, "max_time": None, "low_memory": False,
            "decoder_start_token_id": 7, "eos_token_id": [0], "forced_decoder_ids": None}
    assert refused_keys(noop, 7, 0) == {}


def test_an_unknown_flag_key_is_an_error(marian_dir: Path, tmp_path: Path) -> None:
    folder = folder_with(marian_dir, tmp_path / "opus-mt-en-de")
    with pytest.raises(SourceError) as info:
        export(folder, tmp_path / "package", progress=False,
               ignore_generation_keys=["renormalise_logits"])
    assert info.value.problems == ["--ignore-generation-key renormalise_logits: not a key of "
                                   "transformers' GenerationConfig"]


# -- exported anyway: the manifest and ListModels say so --------------------------------

IGNORED = ("num_beam_groups", "sequence_bias")


@pytest.fixture(scope="module")
def ignored_package(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ignored")
    folder = folder_with(marian_dir, root / "opus-mt-en-de", sequence_bias=[[[5], 2.0]],
                         num_beam_groups=2, diversity_penalty=0.5)
    models = root / "models"
    export(folder, models / "keys-ignored", name="keys-ignored", progress=False,
           ignore_generation_keys=IGNORED)
    return models


def test_ignored_keys_are_in_the_manifest(ignored_package: Path) -> None:
    g = load_package(ignored_package / "keys-ignored").manifest.generation
    assert g.ignored_keys == IGNORED
    assert g.renormalize_logits is True  # the applied keys still are


def test_an_ignored_key_is_not_applied(marian_dir: Path, tmp_path: Path) -> None:
    """repetition_penalty with one beam is refused (generate() penalises raw logits
    there); ignored, the package applies none rather than its own approximation."""
    folder = folder_with(marian_dir, tmp_path / "m", repetition_penalty=1.3, num_beams=1)
    export(folder, tmp_path / "package", progress=False,
           ignore_generation_keys=["repetition_penalty"])
    g = load_package(tmp_path / "package").manifest.generation
    assert (g.ignored_keys, g.repetition_penalty) == (("repetition_penalty",), None)


@pytest.fixture(scope="module")
def server(ignored_package: Path, models_dir: Path) -> Iterator[RunningServer]:
    """The package exported with ignored keys served beside one without."""
    shutil.copytree(models_dir / "tiny-en-de", ignored_package / "tiny-en-de")
    running = RunningServer(server_config(ignored_package, http_port=free_port()))
    yield running
    running.stop()


def test_list_models_says_which_keys_were_ignored(server: RunningServer) -> None:
    with Seq2ServeClient(server.target) as client:
        by_name = {m.name: m for m in client.list_models()}
    assert by_name["keys-ignored"].ignored_generation_keys == IGNORED
    assert by_name["opus-mt-en-de"].ignored_generation_keys == ()
    assert server.http_url is not None
    listed = httpx.get(f"{server.http_url}/v1/models", timeout=60).json()
    keys = {m["name"]: m.get("ignoredGenerationKeys", m.get("ignored_generation_keys"))
            for m in listed["models"]}
    assert keys == {"keys-ignored": list(IGNORED), "opus-mt-en-de": None}


# -- the processors on tiny arrays, against transformers' own ----------------------------


def test_processors_equal_transformers_own() -> None:
    """renormalize (from the changed columns), raise_eos_after and begin suppression
    against LogitNormalization, ExponentialDecayLengthPenalty and
    SuppressTokensAtBeginLogitsProcessor, after a bad word and a min length."""
    import numpy as np
    from transformers.generation import logits_process as lp

    from seq2serve.server.engine.decoding import NEG_INF, Processing, process_without_history

    g = torch.Generator().manual_seed(0)
    scores = (3 * torch.randn(6, 11, generator=g)).log_softmax(-1)  # the decoder's output
    min_length = np.asarray([0, 10, 0, 0, 0, 0])  # EOS banned in row 1
    for generated in range(6):
        ids = torch.zeros(6, generated + 1, dtype=torch.long)  # start + generated tokens
        want = lp.NoBadWordsLogitsProcessor([[3]], 0)(ids, scores.clone())
        want[1, 0] = -float("inf")  # MinLengthLogitsProcessor for row 1 only
        want = lp.ExponentialDecayLengthPenalty((2, 1.7), 0, 1)(ids, want)
        want = lp.SuppressTokensAtBeginLogitsProcessor([4, 7], 1)(ids, want)
        want = lp.LogitNormalization()(ids, want)
        p = Processing(0, (), min_length, np.ones(6, dtype=np.float32),
                       np.zeros(6, dtype=np.int64), bad_words=((3,),), begin_suppress=(4, 7),
                       decay_start=2, decay_factor=1.7, renormalize=True)
        got = process_without_history(scores.numpy().copy(), np.full(6, generated), 1, p)
        assert np.array_equal(np.isinf(got), torch.isinf(want).numpy()), generated
        finite = np.isfinite(got)
        assert np.allclose(got[finite], want.numpy()[finite], atol=1e-6), generated
        assert (got[:, 4] == NEG_INF).all() == (generated == 0)


def test_renormalizing_from_the_changed_columns_equals_a_full_log_softmax() -> None:
    """Rows whose banned token held 99.9% of the mass or a little; a forced
    row: each as torch's log_softmax of the processed row."""
    import numpy as np

    from seq2serve.server.engine.decoding import renormalize_from

    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    logits[0, 2] = 12.0  # nearly all the mass
    rows = logits.log_softmax(-1).float()
    processed = rows.clone()
    processed[:3, 2] = -float("inf")
    processed[3] = -float("inf")
    processed[3, 5] = 0.0  # forced
    columns = np.asarray([2])
    got = renormalize_from(processed.numpy().copy(), columns, rows.numpy()[:, columns],
                           np.asarray([False, False, False, True]))
    want = processed.log_softmax(-1).numpy()
    assert np.array_equal(np.isinf(got), np.isinf(want))
    assert np.allclose(got[np.isfinite(got)], want[np.isfinite(want)], atol=2e-6)


def test_the_flag_is_repeatable_on_the_command_line() -> None:
    import argparse

    from seq2serve.export.exporter import configure

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["in", "out", "--ignore-generation-key", "num_beam_groups",
                              "--ignore-generation-key", "sequence_bias"])
    assert args.ignore_generation_keys == ["num_beam_groups", "sequence_bias"]
    assert parser.parse_args(["in", "out"]).ignore_generation_keys == []
