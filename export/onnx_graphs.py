"""Trace `encode()` and `decode_step()` into the package's encoder and decoder
graphs; write the small cache and selection graphs (reorder, move, select)
directly."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import nn

from seq2serve.model.package.manifest import (
    DECODER_FILE,
    DEFAULT_ATTENTION,
    ENCODER_FILE,
    ENCODER_INPUTS,
    GRAPH_IR_VERSION,
    MOVE_FILE,
    REORDER_FILE,
    SELECT_FILE,
    SELECT_INPUTS,
    SELECT_OUTPUTS,
    TensorSpec,
    decoder_inputs,
    decoder_outputs,
    encoder_outputs,
    move_inputs,
    move_outputs,
    reorder_inputs,
    reorder_outputs,
)
from seq2serve.model.transformer import Seq2SeqTransformer

DEFAULT_OPSET = 17  # the first opset with LayerNormalization as one op


class _Encoder(nn.Module):
    def __init__(self, model: Seq2SeqTransformer):
        super().__init__()
        self.model = model

    def forward(self, src_ids: torch.Tensor, src_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        memory, cross_k, cross_v = self.model.encode(src_ids, src_mask)
        return memory, *cross_k, *cross_v


class _DecoderStep(nn.Module):
    def __init__(self, model: Seq2SeqTransformer):
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The graph's flat inputs (decoder_inputs order) regrouped per layer."""
        layers = len(self.model.decoder_layers)
        tokens, positions, *caches, src_mask = args
        self_k, self_v, cross_k, cross_v = (caches[i * layers:(i + 1) * layers]
                                            for i in range(4))
        log_probs, new_k, new_v, alignment = self.model.decode_step(
            tokens, positions, self_k, self_v, cross_k, cross_v, src_mask)
        return log_probs, *new_k, *new_v, alignment


def _dynamic_axes(spec: list[TensorSpec]) -> dict[str, dict[int, str]]:
    """Every symbolic axis except the fixed model dimensions is dynamic."""
    fixed = {"H", "Dh", "D", "V"}
    return {
        s.name: {i: dim for i, dim in enumerate(s.shape) if isinstance(dim, str)
                 and dim not in fixed}
        for s in spec
    }


def sample_inputs(model: Seq2SeqTransformer, batch: int = 2, beams: int = 2,
                  src_len: int = 5, cached: int = 3, seed: int = 0
                  ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    """Inputs for tracing and for checking ORT against PyTorch: the encoder's
    (src_ids, src_mask) and the decoder step's, flat in decoder_inputs order."""
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    src_ids = torch.randint(4, cfg.src_vocab_size, (batch, src_len), generator=gen)
    src_mask = torch.ones(batch, src_len, dtype=torch.int64)
    src_mask[-1, src_len - 2:] = 0  # one padded row
    src_ids[src_mask == 0] = cfg.pad_id
    with torch.no_grad():
        _, cross_k, cross_v = model.encode(src_ids, src_mask)
    n = batch * beams
    head_dim = cfg.decoder_head_dim
    # Rows at different steps: positions 0..cached, slots to spare.
    cache_shape = (n, cfg.decoder_heads, cached + 2, head_dim)
    layers = range(cfg.decoder_layers)
    step = (
        torch.randint(4, cfg.tgt_vocab_size, (n,), generator=gen),
        torch.arange(n, dtype=torch.int64) % (cached + 1),
        *[torch.randn(cache_shape, generator=gen) for _ in layers],  # self_k
        *[torch.randn(cache_shape, generator=gen) for _ in layers],  # self_v
        *cross_k,
        *cross_v,
        src_mask,
    )
    return (src_ids, src_mask), step


def export_graphs(model: Seq2SeqTransformer, out_dir: Path, opset: int = DEFAULT_OPSET,
                  fused: bool = DEFAULT_ATTENTION == "fused") -> None:
    """Write encoder.onnx and decoder.onnx (fp32) into out_dir: with ONNX Runtime's
    fused attention operators (format 7, `fused_attention.py`), or with `fused`
    False the plain traced chain of format 6. A tied output projection is still
    stored twice here: int8 quantization wants a plain MatMul;
    `tie_output_projection` stores it once for the fp32 and fp16 packages."""
    from seq2serve.export.fused_attention import MS_DOMAIN, FusedDecoderStep, FusedEncoder

    model = model.eval().float()
    encoder: nn.Module = FusedEncoder(model) if fused else _Encoder(model)
    decoder: nn.Module = FusedDecoderStep(model) if fused else _DecoderStep(model)
    custom_opsets = {MS_DOMAIN: 1} if fused else None
    enc_args, dec_args = sample_inputs(model)
    layers = model.cfg.decoder_layers
    enc_outputs, dec_inputs, dec_outputs = (encoder_outputs(layers), decoder_inputs(layers),
                                            decoder_outputs(layers))
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter warns about its own deprecation and about
        # shape-dependent Python values that are in fact constant per model.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            encoder, enc_args, str(out_dir / ENCODER_FILE), dynamo=False,
            opset_version=opset, custom_opsets=custom_opsets,
            input_names=[s.name for s in ENCODER_INPUTS],
            output_names=[s.name for s in enc_outputs],
            dynamic_axes={**_dynamic_axes(ENCODER_INPUTS), **_dynamic_axes(enc_outputs)},
        )
        torch.onnx.export(
            decoder, dec_args, str(out_dir / DECODER_FILE), dynamo=False,
            opset_version=opset, custom_opsets=custom_opsets,
            input_names=[s.name for s in dec_inputs],
            output_names=[s.name for s in dec_outputs],
            dynamic_axes={**_dynamic_axes(dec_inputs), **_dynamic_axes(dec_outputs)},
        )
    write_cache_graphs(out_dir, layers, opset=opset)


def write_cache_graphs(path: Path, layers: int, cache_dtype: str = "float32",
                       opset: int = DEFAULT_OPSET, vocab: int | None = None) -> None:
    """reorder.onnx, move.onnx and select.onnx into the directory `path`, for
    caches of `cache_dtype` ("float32" or "float16") and log-probs over `vocab`
    ids (None: any vocabulary):

    - reorder: Seq2SeqTransformer.reorder_cache, one Gather along the rows per
      cache tensor (any number of rows in and out: rows joining, leaving);
    - move: the rows `moved_rows` of each cache tensor replaced by the rows
      `moved_from` (a Gather of those rows, then a ScatterND into the cache),
      which the runner binds to the cache's own buffers on CPU, so a beam
      search step copies the rows that moved rather than the whole cache;
    - select: each row's best k log-probs and ids, sorted, ties to the lower id
      (`select_nodes`: a TopK over chunk maxima, then over the best chunks).
    """
    elem = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16}[cache_dtype]
    types = {"int64": onnx.TensorProto.INT64, "float32": onnx.TensorProto.FLOAT}

    def info(spec: list[TensorSpec]) -> list[onnx.ValueInfoProto]:
        return [helper.make_tensor_value_info(s.name, types.get(s.dtype, elem), list(s.shape))
                for s in spec]

    def save(nodes: list[onnx.NodeProto], name: str, inputs: list[TensorSpec],
             outputs: list[TensorSpec], file: str) -> None:
        graph = helper.make_graph(nodes, name, info(inputs), info(outputs))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  ir_version=GRAPH_IR_VERSION, producer_name="seq2serve")
        onnx.checker.check_model(model)
        onnx.save(model, str(path / file))

    inputs, outputs = reorder_inputs(layers), reorder_outputs(layers)
    save([helper.make_node("Gather", [src.name, "beam_origin"], [dst.name], axis=0)
          for src, dst in zip(inputs[:-1], outputs, strict=True)],
         "reorder_cache", inputs, outputs, REORDER_FILE)

    inputs, outputs = move_inputs(layers), move_outputs(layers)
    nodes = []
    for src, dst in zip(inputs[:-2], outputs, strict=True):
        rows = f"{dst.name}/rows"
        nodes += [helper.make_node("Gather", [src.name, "moved_from"], [rows], axis=0),
                  helper.make_node("ScatterND", [src.name, "moved_rows", rows], [dst.name])]
    save(nodes, "move_cache_rows", inputs, outputs, MOVE_FILE)

    nodes, constants = select_nodes(vocab)
    graph = helper.make_graph(nodes, "select", info(SELECT_INPUTS), info(SELECT_OUTPUTS),
                              constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=GRAPH_IR_VERSION, producer_name="seq2serve")
    onnx.checker.check_model(model)
    onnx.save(model, str(path / SELECT_FILE))


# The select graph's chunk: the vocabulary is cut into chunks of this many ids.
SELECT_CHUNK = 64


def select_chunk(vocab: int | None) -> int:
    """The chunk size of the select graph for a vocabulary: SELECT_CHUNK, or when
    that does not divide a known vocabulary, the smallest divisor of it up to twice
    SELECT_CHUNK, else the largest down to half of it (10,000: 80), so that its rows
    are whole chunks and need no Pad (which cost 164 us against 94 us with chunks
    of 80, for 32 rows of 10,000, k = 8, one core); else SELECT_CHUNK, padded."""
    if vocab is None or vocab % SELECT_CHUNK == 0:
        return SELECT_CHUNK
    above = [c for c in range(SELECT_CHUNK, 2 * SELECT_CHUNK + 1) if vocab % c == 0]
    below = [c for c in range(SELECT_CHUNK // 2, SELECT_CHUNK) if vocab % c == 0]
    return (above or below[-1:] or [SELECT_CHUNK])[0]


def select_nodes(vocab: int | None = None, chunk: int | None = None
                 ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Each row's k best log-probs in two passes: the max of every chunk of
    SELECT_CHUNK ids, then TopK over the k best chunks only. ONNX Runtime's TopK
    over the whole row scans it element by element (0.60 ms for 96 x 8,000 on one
    core); a ReduceMax over chunks is one vectorized pass, and the two small
    TopKs that follow read k + k * SELECT_CHUNK values (0.23 ms in all).

    Exact, ties included: the result is the first k of the row under the order
    (log-prob descending, id ascending). A chunk holding one of them has its own
    best element at least as high in that order, and only k elements are, so the
    k best chunks (chunk maxima ranked by TopK, ties to the lower chunk, whose ids
    are lower) hold the result. They are gathered in ascending chunk order, so a
    candidate's position grows with its id and the last TopK's ties-to-the-lower-
    position rule is the ties-to-the-lower-id rule. The row is padded to whole
    chunks with -inf at ids past the vocabulary, which lose every tie - unless
    `vocab` is known and whole chunks (8,000 is 125 x 64; 10,000 is 125 x 80, see
    `select_chunk`): then the rows are read as they are, without the Pad's copy of
    the whole (N, V) input (0.92 -> 0.57 ms at 128 x 8,000 on one core)."""
    def const(name: str, values: list[int] | float) -> onnx.TensorProto:
        if isinstance(values, float):
            return numpy_helper.from_array(np.array(values, dtype=np.float32), name)
        return numpy_helper.from_array(np.array(values, dtype=np.int64), name)

    node = helper.make_node
    chunk = chunk or select_chunk(vocab)
    constants = [const("chunk", [chunk]), const("chunk_shape", [0, -1, chunk]),
                 const("flat_shape", [0, -1]), const("last_axis", [2])]
    rows = "log_probs"
    nodes = []
    if vocab is None or vocab % chunk:
        # pad = (-V) mod chunk, so that the padded row is whole chunks
        constants += [const("zero", [0]), const("minus_inf", -np.inf)]
        nodes += [
            node("Shape", ["log_probs"], ["vocab"], start=1, end=2),
            node("Sub", ["zero", "vocab"], ["minus_vocab"]),
            node("Mod", ["minus_vocab", "chunk"], ["pad"]),
            node("Concat", ["zero", "zero", "zero", "pad"], ["pads"], axis=0),
            node("Pad", ["log_probs", "pads", "minus_inf"], ["padded"], mode="constant"),
        ]
        rows = "padded"
    nodes += [
        node("Reshape", [rows, "chunk_shape"], ["chunks"]),  # (N, C, chunk)
        node("ReduceMax", ["chunks"], ["chunk_max"], axes=[2], keepdims=0),  # (N, C)
        node("Shape", ["chunk_max"], ["chunk_count"], start=1, end=2),
        node("Min", ["k", "chunk_count"], ["k_chunks"]),
        node("TopK", ["chunk_max", "k_chunks"], ["_best_max", "best_chunks"], axis=-1,
             largest=1, sorted=1),
        node("TopK", ["best_chunks", "k_chunks"], ["chunk_ids", "_order"], axis=-1,
             largest=0, sorted=1),  # ascending chunk ids
        node("Unsqueeze", ["chunk_ids", "last_axis"], ["chunk_index"]),
        node("GatherND", ["chunks", "chunk_index"], ["candidates"], batch_dims=1),
        node("Reshape", ["candidates", "flat_shape"], ["flat"]),  # (N, k_chunks * chunk)
        node("TopK", ["flat", "k"], ["top_log_probs", "position"], axis=-1, largest=1,
             sorted=1),
        node("Div", ["position", "chunk"], ["slot"]),
        node("Mod", ["position", "chunk"], ["offset"]),
        node("GatherElements", ["chunk_ids", "slot"], ["top_chunk"], axis=1),
        node("Mul", ["top_chunk", "chunk"], ["chunk_start"]),
        node("Add", ["chunk_start", "offset"], ["top_ids"]),
    ]
    return nodes, constants


def tie_output_projection(path: Path) -> bool:
    """Store a tied output projection once.

    The exporter folds `x @ E.T` into a second, transposed copy of the embedding
    matrix E; for a 2-D `x` a Gemm with transB=1 reads E itself. A final-logits
    bias added to its output becomes the Gemm's C, which saves a pass over the
    (N, V) logits per step. Returns whether a copy was removed.
    """
    model = onnx.load(str(path))
    graph = model.graph
    # The ranks come from the graph without its weights: a decoder past protobuf's
    # 2 GB (NLLB-200's: two copies of a 256206-row embedding) is written with external
    # data, and the model loaded whole cannot be serialised for shape inference. The
    # tied one is under the limit again and is saved as one file.
    structure = onnx.load(str(path), load_external_data=False)
    inferred = onnx.shape_inference.infer_shapes(structure).graph
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*inferred.value_info, *inferred.input, *inferred.output]}
    inits = {i.name: i for i in graph.initializer}
    matrices = [i for i in graph.initializer if len(i.dims) == 2]
    for idx, node in enumerate(graph.node):
        if node.op_type != "MatMul" or node.input[1] not in inits or ranks.get(node.input[0]) != 2:
            continue
        weight = inits[node.input[1]]
        for emb in matrices:
            if emb.name == weight.name or list(emb.dims) != list(weight.dims)[::-1]:
                continue
            if not np.array_equal(numpy_helper.to_array(emb).T, numpy_helper.to_array(weight)):
                continue
            gemm = helper.make_node("Gemm", [node.input[0], emb.name], list(node.output),
                                    name=node.name or "tied_output_projection", transB=1)
            _fold_bias(graph, node.output[0], gemm, inits)
            graph.node.remove(node)
            graph.node.insert(idx, gemm)
            if not any(weight.name in n.input for n in graph.node):
                graph.initializer.remove(weight)
            onnx.save(model, str(path))
            return True
    return False


def _fold_bias(graph: onnx.GraphProto, output: str, gemm: onnx.NodeProto,
               inits: dict[str, onnx.TensorProto]) -> None:
    """If `output` feeds only an Add of a constant (V,) vector, make that vector
    the Gemm's C and let the Gemm write the Add's output."""
    consumers = [n for n in graph.node if output in n.input]
    if len(consumers) != 1 or consumers[0].op_type != "Add":
        return
    add = consumers[0]
    bias = next((name for name in add.input if name != output), None)
    if bias not in inits or len(inits[bias].dims) != 1:
        return
    gemm.input.append(bias)
    gemm.output[0] = add.output[0]
    graph.node.remove(add)
