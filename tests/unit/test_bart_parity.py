"""BART (issue 45): load_bart() against transformers' BartForConditionalGeneration on
a tiny random checkpoint with its own byte-level BPE tokenizer (trained here),
the export at fp32 and int8, the engine against generate() token for token, the
package's tokenizer.json against BartTokenizer, and a served summarize request.

The tiny folder forces <s> first and </s> at the limit, as bart-large-cnn does:
generate() runs under the folder's own generation settings, as the package does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import family_checks
import pytest
import torch
import transformers
from conftest import CORPUS
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
from torch import Tensor

from seq2serve.export.exporter import export
from seq2serve.model.families.bart import convert_bart, load_bart
from seq2serve.model.families.hf import ConversionError
from seq2serve.model.families.source import SourceError
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import JsonTokenizer, package_tokenizer

TOL = 1e-4
MAX_NEW = 24
TEXTS = CORPUS[:5] + ["unseen wörds: ☃ zebra", "Open", "  spaces   and\nnew lines  "]
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # BART's ids 0..4


def write_bart_tokenizer(out: Path) -> int:
    """A byte-level BPE trained on the corpus, saved as BART's vocab.json +
    merges.txt and, through BartTokenizer, tokenizer.json. Returns its size."""
    import tokenizers

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 20, vocab_size=400, special_tokens=SPECIALS,
                            show_progress=False)
    out.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(out))
    tok = transformers.BartTokenizer.from_pretrained(str(out))
    tok.save_pretrained(str(out))
    assert (out / "tokenizer.json").is_file()
    return len(tok)


def hf_bart(vocab: int, seed: int = 0, **overrides: Any) -> Any:
    """A tiny BART in which every weight matters (HF initialises biases to zero and
    LayerNorms to identity, which would hide mapping errors)."""
    args: dict[str, Any] = dict(
        vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=48, max_position_embeddings=128, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2, dropout=0.1,
        task_specific_params={"summarization": {"num_beams": 2, "length_penalty": 2.0,
                                                "max_length": 30, "min_length": 3,
                                                "no_repeat_ngram_size": 3}},
        attn_implementation="eager")
    args.update(overrides)
    torch.manual_seed(seed)
    model = transformers.BartForConditionalGeneration(transformers.BartConfig(**args)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
        model.final_logits_bias.normal_()
    return model


def make_bart_dir(out: Path, seed: int = 0, **overrides: Any) -> Path:
    vocab = write_bart_tokenizer(out)
    hf_bart(vocab, seed, **overrides).save_pretrained(out)
    # bart-large-cnn's generation_config.json forces <s> first (transformers 5 does not
    # carry forced_bos_token_id from the model config into the file it saves)
    generation = json.loads((out / "generation_config.json").read_text())
    generation["forced_bos_token_id"] = 0
    (out / "generation_config.json").write_text(json.dumps(generation))
    return out


@pytest.fixture(scope="module")
def bart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bart_dir(tmp_path_factory.mktemp("bart") / "tiny-bart")


@pytest.fixture(scope="module")
def hf(bart_dir: Path) -> tuple[Any, Any]:
    return (transformers.BartTokenizer.from_pretrained(str(bart_dir)),
            transformers.BartForConditionalGeneration.from_pretrained(
                str(bart_dir), attn_implementation="eager").eval())


@pytest.fixture(scope="module")
def bart_package(bart_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bart-packages") / "bart-fp32"
    export(bart_dir, out, progress=False)
    return out


def inputs(vocab: int, seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """A right-padded source batch (lengths 9, 6, 2) and decoder inputs starting
    with </s>, as BART's."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab - 1, (3, 9), generator=g)
    mask = (torch.arange(9)[None, :] < torch.tensor([[9], [6], [2]])).long()
    src = src.masked_fill(mask == 0, 1)
    tgt = torch.randint(3, vocab - 1, (3, 7), generator=g)
    tgt[:, 0] = 2
    return src, mask, tgt


def assert_parity(hf_model: Any, path: Path) -> dict[str, float]:
    batch = inputs(hf_model.config.vocab_size)
    return family_checks.assert_parity(hf_model, load_bart(path), *batch, TOL)


CASES = {
    "gelu": {},
    "relu_scale_embedding": dict(activation_function="relu", scale_embedding=True),
    "untied": dict(tie_word_embeddings=False, encoder_layers=1, decoder_layers=3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pytorch_parity(case: str, tmp_path: Path) -> None:
    vocab = write_bart_tokenizer(tmp_path)
    model = hf_bart(vocab, seed=len(case), **CASES[case])
    model.save_pretrained(tmp_path)
    diffs = assert_parity(model, tmp_path)
    print(case, {k: f"{v:.1e}" for k, v in diffs.items()})
    cfg, state = convert_bart(tmp_path)
    assert cfg.positions == "learned" and cfg.layernorm_embedding and not cfg.pre_norm
    assert cfg.decoder_start_id == cfg.eos_id == 2 and cfg.pad_id == 1 and cfg.bos_id == 0
    assert cfg.unk_id == 3 and cfg.final_logits_bias
    assert state["src_positions"].shape == (128, 32)  # the offset's two rows folded away
    assert cfg.tie_output == (case != "untied")


def test_refuses_conflicting_old_keys(tmp_path: Path) -> None:
    make_bart_dir(tmp_path)
    file = tmp_path / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "normalize_before": True,
                                "add_final_layer_norm": True,
                                "static_position_embeddings": True}))
    with pytest.raises(ConversionError) as info:
        load_bart(tmp_path)
    for key in ("normalize_before", "add_final_layer_norm", "static_position_embeddings"):
        assert sum(key in p for p in info.value.problems) == 1, (key, info.value.problems)


def test_weight_problems_are_listed_together(tmp_path: Path) -> None:
    make_bart_dir(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["model.decoder.embed_positions.weight"] = torch.zeros(128, 32)  # offset missing
    del state["model.encoder.layernorm_embedding.bias"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ConversionError) as info:
        load_bart(tmp_path)
    problems = info.value.problems
    assert any("model.decoder.embed_positions.weight has shape (128, 32)" in p
               for p in problems), problems
    assert any("missing tensor model.encoder.layernorm_embedding.bias" in p
               for p in problems), problems


def test_a_folder_must_say_its_task(tmp_path: Path) -> None:
    """A folder that says no task is refused asking for --task; with it, it exports.
    Without tokenizer.json, the exporter builds it from vocab.json + merges.txt."""
    folder = make_bart_dir(tmp_path / "bart", task_specific_params=None)
    with pytest.raises(SourceError) as info:
        export(folder, tmp_path / "out", progress=False)
    assert any("--task" in p for p in info.value.problems), info.value.problems
    with pytest.raises(SourceError, match="--task must be summarize, translate, or "):
        export(folder, tmp_path / "out", progress=False, task="chat")
    hf_tok = transformers.BartTokenizer.from_pretrained(str(folder))
    (folder / "tokenizer.json").unlink()
    export(folder, tmp_path / "out", progress=False, task="summarize")
    package = load_package(tmp_path / "out")
    assert package.manifest.task == "summarize"
    ours = package_tokenizer(package)
    for text in TEXTS:
        assert ours.encode(text) == hf_tok(text)["input_ids"]


def test_missing_tokenizer_files_are_named(tmp_path: Path) -> None:
    folder = make_bart_dir(tmp_path / "bart")
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        (folder / name).unlink()
    with pytest.raises(SourceError) as info:
        export(folder, tmp_path / "out", progress=False)
    assert any("tokenizer.json: missing" in p and "merges.txt" in p
               for p in info.value.problems), info.value.problems


def test_tokenizer_matches_bart_tokenizer(bart_dir: Path, bart_package: Path,
                                          hf: tuple[Any, Any]) -> None:
    hf_tok = hf[0]
    ours = package_tokenizer(load_package(bart_package))
    assert isinstance(ours, JsonTokenizer)
    texts = [*TEXTS, "Müller größer Straße café Noël", "日本語 🙂", "literal </s> and <pad>",
             "", " ", "Don't stop , he said ."]
    for text in texts:
        assert ours.encode(text) == hf_tok(text)["input_ids"], text
    vocab = len(hf_tok)
    g = torch.Generator().manual_seed(0)
    rows = [hf_tok(t)["input_ids"][1:-1] for t in texts]
    rows += [torch.randint(0, vocab, (12,), generator=g).tolist() for _ in range(100)]
    for ids in rows:
        cut = ids[: ids.index(2)] if 2 in ids else ids  # ours stops at EOS
        assert ours.decode(ids) == hf_tok.decode(cut, skip_special_tokens=True), ids


def test_export_fp32_int8_fp16(bart_dir: Path, bart_package: Path, tmp_path: Path) -> None:
    package = load_package(bart_package)
    manifest = package.manifest
    assert manifest.task == "summarize"
    assert manifest.tokenizer.type == "tokenizers"
    assert (bart_package / "tokenizer.json").is_file()
    assert not (bart_package / "vocab.json").exists()
    assert not (bart_package / "source.spm").exists()
    assert manifest.config.positions == "learned" and manifest.config.layernorm_embedding
    # The folder's summarization entry over its generation_config, as the pipeline
    # applied it (GenerationConfig.update), in new tokens; <s> forced first, </s> at
    # the limit, as the folder says.
    generation = manifest.generation
    gen = pipeline_generation_config(bart_dir)
    assert (generation.max_length, generation.min_length, generation.beam_size,
            generation.length_penalty, generation.no_repeat_ngram_size) == (
        gen.max_length - 1, gen.min_length - 1, gen.num_beams, gen.length_penalty,
        gen.no_repeat_ngram_size)
    assert (generation.forced_bos_token_id, generation.forced_eos_token_id) == (0, 2)
    assert manifest.exporter["fp32_deviation"]["log_probs"] <= TOL  # type: ignore[index]
    for precision in ("int8", "fp16"):
        report = export(bart_dir, tmp_path / precision, precision=precision, progress=False)
        assert report.precision == precision
        assert report.fp32_deviation["log_probs"] <= TOL
        if precision == "fp16":  # 11 significant bits (test_export.py's bound)
            assert report.deviation["log_probs"] <= 0.05
        assert load_package(tmp_path / precision).manifest.tokenizer.type == "tokenizers"
        check_package_batch_invariance(tmp_path / precision, TEXTS, MAX_NEW)


def test_plain_attention_export(bart_dir: Path, tmp_path: Path) -> None:
    report = export(bart_dir, tmp_path / "plain", attention="plain", progress=False)
    assert report.fp32_deviation["log_probs"] <= TOL


# -- the engine against generate() ---------------------------------------------------


def hf_generate(model: Any, batch: dict[str, Tensor], num_beams: int = 1, n: int = 1,
                **kwargs: Any) -> list[list[tuple[list[int], float]]]:
    return reference_nbest(model, batch, num_beams=num_beams, num_return_sequences=n,
                           do_sample=False, max_new_tokens=MAX_NEW, **kwargs)


PARITY = {
    "greedy": ({}, {"beam_size": 1}),
    "greedy_ngram_min_length": ({"no_repeat_ngram_size": 2, "min_new_tokens": 5},
                                {"beam_size": 1, "no_repeat_ngram_size": 2, "min_length": 5}),
    "beam4_nbest2_length_penalty": (
        {"num_beams": 4, "n": 2, "length_penalty": 2.0, "no_repeat_ngram_size": 3,
         "min_new_tokens": 4},
        {"beam_size": 4, "num_hypotheses": 2, "length_penalty": 2.0,
         "no_repeat_ngram_size": 3, "min_length": 4}),
}


@pytest.fixture(scope="module")
def engine(bart_package: Path) -> Any:
    from seq2serve.server.assembly import default_limits
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    return Engine(bart_package, RunnerConfig(provider="cpu", intra_op_threads=1),
                  default_limits())


@pytest.mark.parametrize("case", list(PARITY))
def test_engine_matches_generate(case: str, engine: Any, hf: tuple[Any, Any]) -> None:
    from seq2serve.server.core.options import DecodingOptions

    tok, model = hf
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    sources = [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
               for i in range(len(TEXTS))]
    hf_kwargs, ours = PARITY[case]
    ref = hf_generate(model, batch, **hf_kwargs)
    # The package's defaults (task_specific_params') set explicitly to generate()'s.
    options = {"length_penalty": 1.0, "min_length": 0, "no_repeat_ngram_size": 0, **ours}
    results = engine.generate(sources, DecodingOptions(max_length=MAX_NEW, max_length_ratio=0,
                                                       **options))
    diff = assert_same_nbest(ref, results, TOL)
    print(case, f"score diff {diff:.1e}")


def test_batch_equals_one_at_a_time(engine: Any, hf: tuple[Any, Any]) -> None:
    tokenizer = hf[0]
    sources = [tokenizer(t)["input_ids"] for t in TEXTS]
    check_batch_equals_one_at_a_time(engine, sources, MAX_NEW)


def test_streaming_joining_alignment(engine: Any, hf: tuple[Any, Any]) -> None:
    """Streaming, iteration-level joining and alignments (family_checks.py), <s>
    forced first included."""
    tokenizer, model = hf
    sources = [tokenizer(t)["input_ids"] for t in TEXTS]
    check_streaming(engine, sources, MAX_NEW)
    check_joining(engine, sources, MAX_NEW)
    check_alignment(engine, model, sources, MAX_NEW)


def pipeline_generation_config(folder: Path) -> Any:
    """The generation config transformers' summarization pipeline decoded with: the
    folder's, updated with task_specific_params["summarization"] (pipelines/base.py,
    transformers 4.x; transformers 5 removed the pipeline)."""
    gen = transformers.GenerationConfig.from_pretrained(str(folder))
    params = json.loads((folder / "config.json").read_text())["task_specific_params"]
    assert not gen.update(**params["summarization"])  # every key a generation key
    return gen


def test_engine_defaults_are_the_pipelines_generation(bart_dir: Path, engine: Any,
                                                      hf: tuple[Any, Any]) -> None:
    """With no options, the package decodes as generate() under the folder's own
    generation settings with the summarization entry applied as the pipeline applied
    it: beam 2, length penalty 2, no repeated trigram, 2 to 29 new tokens, <s> forced
    first and </s> at the limit."""
    from seq2serve.server.core.options import DecodingOptions

    tok, model = hf
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    sources = [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
               for i in range(len(TEXTS))]
    ref = reference_nbest(model, batch, generation_config=pipeline_generation_config(bart_dir))
    results = engine.generate(sources, DecodingOptions())
    assert_same_nbest(ref, results, TOL)
    assert all(r[0].token_ids[0] == 0 for r in results)  # the forced <s>


def test_forced_tokens_under_beam_search(engine: Any, hf: tuple[Any, Any]) -> None:
    from seq2serve.server.core.options import DecodingOptions

    tok, model = hf
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    ref = hf_generate(model, batch, num_beams=4, n=2)
    sources = [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
               for i in range(len(TEXTS))]
    # The package's defaults (task_specific_params') set explicitly to generate()'s.
    results = engine.generate(sources, DecodingOptions(beam_size=4, num_hypotheses=2,
                                                       max_length=MAX_NEW, max_length_ratio=0,
                                                       length_penalty=1.0, min_length=0,
                                                       no_repeat_ngram_size=0))
    assert all(h.token_ids[0] == 0 for r in results for h in r)
    assert_same_nbest(ref, results, TOL)


# -- served ----------------------------------------------------------------------------


def test_served_summarize_returns_the_engine_text(bart_package: Path, engine: Any,
                                                  tmp_path: Path) -> None:
    check_served_summarize(bart_package, "tiny-bart", engine, tmp_path, MAX_NEW)


def test_old_configs_keep_their_behaviour() -> None:
    """Checkpoints and manifests written before the BART switches load as before,
    and a manifest of such a model writes none of them."""
    from seq2serve.model.config import ModelConfig
    from seq2serve.model.package.manifest import TokenizerFiles, _plain

    old = {k: v for k, v in ModelConfig().to_dict().items()
           if k not in ("positions", "layernorm_embedding")}
    cfg = ModelConfig.from_dict(old)
    assert cfg.positions == "sinusoid" and not cfg.layernorm_embedding
    written = _plain(cfg)
    assert isinstance(written, dict)
    assert "positions" not in written and "layernorm_embedding" not in written
    files = TokenizerFiles(source_model="source.spm", target_model="target.spm",
                           vocab="vocab.json")
    assert _plain(files) == {"source_model": "source.spm", "target_model": "target.spm",
                             "vocab": "vocab.json", "type": "sentencepiece",
                             "append_eos": True}
    odd = ModelConfig(d_model=15, encoder_heads=3, decoder_heads=3, positions="learned")
    assert odd.problems() == []  # an odd d_model is a problem of sinusoids only
    assert any("even" in p for p in ModelConfig(d_model=15, encoder_heads=3,
                                                decoder_heads=3).problems())
