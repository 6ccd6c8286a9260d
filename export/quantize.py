"""int8 packages whose every row is quantized on its own (batch-invariant int8).

ONNX Runtime's dynamic quantization (`quantize_dynamic`) puts one
`DynamicQuantizeLinear` before each quantized MatMul: one scale and zero point
for the whole activation tensor, so a row's rounding depends on the largest
value of any row in the batch, padding included: a text's translation would
change with its batch-mates.

`per_row_activations` replaces each of those nodes with a per-row symmetric
quantizer, the scheme CTranslate2 uses on CPU (one scale per token), along the
last axis of the activation, at its own rank (..., K):

    scale = max(|x|, last axis) / 127              (..., 1)
    q     = QuantizeLinear(x / scale, 1, 128)      (..., K) uint8: round(x / scale) + 128

Each `MatMulInteger` becomes ONNX Runtime's `MatMulIntegerToFloat` with the
activation scale 1 and zero point 128 (uint8 activations keep ONNX Runtime on its
fast u8 x s8 kernel; int8 x int8 takes a slow path on AVX2 machines): its int32
sums are exact whatever the batch, and the kernel converts them to float times the
weight scale as it writes them. One `Mul` by the per-row scale follows. So every
row's result depends on that
row alone: padded positions and batch-mates cannot move it by a single bit. The
fused conversion and the Mul take less time than int32 sums scaled by a
`DequantizeLinear` over int32, a slow pass in ONNX Runtime (11% of the int8
decoder's kernel time at beam 4 x batch 16 on the OPUS-MT shape).

The quantizer's `Cast -> Mul(x_scale * w_scale)` rescale is not kept: ONNX
Runtime's MatMulIntegerToFloatFusion would match it with the per-row x_scale,
and its kernel reads `a_scale` as one scalar (measured: every row scaled by row
0's scale, log-prob deviation 1.3 instead of 0.22). Hence the explicit scale 1
and the row scale as its own Mul.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

QMAX = 127.0  # symmetric: [-127, 127], then shifted by the zero point into [1, 255]
ZERO_POINT = 128
# A row of zeros would divide by zero; any positive scale quantizes it to 128 (= 0).
MIN_SCALE = 1e-12
MS_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib operators (MatMulIntegerToFloat)


def quantize_int8(src: Path, dst: Path) -> None:
    """Weights int8 (per tensor, as `quantize_dynamic` does), activations per row."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The quantizer logs a pre-processing hint on every call through the root logger.
    logging.getLogger().setLevel(max(logging.getLogger().level, logging.ERROR))
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Gemm", "Gather"])
    model = onnx.load(str(dst))
    per_row_activations(model)
    onnx.save(model, str(dst))


def per_row_activations(model: onnx.ModelProto) -> int:
    """Rewrite every DynamicQuantizeLinear in `model`, and the rescale of each
    MatMulInteger it feeds, into the per-row scheme above. Returns how many
    quantizers were rewritten."""
    graph = model.graph
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    inferred = onnx.shape_inference.infer_shapes(model).graph
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*inferred.value_info, *inferred.input, *inferred.output]}
    inits = {i.name: i for i in graph.initializer}
    nodes = list(graph.node)
    quantizers = {n.output[0]: n for n in nodes if n.op_type == "DynamicQuantizeLinear"}
    if not quantizers:
        return 0
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    producers = {name: n for n in nodes for name in n.output}

    replaced: dict[int, list[onnx.NodeProto]] = {}  # id(node) -> what stands in its place
    dropped: set[int] = set()  # ids of nodes folded into a replacement
    for q_name, dql in quantizers.items():
        x = dql.input[0]
        rank = ranks.get(x)
        if rank is None or rank < 2:
            raise ValueError(f"per-row quantization needs the rank of {x!r} (>= 2), got {rank}")
        replaced[id(dql)] = _per_row_quantizer(dql, opset)
        for mmi in consumers.get(q_name, []):
            if mmi.op_type != "MatMulInteger":
                raise ValueError(f"{q_name!r} feeds a {mmi.op_type}, not a MatMulInteger")
            cast = _only_consumer(consumers, mmi.output[0], "Cast")
            mul = _only_consumer(consumers, cast.output[0], "Mul")
            product = producers[next(n for n in mul.input if n != cast.output[0])]
            w_scale = next(n for n in product.input if n != dql.output[1])
            if w_scale not in inits or int(np.prod(inits[w_scale].dims)) != 1:
                raise ValueError(f"weight scale {w_scale!r} must be one per tensor")
            replaced[id(mmi)] = [_to_float(mmi, w_scale)]
            replaced[id(mul)] = _rescale(mmi.output[0], dql, mul.output[0])
            dropped.update((id(cast), id(product)))
    graph.initializer.extend(_constants())
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    del graph.node[:]
    for node in nodes:
        if id(node) in replaced:
            graph.node.extend(replaced[id(node)])
        elif id(node) not in dropped:
            graph.node.append(node)
    return len(quantizers)


def _only_consumer(consumers: dict[str, list[onnx.NodeProto]], name: str,
                   op_type: str) -> onnx.NodeProto:
    found = consumers.get(name, [])
    if len(found) != 1 or found[0].op_type != op_type:
        raise ValueError(f"{name!r} should feed exactly one {op_type}, feeds "
                         f"{[n.op_type for n in found]}")
    return found[0]


def _constants() -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array(np.array(QMAX, dtype=np.float32), "per_row_qmax"),
        numpy_helper.from_array(np.array(MIN_SCALE, dtype=np.float32), "per_row_min_scale"),
        numpy_helper.from_array(np.array(ZERO_POINT, dtype=np.uint8), "per_row_zero_point"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "per_row_last_axis"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "per_row_one"),
    ]


def _prefix(dql: onnx.NodeProto) -> str:
    return f"{dql.name or dql.input[0]}/per_row"


def _per_row_quantizer(dql: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """x (..., K) -> q (..., K) uint8, scale (..., 1), zero point 128: every row (the
    last axis) its own scale, at any rank, so no reshaping around the MatMul.

    Two passes over x after the scale: x / scale (Div, broadcast over the row), then
    QuantizeLinear with scale 1 and zero point 128, which rounds and saturates
    exactly as a per-row QuantizeLinear would (it divides by 1). A per-row
    QuantizeLinear takes its scales as a 1-D axis, so it needs x flattened to 2-D
    and one zero point per row built at run time: eight more small nodes per
    MatMul, which cost more than the extra pass below about a hundred rows."""
    x = dql.input[0]
    q, scale, zero_point = dql.output
    p = _prefix(dql)
    return [
        helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
        _reduce_max_last_axis(f"{p}/abs", f"{p}/amax", f"{p}/ReduceMax", opset),  # (..., 1)
        helper.make_node("Div", [f"{p}/amax", "per_row_qmax"], [f"{p}/raw_scale"],
                         name=f"{p}/Div_qmax"),
        helper.make_node("Max", [f"{p}/raw_scale", "per_row_min_scale"], [scale],
                         name=f"{p}/Max"),
        helper.make_node("Div", [x, scale], [f"{p}/scaled"], name=f"{p}/Div_scale"),
        helper.make_node("QuantizeLinear", [f"{p}/scaled", "per_row_one", "per_row_zero_point"],
                         [q], name=f"{p}/QuantizeLinear"),
        helper.make_node("Constant", [], [zero_point], name=f"{p}/zero_point",
                         value=numpy_helper.from_array(np.array(ZERO_POINT, np.uint8))),
    ]


def _to_float(mmi: onnx.NodeProto, w_scale: str) -> onnx.NodeProto:
    """MatMulInteger (A uint8, B int8, zero points) -> MatMulIntegerToFloat writing
    float sums x the weight scale (activation scale 1: the row scale comes after)."""
    a, b, a_zero, b_zero = (*mmi.input, "", "")[:4]
    return helper.make_node("MatMulIntegerToFloat", [a, b, "per_row_one", w_scale, a_zero,
                                                     b_zero],
                            [mmi.output[0]], name=f"{mmi.name or mmi.output[0]}/to_float",
                            domain=MS_DOMAIN)


def _rescale(sums: str, dql: onnx.NodeProto, output: str) -> list[onnx.NodeProto]:
    """float sums x weight scale (..., N) times the per-row scale (..., 1)."""
    p = f"{_prefix(dql)}/{sums}"
    return [helper.make_node("Mul", [sums, dql.output[1]], [output], name=f"{p}/Mul_row_scale")]


def _reduce_max_last_axis(x: str, out: str, name: str, opset: int) -> onnx.NodeProto:
    """(..., K) -> (..., 1); ReduceMax takes its axes as an input from opset 18 on."""
    if opset >= 18:
        return helper.make_node("ReduceMax", [x, "per_row_last_axis"], [out], name=name,
                                keepdims=1)
    return helper.make_node("ReduceMax", [x], [out], name=name, axes=[-1], keepdims=1)
