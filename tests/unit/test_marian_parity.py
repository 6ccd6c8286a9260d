"""bart.load_bart(layout=MARIAN) against transformers' MarianMTModel on tiny random
checkpoints, and the loader's error reporting."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import family_checks
import pytest
import torch
import transformers
from conftest import CORPUS
from hf_reference import reference_nbest
from safetensors.torch import load_file, save_file
from torch import Tensor

from seq2serve.export.exporter import export
from seq2serve.model.families.bart import convert_bart, load_bart
from seq2serve.model.families.generation import generation_from_hf
from seq2serve.model.families.hf import ConversionError
from seq2serve.model.families.marian import MARIAN, load_source
from seq2serve.model.families.source import SourceError
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.engine import Engine, Result
from seq2serve.server.engine.runner import RunnerConfig

TOL = 1e-4
VOCAB, PAD, EOS = 41, 40, 0

CASES = {
    "shared_tied_swish": dict(activation_function="swish", scale_embedding=True),
    "separate_vocab_gelu": dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=33,
                                pad_token_id=32, decoder_start_token_id=32,
                                activation_function="gelu", scale_embedding=False,
                                encoder_layers=1, decoder_layers=3, encoder_attention_heads=4,
                                decoder_attention_heads=2, encoder_ffn_dim=40),
    "untied_relu": dict(tie_word_embeddings=False, activation_function="relu",
                        scale_embedding=True, decoder_ffn_dim=16, decoder_attention_heads=1),
    "separate_untied_gelu_new": dict(share_encoder_decoder_embeddings=False,
                                     tie_word_embeddings=False, decoder_vocab_size=37,
                                     pad_token_id=36, decoder_start_token_id=36,
                                     activation_function="gelu_new", encoder_layers=3,
                                     decoder_layers=1),
}


def hf_model(seed: int = 0, **overrides: object) -> transformers.MarianMTModel:
    """A tiny random MarianMTModel in which every weight matters (HF initialises
    biases to zero and LayerNorms to identity, which would hide mapping errors)."""
    args = dict(vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=32,
                decoder_ffn_dim=24, max_position_embeddings=64, pad_token_id=PAD,
                decoder_start_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
                dropout=0.1, attn_implementation="eager")
    args.update(overrides)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(transformers.MarianConfig(**args)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.add_(0.1 * torch.randn_like(p))
        model.final_logits_bias.normal_()
    return model


def inputs(model: transformers.MarianMTModel, seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """A right-padded source batch (lengths 9, 6, 2) and decoder inputs whose last
    row ends in padding, as teacher forcing of a shorter target gives."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, cfg.vocab_size - 1, (3, 9), generator=g)
    mask = (torch.arange(9)[None, :] < torch.tensor([[9], [6], [2]])).long()
    src = src.masked_fill(mask == 0, cfg.pad_token_id)
    tgt = torch.randint(1, cfg.decoder_vocab_size - 1, (3, 6), generator=g)
    tgt[:, 0] = cfg.decoder_start_token_id
    tgt[2, 4:] = cfg.pad_token_id
    return src, mask, tgt


def assert_parity(hf: transformers.MarianMTModel, path: Path) -> dict[str, float]:
    return family_checks.assert_parity(hf, load_bart(path, layout=MARIAN), *inputs(hf), TOL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_safetensors_parity(case: str, tmp_path: Path) -> None:
    hf = hf_model(seed=len(case), **CASES[case])
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert_parity(hf, tmp_path)
    cfg, _ = convert_bart(tmp_path, MARIAN)
    assert cfg.position_layout == "split" and not cfg.pre_norm and cfg.final_logits_bias
    assert cfg.decoder_start_id == cfg.pad_id == hf.config.pad_token_id
    assert cfg.tgt_vocab_size == hf.config.decoder_vocab_size


def test_all_zero_final_logits_bias_is_dropped(tmp_path: Path) -> None:
    """OPUS-MT's final_logits_bias is all zeros: the model gets none (no pass over the
    logits every step) and its logits still match transformers'."""
    hf = hf_model(seed=5)
    with torch.no_grad():
        hf.final_logits_bias.zero_()
    hf.save_pretrained(tmp_path)
    assert_parity(hf, tmp_path)
    cfg, state = convert_bart(tmp_path, MARIAN)
    assert not cfg.final_logits_bias and "final_logits_bias" not in state
    assert load_bart(tmp_path, layout=MARIAN).final_logits_bias is None


def test_ties_follow_the_stored_tensors(tmp_path: Path) -> None:
    hf = hf_model(**CASES["separate_vocab_gelu"])
    hf.save_pretrained(tmp_path)
    model = load_bart(tmp_path, layout=MARIAN)
    assert not model.cfg.share_embeddings and model.cfg.tie_output
    assert model.output.weight is model.tgt_embed.weight


def test_pytorch_bin_with_every_key(tmp_path: Path) -> None:
    """Old checkpoints: pytorch_model.bin with tied duplicates and position tables."""
    hf = hf_model(seed=7, activation_function="swish", scale_embedding=True)
    hf.config.save_pretrained(tmp_path)
    state = hf.state_dict()
    assert "model.encoder.embed_positions.weight" in state
    torch.save({k: v.clone() for k, v in state.items()}, tmp_path / "pytorch_model.bin")
    assert not (tmp_path / "model.safetensors").exists()
    assert_parity(hf, tmp_path)


@torch.no_grad()
def test_greedy_tokens_match_generate(tmp_path: Path) -> None:
    hf = hf_model(seed=3, activation_function="swish", scale_embedding=True)
    hf.save_pretrained(tmp_path)
    ours = load_bart(tmp_path, layout=MARIAN)
    src, mask, _ = inputs(hf)
    expected = hf.generate(input_ids=src, attention_mask=mask, max_new_tokens=8, num_beams=1,
                           do_sample=False, min_length=0, forced_eos_token_id=None,
                           bad_words_ids=None)
    got = ours.greedy(src, mask, max_len=8)
    assert torch.equal(got, expected[:, 1:]), (got, expected)


# -- error reporting ---------------------------------------------------------------


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    hf_model().save_pretrained(tmp_path)
    return tmp_path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConversionError) as info:
        load_bart(path, layout=MARIAN)
    assert isinstance(info.value, ValueError)
    for p in info.value.problems:
        assert p in str(info.value)
    return info.value.problems


def edit_config(path: Path, **changes: object) -> None:
    file = path / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def test_truncated_safetensors(saved: Path) -> None:
    file = saved / "model.safetensors"
    file.write_bytes(file.read_bytes()[:200])
    (problem,) = problems_of(saved)
    assert "model.safetensors cannot be read" in problem


def test_missing_files(saved: Path) -> None:
    (saved / "config.json").unlink()
    (saved / "model.safetensors").unlink()
    problems = problems_of(saved)
    assert any("config.json not found" in p for p in problems)
    assert any("no weights" in p for p in problems)
    assert len(problems) == 2


def test_unknown_model_type(saved: Path) -> None:
    edit_config(saved, model_type="bart")
    assert any("model_type must be 'marian', got 'bart'" in p for p in problems_of(saved))


def test_misshaped_tensor(saved: Path) -> None:
    state = load_file(saved / "model.safetensors")
    name = "model.decoder.layers.1.fc1.weight"
    state[name] = torch.zeros(24, 15)
    save_file(state, saved / "model.safetensors")
    (problem,) = problems_of(saved)
    assert name in problem and "(24, 15)" in problem and "(24, 16)" in problem


def test_config_problems_are_listed_together(saved: Path) -> None:
    edit_config(saved, model_type="bart", activation_function="tanh", normalize_before=True,
                add_final_layer_norm=True, static_position_embeddings=False,
                encoder_attention_heads=3, eos_token_id=[0, 5])
    (saved / "model.safetensors").write_bytes(b"not a safetensors file")
    problems = problems_of(saved)
    for fragment in ("model_type", "activation_function", "normalize_before",
                     "add_final_layer_norm", "static_position_embeddings",
                     "divisible by encoder_heads", "eos_token_id", "model.safetensors"):
        assert sum(fragment in p for p in problems) == 1, (fragment, problems)


def test_weight_problems_are_listed_together(saved: Path) -> None:
    state = load_file(saved / "model.safetensors")
    del state["model.encoder.layers.0.fc2.bias"]
    state["model.encoder.layers.0.self_attn.q_proj.weight"] = torch.zeros(16, 8)
    state["model.encoder.layers.2.fc1.weight"] = torch.zeros(32, 16)  # a third layer
    state["model.decoder.embed_positions.weight"] = torch.randn(64, 16)  # learned positions
    save_file(state, saved / "model.safetensors")
    problems = problems_of(saved)
    for fragment in ("missing tensor model.encoder.layers.0.fc2.bias",
                     "model.encoder.layers.0.self_attn.q_proj.weight has shape (16, 8)",
                     "unexpected tensors (layer counts or architecture differ?): "
                     "model.encoder.layers.2.fc1.weight",
                     "learned positions are not supported"):
        assert any(fragment in p for p in problems), (fragment, problems)
    assert len(problems) == 4


# -- generate() under the folder's own generation_config ------------------------------
# The package's defaults say what generate() does with the folder's
# generation_config.json (families/generation.py), and the engine applies them as
# generate() does: max_length / min_length counting the start token, forced BOS at
# the first new token, forced EOS at the last one the limit allows, bad words.

PARITY_TEXTS = [*CORPUS, "Save the file.", "The port is in use.",
                "Tools for the network.", "Open the archive and read the documentation.",
                "This package contains Python bindings for reading images.",
                "A dummy package.", "Compressed archives and many formats.",
                "The library could not be started because the file is in use."]
PARITY_GENERATION = {"max_length": 12, "min_length": 4, "num_beams": 4,
                     "forced_eos_token_id": 0}  # EOS: OPUS-MT's


def _folder_with(marian_dir: Path, out: Path, **settings: object) -> Path:
    """A copy of the trained tiny Marian folder whose generation_config.json also
    sets `settings` (None removes a key)."""
    shutil.copytree(marian_dir, out)
    file = out / "generation_config.json"
    config = {**json.loads(file.read_text()), **settings}
    file.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return out


@dataclass
class Folder:
    hf: transformers.MarianMTModel
    batch: dict[str, Tensor]
    sources: list[list[int]]
    engine: Engine


def _folder(path: Path, package: Path) -> Folder:
    export(path, package, progress=False)
    tok = transformers.MarianTokenizer.from_pretrained(path)
    batch = dict(tok(PARITY_TEXTS, return_tensors="pt", padding=True))
    sources = [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
               for i in range(len(PARITY_TEXTS))]
    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    return Folder(transformers.MarianMTModel.from_pretrained(path).eval(), batch, sources,
                  engine)


@pytest.fixture(scope="module")
def forced_eos(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Folder:
    root = tmp_path_factory.mktemp("forced-eos")
    return _folder(_folder_with(marian_dir, root / "opus-mt-en-de", **PARITY_GENERATION),
                   root / "package")


@pytest.fixture(scope="module")
def forced_bos(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Folder:
    """Marian does not force a BOS; mBART, M2M100 and NLLB force the target
    language this way. Token 5: an ordinary piece, so the forcing shows."""
    root = tmp_path_factory.mktemp("forced-bos")
    return _folder(_folder_with(marian_dir, root / "opus-mt-en-de", forced_bos_token_id=5,
                                **PARITY_GENERATION), root / "package")


def generate_nbest(folder: Folder, **overrides: object) -> list[list[tuple[list[int], float]]]:
    return reference_nbest(folder.hf, folder.batch, **overrides)


def compare(ref: list[list[tuple[list[int], float]]], got: Sequence[Result]
            ) -> tuple[int, float]:
    """(sources whose n-best tokens are identical, max score difference over them)."""
    same, diff = 0, 0.0
    for r, g in zip(ref, got, strict=True):
        if [t for t, _ in r] == [h.token_ids for h in g]:
            same += 1
            diff = max(diff, *(abs(s - float(h.score or 0.0)) for (_, s), h in
                               zip(r, g, strict=True)))
    return same, diff


GENERATE_CASES = {  # generate()'s overrides, the request's options
    "defaults_beam4": ({}, {}),
    "greedy": ({"num_beams": 1}, {"beam_size": 1}),
    "beam4_nbest2": ({"num_return_sequences": 2}, {"num_hypotheses": 2}),
}


def test_package_defaults_follow_generation_config(forced_eos: Folder,
                                                   forced_bos: Folder) -> None:
    manifest = forced_eos.engine.package.manifest
    g = manifest.generation
    pad = manifest.special_tokens.pad
    # max_length 12 and min_length 4 count the start token: 11 and 3 new tokens.
    assert (g.beam_size, g.max_length, g.min_length, g.max_length_ratio) == (4, 11, 3, 0.0)
    assert (g.forced_bos_token_id, g.forced_eos_token_id, g.bad_words_ids) == (
        None, 0, ((pad,),))
    assert manifest.special_tokens.suppress == ()  # generate() bans padding as a bad word
    assert forced_bos.engine.package.manifest.generation.forced_bos_token_id == 5


@pytest.mark.parametrize("case", list(GENERATE_CASES))
@pytest.mark.parametrize("forced", ["forced_eos", "forced_bos"])
def test_engine_equals_generate_under_the_folders_config(
        case: str, forced: str, request: pytest.FixtureRequest) -> None:
    folder: Folder = request.getfixturevalue(forced)
    overrides, options = GENERATE_CASES[case]
    ref = generate_nbest(folder, **overrides)
    got = folder.engine.generate(folder.sources, DecodingOptions(**options))
    same, diff = compare(ref, got)
    assert (same, len(ref)) == (16, 16), [(r, [h.token_ids for h in g])
                                          for r, g in zip(ref, got, strict=True)]
    assert diff <= TOL, diff
    # The limit binds: some outputs got the forced EOS as their 11th token.
    assert any(len(h.token_ids) == 10 and h.finish_reason == "eos" for r in got for h in r)
    if forced == "forced_bos":
        assert all(h.token_ids[0] == 5 for r in got for h in r)


def test_forced_eos_follows_each_sources_own_limit(forced_eos: Folder) -> None:
    """Sources with different limits (a request's max_length, or the ratio for its
    length) in one batch: each gets its forced EOS at its own last token, exactly
    as alone and as generate() with that max_new_tokens."""
    engine, sources = forced_eos.engine, forced_eos.sources
    options = [DecodingOptions(max_length=4 + i % 5, num_hypotheses=2) if i % 3 else
               DecodingOptions(max_length=11, max_length_ratio=0.5, num_hypotheses=2)
               for i in range(len(sources))]
    together = engine.generate(sources, options)
    for i, (src, opt, result) in enumerate(zip(sources, options, together, strict=True)):
        alone = engine.generate([src], opt)[0]
        assert [(h.token_ids, h.score) for h in alone] == \
            [(h.token_ids, h.score) for h in result]
        limit = engine.resolve(opt).max_new_tokens(len(src))
        one = Folder(forced_eos.hf, {k: v[i:i + 1] for k, v in forced_eos.batch.items()},
                     [src], engine)
        ref = generate_nbest(one, max_new_tokens=limit, num_return_sequences=2)
        assert compare(ref, [result]) == (1, pytest.approx(0.0, abs=TOL)), (i, ref, result)
        assert all(len(h.token_ids) < limit and h.finish_reason == "eos" for h in result)


@pytest.mark.parametrize("beams", [1, 4])
def test_forced_tokens_joining_mid_batch_equal_alone(forced_bos: Folder, beams: int) -> None:
    """Sources with limits of their own join a running batch at different steps:
    each gets its forced BOS first and its forced EOS at its own limit, bit for bit
    as alone (a row's tokens never depend on its batch-mates or its join step)."""
    engine, sources = forced_bos.engine, forced_bos.sources
    resolved = [engine.resolve(DecodingOptions(
        beam_size=beams, num_hypotheses=min(2, beams), max_length=3 + i % 9,
        max_length_ratio=0.4 if i % 4 == 0 else 0.0)) for i in range(len(sources))]
    alone = [[(h.token_ids, h.score) for h in engine.generate([s], o)[0]]
             for s, o in zip(sources, resolved, strict=True)]
    assert all(h[0][0] == 5 for a in alone for h in a)
    half = len(sources) // 2
    for at_step in (0, 2, 5):
        batch = engine.start_batch(beams)
        batch.admit([engine.request(i, sources[i], resolved[i]) for i in range(half)])
        results: dict[int, Result] = {}
        for _ in range(at_step):
            results.update(batch.step().finished)
        batch.admit([engine.request(i, sources[i], resolved[i])
                     for i in range(half, len(sources))])
        while batch.rows:
            results.update(batch.step().finished)
        assert {i: [(h.token_ids, h.score) for h in r] for i, r in results.items()} == \
            dict(enumerate(alone)), at_step


def test_generation_from_hf_counts_as_generate_does() -> None:
    g = generation_from_hf({"max_length": 12, "min_length": 4, "num_beams": 4,
                            "eos_token_id": 0, "bad_words_ids": [[0], [7], [3, 4]],
                            "forced_eos_token_id": 0, "length_penalty": 0.6,
                            "no_repeat_ngram_size": 3, "early_stopping": True}, 64)
    assert (g.max_length, g.min_length, g.max_length_ratio, g.beam_size) == (11, 3, 0.0, 4)
    assert (g.length_penalty, g.no_repeat_ngram_size, g.early_stopping) == (0.6, 3, True)
    # A one-token bad word that is EOS is dropped, as NoBadWordsLogitsProcessor does.
    assert (g.forced_eos_token_id, g.bad_words_ids) == (0, ((7,), (3, 4)))
    # max_new_tokens / min_new_tokens take precedence and count new tokens.
    g = generation_from_hf({"max_length": 12, "max_new_tokens": 5, "min_length": 4,
                            "min_new_tokens": 2}, 64)
    assert (g.max_length, g.min_length) == (5, 2)
    # Nothing set: generate()'s defaults (greedy, and 20 new tokens: see below); a
    # limit past the positions is the positions'.
    g = generation_from_hf({}, 64)
    assert (g.beam_size, g.max_length, g.min_length, g.early_stopping, g.length_penalty,
            g.forced_bos_token_id, g.forced_eos_token_id, g.bad_words_ids) == (
        1, 20, 0, False, 1.0, None, None, None)
    assert generation_from_hf({}, 16).max_length == 15  # start + new <= positions
    assert generation_from_hf({"max_length": 512}, 64).max_length == 64


@torch.no_grad()
def test_generates_default_length_is_20_new_tokens() -> None:
    """transformers 5.24: with max_length set nowhere, generate() makes 20 new
    tokens (its default max_length 20 plus the start token), not 19."""
    hf = hf_model(seed=4)
    hf.generation_config.forced_eos_token_id = None
    assert hf.generation_config.max_length is None
    src, mask, _ = inputs(hf)
    out = hf.generate(input_ids=src, attention_mask=mask, num_beams=1, do_sample=False,
                      suppress_tokens=[EOS])  # no EOS: the limit ends every row
    assert out.shape[1] == 1 + 20 == 1 + generation_from_hf({}, 64).max_length


def test_generation_config_problems_are_listed(marian_dir: Path, tmp_path: Path) -> None:
    folder = _folder_with(marian_dir, tmp_path / "m", decoder_start_token_id=3)
    with pytest.raises(SourceError) as info:
        load_source(folder)
    assert any("decoder_start_token_id 3 differs" in p for p in info.value.problems)
    (folder / "generation_config.json").write_text("{not json")
    with pytest.raises(SourceError) as info:
        load_source(folder)
    assert any("generation_config.json: not valid JSON" in p for p in info.value.problems)
    # Without one, generate() reads config.json's keys (forced_eos_token_id 0 here).
    (folder / "generation_config.json").unlink()
    g = load_source(folder).generation
    assert (g.forced_eos_token_id, g.beam_size, g.max_length, g.bad_words_ids) == (0, 1, 20, None)
