"""decoder_shortlist.onnx: the package's decoder step with the output projection
over each source's candidates only (package format 8, model/package/shortlist.py).

Built from the finished decoder.onnx (fp32, fp16 or int8, plain or fused
attention) by replacing its last projection: everything before it is the same
graph, byte for byte the same weights, so a candidate's logit is the full
decoder's logit for that id (in int8 the same integer sums and scales; in fp32 a
batched MatMul over the gathered columns instead of one Gemm, equal to rounding).
Two inputs are added:

- shortlist_weight (B, D, C): per source, the projection's columns of its
  candidates (the decoder's dtype: float32, float16 or int8), gathered once per
  sentence by the runner from shortlist.npz;
- shortlist_bias (B, C) float32: the final-logits bias of those columns (0 when
  the model has none), -inf at the padded slots past a source's own candidates.

The projection becomes one batched MatMul (B, K, D) x (B, D, C) (the K rows of a
source against its own columns: rows are grouped by source, as for
cross-attention), the bias is added and LogSoftmax runs over the C axis, so
`log_probs` is (N, C): log-probs over the candidates, normalised over them alone.
A padded slot's -inf never wins and its exp adds 0 to the normalisation. Every
operator here has CPU and CUDA kernels (MatMul, MatMulIntegerToFloat, Reshape,
Shape, Concat, Unsqueeze, Add, LogSoftmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

SHORTLIST_DECODER_FILE = "decoder_shortlist.onnx"
WEIGHT_INPUT = "shortlist_weight"
BIAS_INPUT = "shortlist_bias"

_PROJECTIONS = ("MatMul", "Gemm", "MatMulIntegerToFloat")


@dataclass(frozen=True)
class ShortlistGraph:
    model: onnx.ModelProto
    weight: np.ndarray  # (D, V) as the decoder holds it
    bias: np.ndarray  # (V,) float32


def shortlist_decoder(decoder: onnx.ModelProto) -> ShortlistGraph:
    """The shortlist decoder of a finished decoder graph, and the projection it
    takes its columns from. Raises ValueError when the graph's end is not a
    projection followed by LogSoftmax (through a Cast, a row scale, a bias Add)."""
    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    # The LogSoftmax that gives log_probs, maybe through Casts (an fp16 graph keeps
    # it in fp32 and casts its output to fp16 and back: they stay, elementwise).
    softmax = producers.get("log_probs")
    while softmax is not None and softmax.op_type == "Cast":
        softmax = producers.get(softmax.input[0])
    if softmax is None or softmax.op_type != "LogSoftmax":
        raise ValueError("the decoder's log_probs is not a LogSoftmax output")

    # Walk back from the LogSoftmax to the projection: Casts and a row-scale Mul
    # stay (elementwise per row), a constant bias Add goes (its columns are gathered).
    bias = None
    value = softmax.input[0]
    node = producers[value]
    while node.op_type not in _PROJECTIONS:
        if node.op_type == "Add" and any(i in inits for i in node.input):
            [b] = [i for i in node.input if i in inits]
            bias = numpy_helper.to_array(inits[b]).astype(np.float32)
            main = next(i for i in node.input if i != b)
            _rewire(graph, node.output[0], main)
            graph.node.remove(node)
            producers = {o: n for n in graph.node for o in n.output}
            value = softmax.input[0]
        elif node.op_type in ("Cast", "Mul", "Add"):
            main = node.input[0]
            value = main
        else:
            raise ValueError(f"unexpected {node.op_type} between the projection and "
                             "LogSoftmax")
        node = producers[value]
    projection = node
    hidden, weight_name = projection.input[0], projection.input[1]
    if weight_name not in inits:
        raise ValueError(f"the projection's weight {weight_name!r} is not a constant")
    weight = numpy_helper.to_array(inits[weight_name])
    if projection.op_type == "Gemm":
        attrs = {a.name: helper.get_attribute_value(a) for a in projection.attribute}
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 \
                or attrs.get("beta", 1.0) != 1.0:
            raise ValueError("a Gemm projection with transA, alpha or beta is not supported")
        if attrs.get("transB", 0):
            weight = weight.T
        if len(projection.input) > 2 and projection.input[2]:
            c = numpy_helper.to_array(inits[projection.input[2]]).astype(np.float32)
            bias = c if bias is None else bias + c
    vocab = weight.shape[1]
    bias = np.zeros(vocab, dtype=np.float32) if bias is None else bias.reshape(vocab)
    d_model = weight.shape[0]

    p = "shortlist"
    elem = inits[weight_name].data_type
    consts = [numpy_helper.from_array(np.array([-1], dtype=np.int64), f"{p}/minus_one"),
              numpy_helper.from_array(np.array([d_model], dtype=np.int64), f"{p}/d_model"),
              numpy_helper.from_array(np.array([1], dtype=np.int64), f"{p}/axis_1")]
    node_ = helper.make_node
    logits_2d = projection.output[0]
    before = [
        node_("Shape", [BIAS_INPUT], [f"{p}/sources"], start=0, end=1),  # [B]
        node_("Shape", [BIAS_INPUT], [f"{p}/width"], start=1, end=2),  # [C]
        node_("Shape", [hidden], [f"{p}/rows"], start=0, end=1),  # [N]
        node_("Concat", [f"{p}/sources", f"{p}/minus_one", f"{p}/d_model"],
              [f"{p}/grouped_shape"], axis=0),
        node_("Concat", [f"{p}/rows", f"{p}/width"], [f"{p}/flat_shape"], axis=0),
        node_("Concat", [f"{p}/sources", f"{p}/minus_one", f"{p}/width"],
              [f"{p}/logit_shape"], axis=0),
        node_("Reshape", [hidden, f"{p}/grouped_shape"], [f"{p}/hidden"]),  # (B, K, D)
    ]
    inputs = [f"{p}/hidden", WEIGHT_INPUT, *projection.input[2:]]
    if projection.op_type == "Gemm":
        inputs = inputs[:2]  # its bias is in shortlist_bias
    new_projection = node_("MatMul" if projection.op_type == "Gemm" else projection.op_type,
                           inputs, [f"{p}/logits"], name=f"{p}/projection",
                           domain=projection.domain)
    after = [node_("Reshape", [f"{p}/logits", f"{p}/flat_shape"], [logits_2d])]  # (N, C)
    index = list(graph.node).index(projection)
    graph.node.remove(projection)
    for offset, n in enumerate([*before, new_projection, *after]):
        graph.node.insert(index + offset, n)

    # LogSoftmax over each source's candidates, its bias (and padding) added first.
    logits = softmax.input[0]
    softmax_index = list(graph.node).index(softmax)
    graph.node.remove(softmax)
    tail = [
        node_("Reshape", [logits, f"{p}/logit_shape"], [f"{p}/grouped_logits"]),  # (B, K, C)
        node_("Unsqueeze", [BIAS_INPUT, f"{p}/axis_1"], [f"{p}/bias"]),  # (B, 1, C)
        node_("Add", [f"{p}/grouped_logits", f"{p}/bias"], [f"{p}/biased"]),
        node_("LogSoftmax", [f"{p}/biased"], [f"{p}/log_probs"], axis=-1),
        node_("Reshape", [f"{p}/log_probs", f"{p}/flat_shape"], [softmax.output[0]]),  # (N, C)
    ]
    for offset, n in enumerate(tail):
        graph.node.insert(softmax_index + offset, n)
    graph.initializer.extend(consts)
    if not any(weight_name in n.input for n in graph.node):
        graph.initializer.remove(inits[weight_name])
    for name in [t for t in ([projection.input[2]] if projection.op_type == "Gemm"
                             and len(projection.input) > 2 else []) if t]:
        if name in inits and not any(name in n.input for n in graph.node):
            graph.initializer.remove(inits[name])

    graph.input.extend([
        helper.make_tensor_value_info(WEIGHT_INPUT, elem, ["B", d_model, "C"]),
        helper.make_tensor_value_info(BIAS_INPUT, onnx.TensorProto.FLOAT, ["B", "C"]),
    ])
    [out] = [o for o in graph.output if o.name == "log_probs"]
    out.CopyFrom(helper.make_tensor_value_info("log_probs", onnx.TensorProto.FLOAT,
                                               ["N", "C"]))
    del graph.value_info[:]  # the traced shapes of the old tail no longer hold
    _sort_topologically(graph)
    onnx.checker.check_model(model)
    return ShortlistGraph(model, np.ascontiguousarray(weight), bias.astype(np.float32))


def _rewire(graph: onnx.GraphProto, old: str, new: str) -> None:
    for n in graph.node:
        for i, name in enumerate(n.input):
            if name == old:
                n.input[i] = new


def _sort_topologically(graph: onnx.GraphProto) -> None:
    """Nodes in an order where each comes after its inputs' producers (the fp16
    converter appends its Casts at the end; the checker wants the order), else
    in their given order."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        left = []
        for node in pending:
            if all(name in ready for name in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                left.append(node)
        if len(left) == len(pending):
            raise ValueError("the decoder graph has a cycle or an input nobody produces")
        pending = left
    del graph.node[:]
    graph.node.extend(ordered)
