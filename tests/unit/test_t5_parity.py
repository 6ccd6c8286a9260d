"""T5 / Flan-T5 / mT5 (issue 45): load_t5() against transformers'
T5ForConditionalGeneration / MT5ForConditionalGeneration on tiny random
checkpoints (T5: relu, tied, output scaled; T5 v1.1 / Flan-T5 style: gated-gelu,
untied lm_head, d_kv * heads != d_model; mT5: never scaled) with every weight
perturbed: encoder, logits, cached decode steps, rows at mixed positions; the
export (fused and plain attention, fp32 and int8) with a SentencePiece model
trained here and packaged as tokenizer.json (checked against T5Tokenizer); the
engine against generate() token for token; a served request.

generate() runs under the folder's own generation settings, as the package does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
from torch import Tensor

from seq2serve.export.exporter import export
from seq2serve.model.config import ModelConfig
from seq2serve.model.families.hf import ConversionError
from seq2serve.model.families.source import SourceError
from seq2serve.model.families.t5 import convert_t5, load_t5
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import JsonTokenizer, package_tokenizer

TOL = 1e-4
VOCAB = 200  # larger than the tokenizer (90 pieces + 100 extra ids), as T5's 32128
MAX_NEW = 24
TEXTS = CORPUS[:5] + ["unseen wörds: ☃ zebra", "Open", "  spaces   and\nnew lines  "]
TASK = {"summarization": {"prefix": "summarize: ", "num_beams": 2, "max_length": 20,
                          "min_length": 3, "no_repeat_ngram_size": 3, "length_penalty": 2.0,
                          "early_stopping": True}}

T5_BASE: dict[str, Any] = dict(
    vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3,
    num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.1)

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # original T5: relu, tied, decoder output scaled by d_model**-0.5
    "t5": ("t5", dict(feed_forward_proj="relu")),
    # T5 v1.1 / Flan-T5: gated-gelu, untied lm_head, no scaling, heads*d_kv != d_model
    "t5_v1_1": ("t5", dict(feed_forward_proj="gated-gelu", d_kv=8, num_heads=3,
                           tie_word_embeddings=False)),
    # mT5: gated-gelu, untied, never scaled
    "mt5": ("mt5", dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
}


def hf_t5(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    """A tiny T5 / mT5 in which every weight matters."""
    args = {**T5_BASE, **overrides}
    config_cls, model_cls = ((transformers.MT5Config, transformers.MT5ForConditionalGeneration)
                             if model_type == "mt5" else
                             (transformers.T5Config, transformers.T5ForConditionalGeneration))
    torch.manual_seed(seed)
    model = model_cls(config_cls(**args)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def save_t5(model: Any, out: Path, tie: bool | None, untie_head: bool) -> Path:
    """save_pretrained, then config.json and weights as the hub's folders hold
    them: tie_word_embeddings as given (None: absent), no scale_decoder_outputs
    (transformers-4 era files), and, with `untie_head`, a distinct lm_head.weight
    (Flan-T5 / mT5 store one)."""
    model.save_pretrained(out)
    file = out / "config.json"
    raw = json.loads(file.read_text())
    raw.pop("scale_decoder_outputs", None)
    raw.pop("tie_word_embeddings", None)
    if tie is not None:
        raw["tie_word_embeddings"] = tie
    file.write_text(json.dumps(raw))
    if untie_head:
        weights = load_file(out / "model.safetensors")
        g = torch.Generator().manual_seed(7)
        weights["lm_head.weight"] = 0.2 * torch.randn(weights["shared.weight"].shape, generator=g)
        save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def make_t5_dir(out: Path, case: str, seed: int = 0, **overrides: Any) -> Path:
    model_type, args = CASES[case]
    args = {**args, **overrides}
    tie = args.pop("tie_word_embeddings", None)
    return save_t5(hf_t5(model_type, seed, **args), out, tie, untie_head=tie is False)


def write_t5_tokenizer(out: Path) -> int:
    """A SentencePiece unigram model trained on the corpus (pad 0, eos 1, unk 2, no
    bos, as T5's), loaded by T5Tokenizer (100 extra ids) and saved: spiece.model
    and tokenizer.json. Returns the tokenizer's size."""
    train_sentencepiece(out, "spiece", 90, "unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    tok = transformers.T5Tokenizer.from_pretrained(str(out))
    tok.save_pretrained(str(out))
    assert (out / "tokenizer.json").is_file()
    return len(tok)


def make_t5_package_dir(out: Path, case: str, **overrides: Any) -> Path:
    size = write_t5_tokenizer(out)
    assert size < VOCAB
    return make_t5_dir(out, case, task_specific_params=TASK, **overrides)


def reload(path: Path) -> Any:
    model_type = json.loads((path / "config.json").read_text())["model_type"]
    cls = (transformers.MT5ForConditionalGeneration if model_type == "mt5"
           else transformers.T5ForConditionalGeneration)
    return cls.from_pretrained(str(path), attn_implementation="eager").eval()


def max_diff(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item()


def inputs(vocab: int, seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """A right-padded source batch (lengths 9, 6, 2) ending in eos and decoder
    inputs starting with pad, as T5's; long enough (> max_distance) to reach the
    log-spaced buckets."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(2, vocab, (3, 24), generator=g)
    mask = (torch.arange(24)[None, :] < torch.tensor([[24], [15], [2]])).long()
    src = src.masked_fill(mask == 0, 0)
    tgt = torch.randint(2, vocab, (3, 20), generator=g)
    tgt[:, 0] = 0
    return src, mask, tgt


@torch.no_grad()
def assert_parity(hf_model: Any, path: Path) -> dict[str, float]:
    ours = load_t5(path)
    src, mask, tgt = inputs(hf_model.config.vocab_size)
    hf_memory = hf_model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    hf_logits = hf_model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    memory, cross_k, cross_v = ours.encode(src, mask)
    diffs = {"encoder": max_diff(memory[mask.bool()], hf_memory[mask.bool()]),
             "logits": max_diff(ours(src, mask, tgt), hf_logits)}
    assert ours(src, mask, tgt).shape[-1] == hf_model.config.vocab_size  # every row kept
    hf_log_probs = hf_logits.log_softmax(-1)
    self_k, self_v = ours.empty_cache(3)
    step = 0.0
    for t in range(tgt.shape[1]):
        log_probs, self_k, self_v, _ = ours.decode_step(tgt[:, t], torch.full((3,), t), self_k,
                                                     self_v, cross_k, cross_v, mask)
        step = max(step, max_diff(log_probs, hf_log_probs[:, t]))
    diffs["decode_step"] = step
    # Rows at different steps in one call: row r at position p_r over its own
    # earlier keys (the cache of the full run; later slots are masked).
    rows = torch.arange(3)
    mixed = 0.0
    for positions in (torch.tensor([19, 7, 0]), torch.tensor([3, 18, 11])):
        log_probs, *_ = ours.decode_step(tgt[rows, positions], positions,
                                         [k.clone() for k in self_k],
                                         [v.clone() for v in self_v], cross_k, cross_v, mask)
        mixed = max(mixed, max_diff(log_probs, hf_log_probs[rows, positions]))
    diffs["mixed_positions"] = mixed
    assert all(d <= TOL for d in diffs.values()), diffs
    return diffs


@pytest.mark.parametrize("case", sorted(CASES))
def test_pytorch_parity(case: str, tmp_path: Path) -> None:
    model_type, args = CASES[case]
    folder = make_t5_dir(tmp_path, case, seed=len(case))
    hf_model = reload(folder)
    diffs = assert_parity(hf_model, folder)
    print(case, {k: f"{v:.1e}" for k, v in diffs.items()})
    cfg, state = convert_t5(folder)
    assert cfg.positions == "relative" and cfg.norm == "rms" and cfg.pre_norm
    assert not cfg.linear_bias and cfg.attention_scale == 1.0
    assert cfg.head_dim == args.get("d_kv", 8)
    assert cfg.ffn_gated == (case != "t5")
    assert cfg.decoder_start_id == cfg.pad_id == 0 and cfg.eos_id == 1
    assert cfg.tie_output == (case == "t5")
    assert cfg.extra["decoder_output_scaled"] == (case == "t5")
    assert state["src_relative.weight"].shape == (8, args.get("num_heads", 4))


def test_scale_decoder_outputs_key_wins(tmp_path: Path) -> None:
    """A config.json saved by transformers 5 says scale_decoder_outputs: it wins
    over tie_word_embeddings (a T5 v1.1 re-saved keeps its unscaled output)."""
    folder = make_t5_dir(tmp_path, "t5_v1_1")
    raw = json.loads((folder / "config.json").read_text())
    raw["scale_decoder_outputs"] = True
    (folder / "config.json").write_text(json.dumps(raw))
    assert convert_t5(folder)[0].extra["decoder_output_scaled"]
    hf_model = reload(folder)
    assert hf_model.config.scale_decoder_outputs
    assert_parity(hf_model, folder)


def test_weight_problems_are_listed_together(tmp_path: Path) -> None:
    folder = make_t5_dir(tmp_path, "t5")
    state = load_file(folder / "model.safetensors")
    del state["decoder.block.1.layer.2.DenseReluDense.wo.weight"]
    state["encoder.final_layer_norm.weight"] = torch.ones(31)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ConversionError) as info:
        load_t5(folder)
    problems = info.value.problems
    assert any("missing tensor decoder.block.1.layer.2.DenseReluDense.wo.weight" in p
               for p in problems), problems
    assert any("encoder.final_layer_norm.weight has shape (31,)" in p for p in problems), problems


def test_bad_feed_forward_proj_is_refused(tmp_path: Path) -> None:
    folder = make_t5_dir(tmp_path, "t5")
    raw = json.loads((folder / "config.json").read_text())
    raw["feed_forward_proj"] = "gated-unknown"
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConversionError, match="feed_forward_proj"):
        load_t5(folder)


def test_old_configs_keep_their_behaviour() -> None:
    """The new fields default to what configs without them mean, and a manifest
    leaves them out at those defaults."""
    from seq2serve.model.package.manifest import _plain  # type: ignore[attr-defined]

    cfg = ModelConfig.from_dict({"d_model": 16, "encoder_heads": 2, "decoder_heads": 2})
    assert (cfg.norm, cfg.linear_bias, cfg.ffn_gated, cfg.head_dim, cfg.attention_scale) == (
        "layer", True, False, 0, 0.0)
    assert cfg.decoder_head_dim == 8
    plain = _plain(cfg)
    for name in ("norm", "linear_bias", "ffn_gated", "head_dim", "attention_scale",
                 "relative_buckets", "relative_max_distance"):
        assert name not in plain


# -- export --------------------------------------------------------------------------

# (case, attention) of the fp32 packages the engine decodes: both graph kinds.
PACKAGED = (("t5", "plain"), ("t5_v1_1", "fused"), ("mt5", "fused"))


@pytest.fixture(scope="module", params=PACKAGED, ids=[f"{c}-{a}" for c, a in PACKAGED])
def t5_case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[str, Path, Path]:
    """(case, folder, its fp32 package)."""
    case, attention = request.param
    root = tmp_path_factory.mktemp(f"t5-{case}")
    folder = make_t5_package_dir(root / case, case)
    package = root / "fp32"
    export(folder, package, attention=attention, progress=False)
    return case, folder, package


@pytest.fixture(scope="module")
def hf(t5_case: tuple[str, Path, Path]) -> tuple[Any, Any]:
    folder = t5_case[1]
    return transformers.T5Tokenizer.from_pretrained(str(folder)), reload(folder)


def test_export_fp32(t5_case: tuple[str, Path, Path]) -> None:
    case, _, path = t5_case
    manifest = load_package(path).manifest
    assert manifest.task == "summarize"
    assert manifest.tokenizer.type == "tokenizers" and (path / "tokenizer.json").is_file()
    assert manifest.config.positions == "relative" and manifest.config.norm == "rms"
    assert manifest.config.head_dim == 8 and manifest.config.attention_scale == 1.0
    assert manifest.config.tgt_vocab_size == VOCAB
    assert manifest.exporter["fp32_deviation"]["log_probs"] <= TOL  # type: ignore[index]
    assert manifest.input_prefix == "summarize: "
    # The folder's one task, its entry applied over generation_config as the summarization
    # pipeline applied it (GenerationConfig.update), in the engine's terms (new tokens).
    gen = transformers.GenerationConfig.from_pretrained(str(t5_case[1]))
    gen.update(**{k: v for k, v in TASK["summarization"].items() if k != "prefix"})
    generation = manifest.generation
    assert (generation.beam_size, generation.max_length, generation.min_length,
            generation.no_repeat_ngram_size, generation.length_penalty,
            generation.early_stopping) == (
        gen.num_beams, gen.max_length - 1, gen.min_length - 1, gen.no_repeat_ngram_size,
        gen.length_penalty, gen.early_stopping)
    said = manifest.exporter["source"]["task_specific_params"]  # type: ignore[index]
    assert said["entry"] == "summarization" and said["prefix"] == "summarize: "


@pytest.mark.parametrize("attention,precision", [("plain", "fp32"), ("fused", "fp32"),
                                                 ("fused", "int8"), ("plain", "int8")])
def test_export_plain_and_int8(attention: str, precision: str,
                               t5_case: tuple[str, Path, Path], tmp_path: Path) -> None:
    report = export(t5_case[1], tmp_path / "pkg", attention=attention, precision=precision,
                    progress=False)
    assert report.precision == precision
    assert report.fp32_deviation["log_probs"] <= TOL
    # One folder's packages at two precisions have two names (one server serves both).
    name = load_package(tmp_path / "pkg").manifest.name
    assert name == (t5_case[1].name if precision == "fp32" else f"{t5_case[1].name}-int8")
    check_package_batch_invariance(tmp_path / "pkg", TEXTS, MAX_NEW)


def test_export_mt5(tmp_path: Path) -> None:
    folder = make_t5_package_dir(tmp_path / "mt5", "mt5")
    report = export(folder, tmp_path / "pkg", progress=False)
    assert report.fp32_deviation["log_probs"] <= TOL
    assert load_package(tmp_path / "pkg").manifest.config.ffn_gated


def test_fused_needs_heads_of_a_multiple_of_8(tmp_path: Path) -> None:
    """GroupQueryAttention takes heads of a multiple of 8: others export plain."""
    folder = make_t5_package_dir(tmp_path / "t5", "t5", d_kv=6)
    with pytest.raises(SourceError, match="--attention plain"):
        export(folder, tmp_path / "fused", attention="fused", progress=False)
    report = export(folder, tmp_path / "plain", attention="plain", progress=False)
    assert report.fp32_deviation["log_probs"] <= TOL


def test_task_from_translation_params_or_flag(tmp_path: Path) -> None:
    """translation_en_to_de names the task and languages; a folder that says no task
    is refused asking for --task; tokenizer.json is built from spiece.model."""
    folder = make_t5_package_dir(tmp_path / "t5", "t5")
    raw = json.loads((folder / "config.json").read_text())
    raw["task_specific_params"] = {"translation_en_to_de": {
        "prefix": "translate English to German: ", "max_length": 30}}
    (folder / "config.json").write_text(json.dumps(raw))
    (folder / "tokenizer.json").unlink()
    export(folder, tmp_path / "de", progress=False)
    manifest = load_package(tmp_path / "de").manifest
    assert (manifest.task, manifest.source_language, manifest.target_language) == (
        "translate", "en", "de")
    assert manifest.input_prefix == "translate English to German: "
    del raw["task_specific_params"]
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(SourceError) as info:
        export(folder, tmp_path / "none", progress=False)
    assert any("--task" in p for p in info.value.problems), info.value.problems
    export(folder, tmp_path / "summarize", progress=False, task="summarize")
    assert load_package(tmp_path / "summarize").manifest.task == "summarize"


def test_tokenizer_matches_t5_tokenizer(t5_case: tuple[str, Path, Path],
                                        hf: tuple[Any, Any]) -> None:
    hf_tok = hf[0]
    ours = package_tokenizer(load_package(t5_case[2]))
    assert isinstance(ours, JsonTokenizer)
    texts = [*TEXTS, "Müller größer Straße café Noël", "日本語 🙂", "literal </s> and <pad>",
             "<extra_id_0> masked <extra_id_1> spans", "", " ", "Don't stop , he said ."]
    for text in texts:
        assert ours.encode(text) == hf_tok(text)["input_ids"], text
    g = torch.Generator().manual_seed(0)
    rows = [hf_tok(t)["input_ids"][:-1] for t in texts]
    rows += [torch.randint(0, len(hf_tok), (12,), generator=g).tolist() for _ in range(100)]
    for ids in rows:
        cut = ids[: ids.index(1)] if 1 in ids else ids  # ours stops at EOS
        assert ours.decode(ids) == hf_tok.decode(cut, skip_special_tokens=True), ids


# -- the engine against generate() ---------------------------------------------------


def hf_generate(model: Any, batch: dict[str, Tensor], num_beams: int = 1, n: int = 1,
                **kwargs: Any) -> list[list[tuple[list[int], float]]]:
    """generate()'s n-best under the folder's own settings, without generate()'s
    cache: transformers 5.24 sizes it by num_layers, not num_decoder_layers (an
    IndexError for these 2 + 3 layer models); the uncached pass computes the same."""
    return reference_nbest(model, batch, num_beams=num_beams, num_return_sequences=n,
                           do_sample=False, max_new_tokens=MAX_NEW, use_cache=False, **kwargs)


PARITY = {
    "greedy": ({}, {"beam_size": 1}),
    "beam4_nbest2": ({"num_beams": 4, "n": 2}, {"beam_size": 4, "num_hypotheses": 2}),
    "beam4_nbest2_length_penalty_ngram": (
        {"num_beams": 4, "n": 2, "length_penalty": 2.0, "no_repeat_ngram_size": 3,
         "min_new_tokens": 4},
        {"beam_size": 4, "num_hypotheses": 2, "length_penalty": 2.0,
         "no_repeat_ngram_size": 3, "min_length": 4}),
}


@pytest.fixture(scope="module")
def engine(t5_case: tuple[str, Path, Path]) -> Any:
    from seq2serve.server.assembly import default_limits
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    return Engine(t5_case[2], RunnerConfig(provider="cpu", intra_op_threads=1),
                  default_limits())


@pytest.mark.parametrize("case", list(PARITY))
def test_engine_matches_generate(case: str, engine: Any, hf: tuple[Any, Any]) -> None:
    from seq2serve.server.core.options import DecodingOptions

    tok, model = hf
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    sources = [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
               for i in range(len(TEXTS))]
    hf_kwargs, ours = PARITY[case]
    # generate() under the folder's generation_config.json only (not the task's)
    ref = hf_generate(model, batch, early_stopping=False, **hf_kwargs)
    options = {"length_penalty": 1.0, "min_length": 0, "no_repeat_ngram_size": 0,
               "early_stopping": False, **ours}
    results = engine.generate(sources, DecodingOptions(max_length=MAX_NEW, max_length_ratio=0,
                                                       **options))
    diff = assert_same_nbest(ref, results, TOL)
    print(case, f"score diff {diff:.1e}")


def test_engine_under_the_tasks_defaults_matches_the_pipelines_generate(
        t5_case: tuple[str, Path, Path], engine: Any, hf: tuple[Any, Any]) -> None:
    """No request options: the package's defaults, the summarization entry's, decode
    as generate() under the generation_config the pipeline made (updated with the
    entry), on the prefixed texts."""
    from seq2serve.server.core.options import DecodingOptions

    tok = hf[0]
    model = reload(t5_case[1])
    params = {k: v for k, v in TASK["summarization"].items() if k != "prefix"}
    model.generation_config.update(**params)
    texts = [TASK["summarization"]["prefix"] + t for t in TEXTS]
    batch = tok(texts, return_tensors="pt", padding=True)
    sources = [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
               for i in range(len(texts))]
    ref = reference_nbest(model, batch, use_cache=False)
    diff = assert_same_nbest(ref, engine.generate(sources, DecodingOptions()), TOL)
    print(f"task defaults: score diff {diff:.1e}")


def test_batch_equals_one_at_a_time(engine: Any, hf: tuple[Any, Any]) -> None:
    tokenizer = hf[0]
    sources = [tokenizer(t)["input_ids"] for t in TEXTS]
    check_batch_equals_one_at_a_time(engine, sources, MAX_NEW)


def test_streaming_joining_alignment(engine: Any, hf: tuple[Any, Any]) -> None:
    """Streaming, iteration-level joining and alignments (family_checks.py)."""
    tokenizer, model = hf
    sources = [tokenizer(t)["input_ids"] for t in TEXTS]
    check_streaming(engine, sources, MAX_NEW)
    check_joining(engine, sources, MAX_NEW)
    check_alignment(engine, model, sources, MAX_NEW)


# -- encoder and decoder embeddings held apart (issue 51 item 9) -------------------------


def untie_embeddings(folder: Path, seed: int = 11) -> None:
    """encoder.embed_tokens and decoder.embed_tokens stored beside shared, each with
    its own values (a T5 trained untied in transformers 5 saves them so)."""
    weights = load_file(folder / "model.safetensors")
    g = torch.Generator().manual_seed(seed)
    shared = weights["shared.weight"]
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        weights[name] = shared + 0.2 * torch.randn(shared.shape, generator=g)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("case", ["t5_v1_1", "mt5"])
def test_untied_embeddings_as_transformers_loads_them(case: str, tmp_path: Path) -> None:
    folder = make_t5_dir(tmp_path, case, seed=3)
    untie_embeddings(folder)
    hf_model = reload(folder)
    # transformers 5 keeps each apart ("will NOT tie them"): three distinct matrices
    shared = hf_model.shared.weight
    encoder, decoder = hf_model.encoder.embed_tokens.weight, hf_model.decoder.embed_tokens.weight
    assert not torch.equal(encoder, shared) and not torch.equal(decoder, shared)
    assert not torch.equal(encoder, decoder)
    assert_parity(hf_model, folder)
    cfg, _ = convert_t5(folder)
    assert not cfg.share_embeddings and not cfg.tie_output


def test_untied_embeddings_export_and_decode_as_generate(tmp_path: Path) -> None:
    """A Flan-T5-style folder whose encoder and decoder embeddings are held apart
    exports, and the engine's n-best equals generate()'s (greedy and beam 4)."""
    from seq2serve.server.assembly import default_limits
    from seq2serve.server.core.options import DecodingOptions
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    folder = make_t5_package_dir(tmp_path / "flan", "t5_v1_1")
    untie_embeddings(folder)
    report = export(folder, tmp_path / "pkg", attention="plain", progress=False)
    assert report.fp32_deviation["log_probs"] <= TOL
    assert not load_package(tmp_path / "pkg").manifest.config.share_embeddings
    tok, model = transformers.T5Tokenizer.from_pretrained(str(folder)), reload(folder)
    engine = Engine(tmp_path / "pkg", RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    sources = [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
               for i in range(len(TEXTS))]
    for hf_kwargs, ours in (PARITY["greedy"], PARITY["beam4_nbest2"]):
        ref = hf_generate(model, batch, early_stopping=False, **hf_kwargs)
        options = {"length_penalty": 1.0, "min_length": 0, "no_repeat_ngram_size": 0,
                   "early_stopping": False, **ours}
        results = engine.generate(sources, DecodingOptions(
            max_length=MAX_NEW, max_length_ratio=0, **options))
        assert_same_nbest(ref, results, TOL)


# -- served ----------------------------------------------------------------------------


def test_served_summarize_returns_the_engine_text(t5_case: tuple[str, Path, Path],
                                                  engine: Any, tmp_path: Path) -> None:
    package = t5_case[2]
    name = load_package(package).manifest.name
    check_served_summarize(package, name, engine, tmp_path, MAX_NEW)


@pytest.mark.parametrize("attention", ["plain", "fused"])
def test_export_fp16_keeps_t5s_fp32_parts(attention: str, t5_case: tuple[str, Path, Path],
                                           tmp_path: Path) -> None:
    """At fp16 the RMSNorms, the feed-forward output projections and the residual
    stream stay fp32 (as transformers keeps T5's wo in fp32)."""
    import onnx

    report = export(t5_case[1], tmp_path / "fp16", attention=attention, precision="fp16",
                    progress=False)
    assert report.fp32_deviation["log_probs"] <= TOL
    assert report.deviation["log_probs"] <= 0.05  # test_export.py's fp16 bound
    for name in ("encoder.onnx", "decoder.onnx"):
        graph = onnx.load(str(tmp_path / "fp16" / name)).graph
        producers = {out: node for node in graph.node for out in node.output}
        weights = {t.name: t.data_type for t in graph.initializer}

        def to(node: Any) -> int | None:
            return next((a.i for a in node.attribute if a.name == "to"), None)

        # The variance is computed in fp32 from the fp32 residual stream...
        means = [n for n in graph.node if n.op_type == "ReduceMean" and "norm" in n.name]
        assert means and all(producers[n.input[0]].op_type == "Pow" for n in means)
        # ... the feed-forward output projection has fp32 weights...
        fc2 = [n for n in graph.node if n.op_type == "MatMul" and "/ffn/fc2/" in n.name]
        assert fc2 and all(weights[n.input[1]] == onnx.TensorProto.FLOAT for n in fc2)
        # ... and nothing kept fp32 goes through fp16 on its way to the next.
        for node in graph.node:
            if node.op_type == "Cast" and to(node) == onnx.TensorProto.FLOAT:
                first = producers.get(node.input[0])
                assert first is None or first.op_type != "Cast" or to(first) != 10, node.name
        # The other projections are fp16.
        matmuls = [n for n in graph.node if n.op_type == "MatMul" and n not in fc2]
        assert matmuls and all(weights.get(n.input[1], onnx.TensorProto.FLOAT16)
                               == onnx.TensorProto.FLOAT16 for n in matmuls)
