"""Seq2SeqTransformer on tiny configs: shapes, masks, the KV cache, beam reordering,
grouped cross-attention, config validation and greedy decoding."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from seq2serve.model.config import ModelConfig
from seq2serve.model.transformer import Seq2SeqTransformer

PAD, START, EOS = 0, 1, 2


def tiny(**overrides: object) -> ModelConfig:
    base = ModelConfig(src_vocab_size=29, tgt_vocab_size=29, d_model=16, encoder_layers=2,
                       decoder_layers=2, encoder_heads=2, decoder_heads=4, encoder_ffn_dim=32,
                       decoder_ffn_dim=24, max_positions=40, dropout=0.0, pad_id=PAD,
                       bos_id=START, eos_id=EOS, unk_id=3, decoder_start_id=START)
    return dataclasses.replace(base, **overrides)


def build(cfg: ModelConfig, seed: int = 0) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(cfg).eval()
    with torch.no_grad():  # nonzero biases and norms, so every parameter matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        if model.final_logits_bias is not None:
            model.final_logits_bias.normal_()
    return model


def batch(cfg: ModelConfig, b: int = 3, s: int = 7, t: int = 5,
          seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Sources with lengths s, s-2, s-4 (right-padded) and teacher-forced targets."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, cfg.src_vocab_size, (b, s), generator=g)
    lengths = torch.tensor([max(s - 2 * i, 1) for i in range(b)])
    mask = (torch.arange(s)[None, :] < lengths[:, None]).long()  # (B, S)
    src = src.masked_fill(mask == 0, cfg.pad_id)
    tgt = torch.randint(4, cfg.tgt_vocab_size, (b, t), generator=g)
    tgt[:, 0] = cfg.decoder_start_id
    return src, mask, tgt


def stepwise(model: Seq2SeqTransformer, src: Tensor, mask: Tensor, tgt: Tensor) -> Tensor:
    """Log-probs (B, T, V) from decode_step with the cache, one token at a time."""
    _, cross_k, cross_v = model.encode(src, mask)
    b, t = tgt.shape
    self_k, self_v = model.empty_cache(b)
    out = []
    for step in range(t):
        positions = torch.full((b,), step)
        log_probs, self_k, self_v, _ = model.decode_step(tgt[:, step], positions, self_k, self_v,
                                                      cross_k, cross_v, mask)
        out.append(log_probs)
    return torch.stack(out, dim=1)


CONFIGS = {
    "post_norm": tiny(),
    "pre_norm": tiny(pre_norm=True),
    "marian_like": tiny(activation="swish", position_layout="split", final_logits_bias=True,
                        share_embeddings=False, tgt_vocab_size=23),
    "untied_gelu": tiny(activation="gelu", tie_output=False, scale_embedding=False,
                        encoder_layers=1, decoder_layers=3),
    "pre_norm_gelu_new": tiny(pre_norm=True, activation="gelu_new", decoder_heads=1,
                              encoder_heads=8, decoder_ffn_dim=8),
}


@torch.no_grad()
def test_shapes() -> None:
    cfg = tiny()
    model = build(cfg)
    src, mask, tgt = batch(cfg, b=3, s=7, t=5)
    memory, cross_k, cross_v = model.encode(src, mask)
    dh = cfg.d_model // cfg.decoder_heads
    assert memory.shape == (3, 7, cfg.d_model)
    assert len(cross_k) == len(cross_v) == cfg.decoder_layers
    assert all(kv.shape == (3, cfg.decoder_heads, 7, dh) for kv in [*cross_k, *cross_v])
    assert model(src, mask, tgt).shape == (3, 5, cfg.tgt_vocab_size)

    n = 6  # two hypotheses per source
    self_k, self_v = model.empty_cache(n)
    assert len(self_k) == len(self_v) == cfg.decoder_layers
    assert all(kv.shape == (n, cfg.decoder_heads, 0, dh) for kv in [*self_k, *self_v])
    tokens = torch.full((n,), START)
    log_probs, new_k, new_v, alignment = model.decode_step(
        tokens, torch.zeros(n, dtype=torch.long), self_k, self_v, cross_k, cross_v, mask)
    assert log_probs.shape == (n, cfg.tgt_vocab_size)
    assert alignment.shape == (n,) and alignment.dtype == torch.int64
    assert len(new_k) == len(new_v) == cfg.decoder_layers
    assert all(kv.shape == (n, cfg.decoder_heads, 1, dh) for kv in [*new_k, *new_v])
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(n))


@torch.no_grad()
def test_padded_source_tokens_do_not_matter() -> None:
    cfg = tiny()
    model = build(cfg)
    src, mask, tgt = batch(cfg)
    other = src.clone()
    other[mask == 0] = 5  # any token id under the padding
    assert not torch.equal(src, other)
    memory, _, _ = model.encode(src, mask)
    memory2, _, _ = model.encode(other, mask)
    keep = mask.bool()
    torch.testing.assert_close(memory[keep], memory2[keep], rtol=0, atol=1e-6)
    torch.testing.assert_close(model(src, mask, tgt), model(other, mask, tgt), rtol=0, atol=1e-6)
    torch.testing.assert_close(stepwise(model, src, mask, tgt), stepwise(model, other, mask, tgt),
                               rtol=0, atol=1e-6)


@torch.no_grad()
def test_batch_rows_are_independent() -> None:
    cfg = tiny()
    model = build(cfg)
    src, mask, tgt = batch(cfg)
    s = int(mask[1].sum())
    alone = model(src[1:2, :s], mask[1:2, :s], tgt[1:2])
    torch.testing.assert_close(model(src, mask, tgt)[1:2], alone, rtol=0, atol=1e-5)


@torch.no_grad()
def test_later_target_tokens_do_not_change_earlier_logits() -> None:
    cfg = tiny()
    model = build(cfg)
    src, mask, tgt = batch(cfg, t=6)
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % cfg.tgt_vocab_size
    before, after = model(src, mask, tgt), model(src, mask, changed)
    torch.testing.assert_close(before[:, :3], after[:, :3], rtol=0, atol=0)
    assert not torch.allclose(before[:, 3:], after[:, 3:])


@pytest.mark.parametrize("name", sorted(CONFIGS))
@torch.no_grad()
def test_cached_decoding_equals_full_sequence(name: str) -> None:
    cfg = CONFIGS[name]
    model = build(cfg)
    src, mask, tgt = batch(cfg, b=3, s=8, t=7)
    full = model(src, mask, tgt).log_softmax(-1)
    diff = (stepwise(model, src, mask, tgt) - full).abs().max().item()
    assert diff <= 1e-5, f"{name}: max abs diff {diff}"


@torch.no_grad()
def test_reorder_cache_then_step_is_the_reordered_history() -> None:
    cfg = tiny()
    model = build(cfg)
    b, k, t = 2, 3, 4
    src, mask, _ = batch(cfg, b=b, s=6)
    _, cross_k, cross_v = model.encode(src, mask)
    g = torch.Generator().manual_seed(3)
    prefixes = torch.randint(4, cfg.tgt_vocab_size, (b * k, t), generator=g)
    prefixes[:, 0] = START
    self_k, self_v = model.empty_cache(b * k)
    for step in range(t):
        _, self_k, self_v, _ = model.decode_step(prefixes[:, step], torch.full((b * k,), step),
                                                 self_k, self_v, cross_k, cross_v, mask)
    # Beam search keeps hypotheses within their source's group, possibly duplicated.
    origin = torch.tensor([2, 2, 0, 4, 5, 3])
    moved_k, moved_v = model.reorder_cache(self_k, self_v, origin)
    for before, after in zip([*self_k, *self_v], [*moved_k, *moved_v], strict=True):
        assert torch.equal(after, before[origin])
    nxt = torch.randint(4, cfg.tgt_vocab_size, (b * k,), generator=g)
    positions = torch.full((b * k,), t)
    log_probs, _, _, _ = model.decode_step(nxt, positions, moved_k, moved_v, cross_k,
                                           cross_v, mask)
    # And it is what a full pass over the reordered histories computes.
    tgt = torch.cat([prefixes[origin], nxt[:, None]], dim=1)
    full = model(src.repeat_interleave(k, 0), mask.repeat_interleave(k, 0), tgt)
    torch.testing.assert_close(log_probs, full[:, -1].log_softmax(-1), rtol=0, atol=1e-5)


@torch.no_grad()
def test_grouped_cross_attention_equals_expanded() -> None:
    cfg = tiny()
    model = build(cfg)
    b, k = 3, 4
    src, mask, _ = batch(cfg, b=b, s=7)
    _, cross_k, cross_v = model.encode(src, mask)
    n = b * k
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(4, cfg.tgt_vocab_size, (n,), generator=g)
    shape = (n, cfg.decoder_heads, 3, cfg.d_model // cfg.decoder_heads)
    self_k = [torch.randn(shape, generator=g) for _ in range(cfg.decoder_layers)]
    self_v = [torch.randn(shape, generator=g) for _ in range(cfg.decoder_layers)]
    positions = torch.full((n,), 3)
    grouped = model.decode_step(tokens, positions, self_k, self_v, cross_k, cross_v, mask)
    expanded = model.decode_step(tokens, positions, self_k, self_v,
                                 [c.repeat_interleave(k, 0) for c in cross_k],
                                 [c.repeat_interleave(k, 0) for c in cross_v],
                                 mask.repeat_interleave(k, 0))
    for a, e in zip(grouped, expanded, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-6)


def test_config_lists_every_problem() -> None:
    bad = ModelConfig(d_model=30, encoder_heads=4, decoder_layers=0, activation="tanh",
                      position_layout="diagonal", dropout=1.5, src_vocab_size=100,
                      tgt_vocab_size=50, share_embeddings=True, pad_id=-1, eos_id=50)
    problems = bad.problems()
    expected = ["decoder_layers must be >= 1", "divisible by encoder_heads", "activation",
                "position_layout", "dropout must be in [0, 1)", "share_embeddings",
                "pad_id must be in [0, 50)", "eos_id must be in [0, 50)"]
    for fragment in expected:
        assert any(fragment in p for p in problems), (fragment, problems)
    with pytest.raises(ValueError) as info:
        Seq2SeqTransformer(bad)
    for fragment in expected:
        assert fragment in str(info.value)
    assert tiny().problems() == []


def test_config_json_round_trip() -> None:
    cfg = tiny(activation="swish", extra={"source": "test"})
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="unknown ModelConfig fields: nope"):
        ModelConfig.from_dict({**cfg.to_dict(), "nope": 1})


def test_shared_and_tied_weights_are_one_tensor() -> None:
    model = Seq2SeqTransformer(tiny())
    assert model.src_embed.weight is model.tgt_embed.weight is model.output.weight
    untied = Seq2SeqTransformer(tiny(share_embeddings=False, tie_output=False))
    assert untied.src_embed.weight is not untied.tgt_embed.weight
    assert untied.output.weight is not untied.tgt_embed.weight


@torch.no_grad()
def test_greedy_follows_the_argmax() -> None:
    cfg = tiny(activation="swish", position_layout="split", final_logits_bias=True)
    model = build(cfg)
    src, mask, _ = batch(cfg)
    out = model.greedy(src, mask, max_len=6)
    assert out.dtype == torch.long and out.shape[0] == 3 and 1 <= out.shape[1] <= 6
    # Every greedy token is the argmax of a full pass over its own prefix.
    tgt_in = torch.cat([torch.full((3, 1), cfg.decoder_start_id), out[:, :-1]], dim=1)
    argmax = model(src, mask, tgt_in).argmax(-1)
    for row in range(3):
        ends = (out[row] == cfg.eos_id).nonzero()
        stop = int(ends[0]) + 1 if len(ends) else out.shape[1]
        assert torch.equal(out[row, :stop], argmax[row, :stop])
        assert (out[row, stop:] == cfg.pad_id).all()
