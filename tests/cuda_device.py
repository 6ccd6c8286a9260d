"""Whether a CUDA device answers here, for the `gpu` tests (issue 52): they skip when
none does, not when onnxruntime was built without the CUDA provider. A device
answers when a tiny session runs on the CUDA provider (onnxruntime-gpu with a
driver), or when nvidia-smi lists a GPU (then a build without the provider fails
the tests, as it should: that machine is misconfigured)."""

from __future__ import annotations

import functools
import subprocess

import numpy as np
import onnxruntime as ort
import pytest
import system_tools

from seq2serve.model.package.manifest import GRAPH_IR_VERSION

CUDA = "CUDAExecutionProvider"


@functools.cache
def device_answers() -> str | None:
    """None when a CUDA device answers, else why not (the skip's reason)."""
    if CUDA in ort.get_available_providers():
        try:
            from onnx import TensorProto, helper

            graph = helper.make_graph(
                [helper.make_node("Add", ["x", "x"], ["y"])], "probe",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                      ir_version=GRAPH_IR_VERSION)
            session = ort.InferenceSession(model.SerializeToString(), providers=[CUDA])
            if session.get_providers()[0] == CUDA:
                session.run(None, {"x": np.ones(2, dtype=np.float32)})
                return None
        except Exception as e:  # noqa: BLE001 - any failure: no device answered
            reason = f"a CUDA session failed: {e}"
        else:
            reason = "the CUDA provider fell back to the CPU"
    else:
        reason = f"onnxruntime has no {CUDA}"
    smi = system_tools.find("nvidia-smi")
    if smi is not None:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
        if listed.returncode == 0 and "GPU" in listed.stdout:
            return None  # a GPU is there: the tests run (and fail if onnxruntime cannot use it)
    return f"no CUDA device answers ({reason}; no GPU listed by nvidia-smi)"


def requires_cuda() -> pytest.MarkDecorator:
    reason = device_answers()
    return pytest.mark.skipif(reason is not None, reason=reason or "")
