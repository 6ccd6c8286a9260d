"""The pick graph: a step's log-probs reduced, on the device, to each row's k best.

On a device the decoder's (N, V) log-probs never come to the host: this graph
takes them where the decoder left them, applies the step's processing as the
host sends it (edits.py: short lists of (row, column) entries and one forced
column per row), renormalizes where the package asks (generate()'s
renormalize_logits: the row's log-softmax again), and returns each row's k best
values and ids, sorted, ties to the lower id (ONNX TopK's order, the select
graph's contract). Only those (N, k) come back.

Built with onnx.helper when the runner loads (no file in the package, so
packages exported before it need no re-export); one session per renormalize
setting, on the runner's provider.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from seq2serve.model.package.manifest import GRAPH_IR_VERSION
from seq2serve.server.engine.device import OPSET, Memory
from seq2serve.server.engine.edits import StepEdits

if TYPE_CHECKING:  # onnx is imported where a graph is built: the CPU path never needs it
    import onnx


class Picker:
    def __init__(self, memory: Memory, options: ort.SessionOptions, providers: list[object],
                 run_options: ort.RunOptions, vocab: int):
        self.memory = memory
        self._options = options
        self._providers = providers
        self._run_options = run_options
        self.vocab = vocab
        self._sessions: dict[bool, ort.InferenceSession] = {}

    def pick(self, log_probs: ort.OrtValue, edits: StepEdits, k: int
             ) -> tuple[np.ndarray, np.ndarray]:
        """Each row's k best processed log-probs (N, k) float32 and their columns
        (N, k) int64, brought to the host."""
        session = self._session(edits.renormalize)
        binding = session.io_binding()
        binding.bind_ortvalue_input("log_probs", log_probs)
        bind = self.memory.bind_input
        bind(binding, "pen_at", edits.pen_at)
        bind(binding, "pen", edits.pen)
        bind(binding, "forced", edits.forced)
        bind(binding, "decay_at", edits.decay_at)
        bind(binding, "growth", edits.growth)
        bind(binding, "ban_at", edits.ban_at)
        bind(binding, "k", np.array([min(k, log_probs.shape()[1])], dtype=np.int64))
        binding.bind_output("values", self.memory.device, self.memory.device_id)
        binding.bind_output("ids", self.memory.device, self.memory.device_id)
        session.run_with_iobinding(binding, self._run_options)
        values, ids = binding.get_outputs()
        return self.memory.download(values), self.memory.download(ids)

    def _session(self, renormalize: bool) -> ort.InferenceSession:
        if renormalize not in self._sessions:
            self._sessions[renormalize] = ort.InferenceSession(
                pick_graph(renormalize).SerializeToString(), self._options,
                providers=self._providers)
        return self._sessions[renormalize]


def pick_graph(renormalize: bool) -> onnx.ModelProto:
    """log_probs (N, W) float32, pen_at (P, 2), pen (P,), forced (N,), decay_at
    (E, 2), growth (E,), ban_at (M, 2), k (1,) -> values (N, k), ids (N, k)."""
    import onnx
    from onnx import TensorProto, helper
    f, i = TensorProto.FLOAT, TensorProto.INT64
    inputs = [helper.make_tensor_value_info("log_probs", f, ["N", "W"]),
              helper.make_tensor_value_info("pen_at", i, ["P", 2]),
              helper.make_tensor_value_info("pen", f, ["P"]),
              helper.make_tensor_value_info("forced", i, ["N"]),
              helper.make_tensor_value_info("decay_at", i, ["E", 2]),
              helper.make_tensor_value_info("growth", f, ["E"]),
              helper.make_tensor_value_info("ban_at", i, ["M", 2]),
              helper.make_tensor_value_info("k", i, [1])]
    outputs = [helper.make_tensor_value_info("values", f, ["N", "K"]),
               helper.make_tensor_value_info("ids", i, ["N", "K"])]
    consts = [helper.make_tensor("zero_f", f, [], [0.0]),
              helper.make_tensor("neg_inf", f, [], [float("-inf")]),
              helper.make_tensor("zero_i", i, [], [0]),
              helper.make_tensor("one_i", i, [], [1]),
              helper.make_tensor("axis1", i, [1], [1])]
    node = helper.make_node
    nodes = [
        # The repetition penalty: x * pen where negative, x / pen where not (HF's).
        node("GatherND", ["log_probs", "pen_at"], ["pv"]),
        node("Less", ["pv", "zero_f"], ["pneg"]),
        node("Mul", ["pv", "pen"], ["pmul"]),
        node("Div", ["pv", "pen"], ["pdiv"]),
        node("Where", ["pneg", "pmul", "pdiv"], ["pnew"]),
        node("ScatterND", ["log_probs", "pen_at", "pnew"], ["x1"]),
        # Forced rows: -inf everywhere but the forced column, which is 0.
        node("Shape", ["x1"], ["width"], start=1, end=2),
        node("Squeeze", ["width"], ["width_s"]),
        node("Range", ["zero_i", "width_s", "one_i"], ["cols"]),
        node("Unsqueeze", ["forced", "axis1"], ["forced2"]),
        node("Equal", ["forced2", "cols"], ["is_forced_col"]),
        node("Where", ["is_forced_col", "zero_f", "neg_inf"], ["forced_row"]),
        node("GreaterOrEqual", ["forced2", "zero_i"], ["is_forced"]),
        node("Where", ["is_forced", "forced_row", "x1"], ["x2"]),
        # EOS's exponential decay: a finite x becomes x + |x| * growth.
        node("GatherND", ["x2", "decay_at"], ["dv"]),
        node("Abs", ["dv"], ["dabs"]),
        node("Mul", ["dabs", "growth"], ["draise"]),
        node("Add", ["dv", "draise"], ["draised"]),
        node("IsInf", ["dv"], ["dinf"]),
        node("Where", ["dinf", "dv", "draised"], ["dnew"]),
        node("ScatterND", ["x2", "decay_at", "dnew"], ["x3"]),
        # The bans.
        node("Shape", ["ban_at"], ["bans"], start=0, end=1),
        node("Expand", ["neg_inf", "bans"], ["ban_values"]),
        node("ScatterND", ["x3", "ban_at", "ban_values"], ["x4"]),
    ]
    last = "x4"
    if renormalize:  # decoding.renormalize: a row with no possible token stays
        nodes += [
            node("ReduceMax", ["x4"], ["top"], axes=[1], keepdims=1),
            node("IsInf", ["top"], ["top_inf"]),
            node("Where", ["top_inf", "zero_f", "top"], ["top_f"]),
            node("Sub", ["x4", "top_f"], ["centred"]),
            node("Exp", ["centred"], ["e"]),
            node("ReduceSum", ["e", "axis1"], ["total"], keepdims=1),
            node("Log", ["total"], ["log_total"]),
            node("Add", ["log_total", "top_f"], ["shift_all"]),
            node("Greater", ["total", "zero_f"], ["has_mass"]),
            node("Where", ["has_mass", "shift_all", "zero_f"], ["shift"]),
            node("Sub", ["x4", "shift"], ["x5"]),
        ]
        last = "x5"
    nodes.append(node("TopK", [last, "k"], ["values", "ids"], axis=1, largest=1, sorted=1))
    graph = helper.make_graph(nodes, "pick", inputs, outputs, initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=GRAPH_IR_VERSION)
    onnx.checker.check_model(model)
    return model
