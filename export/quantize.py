"""int8 packages whose every row is quantized on its own (batch-invariant int8).

ONNX Runtime's dynamic quantization (`quantize_dynamic`) puts one
`DynamicQuantizeLinear` before each quantized MatMul: one scale and zero point
for the whole activation tensor, so a row's rounding depends on the largest
value of any row in the batch, padding included. Served that way, a text's
translation changed with its batch-mates (issue 10: 14% of texts in a soak).

`per_row_activations` replaces each of those nodes with a per-row symmetric
quantizer, the scheme CTranslate2 uses on CPU (one scale per token):

    scale = max(|x|, last axis) / 127          (..., 1)
    q     = uint8(round(x / scale) + 128)      (..., K), zero point 128

`MatMulInteger` keeps its inputs and takes the scalar zero point 128 (uint8
activations keep ONNX Runtime on its fast u8 x s8 kernel; int8 x int8 takes a
slow path on AVX2 machines), and its int32 sums are exact whatever the batch;
the rescale multiplies them by the (..., 1) row scale, then by the weight
scale. So every row's result depends on that row alone: padded positions and
batch-mates cannot move it by a single bit.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

QMAX = 127.0  # symmetric: [-127, 127], then shifted by the zero point into [1, 255]
ZERO_POINT = 128
# A row of zeros would divide by zero; any positive scale quantizes it to 128 (= 0).
MIN_SCALE = 1e-12


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
    """Rewrite every DynamicQuantizeLinear in `model` into the per-row quantizer
    above, keeping its three output names. Returns how many were rewritten."""
    graph = model.graph
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= 18:
        graph.initializer.append(
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "per_row_axes"))
    graph.initializer.extend([
        numpy_helper.from_array(np.array(QMAX, dtype=np.float32), "per_row_qmax"),
        numpy_helper.from_array(np.array(MIN_SCALE, dtype=np.float32), "per_row_min_scale"),
        numpy_helper.from_array(np.array(float(ZERO_POINT), dtype=np.float32),
                                "per_row_shift"),
    ])
    nodes = list(graph.node)
    row_scales = {n.output[1] for n in nodes if n.op_type == "DynamicQuantizeLinear"}
    producers = {name: n for n in nodes for name in n.output}
    del graph.node[:]
    for node in nodes:
        if node.op_type == "DynamicQuantizeLinear":
            graph.node.extend(_per_row_quantizer(node, opset))
        elif node.op_type == "Mul" and row_scales.intersection(node.input):
            continue  # Mul(x_scale, w_scale): folded into the rescale below
        elif node.op_type == "Mul" and any(_is_scale_product(name, row_scales, producers)
                                           for name in node.input):
            graph.node.extend(_rescale(node, row_scales, producers))
        else:
            graph.node.append(node)
    return len(row_scales)


Producers = dict[str, onnx.NodeProto]


def _is_scale_product(name: str, row_scales: set[str], producers: Producers) -> bool:
    producer = producers.get(name)
    return (producer is not None and producer.op_type == "Mul"
            and bool(row_scales.intersection(producer.input)))


def _rescale(node: onnx.NodeProto, row_scales: set[str],
             producers: Producers) -> list[onnx.NodeProto]:
    """`Mul(int32 sums as float, Mul(x_scale, w_scale))` becomes
    `Mul(Mul(sums, x_scale), w_scale)`.

    Not only the same arithmetic: ONNX Runtime's MatMulIntegerToFloatFusion
    matches the first form and its fused kernel reads x_scale as one scalar,
    which would apply row 0's scale to every row (measured: log-prob deviation
    1.3 instead of 0.22). In the second form neither Mul has both a Cast and a
    Mul parent, so the graph stays as written.
    """
    product = next(name for name in node.input
                   if _is_scale_product(name, row_scales, producers))
    sums = next(name for name in node.input if name != product)
    producer = producers[product]
    x_scale = next(name for name in producer.input if name in row_scales)
    w_scale = next(name for name in producer.input if name != x_scale)
    p = f"{node.name or node.output[0]}/per_row"
    return [helper.make_node("Mul", [sums, x_scale], [f"{p}/row_scaled"], name=f"{p}/Mul_row"),
            helper.make_node("Mul", [f"{p}/row_scaled", w_scale], list(node.output),
                             name=f"{p}/Mul_weight")]


def _per_row_quantizer(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    x = node.input[0]
    q, scale, zero_point = node.output
    p = f"{node.name or x}/per_row"
    return [
        helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
        _reduce_max_last_axis(f"{p}/abs", f"{p}/amax", f"{p}/ReduceMax", opset),  # (..., 1)
        helper.make_node("Div", [f"{p}/amax", "per_row_qmax"], [f"{p}/raw_scale"],
                         name=f"{p}/Div_qmax"),
        helper.make_node("Max", [f"{p}/raw_scale", "per_row_min_scale"], [scale],
                         name=f"{p}/Max"),
        helper.make_node("Div", [x, scale], [f"{p}/scaled"], name=f"{p}/Div_scale"),
        helper.make_node("Round", [f"{p}/scaled"], [f"{p}/rounded"], name=f"{p}/Round"),
        helper.make_node("Add", [f"{p}/rounded", "per_row_shift"], [f"{p}/shifted"],
                         name=f"{p}/Add"),
        helper.make_node("Cast", [f"{p}/shifted"], [q], name=f"{p}/Cast", to=TensorProto.UINT8),
        helper.make_node("Constant", [], [zero_point], name=f"{p}/zero_point",
                         value=numpy_helper.from_array(np.array(ZERO_POINT, np.uint8))),
    ]


def _reduce_max_last_axis(x: str, out: str, name: str, opset: int) -> onnx.NodeProto:
    """(..., K) -> (..., 1); ReduceMax takes its axes as an input from opset 18 on."""
    if opset >= 18:
        return helper.make_node("ReduceMax", [x, "per_row_axes"], [out], name=name, keepdims=1)
    return helper.make_node("ReduceMax", [x], [out], name=name, axes=[-1], keepdims=1)
