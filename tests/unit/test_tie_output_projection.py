"""`tie_output_projection` on a decoder graph written with external data, as
torch.onnx writes a graph past protobuf's 2 GB (NLLB-200's decoder before tying: two
copies of its 256206-row embedding): shape inference must not serialise the weights,
and the tied graph comes out as the one-file graph would."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from seq2serve.bench.engine import families
from seq2serve.export.onnx_graphs import export_graphs, sample_inputs, tie_output_projection
from seq2serve.model.families import m2m100
from seq2serve.model.package.manifest import DECODER_FILE


def _external(model: onnx.ModelProto) -> set[str]:
    return {t.name for t in model.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL}


def test_a_decoder_with_external_data_is_tied(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    shape = families.FAMILY_SHAPES["tiny-m2m100"]
    model = m2m100.load_m2m100(families.build_folder(tmp_path / "hf", shape, 0))
    assert model.cfg.tie_output
    plain = tmp_path / "plain"
    plain.mkdir()
    export_graphs(model, plain)
    external = tmp_path / "external"
    external.mkdir()
    onnx.save(onnx.load(str(plain / DECODER_FILE)), str(external / DECODER_FILE),
              save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)
    stored = _external(onnx.load(str(external / DECODER_FILE), load_external_data=False))
    assert stored  # the weights are files of their own

    unchanged = shutil.copytree(plain, tmp_path / "plain-copy")
    assert tie_output_projection(unchanged / DECODER_FILE)
    infer = onnx.shape_inference.infer_shapes

    def without_weights(graph: onnx.ModelProto, *args: object, **kwargs: object) -> object:
        # a past-2-GB model could not be serialised with its weights loaded
        assert _external(graph) == stored
        return infer(graph, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", without_weights)
    assert tie_output_projection(external / DECODER_FILE)
    tied = onnx.load(str(external / DECODER_FILE), load_external_data=False)
    assert not _external(tied)  # one file again
    reference = onnx.load(str(unchanged / DECODER_FILE))
    assert [n.op_type for n in tied.graph.node] == [n.op_type for n in reference.graph.node]
    assert "Gemm" in {n.op_type for n in tied.graph.node}
    assert len(tied.graph.initializer) == len(reference.graph.initializer)
    # and it computes what the untied graph computes
    _, dec_args = sample_inputs(model)
    untied = ort.InferenceSession(str(plain / DECODER_FILE), providers=["CPUExecutionProvider"])
    names = [i.name for i in untied.get_inputs()]
    feeds = {name: arg.numpy() for name, arg in zip(names, dec_args, strict=True)}
    session = ort.InferenceSession(str(external / DECODER_FILE),
                                   providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, feeds), untied.run(None, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
