"""The model's attention as ONNX Runtime's fused operators, for tracing (format 7).

`FusedEncoder` and `FusedDecoderStep` compute what `Seq2SeqTransformer.encode()`
and `decode_step()` compute, from the same modules, but trace each attention
into one com.microsoft operator instead of the ~25 small nodes of the plain
chain (shape arithmetic, transposes, MatMuls, the mask, the softmax):

- encoder self-attention and decoder cross-attention: `MultiHeadAttention`
  with the source mask as its `key_padding_mask` (B, S) int32. The cross K/V
  come from the encoder already split into heads, (B, H, S, Dh), which the
  operator takes as they are; the K hypotheses of a source are its K query
  positions, so the cross K/V are never copied per beam. The decoder's last
  layer keeps the plain chain: the alignment output needs its attention weights.
- decoder self-attention: `GroupQueryAttention` with kv_num_heads = num_heads.
  The cache (N, H, T, Dh) is its past_key/past_value and its present_key/
  present_value: it writes each row's new key and value at the row's position
  (`seqlens_k` = positions) and attends to slots 0..position only. When the
  runner binds past and present to one buffer, the operator writes the N x H
  slots in place and copies nothing (ONNX Runtime's past_present_share_buffer,
  as onnxruntime-genai binds it); otherwise present is past with those slots
  written, the same values. Each row reads only its own slots, so a row's
  floats depend neither on the cache's length nor on its batch-mates.

T5's attention (scale 1.0, a relative position bias added to the scores): the
operators' `scale` attribute, and the bias as their `attention_bias` input:
(1, H, S, S) for the encoder's MultiHeadAttention, (N, H, 1, Tc) per row for
GroupQueryAttention (whose total_sequence_length is then the cache's length Tc,
the bias's last axis; each row still attends to its slots 0..position only).
Cross-attention has no bias. Heads may be narrower than d_model / H (T5's d_kv):
the operators take the projections' width, H * Dh.

Both operators have CPU kernels (float32, float16) and CUDA kernels
(MultiHeadAttention: float32 and float16; GroupQueryAttention: float16 and
bfloat16; an fp32 package on CUDA runs that one node on the CPU provider,
which ONNX Runtime places and copies for by itself).

Each operator is a `torch.autograd.Function` whose `symbolic` the TorchScript
exporter emits; its `forward` computes the same values in PyTorch, so a traced
run and an eager run agree. The exporter checks the graphs against the model's
own `encode()`/`decode_step()` (verify.py), not against these.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from seq2serve.model.transformer import (
    DecoderLayer,
    EncoderLayer,
    MultiHeadAttention,
    Seq2SeqTransformer,
    attention_with_probs,
)

MS_DOMAIN = "com.microsoft"


def _scale_attribute(scale: float) -> dict[str, float]:
    """The operators' `scale` attribute: left out at 0.0 (1/sqrt(Dh), their default)."""
    return {"scale_f": scale} if scale else {}


class _MultiHeadAttention(torch.autograd.Function):
    """com.microsoft MultiHeadAttention: query (B, Tq, H*Dh); key, value either
    (B, Tk, H*Dh) or already split into heads (B, H, Tk, Dh); key_padding_mask
    (B, Tk) int32, nonzero = attend; attention_bias (1, H, Tq, Tk) or None; scale
    (0.0: 1/sqrt(Dh)). Returns (B, Tq, H*Dh)."""

    @staticmethod
    def forward(ctx: Any, query: Tensor, key: Tensor, value: Tensor, mask: Tensor,
                heads: int, scale: float = 0.0, attention_bias: Tensor | None = None
                ) -> Tensor:
        b, tq, d = query.shape
        q = query.view(b, tq, heads, d // heads).transpose(1, 2)  # (B, H, Tq, Dh)
        if key.dim() == 3:
            key = key.view(b, -1, heads, d // heads).transpose(1, 2)  # (B, H, Tk, Dh)
            value = value.view(b, -1, heads, d // heads).transpose(1, 2)
        out = attention_with_probs(q, key, value, mask.bool()[:, None, None, :], None, scale,
                                   attention_bias)[0]  # (B, H, Tq, Dh)
        return out.transpose(1, 2).reshape(b, tq, d)

    @staticmethod
    def symbolic(g: Any, query: Any, key: Any, value: Any, mask: Any, heads: int,
                 scale: float = 0.0, attention_bias: Any = None) -> Any:
        no_bias = g.op("prim::Constant").setType(torch._C.OptionalType.ofTensor())
        extra = [] if attention_bias is None else [attention_bias]
        return g.op(f"{MS_DOMAIN}::MultiHeadAttention", query, key, value, no_bias, mask,
                    *extra, num_heads_i=heads,
                    **_scale_attribute(scale)).setType(query.type())


class _GroupQueryAttention(torch.autograd.Function):
    """com.microsoft GroupQueryAttention for one new position per row: query, key,
    value (N, 1, D); past_key, past_value (N, H, T, Dh); seqlens_k (N,) int32, each
    row's position (its slots are 0..position); total (scalar int32), the longest
    row's slot count (the cache's length where an attention_bias (N, H, 1, T) is
    given); scale (0.0: 1/sqrt(Dh)). Returns the output (N, 1, D) and present key
    and value: the past with each row's slot written. (D here is H * Dh.)"""

    @staticmethod
    def forward(ctx: Any, query: Tensor, key: Tensor, value: Tensor, past_key: Tensor,
                past_value: Tensor, seqlens_k: Tensor, total: Tensor, heads: int,
                scale: float = 0.0, attention_bias: Tensor | None = None
                ) -> tuple[Tensor, Tensor, Tensor]:
        n, _, d = query.shape
        split = (n, heads, d // heads)
        rows = torch.arange(n).unsqueeze(1)  # (N, 1)
        slots = (rows, torch.arange(heads).unsqueeze(0), seqlens_k.long().unsqueeze(1))
        present_key = torch.index_put(past_key, slots, key.view(split))  # (N, H, T, Dh)
        present_value = torch.index_put(past_value, slots, value.view(split))
        # Row r attends to its slots 0..seqlens_k[r]: (N, 1, 1, T).
        mask = torch.arange(past_key.shape[2])[None, :] <= seqlens_k.long()[:, None]
        q = query.view(split).unsqueeze(2)  # (N, H, 1, Dh)
        out = attention_with_probs(q, present_key, present_value, mask[:, None, None, :], None,
                                   scale, attention_bias)[0]
        return out.reshape(n, 1, d), present_key, present_value

    @staticmethod
    def symbolic(g: Any, query: Any, key: Any, value: Any, past_key: Any, past_value: Any,
                 seqlens_k: Any, total: Any, heads: int, scale: float = 0.0,
                 attention_bias: Any = None) -> Any:
        extra = []
        if attention_bias is not None:  # after cos_cache, sin_cache, position_ids: absent
            absent = g.op("prim::Constant").setType(torch._C.OptionalType.ofTensor())
            extra = [absent, absent, absent, attention_bias]
        out, present_key, present_value = g.op(
            f"{MS_DOMAIN}::GroupQueryAttention", query, key, value, past_key, past_value,
            seqlens_k, total, *extra, num_heads_i=heads, kv_num_heads_i=heads,
            **_scale_attribute(scale), outputs=3)
        out.setType(query.type())
        present_key.setType(past_key.type())
        present_value.setType(past_value.type())
        return out, present_key, present_value


def multi_head_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor,
                         heads: int, scale: float = 0.0,
                         attention_bias: Tensor | None = None) -> Tensor:
    """`_MultiHeadAttention` (one com.microsoft MultiHeadAttention node when traced)."""
    apply: Any = _MultiHeadAttention.apply  # torch leaves apply untyped
    out: Tensor = apply(query, key, value, mask, heads, scale, attention_bias)
    return out


def group_query_attention(query: Tensor, key: Tensor, value: Tensor, past_key: Tensor,
                          past_value: Tensor, seqlens_k: Tensor, total: Tensor, heads: int,
                          scale: float = 0.0, attention_bias: Tensor | None = None
                          ) -> tuple[Tensor, Tensor, Tensor]:
    """`_GroupQueryAttention` (one com.microsoft GroupQueryAttention node when traced)."""
    apply: Any = _GroupQueryAttention.apply  # torch leaves apply untyped
    out: tuple[Tensor, Tensor, Tensor] = apply(query, key, value, past_key, past_value,
                                                seqlens_k, total, heads, scale, attention_bias)
    return out


def _projections(attn: MultiHeadAttention, x: Tensor) -> tuple[Tensor, ...]:
    """q, k, v of x (B, T, D), each (B, T, H*Dh), as one (D, 3 H*Dh) MatMul (as
    `MultiHeadAttention.queries_keys_values`, before the split into heads)."""
    weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    if not attn.has_bias:  # T5: no bias
        return nn.functional.linear(x, weight).chunk(3, dim=-1)
    bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
    return nn.functional.linear(x, weight, bias).chunk(3, dim=-1)


def _output(attn: MultiHeadAttention, x: Tensor) -> Tensor:
    out: Tensor = attn.out_proj(x)
    return out


def _fused_self_attention(attn: MultiHeadAttention, x: Tensor, mask: Tensor,
                          bias: Tensor | None = None) -> Tensor:
    """Encoder self-attention: x (B, S, D), mask (B, S) int32, bias (1, H, S, S) or
    None -> (B, S, D)."""
    q, k, v = _projections(attn, x)
    return _output(attn, multi_head_attention(q, k, v, mask, attn.heads, attn.scale, bias))


class FusedEncoder(nn.Module):
    """`Seq2SeqTransformer.encode` with fused self-attention; the graph's outputs
    flat: memory, cross_k.*, cross_v.*."""

    def __init__(self, model: Seq2SeqTransformer):
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor, src_mask: Tensor) -> tuple[Tensor, ...]:
        model = self.model
        b, s = src_ids.shape
        positions = torch.arange(s).expand(b, s)
        x = model.embed_source(src_ids, positions)  # (B, S, D)
        mask = src_mask.to(torch.int32)  # (B, S)
        bias = model.encoder_bias(s, src_ids.device)  # T5's relative bias, or None
        for layer in model.encoder_layers:
            assert isinstance(layer, EncoderLayer)
            attn = layer.self_attn
            x = layer.attn_block(
                x, lambda h, attn=attn: _fused_self_attention(attn, h, mask, bias))
            x = layer.ffn_block(x, layer.ffn)
        if model.encoder_norm is not None:
            x = model.encoder_norm(x)
        cross_k, cross_v = model.cross_keys_values(x)
        return x, *cross_k, *cross_v


class FusedDecoderStep(nn.Module):
    """`Seq2SeqTransformer.decode_step` with fused attention; the graph's inputs
    and outputs flat, in decoder_inputs and decoder_outputs order."""

    def __init__(self, model: Seq2SeqTransformer):
        super().__init__()
        self.model = model

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        model = self.model
        layers = len(model.decoder_layers)
        tokens, positions, *caches, src_mask = args
        self_k, self_v, cross_k, cross_v = (caches[i * layers:(i + 1) * layers]
                                            for i in range(4))
        n = tokens.shape[0]
        x = model.embed_target(tokens[:, None], positions[:, None])  # (N, 1, D)
        seqlens_k = positions.to(torch.int32)  # (N,)
        slots = torch.arange(self_k[0].shape[2], device=tokens.device)
        self_bias = model.decoder_step_bias(positions, slots)  # (N, H, 1, Tc) or None
        if self_bias is None:
            total = (positions.max() + 1).to(torch.int32)  # a scalar
        else:  # the bias spans the whole cache: so does total_sequence_length
            total = (slots[-1] + 1).to(torch.int32)
        mask = src_mask.to(torch.int32)  # (B, S)
        new_k: list[Tensor] = []
        new_v: list[Tensor] = []
        weights = x.new_zeros(0)
        for i, layer in enumerate(model.decoder_layers):
            assert isinstance(layer, DecoderLayer)
            last = i == layers - 1

            def self_attention(h: Tensor, layer: DecoderLayer = layer, i: int = i) -> Tensor:
                attn = layer.self_attn
                q, k, v = _projections(attn, h)  # (N, 1, D) each
                out, present_k, present_v = group_query_attention(
                    q, k, v, self_k[i], self_v[i], seqlens_k, total, attn.heads, attn.scale,
                    self_bias)
                new_k.append(present_k)
                new_v.append(present_v)
                return _output(attn, out)

            def cross_attention(h: Tensor, layer: DecoderLayer = layer, i: int = i,
                                last: bool = last) -> Tensor:
                nonlocal weights
                attn = layer.cross_attn
                b = cross_k[i].shape[0]
                _, t, d = h.shape
                # Hypotheses of one source become extra query positions of that source.
                grouped = attn.q_proj(h.reshape(b, (n // b) * t, d))  # (B, K*T, D)
                if last:  # the alignment needs this layer's weights: the plain chain
                    out, weights = attn.attend_with_probs(
                        attn.split_heads(grouped), cross_k[i], cross_v[i],
                        src_mask.bool()[:, None, None, :])
                else:
                    out = _output(attn, multi_head_attention(
                        grouped, cross_k[i], cross_v[i], mask, attn.heads, attn.scale))
                return out.reshape(n, t, d)

            x = layer.self_block(x, self_attention)
            x = layer.cross_block(x, cross_attention)
            x = layer.ffn_block(x, layer.ffn)
        if model.decoder_norm is not None:
            x = model.decoder_norm(x)
        logits = model.logits(x[:, 0])  # (N, V)
        if logits.dtype != torch.float32:
            logits = logits.float()
        # Only the last layer's weights: averaged over heads, (B, H, K, S) -> (N, S).
        alignment = weights.mean(dim=1).reshape(n, -1).argmax(dim=-1)  # (N,)
        return logits.log_softmax(dim=-1), *new_k, *new_v, alignment

