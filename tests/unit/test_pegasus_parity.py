"""Pegasus (issue 45): bart.load_bart(layout=PEGASUS) against transformers'
PegasusForConditionalGeneration on a tiny random checkpoint with its own SentencePiece
unigram tokenizer (trained here, loaded by PegasusTokenizer with its offset of 103 and
saved as tokenizer.json), the export at fp32, int8 and fp16, the engine against
generate() token for token, the package's tokenizer.json against PegasusTokenizer, and
a served summarize request.

generate() runs under the folder's own generation settings (PegasusConfig's forced
EOS included), as the package does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import family_checks
import pytest
import torch
import transformers
from conftest import CORPUS, train_sentencepiece
from family_checks import (
    assert_same_nbest,
    check_alignment,
    check_batch_equals_one_at_a_time,
    check_joining,
    check_package_batch_invariance,
    check_served_summarize,
    check_streaming,
)
from hf_reference import reference_nbest
from safetensors.torch import load_file, save_file
from test_bart_parity import MAX_NEW, PARITY, hf_generate, inputs
from torch import Tensor

from seq2serve.export.exporter import export
from seq2serve.model.families.bart import convert_bart, load_bart
from seq2serve.model.families.hf import ConversionError
from seq2serve.model.families.pegasus import PEGASUS
from seq2serve.model.families.source import SourceError
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import JsonTokenizer, package_tokenizer

TOL = 1e-4
PAD, EOS, UNK = 0, 1, 105  # <unk> is SentencePiece's 2 + the offset 103
TEXTS = CORPUS[:5] + ["unseen wörds: ☃ zebra", "Open", "  spaces   and\nnew lines  "]
XSUM = {"length_penalty": 0.6, "max_length": 30, "min_length": 3, "num_beams": 3,
        "no_repeat_ngram_size": 3, "max_position_embeddings": 128}  # pegasus-xsum's shape


def write_pegasus_tokenizer(out: Path) -> int:
    """A SentencePiece unigram model trained on the corpus with Pegasus's ids (pad 0,
    eos 1, unk 2, no bos) as spiece.model, loaded by PegasusTokenizer (offset 103)
    and saved, so that the folder has tokenizer.json too. Returns its size."""
    train_sentencepiece(out, "spiece", 90, "unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    tok = transformers.PegasusTokenizer.from_pretrained(str(out))
    tok.save_pretrained(str(out))
    assert (out / "tokenizer.json").is_file() and tok.unk_token_id == UNK
    return len(tok)


def hf_pegasus(vocab: int, seed: int = 0, eos_bias: float = 4.5, **overrides: Any) -> Any:
    """A tiny Pegasus in which every weight matters (HF initialises biases to zero
    and LayerNorms to identity, which would hide mapping errors); the position
    tables keep their sinusoids (Pegasus has no learned positions)."""
    args: dict[str, Any] = dict(
        vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=48, max_position_embeddings=128, pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=PAD, forced_eos_token_id=EOS, dropout=0.1,
        activation_function="relu", scale_embedding=True,
        task_specific_params={"summarization_xsum": XSUM}, attn_implementation="eager")
    args.update(overrides)
    torch.manual_seed(seed)
    model = transformers.PegasusForConditionalGeneration(transformers.PegasusConfig(**args))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.add_(0.3 * torch.randn_like(p))
        model.final_logits_bias.normal_()
        model.final_logits_bias[0, EOS] = eos_bias  # some outputs end by EOS, some by length
    return model.eval()


def make_pegasus_dir(out: Path, seed: int = 0, **overrides: Any) -> Path:
    vocab = write_pegasus_tokenizer(out)
    hf_pegasus(vocab, seed, **overrides).save_pretrained(out)
    return out


def patch_config(folder: Path, **keys: Any) -> None:
    file = folder / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **keys}))


@pytest.fixture(scope="module")
def pegasus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pegasus_dir(tmp_path_factory.mktemp("pegasus") / "tiny-pegasus")


@pytest.fixture(scope="module")
def hf(pegasus_dir: Path) -> tuple[Any, Any]:
    return (transformers.PegasusTokenizer.from_pretrained(str(pegasus_dir)),
            transformers.PegasusForConditionalGeneration.from_pretrained(
                str(pegasus_dir), attn_implementation="eager").eval())


@pytest.fixture(scope="module")
def pegasus_package(pegasus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pegasus-packages") / "pegasus-fp32"
    export(pegasus_dir, out, progress=False)
    return out


def pegasus_inputs(vocab: int) -> tuple[Tensor, Tensor, Tensor]:
    """BART's batch (test_bart_parity.inputs) with Pegasus's pad and start (0)."""
    src, mask, tgt = inputs(vocab)
    return src.masked_fill(mask == 0, PAD), mask, tgt.index_fill(1, torch.tensor([0]), PAD)


def assert_parity(hf_model: Any, path: Path) -> dict[str, float]:
    batch = pegasus_inputs(hf_model.config.vocab_size)
    return family_checks.assert_parity(hf_model, load_bart(path, layout=PEGASUS), *batch, TOL)


CASES = {
    "relu_scale_embedding": {},  # the hub's checkpoints
    "gelu_unscaled": dict(activation_function="gelu", scale_embedding=False),
    "untied": dict(tie_word_embeddings=False, encoder_layers=1, decoder_layers=3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pytorch_parity(case: str, tmp_path: Path) -> None:
    vocab = write_pegasus_tokenizer(tmp_path)
    model = hf_pegasus(vocab, seed=len(case), **CASES[case])
    model.save_pretrained(tmp_path)
    diffs = assert_parity(model, tmp_path)
    print(case, {k: f"{v:.1e}" for k, v in diffs.items()})
    cfg, state = convert_bart(tmp_path, PEGASUS)
    assert cfg.pre_norm and cfg.positions == "sinusoid" and cfg.position_layout == "split"
    assert not cfg.layernorm_embedding and cfg.final_logits_bias
    assert cfg.decoder_start_id == cfg.pad_id == cfg.bos_id == PAD and cfg.eos_id == EOS
    assert cfg.unk_id == UNK and cfg.extra["unk_id_from"] == "tokenizer.json"
    assert cfg.scale_embedding == (case != "gelu_unscaled")
    assert state["encoder_norm.weight"].shape == (32,) and "positions" not in state
    assert cfg.tie_output == (case != "untied")


def test_hub_style_folder(tmp_path: Path) -> None:
    """A folder as the hub's pegasus-xsum is: config.json with transformers 3's keys
    (the values of Pegasus's structure; extra_pos_embeddings, which only learned tables
    read) and generation keys at its top level, pytorch_model.bin storing every copy of
    the tied matrix; the package decodes as generate() under those keys."""
    folder = make_pegasus_dir(tmp_path / "pegasus")
    patch_config(folder, normalize_before=True, add_final_layer_norm=True,
                 static_position_embeddings=True, normalize_embedding=False,
                 add_bias_logits=False, extra_pos_embeddings=1, bos_token_id=0,
                 num_beams=2, max_length=12, length_penalty=0.6)
    (folder / "generation_config.json").unlink()
    state = load_file(folder / "model.safetensors")
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                 "lm_head.weight"):
        state[name] = state["model.shared.weight"].clone()
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    cfg, _ = convert_bart(folder, PEGASUS)
    assert cfg.pre_norm and cfg.bos_id == 0 and cfg.share_embeddings and cfg.tie_output
    export(folder, tmp_path / "out", progress=False)
    generation = load_package(tmp_path / "out").manifest.generation
    assert (generation.beam_size, generation.max_length, generation.length_penalty) == \
        (2, 11, 0.6)


def test_several_summarization_entries(tmp_path: Path) -> None:
    """pegasus-large says one summarization_* entry per dataset: a summarizer, with
    none of their settings (config.json's and generation_config.json's decide)."""
    folder = make_pegasus_dir(tmp_path / "pegasus", task_specific_params={
        "summarization_aeslc": {"length_penalty": 0.6, "max_length": 32},
        "summarization_xsum": {"length_penalty": 0.8, "max_length": 64, "num_beams": 2}})
    export(folder, tmp_path / "out", progress=False)
    manifest = load_package(tmp_path / "out").manifest
    assert manifest.task == "summarize"
    # generate()'s own defaults: greedy, length penalty 1
    assert (manifest.generation.beam_size, manifest.generation.length_penalty) == (1, 1.0)


def test_refuses_conflicting_old_keys(tmp_path: Path) -> None:
    make_pegasus_dir(tmp_path)
    patch_config(tmp_path, normalize_before=False, add_final_layer_norm=False,
                 static_position_embeddings=False, normalize_embedding=True)
    with pytest.raises(ConversionError) as info:
        load_bart(tmp_path, layout=PEGASUS)
    for key in ("normalize_before", "add_final_layer_norm", "static_position_embeddings",
                "normalize_embedding"):
        assert sum(key in p for p in info.value.problems) == 1, (key, info.value.problems)


def test_weight_problems_are_listed_together(tmp_path: Path) -> None:
    make_pegasus_dir(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["model.encoder.embed_positions.weight"] += 0.01  # learned, not the sinusoids
    del state["model.decoder.layer_norm.bias"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ConversionError) as info:
        load_bart(tmp_path, layout=PEGASUS)
    problems = info.value.problems
    assert any("model.encoder.embed_positions.weight is not Pegasus's sinusoid table" in p
               for p in problems), problems
    assert any("missing tensor model.decoder.layer_norm.bias" in p for p in problems), problems


def test_a_folder_must_say_its_task(tmp_path: Path) -> None:
    """A folder that says no task is refused asking for --task; with it, it exports.
    Without tokenizer.json, the exporter builds it from spiece.model."""
    folder = make_pegasus_dir(tmp_path / "pegasus", task_specific_params=None)
    with pytest.raises(SourceError) as info:
        export(folder, tmp_path / "out", progress=False)
    assert any("--task" in p and "Pegasus" in p for p in info.value.problems), \
        info.value.problems
    hf_tok = transformers.PegasusTokenizer.from_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    export(folder, tmp_path / "out", progress=False, task="summarize")
    package = load_package(tmp_path / "out")
    assert package.manifest.task == "summarize"
    assert package.manifest.special_tokens.unk == UNK
    ours = package_tokenizer(package)
    for text in TEXTS:
        assert ours.encode(text) == hf_tok(text)["input_ids"]


def test_missing_tokenizer_files_are_named(tmp_path: Path) -> None:
    folder = make_pegasus_dir(tmp_path / "pegasus")
    for name in ("tokenizer.json", "spiece.model"):
        (folder / name).unlink()
    with pytest.raises(SourceError) as info:
        export(folder, tmp_path / "out", progress=False)
    assert any("tokenizer.json: missing" in p and "spiece.model" in p
               for p in info.value.problems), info.value.problems


def test_tokenizer_matches_pegasus_tokenizer(pegasus_package: Path,
                                             hf: tuple[Any, Any]) -> None:
    hf_tok = hf[0]
    ours = package_tokenizer(load_package(pegasus_package))
    assert isinstance(ours, JsonTokenizer) and ours.unk_id == UNK
    texts = [*TEXTS, "Müller größer Straße café Noël", "日本語 🙂", "zzqx ǂ ∰ unknown pieces",
             "literal </s> and <pad> and <mask_1> <unk_7>", "trailing spaces   ", "\ttab",
             "ﬁ ligature ＦＵＬＬ width", "", " ", "Don't stop , he said ."]
    for text in texts:
        assert ours.encode(text) == hf_tok(text)["input_ids"], text
    assert UNK in ours.encode("zzqx ǂ")  # pieces the model has not seen
    vocab = len(hf_tok)
    g = torch.Generator().manual_seed(0)
    rows = [hf_tok(t)["input_ids"][:-1] for t in texts]
    rows += [torch.randint(0, vocab, (12,), generator=g).tolist() for _ in range(200)]
    rows += [[2, 3, 4, 104, UNK, 106, 107]]  # the masks, <unk_n> and <unk>
    for ids in rows:
        cut = ids[: ids.index(EOS)] if EOS in ids else ids  # ours stops at EOS
        assert ours.decode(ids) == hf_tok.decode(cut, skip_special_tokens=True), ids


def test_export_fp32_int8_fp16(pegasus_dir: Path, pegasus_package: Path,
                               tmp_path: Path) -> None:
    package = load_package(pegasus_package)
    manifest = package.manifest
    assert manifest.task == "summarize"
    assert manifest.tokenizer.type == "tokenizers"
    assert (pegasus_package / "tokenizer.json").is_file()
    assert not (pegasus_package / "spiece.model").exists()
    assert manifest.config.pre_norm and manifest.config.position_layout == "split"
    assert manifest.special_tokens.unk == UNK and manifest.special_tokens.pad == PAD
    # generate()'s own settings (summarization_xsum's are the pipeline's): nothing sets
    # a length, so its default 20 new tokens; </s> forced at the limit
    generation = manifest.generation
    assert (generation.max_length, generation.min_length, generation.beam_size) == (20, 0, 1)
    assert generation.forced_eos_token_id == EOS and generation.forced_bos_token_id is None
    deviation = manifest.exporter["fp32_deviation"]["log_probs"]  # type: ignore[index]
    print("fp32 deviation", deviation)
    assert deviation <= TOL
    for precision in ("int8", "fp16"):
        report = export(pegasus_dir, tmp_path / precision, precision=precision, progress=False)
        print(precision, "deviation", report.deviation)
        assert report.precision == precision
        assert report.fp32_deviation["log_probs"] <= TOL
        if precision == "fp16":  # 11 significant bits (test_export.py's bound)
            assert report.deviation["log_probs"] <= 0.05
        assert load_package(tmp_path / precision).manifest.tokenizer.type == "tokenizers"
        check_package_batch_invariance(tmp_path / precision, TEXTS, MAX_NEW)


# -- the engine against generate() ---------------------------------------------------


@pytest.fixture(scope="module")
def engine(pegasus_package: Path) -> Any:
    from seq2serve.server.assembly import default_limits
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    return Engine(pegasus_package, RunnerConfig(provider="cpu", intra_op_threads=1),
                  default_limits())


def sources_of(tok: Any) -> tuple[dict[str, Tensor], list[list[int]]]:
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    return batch, [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
                   for i in range(len(TEXTS))]


@pytest.mark.parametrize("case", list(PARITY))
def test_engine_matches_generate(case: str, engine: Any, hf: tuple[Any, Any]) -> None:
    from seq2serve.server.core.options import DecodingOptions

    tok, model = hf
    batch, sources = sources_of(tok)
    hf_kwargs, ours = PARITY[case]
    ref = hf_generate(model, batch, **hf_kwargs)
    # The package's defaults (summarization_xsum's) set explicitly to generate()'s.
    options = {"length_penalty": 1.0, "min_length": 0, "no_repeat_ngram_size": 0, **ours}
    results = engine.generate(sources, DecodingOptions(max_length=MAX_NEW, max_length_ratio=0,
                                                       **options))
    diff = assert_same_nbest(ref, results, TOL)
    if case == "greedy":  # the EOS bias makes both endings occur: chosen, and forced
        lengths = {len(r[0].token_ids) for r in results}  # at the limit (PegasusConfig's)
        assert MAX_NEW - 1 in lengths and min(lengths) < MAX_NEW - 1, lengths
    print(case, f"score diff {diff:.1e}")


def test_batch_equals_one_at_a_time(engine: Any, hf: tuple[Any, Any]) -> None:
    sources = sources_of(hf[0])[1]
    check_batch_equals_one_at_a_time(engine, sources, MAX_NEW)


def test_streaming_joining_alignment(engine: Any, hf: tuple[Any, Any]) -> None:
    """Streaming, iteration-level joining and alignments (family_checks.py)."""
    sources = sources_of(hf[0])[1]
    check_streaming(engine, sources, MAX_NEW)
    check_joining(engine, sources, MAX_NEW)
    check_alignment(engine, hf[1], sources, MAX_NEW)


def test_engine_defaults_are_the_folders_generation(engine: Any, hf: tuple[Any, Any]) -> None:
    """With no options, the package decodes as generate() does under the folder's own
    generation settings: greedy, 20 new tokens, </s> forced at the limit."""
    from seq2serve.server.core.options import DecodingOptions

    tok, model = hf
    batch, sources = sources_of(tok)
    ref = reference_nbest(model, batch)
    results = engine.generate(sources, DecodingOptions())
    diff = assert_same_nbest(ref, results, TOL)
    print("defaults", f"score diff {diff:.1e}")


# -- served ----------------------------------------------------------------------------


def test_served_summarize_returns_the_engine_text(pegasus_package: Path, engine: Any,
                                                  tmp_path: Path) -> None:
    check_served_summarize(pegasus_package, "tiny-pegasus", engine, tmp_path, MAX_NEW)
