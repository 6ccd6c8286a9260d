"""A seq2serve checkpoint as ONNX Runtime's `BeamSearch` operator: the whole
decoding loop of a request-level batch in C++, for `seq2serve bench --model NAME
--ort-beam-search`.

ONNX Runtime's contrib operator `BeamSearch` (com.microsoft, `model_type` 1)
drives an encoder and a decoder subgraph in the contract of its T5/BART
converter (`onnxruntime.transformers.convert_generation`):

- encoder: `encoder_input_ids`, `encoder_attention_mask` (B, S) int32 ->
  `present_{key,value}_cross_{i}` (B, H, S, Dh), one pair per decoder layer;
- decoder: `input_ids` (N, 1) int32, `encoder_attention_mask` (N, S) int32,
  `past_{key,value}_self_{i}` (N, H, T, Dh), `past_{key,value}_cross_{i}` -> `logits`
  (N, 1, V) and `present_{key,value}_self_{i}` (N, H, T + 1, Dh): the self-attention
  cache grows by concatenation (the operator reorders it between steps), a row's
  position is T, and the operator applies the log-softmax, the beam step, Hugging
  Face's length penalty and stop rule, and `vocab_mask` (the package's suppressed
  tokens) itself.

Both subgraphs are traced from the same PyTorch model code as the package's own
graphs (`Seq2SeqTransformer`'s layers, called here with a concatenated cache and
no self-attention mask) and quantized with the same per-row int8 scheme
(`export.quantize`). This is a measurement of that design direction, not a
serving path: its scores differ from the engine's in the low bits (its own
log-softmax and cache layout), so taking it for some batches and not others would
let a text's output depend on its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2serve.bench.engine.systems import System, Tokens, cpu_session, engine_defaults

GRAPH_FILE = "beam_search.onnx"
OPSET = 17


def _subgraphs(checkpoint: Path, out: Path) -> tuple[Path, Path]:
    """Trace the encoder and the decoder subgraphs of `checkpoint` into `out`."""
    import torch
    from torch import Tensor, nn

    from seq2serve.model.checkpoint import load_checkpoint

    model, _, _ = load_checkpoint(checkpoint)
    cfg = model.cfg
    layers = cfg.decoder_layers

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model  # a submodule: its weights are the graph's initializers

        def forward(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
            memory = model.run_encoder(ids.long(), mask.long())
            keys, values = model.cross_keys_values(memory)
            return tuple(t for pair in zip(keys, values, strict=True) for t in pair)

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Tensor, enc_mask: Tensor, *past: Tensor
                    ) -> tuple[Tensor, ...]:
            self_kv, cross_kv = past[:2 * layers], past[2 * layers:]
            positions = torch.zeros_like(input_ids, dtype=torch.long) + self_kv[0].shape[2]
            x = model.embed_target(input_ids.long(), positions)  # (N, 1, D)
            cross_mask = enc_mask.bool()[:, None, None, :]
            presents: list[Tensor] = []
            for i, layer in enumerate(model.decoder_layers):
                past_k, past_v = self_kv[2 * i], self_kv[2 * i + 1]
                cross_k, cross_v = cross_kv[2 * i], cross_kv[2 * i + 1]

                def self_attention(h: Tensor, layer: Any = layer, past_k: Tensor = past_k,
                                   past_v: Tensor = past_v) -> Tensor:
                    q, k, v = layer.self_attn.queries_keys_values(h)
                    k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
                    presents.extend((k, v))
                    return layer.self_attn.attend(q, k, v, None)  # every slot is its own past

                def cross_attention(h: Tensor, layer: Any = layer, cross_k: Tensor = cross_k,
                                    cross_v: Tensor = cross_v) -> Tensor:
                    q = layer.cross_attn.split_heads(layer.cross_attn.q_proj(h))
                    return layer.cross_attn.attend(q, cross_k, cross_v, cross_mask)

                x = layer.self_block(x, self_attention)
                x = layer.cross_block(x, cross_attention)
                x = layer.ffn_block(x, layer.ffn)
            if model.decoder_norm is not None:
                x = model.decoder_norm(x)
            return (model.logits(x), *presents)

    heads, head_dim = cfg.decoder_heads, cfg.decoder_head_dim
    batch, source, past_length = 2, 5, 3
    ids = torch.randint(4, cfg.src_vocab_size, (batch, source), dtype=torch.int32)
    mask = torch.ones(batch, source, dtype=torch.int32)
    cross = [f"present_{kv}_cross_{i}" for i in range(layers) for kv in ("key", "value")]
    past_self = [f"past_{kv}_self_{i}" for i in range(layers) for kv in ("key", "value")]
    past_cross = [f"past_{kv}_cross_{i}" for i in range(layers) for kv in ("key", "value")]
    present_self = [f"present_{kv}_self_{i}" for i in range(layers) for kv in ("key", "value")]
    past = ([torch.randn(batch, heads, past_length, head_dim) for _ in past_self]
            + [torch.randn(batch, heads, source, head_dim) for _ in past_cross])
    encoder, decoder = out / "encoder.onnx", out / "decoder.onnx"
    with torch.no_grad():
        torch.onnx.export(
            Encoder(), (ids, mask), str(encoder), dynamo=False, opset_version=OPSET,
            input_names=["encoder_input_ids", "encoder_attention_mask"], output_names=cross,
            dynamic_axes={"encoder_input_ids": {0: "B", 1: "S"},
                          "encoder_attention_mask": {0: "B", 1: "S"},
                          **{name: {0: "B", 2: "S"} for name in cross}})
        torch.onnx.export(
            Decoder(), (torch.randint(4, cfg.tgt_vocab_size, (batch, 1), dtype=torch.int32),
                        mask, *past),
            str(decoder), dynamo=False, opset_version=OPSET,
            input_names=["input_ids", "encoder_attention_mask", *past_self, *past_cross],
            output_names=["logits", *present_self],
            dynamic_axes={"input_ids": {0: "N"}, "encoder_attention_mask": {0: "N", 1: "S"},
                          "logits": {0: "N"},
                          **{name: {0: "N", 2: "T"} for name in past_self},
                          **{name: {0: "N", 2: "S"} for name in past_cross},
                          **{name: {0: "N", 2: "T1"} for name in present_self}})
    return encoder, decoder


def build(checkpoint: str | Path, out: str | Path, precision: str = "fp32") -> Path:
    """Write OUT/beam_search.onnx: one BeamSearch node over `checkpoint`'s encoder and
    decoder subgraphs (int8: per-row quantized as the packages are). Returns its path."""
    import onnx
    from onnx import TensorProto, helper

    from seq2serve.export.quantize import quantize_int8
    from seq2serve.model.checkpoint import read_meta
    from seq2serve.model.config import ModelConfig

    checkpoint, out = Path(checkpoint), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = ModelConfig.from_dict(read_meta(checkpoint)["model"])
    paths = _subgraphs(checkpoint, out)
    if precision == "int8":
        for path in paths:
            quantize_int8(path, path)
    encoder, decoder = (onnx.load(str(p)) for p in paths)
    node = helper.make_node(
        "BeamSearch",
        ["input_ids", "max_length", "min_length", "num_beams", "num_return_sequences",
         "length_penalty", "repetition_penalty", "vocab_mask", "", "attention_mask"],
        ["sequences", "sequences_scores"], domain="com.microsoft", name="BeamSearch",
        eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id,
        decoder_start_token_id=cfg.decoder_start_id, no_repeat_ngram_size=0,
        early_stopping=0, model_type=1, encoder=encoder.graph, decoder=decoder.graph)
    int32, one = TensorProto.INT32, [1]
    inputs = [helper.make_tensor_value_info("input_ids", int32, ["B", "S"]),
              *(helper.make_tensor_value_info(name, int32, one) for name in
                ("max_length", "min_length", "num_beams", "num_return_sequences")),
              *(helper.make_tensor_value_info(name, TensorProto.FLOAT, one) for name in
                ("length_penalty", "repetition_penalty")),
              helper.make_tensor_value_info("vocab_mask", int32, [cfg.tgt_vocab_size]),
              helper.make_tensor_value_info("attention_mask", int32, ["B", "S"])]
    outputs = [helper.make_tensor_value_info("sequences", int32, ["B", "R", "L"]),
               helper.make_tensor_value_info("sequences_scores", TensorProto.FLOAT, ["B", "R"])]
    opsets = {o.domain: o.version for o in [*encoder.opset_import, *decoder.opset_import]}
    opsets.setdefault("com.microsoft", 1)
    model = helper.make_model(helper.make_graph([node], "beam_search", inputs, outputs),
                              opset_imports=[helper.make_opsetid(d, v)
                                             for d, v in sorted(opsets.items())])
    model.ir_version = encoder.ir_version
    graph = out / GRAPH_FILE
    onnx.save(model, str(graph))
    for path in paths:
        path.unlink()
    return graph


class OrtBeamSearch(System):
    """`build`'s graph on the engine's token ids, with the package's generation
    defaults (length limit, length penalty, suppressed tokens) as CheckpointCTranslate2
    takes them: one length limit per call, the batch's longest, each output then cut
    to its own source's. Outputs end with EOS where the model ended them (the
    operator pads after EOS, without it)."""

    name = "ort-beamsearch"

    def __init__(self, graph: Path, package: Path, precision: str, threads: int):
        from seq2serve.model.package.manifest import load_package

        self.graph = Path(graph)
        self.precision = precision
        self.threads = threads
        manifest = load_package(package).manifest
        self.special = manifest.special_tokens
        self.never_generated = manifest.never_generated()
        self.options = engine_defaults(manifest)
        self.vocab = manifest.config.tgt_vocab_size
        self.session: Any = None

    def load(self) -> None:
        self.session = cpu_session(self.graph, self.threads)

    def prepare(self, sources: Sequence[Sequence[int]]) -> Any:
        import numpy as np

        width = max(len(s) for s in sources)
        ids = np.full((len(sources), width), self.special.pad, np.int32)
        mask = np.zeros((len(sources), width), np.int32)
        for row, source in enumerate(sources):
            ids[row, :len(source)] = source
            mask[row, :len(source)] = 1
        vocab_mask = np.ones(self.vocab, np.int32)
        vocab_mask[list(self.never_generated)] = 0
        limits = [self.options.max_new_tokens(len(s)) for s in sources]
        feeds = {"input_ids": ids, "attention_mask": mask, "vocab_mask": vocab_mask,
                 "num_return_sequences": np.array([1], np.int32),
                 "length_penalty": np.array([self.options.length_penalty], np.float32),
                 "repetition_penalty": np.array([self.options.repetition_penalty], np.float32)}
        return feeds, limits

    def generate(self, prepared: Any, beam: int, new_tokens: int | None) -> Tokens:
        import numpy as np

        feeds, limits = prepared
        # Lengths count the decoder's start token, which the sequences begin with.
        longest = (new_tokens or max(limits)) + 1
        shortest = new_tokens + 1 if new_tokens else self.options.min_length + 1
        sequences = self.session.run(["sequences"], {
            **feeds, "num_beams": np.array([beam], np.int32),
            "max_length": np.array([longest], np.int32),
            "min_length": np.array([shortest], np.int32)})[0]
        outputs = []
        cut = limits if new_tokens is None else [new_tokens] * len(limits)
        for row, limit in zip(sequences[:, 0].tolist(), cut, strict=True):
            tokens = row[1:]
            if self.special.pad in tokens:  # ended: EOS, then padding
                tokens = tokens[:tokens.index(self.special.pad)] + [self.special.eos]
            outputs.append(tokens[:limit])
        return outputs

    def close(self) -> None:
        self.session = None
        super().close()
