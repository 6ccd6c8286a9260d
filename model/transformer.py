"""The encoder-decoder transformer of "Attention Is All You Need", from the paper.

`encode()`, `decode_step()` and `reorder_cache()` have exactly the signatures
of the exported ONNX graphs (see export/): the encoder also returns every decoder layer's
cross-attention keys and values, so they are computed once per source, and the
decoder step groups hypotheses by source so cross K/V are never copied per
beam. `forward()` is the full-sequence pass used for training.

Shapes: B sources, K hypotheses per source (beam), N = B*K decoder rows,
S source length, T target (cache) length, L layers, H heads, Dh = D / H (or the
configured head_dim: T5's d_kv).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2serve.model.config import ModelConfig


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where query t may attend to key s (s <= t)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def fit_cache(cache: Tensor, positions: Tensor) -> Tensor:
    """cache (N, H, Tc, Dh) zero-padded along Tc to hold slot max(positions)."""
    needed = int(positions.max()) + 1 if positions.numel() else 0
    if cache.shape[2] >= needed:
        return cache
    return F.pad(cache, (0, 0, 0, needed - cache.shape[2]))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
              dropout: nn.Module | None = None) -> Tensor:
    """Scaled dot-product attention. q (..., Tq, Dh), k/v (..., Tk, Dh), mask
    broadcastable to (..., Tq, Tk), True = attend. Returns (..., Tq, Dh)."""
    return attention_with_probs(q, k, v, mask, dropout)[0]


def attention_with_probs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                         dropout: nn.Module | None = None, scale: float = 0.0,
                         bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`attention`, also returning the attention weights (..., Tq, Tk) (before dropout).
    `scale` 0.0 is 1/sqrt(Dh) (T5's is 1.0); `bias` (broadcastable to the scores)
    is added to the scores before masking (T5's relative position bias)."""
    if not scale:
        # int(): the head size is a constant of the model, not a graph value to trace.
        scale = 1.0 / math.sqrt(int(q.shape[-1]))
    scores = torch.matmul(q * scale if scale != 1.0 else q, k.transpose(-1, -2))  # (..., Tq, Tk)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        # finfo.min rather than -inf: a fully masked row (a padding query) stays finite.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    return torch.matmul(dropout(probs) if dropout is not None else probs, v), probs


def sinusoid_table(num_positions: int, dim: int, layout: str) -> Tensor:
    """(P, D) positional encodings. 'interleaved' is the paper's PE(pos, 2i) = sin,
    PE(pos, 2i+1) = cos; 'split' is Marian's: all sines, then all cosines."""
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    inv_freq = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (D/2,)
    angles = position * inv_freq  # (P, D/2)
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    if layout == "interleaved":
        table[:, 0::2] = torch.sin(angles)
        table[:, 1::2] = torch.cos(angles)
    else:
        table[:, : dim // 2] = torch.sin(angles)
        table[:, dim // 2:] = torch.cos(angles)
    return table.float()


def activation_fn(name: str):
    return {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
        "swish": F.silu,
    }[name]


class RMSNorm(nn.Module):
    """T5's LayerNorm (T5LayerNorm): x / sqrt(mean(x^2) + eps) * weight, no mean
    subtracted, no bias, the variance in fp32 whatever the weights' dtype (the
    result is cast back to the weight's dtype, as transformers does)."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Casts only where they convert (a no-op Cast traced badly).
        xf = x if x.dtype == torch.float32 else x.float()
        h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (h if h.dtype == self.weight.dtype else h.to(self.weight.dtype))


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The configured normalisation over d_model: LayerNorm, or T5's RMSNorm."""
    if cfg.norm == "rms":
        return RMSNorm(cfg.d_model, cfg.layer_norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)


def relative_bucket(relative: Tensor, bidirectional: bool, num_buckets: int,
                    max_distance: int) -> Tensor:
    """T5's relative position bucket (T5Attention._relative_position_bucket) of
    `relative` = key position - query position (int64, any shape)."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        relative = relative.abs()
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    max_exact = num_buckets // 2
    small = relative < max_exact
    large = max_exact + (torch.log(relative.float() / max_exact)
                         / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(small, relative, large)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float, head_dim: int = 0,
                 bias: bool = True, scale: float = 0.0):
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim or d_model // heads
        self.scale = scale  # 0.0: 1/sqrt(head_dim)
        self.has_bias = bias
        inner = heads * self.head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    @staticmethod
    def merge_heads(x: Tensor) -> Tensor:
        b, h, t, dh = x.shape
        return x.transpose(1, 2).reshape(b, t, h * dh)  # (B, T, D)

    def keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        return self.split_heads(self.k_proj(memory)), self.split_heads(self.v_proj(memory))

    def queries_keys_values(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's three projections of x (B, T, D) as one matrix product
        (one (D, 3D) MatMul in the exported graphs: one pass over x instead of
        three small ones) -> q, k, v each (B, H, T, Dh)."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        bias = (torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
                if self.has_bias else None)
        q, k, v = F.linear(x, weight, bias).chunk(3, dim=-1)  # (B, T, H*Dh) each
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               bias: Tensor | None = None) -> Tensor:
        """q (B, H, Tq, Dh); k, v (B, H, Tk, Dh) already projected -> (B, Tq, D).
        bias: added to the scores (T5's relative position bias), or None."""
        return self.attend_with_probs(q, k, v, mask, bias)[0]

    def attend_with_probs(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                          bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`attend`, also returning the attention weights (B, H, Tq, Tk)."""
        out, probs = attention_with_probs(q, k, v, mask,
                                          self.dropout if self.training else None,
                                          self.scale, bias)
        return self.out_proj(self.merge_heads(out)), probs

    def forward(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """x (B, Tq, D); k, v (B, H, Tk, Dh) already projected."""
        return self.attend(self.split_heads(self.q_proj(x)), k, v, mask)  # q (B, H, Tq, Dh)


class FeedForward(nn.Module):
    """fc2(act(fc1 x)); gated (T5 v1.1, Flan-T5, mT5): fc2(act(fc1 x) * fc_gate x)."""

    def __init__(self, d_model: int, d_ff: int, activation: str, dropout: float,
                 bias: bool = True, gated: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.fc_gate = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.act = activation_fn(activation)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.fc1(x))
        if self.fc_gate is not None:
            h = h * self.fc_gate(x)
        return self.fc2(self.dropout(h))


def _attention(cfg: ModelConfig, heads: int) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, heads, cfg.attention_dropout, cfg.head_dim,
                              cfg.linear_bias, cfg.attention_scale)


def _ffn(cfg: ModelConfig, d_ff: int) -> FeedForward:
    return FeedForward(cfg.d_model, d_ff, cfg.activation, cfg.activation_dropout,
                       cfg.linear_bias, cfg.ffn_gated)


class Sublayer(nn.Module):
    """Residual connection around a sublayer with LayerNorm (or T5's RMSNorm),
    post- or pre-norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = make_norm(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.pre_norm

    def forward(self, x: Tensor, fn) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = _attention(cfg, cfg.encoder_heads)
        self.ffn = _ffn(cfg, cfg.encoder_ffn_dim)
        self.attn_block = Sublayer(cfg)
        self.ffn_block = Sublayer(cfg)

    def forward(self, x: Tensor, mask: Tensor, bias: Tensor | None = None) -> Tensor:
        """bias: T5's relative position bias (1, H, S, S), or None."""
        def self_attention(h: Tensor) -> Tensor:
            return self.self_attn.attend(*self.self_attn.queries_keys_values(h), mask, bias)

        x = self.attn_block(x, self_attention)
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = _attention(cfg, cfg.decoder_heads)
        self.cross_attn = _attention(cfg, cfg.decoder_heads)
        self.ffn = _ffn(cfg, cfg.decoder_ffn_dim)
        self.self_block = Sublayer(cfg)
        self.cross_block = Sublayer(cfg)
        self.ffn_block = Sublayer(cfg)

    def forward(self, x: Tensor, past_k: Tensor | None, past_v: Tensor | None,
                self_mask: Tensor | None, cross_k: Tensor, cross_v: Tensor,
                cross_mask: Tensor, write_at: Tensor | None = None,
                self_bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x (N, T, D). past_k/v (N, H, Tc, Dh) or None. cross_k/v (B, H, S, Dh) with
        N = B*K: the K hypotheses of a source share one copy of its cross K/V.
        With a cache, T is 1 and write_at (N,) is each row's slot in it (its
        position): the new key/value overwrite that slot, so the cache keeps its
        length Tc. Returns x, the self-attention keys/values including this
        call's positions, and the cross-attention weights (B, H, K*T, S),
        queries grouped by source. self_bias: T5's relative position bias added to
        the self-attention scores ((N, H, 1, Tc) with a cache, (1, H, T, T)
        without), or None."""
        new_kv: list[Tensor] = []
        cross_weights: list[Tensor] = []

        def self_attention(h: Tensor) -> Tensor:
            q, k, v = self.self_attn.queries_keys_values(h)  # (N, H, T, Dh)
            if past_k is not None and past_v is not None and write_at is not None:
                # A row's keys sit at slots 0..position whatever the cache's length,
                # so rows at different steps share one cache (format 3). index_put
                # is a ScatterND in the graph: with its output bound to its input's
                # buffer ONNX Runtime writes the N x H slots and copies nothing
                # (ScatterElements copied the whole cache first, even in place).
                rows = torch.arange(k.shape[0], device=k.device).unsqueeze(1)  # (N, 1)
                heads = torch.arange(k.shape[1], device=k.device).unsqueeze(0)  # (1, H)
                slots = (rows, heads, write_at.unsqueeze(1))
                k = torch.index_put(past_k, slots, k[:, :, 0])  # (N, H, Tc, Dh)
                v = torch.index_put(past_v, slots, v[:, :, 0])
            new_kv.extend((k, v))
            return self.self_attn.attend(q, k, v, self_mask, self_bias)

        def cross_attention(h: Tensor) -> Tensor:
            n, t, d = h.shape
            b = cross_k.shape[0]
            # Hypotheses of one source become extra query positions of that source.
            grouped = h.reshape(b, (n // b) * t, d)  # (B, K*T, D)
            q = self.cross_attn.split_heads(self.cross_attn.q_proj(grouped))  # (B, H, K*T, Dh)
            out, weights = self.cross_attn.attend_with_probs(q, cross_k, cross_v, cross_mask)
            cross_weights.append(weights)
            return out.reshape(n, t, d)

        x = self.self_block(x, self_attention)
        x = self.cross_block(x, cross_attention)
        x = self.ffn_block(x, self.ffn)
        return x, new_kv[0], new_kv[1], cross_weights[0]


class Seq2SeqTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        if cfg.share_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, cfg.d_model,
                                          padding_idx=cfg.pad_id)
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_output:
            self.output.weight = self.tgt_embed.weight
        if cfg.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(cfg.tgt_vocab_size))
        else:
            self.final_logits_bias = None
        # Sinusoids: one table for both stacks, recomputed (not saved). Learned
        # (BART): one table per stack, saved with the weights.
        # Relative (T5): no absolute positions; one bias table (buckets, H) per
        # stack (Hugging Face's first layer's), added to every self-attention layer.
        self.src_positions: nn.Parameter | None = None
        self.tgt_positions: nn.Parameter | None = None
        self.src_relative: nn.Embedding | None = None
        self.tgt_relative: nn.Embedding | None = None
        if cfg.positions == "learned":
            self.src_positions = nn.Parameter(torch.zeros(cfg.max_positions, cfg.d_model))
            self.tgt_positions = nn.Parameter(torch.zeros(cfg.max_positions, cfg.d_model))
        elif cfg.positions == "relative":
            self.src_relative = nn.Embedding(cfg.relative_buckets, cfg.encoder_heads)
            self.tgt_relative = nn.Embedding(cfg.relative_buckets, cfg.decoder_heads)
        else:
            self.register_buffer(
                "positions", sinusoid_table(cfg.max_positions, cfg.d_model, cfg.position_layout),
                persistent=False,
            )
        # BART's LayerNorm of the embedded tokens (after adding positions), per stack.
        self.src_embed_norm = make_norm(cfg) if cfg.layernorm_embedding else None
        self.tgt_embed_norm = make_norm(cfg) if cfg.layernorm_embedding else None
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm stacks end in a LayerNorm; post-norm stacks already end normalised.
        self.encoder_norm = make_norm(cfg) if cfg.pre_norm else None
        self.decoder_norm = make_norm(cfg) if cfg.pre_norm else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        nn.init.normal_(self.src_embed.weight, std=self.cfg.d_model ** -0.5)
        if not self.cfg.share_embeddings:
            nn.init.normal_(self.tgt_embed.weight, std=self.cfg.d_model ** -0.5)
        for emb in (self.src_embed, self.tgt_embed):
            with torch.no_grad():
                emb.weight[self.cfg.pad_id].zero_()

    # -- pieces ---------------------------------------------------------------

    def embed(self, table: nn.Embedding, ids: Tensor, positions: Tensor,
              position_table: Tensor | None = None, norm: nn.Module | None = None) -> Tensor:
        """ids (B, T), positions (B, T) -> (B, T, D): the tokens' embedding (scaled)
        plus their positions' (from `position_table`, by default the sinusoids;
        none with relative positions), normalised by `norm` where given."""
        if self.cfg.positions == "relative":
            x = table(ids) * self.embed_scale if self.embed_scale != 1.0 else table(ids)
        else:
            if position_table is None:
                position_table = self.positions
            x = table(ids) * self.embed_scale + position_table[positions]
        if norm is not None:
            x = norm(x)
        return self.dropout(x)

    def embed_source(self, ids: Tensor, positions: Tensor) -> Tensor:
        """The encoder's input: source ids (B, S), positions (B, S) -> (B, S, D)."""
        return self.embed(self.src_embed, ids, positions, self.src_positions,
                          self.src_embed_norm)  # src_positions None: the sinusoids

    def embed_target(self, ids: Tensor, positions: Tensor) -> Tensor:
        """The decoder's input: target ids (N, T), positions (N, T) -> (N, T, D)."""
        return self.embed(self.tgt_embed, ids, positions, self.tgt_positions,
                          self.tgt_embed_norm)

    def logits(self, hidden: Tensor) -> Tensor:
        out = self.output(hidden)
        if self.final_logits_bias is not None:
            out = out + self.final_logits_bias
        return out

    # -- T5's relative position bias ---------------------------------------------

    def encoder_bias(self, length: int | Tensor, device: torch.device) -> Tensor | None:
        """(1, H, S, S) the encoder's relative position bias, or None."""
        if self.src_relative is None:
            return None
        cfg = self.cfg
        span = torch.arange(length, device=device)
        relative = span[None, :] - span[:, None]  # key - query
        buckets = relative_bucket(relative, True, cfg.relative_buckets,
                                  cfg.relative_max_distance)
        return self.src_relative(buckets).permute(2, 0, 1).unsqueeze(0)

    def decoder_bias(self, length: int | Tensor, device: torch.device) -> Tensor | None:
        """(1, H, T, T) the decoder's causal relative position bias over T
        positions (the full-sequence pass), or None."""
        if self.tgt_relative is None:
            return None
        cfg = self.cfg
        span = torch.arange(length, device=device)
        buckets = relative_bucket(span[None, :] - span[:, None], False, cfg.relative_buckets,
                                  cfg.relative_max_distance)
        return self.tgt_relative(buckets).permute(2, 0, 1).unsqueeze(0)

    def decoder_step_bias(self, positions: Tensor, slots: Tensor) -> Tensor | None:
        """(N, H, 1, Tc) the relative bias of each row's query (at positions[r])
        to the cache's slots: rows at different steps get their own."""
        if self.tgt_relative is None:
            return None
        cfg = self.cfg
        relative = slots[None, :] - positions[:, None]  # (N, Tc)
        buckets = relative_bucket(relative, False, cfg.relative_buckets,
                                  cfg.relative_max_distance)
        return self.tgt_relative(buckets).permute(0, 2, 1).unsqueeze(2)

    def run_encoder(self, src_ids: Tensor, src_mask: Tensor) -> Tensor:
        """src_ids (B, S), src_mask (B, S) nonzero = token -> memory (B, S, D)."""
        b, s = src_ids.shape
        positions = torch.arange(s, device=src_ids.device).expand(b, s)
        x = self.embed_source(src_ids, positions)
        mask = src_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        bias = self.encoder_bias(s, src_ids.device)
        for layer in self.encoder_layers:
            x = layer(x, mask, bias)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x

    def cross_keys_values(self, memory: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """memory (B, S, D) -> cross K, V: L tensors (B, H, S, Dh) each."""
        pairs = [layer.cross_attn.keys_values(memory) for layer in self.decoder_layers]
        return [k for k, _ in pairs], [v for _, v in pairs]

    # -- the exported signatures ----------------------------------------------

    def encode(self, src_ids: Tensor, src_mask: Tensor
               ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Encoder graph: (src_ids (B, S), src_mask (B, S)) -> (memory (B, S, D),
        cross_k, cross_v: one (B, H, S, Dh) tensor per decoder layer each)."""
        memory = self.run_encoder(src_ids, src_mask)
        cross_k, cross_v = self.cross_keys_values(memory)
        return memory, cross_k, cross_v

    def decode_step(self, tokens: Tensor, positions: Tensor, self_k: Sequence[Tensor],
                    self_v: Sequence[Tensor], cross_k: Sequence[Tensor],
                    cross_v: Sequence[Tensor], src_mask: Tensor
                    ) -> tuple[Tensor, list[Tensor], list[Tensor], Tensor]:
        """Decoder step graph (package format 5: rows may be at different steps).

        tokens (N,) the last token of each hypothesis; positions (N,) its position,
        which is also its slot in the cache; self_k/self_v: per layer,
        (N, H, Tc, Dh) the cache, row r holding its earlier steps in slots
        0..positions[r]-1 and anything (masked) after; the graph needs
        Tc > max(positions) (the runner grows it in whole blocks; an eager call
        with a shorter cache, e.g. an empty one, gets it grown here);
        cross_k/cross_v: per layer, (B, H, S, Dh) from encode(); src_mask (B, S).
        Row r continues cache row r: beams that moved are reordered before the
        call (`reorder_cache`), so a step whose rows did not move copies no
        cache, and the new cache differs from the old one only in each row's
        slot (the server binds it to the old cache's buffer).
        Returns log_probs (N, V), the new cache, per layer (N, H, Tc, Dh), twice,
        and alignment (N,): the source position the last decoder layer's
        cross-attention weighs most (averaged over heads) for this step's token.

        One tensor per layer rather than one stacked (L, ...) tensor: a stacked
        cache costs the graph a Split and a stacking Concat of the whole cache
        every step (measured in docs/benchmarks.md).
        """
        if not torch.jit.is_tracing():
            self_k = [fit_cache(k, positions) for k in self_k]
            self_v = [fit_cache(v, positions) for v in self_v]
        x = self.embed_target(tokens[:, None], positions[:, None])  # (N, 1, D)
        cross_mask = src_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        # Row r attends to its own slots 0..positions[r]: (N, 1, 1, Tc).
        slots = torch.arange(self_k[0].shape[2], device=tokens.device)
        self_mask = (slots[None, :] <= positions[:, None])[:, None, None, :]
        self_bias = self.decoder_step_bias(positions, slots)
        new_k, new_v = [], []
        cross_weights = x.new_zeros(0)
        for i, layer in enumerate(self.decoder_layers):
            x, k, v, cross_weights = layer(x, self_k[i], self_v[i], self_mask, cross_k[i],
                                           cross_v[i], cross_mask, positions, self_bias)
            new_k.append(k)
            new_v.append(v)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        logits = self.logits(x[:, 0])  # (N, V)
        if logits.dtype != torch.float32:  # traced as a Cast: only where it converts
            logits = logits.float()
        # Only the last layer's weights: averaged over heads, (B, H, K, S) -> (N, S).
        averaged = cross_weights.mean(dim=1).reshape(tokens.shape[0], -1)
        alignment = averaged.argmax(dim=-1)  # (N,)
        return logits.log_softmax(dim=-1), new_k, new_v, alignment

    @staticmethod
    def reorder_cache(self_k: Sequence[Tensor], self_v: Sequence[Tensor], beam_origin: Tensor
                      ) -> tuple[list[Tensor], list[Tensor]]:
        """Reorder graph: the cache rows (N', H, Tc, Dh) per layer picked by
        beam_origin (N,), the row each hypothesis continues (beam search moving
        hypotheses, rows joining or leaving)."""
        return ([k.index_select(0, beam_origin) for k in self_k],
                [v.index_select(0, beam_origin) for v in self_v])

    def empty_cache(self, rows: int, device: torch.device | None = None,
                    dtype: torch.dtype = torch.float32) -> tuple[list[Tensor], list[Tensor]]:
        """A zero-length self-attention cache for `rows` hypotheses, per layer."""
        cfg = self.cfg
        shape = (rows, cfg.decoder_heads, 0, cfg.decoder_head_dim)
        layers = range(cfg.decoder_layers)
        return ([torch.zeros(shape, device=device, dtype=dtype) for _ in layers],
                [torch.zeros(shape, device=device, dtype=dtype) for _ in layers])

    # -- training -------------------------------------------------------------

    def forward(self, src_ids: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced pass: src (B, S), tgt_in (B, T) starting with the decoder
        start token -> logits (B, T, V)."""
        memory = self.run_encoder(src_ids, src_mask)
        b, t = tgt_in.shape
        positions = torch.arange(t, device=tgt_in.device).expand(b, t)
        x = self.embed_target(tgt_in, positions)
        self_mask = causal_mask(t, tgt_in.device)  # (T, T), broadcast over (B, H)
        cross_mask = src_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        self_bias = self.decoder_bias(t, tgt_in.device)
        for layer in self.decoder_layers:
            k, v = layer.cross_attn.keys_values(memory)
            x, _, _, _ = layer(x, None, None, self_mask, k, v, cross_mask, None, self_bias)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.logits(x)

    @torch.no_grad()
    def greedy(self, src_ids: Tensor, src_mask: Tensor, max_len: int) -> Tensor:
        """Greedy decoding with the cache (reference for tests and the trainer's
        validation; the server decodes with ONNX Runtime). Returns (B, <=max_len)
        token ids without the start token, EOS included, padded with pad_id."""
        cfg = self.cfg
        b = src_ids.shape[0]
        _, cross_k, cross_v = self.encode(src_ids, src_mask)
        self_k, self_v = self.empty_cache(b, src_ids.device, cross_k[0].dtype)
        tokens = torch.full((b,), cfg.decoder_start_id, dtype=torch.long, device=src_ids.device)
        done = torch.zeros(b, dtype=torch.bool, device=src_ids.device)
        out = []
        for step in range(max_len):
            positions = torch.full_like(tokens, step)
            log_probs, self_k, self_v, _ = self.decode_step(
                tokens, positions, self_k, self_v, cross_k, cross_v, src_mask)
            tokens = log_probs.argmax(-1).masked_fill(done, cfg.pad_id)
            out.append(tokens)
            done |= tokens == cfg.eos_id
            if bool(done.all()):
                break
        return torch.stack(out, dim=1)
