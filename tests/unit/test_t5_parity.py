"""T5 / Flan-T5 / mT5 (issue 45): load_t5() against transformers'
T5ForConditionalGeneration / MT5ForConditionalGeneration on tiny random
checkpoints (T5: relu, tied, output scaled; T5 v1.1 / Flan-T5 style: gated-gelu,
untied lm_head, d_kv * heads != d_model; mT5: never scaled) with every weight
perturbed: encoder, logits, cached decode steps, rows at mixed positions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import Tensor

from seq2serve.model.config import ModelConfig
from seq2serve.model.families.hf import ConversionError
from seq2serve.model.families.t5 import convert_t5, load_t5

TOL = 1e-4
VOCAB = 200  # larger than the tokenizer, as T5's 32128

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
            p.add_(0.3 * torch.randn_like(p))
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
