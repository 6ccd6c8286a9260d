"""What lives on the provider's device, behind one interface: `Memory`.

A decoding keeps its self-attention cache, the cross keys/values of its
sources (source_slots.py), and the log-prob and candidate buffers of its steps
where the provider computes them. Everything the runner and the source slots
do to those tensors (allocate, grow or trim an axis, gather or overwrite rows,
take the first rows) goes through a Memory, and so does every array that
crosses between the host and the device: `upload`, `download` and `bind_input`
are the one place data crosses, and a device Memory counts there (calls and
bytes, per direction: `TransferCounter`, exported as
seq2serve_host_device_bytes_total).

Two implementations:
- `HostMemory` (the CPU provider): the tensors are host arrays, so OrtValues
  wrap numpy arrays without a copy and the edits are numpy's, in place;
  nothing crosses, so nothing is counted. It is the CPU's fast path: the
  decoder may write its outputs straight into host buffers (`host_outputs`).
- `DeviceMemory` (CUDA, or the CPU emulating a device for the tests, the
  runner's `emulate_device`): the tensors are OrtValues on the device, and
  each edit runs a small ONNX graph on the provider (Expand and Concat, Slice,
  Gather, ScatterND: built here with onnx.helper, no file), so a tensor never visits
  the host after it is made. Emulated, the device is the CPU, every upload
  and download is a real copy (as on a device: no aliasing of host arrays),
  and every branch is the device's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from seq2serve.model.package.manifest import GRAPH_IR_VERSION

if TYPE_CHECKING:  # onnx is imported where a graph is built: the CPU path never needs it
    import onnx

# The opset of the small graphs built here and in pick.py: every op they use has a
# CPU and a CUDA kernel at it for the types used (float32, float16, int64).
OPSET = 17


@dataclass(frozen=True)
class Transfers:
    """Host<->device crossings so far: calls and bytes, each way."""

    to_device_calls: int = 0
    to_device_bytes: int = 0
    to_host_calls: int = 0
    to_host_bytes: int = 0

    def __sub__(self, other: Transfers) -> Transfers:
        return Transfers(self.to_device_calls - other.to_device_calls,
                         self.to_device_bytes - other.to_device_bytes,
                         self.to_host_calls - other.to_host_calls,
                         self.to_host_bytes - other.to_host_bytes)


class TransferCounter:
    """Counts crossings; read from other threads (the metrics), so under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = Transfers()

    def to_device(self, nbytes: int) -> None:
        with self._lock:
            c = self._counts
            self._counts = Transfers(c.to_device_calls + 1, c.to_device_bytes + nbytes,
                                     c.to_host_calls, c.to_host_bytes)

    def to_host(self, nbytes: int) -> None:
        with self._lock:
            c = self._counts
            self._counts = Transfers(c.to_device_calls, c.to_device_bytes,
                                     c.to_host_calls + 1, c.to_host_bytes + nbytes)

    def read(self) -> Transfers:
        with self._lock:
            return self._counts


class Memory:
    """The interface; see the module's docstring. `device` and `device_id` name
    where the tensors are (an OrtValue's device, an IOBinding's output)."""

    device: str
    device_id: int
    # The decoder may bind outputs to host buffers and ScatterND writes in place:
    # true only where the device is the host (HostMemory).
    host_outputs: bool
    counter: TransferCounter

    @property
    def on_device(self) -> bool:
        return not self.host_outputs

    def upload(self, array: np.ndarray) -> ort.OrtValue:
        raise NotImplementedError

    def download(self, value: ort.OrtValue) -> np.ndarray:
        raise NotImplementedError

    def bind_input(self, binding: ort.IOBinding, name: str, array: np.ndarray) -> None:
        """A host array as a run's input (tokens, positions, row lists)."""
        raise NotImplementedError

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> ort.OrtValue:
        raise NotImplementedError

    def resize(self, value: ort.OrtValue, axis: int, length: int, fill: float = 0.0
               ) -> ort.OrtValue:
        """`value` with `length` entries along `axis`: trimmed, or padded with `fill`."""
        shape = list(value.shape())
        shape[axis] = length
        return self.fit(value, tuple(shape), fill)

    def fit(self, value: ort.OrtValue, shape: tuple[int, ...], fill: float = 0.0
            ) -> ort.OrtValue:
        """`value` trimmed or padded (with `fill`) to `shape` along every axis."""
        raise NotImplementedError

    def take(self, value: ort.OrtValue, index: np.ndarray, axis: int = 0,
             length: int | None = None) -> ort.OrtValue:
        """The rows (axis 0) `index` of value, a new tensor; with `length`, trimmed
        to that many entries along `axis` too."""
        raise NotImplementedError

    def put(self, store: ort.OrtValue, rows: np.ndarray, values: ort.OrtValue,
            fill: float = 0.0) -> ort.OrtValue:
        """store with its rows `rows` replaced by `values`, whose other axes may be
        shorter than store's (padded with `fill`). May write `store` in place."""
        raise NotImplementedError

    def head(self, value: ort.OrtValue, count: int) -> ort.OrtValue:
        """The first `count` rows of value (a view where the memory allows)."""
        raise NotImplementedError


class HostMemory(Memory):
    """The CPU provider's: tensors are numpy arrays wrapped without a copy."""

    def __init__(self) -> None:
        self.device, self.device_id, self.host_outputs = "cpu", 0, True
        self.counter = TransferCounter()  # stays at zero: nothing crosses

    def upload(self, array: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))

    def download(self, value: ort.OrtValue) -> np.ndarray:
        out: np.ndarray = value.numpy()
        return out

    def bind_input(self, binding: ort.IOBinding, name: str, array: np.ndarray) -> None:
        binding.bind_cpu_input(name, np.ascontiguousarray(array))

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> ort.OrtValue:
        return self.upload(np.zeros(shape, dtype=dtype))

    def fit(self, value: ort.OrtValue, shape: tuple[int, ...], fill: float = 0.0
            ) -> ort.OrtValue:
        old = value.numpy()
        new = np.zeros(shape, dtype=old.dtype) if fill == 0 else \
            np.full(shape, fill, dtype=old.dtype)
        kept = tuple(slice(0, min(a, b)) for a, b in zip(shape, old.shape, strict=True))
        new[kept] = old[kept]  # one allocation and one copy, whatever the axes
        return self.upload(new)

    def take(self, value: ort.OrtValue, index: np.ndarray, axis: int = 0,
             length: int | None = None) -> ort.OrtValue:
        old = value.numpy()
        picked: list[Any] = [index, *(slice(None) for _ in old.shape[1:])]
        if length is not None:
            picked[axis] = slice(0, length)
        return self.upload(old[tuple(picked)])  # fancy indexing: one fresh array

    def put(self, store: ort.OrtValue, rows: np.ndarray, values: ort.OrtValue,
            fill: float = 0.0) -> ort.OrtValue:
        target, new = store.numpy(), values.numpy()
        target[rows] = fill
        index: tuple[Any, ...] = (rows, *(slice(0, n) for n in new.shape[1:]))
        target[index] = new
        return store  # in place: the OrtValue wraps `target`

    def head(self, value: ort.OrtValue, count: int) -> ort.OrtValue:
        return self.upload(value.numpy()[:count])  # a view: no copy


class DeviceMemory(Memory):
    """Tensors on the provider's device; edits run as one-node graphs there.
    `providers` the session providers (the device's first); emulated: the CPU's."""

    def __init__(self, device: str, device_id: int, providers: list[Any],
                 options: ort.SessionOptions, run_options: ort.RunOptions):
        self.device, self.device_id, self.host_outputs = device, device_id, False
        self.counter = TransferCounter()
        self._providers = providers
        self._options = options
        self._run_options = run_options
        self._sessions: dict[tuple[str, int, int], ort.InferenceSession] = {}

    # -- the crossing --------------------------------------------------------------------

    def upload(self, array: np.ndarray) -> ort.OrtValue:
        # A copy even where the device is the CPU: a device tensor never aliases a
        # host array (ortvalue_from_numpy keeps the copy alive).
        array = np.array(array, copy=True, order="C")
        self.counter.to_device(array.nbytes)
        return ort.OrtValue.ortvalue_from_numpy(array, self.device, self.device_id)

    def download(self, value: ort.OrtValue) -> np.ndarray:
        out = np.array(value.numpy(), copy=True)
        self.counter.to_host(out.nbytes)
        return out

    def bind_input(self, binding: ort.IOBinding, name: str, array: np.ndarray) -> None:
        binding.bind_ortvalue_input(name, self.upload(array))

    # -- edits on the device -------------------------------------------------------------

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> ort.OrtValue:
        # An empty tensor padded on the device: only the shape crosses.
        empty = ort.OrtValue.ortvalue_from_shape_and_type(
            [0, *shape[1:]], np.dtype(dtype).type, self.device, self.device_id) \
            if shape else self.upload(np.zeros(shape, dtype=dtype))
        return self.resize(empty, 0, shape[0]) if shape else empty

    def fit(self, value: ort.OrtValue, shape: tuple[int, ...], fill: float = 0.0
            ) -> ort.OrtValue:
        for axis, length in enumerate(shape):
            value = self._resize(value, axis, length, fill)
        return value

    def _resize(self, value: ort.OrtValue, axis: int, length: int, fill: float
                ) -> ort.OrtValue:
        shape = value.shape()
        if length == shape[axis]:
            return value
        if length < shape[axis]:
            return self._run("slice", value, {
                "starts": np.zeros(1, dtype=np.int64),
                "ends": np.array([length], dtype=np.int64),
                "axes": np.array([axis], dtype=np.int64)})
        block = np.array(shape, dtype=np.int64)
        block[axis] = length - shape[axis]
        return self._run("grow", value, {
            "block": block, "fill": np.array(fill, dtype=numpy_type(value))}, axis=axis)

    def take(self, value: ort.OrtValue, index: np.ndarray, axis: int = 0,
             length: int | None = None) -> ort.OrtValue:
        taken = self._run("take", value, {"index": np.asarray(index, dtype=np.int64)})
        return taken if length is None else self._resize(taken, axis, length, 0.0)

    def put(self, store: ort.OrtValue, rows: np.ndarray, values: ort.OrtValue,
            fill: float = 0.0) -> ort.OrtValue:
        values = self.fit(values, (values.shape()[0], *store.shape()[1:]), fill)
        return self._run("put", store, {
            "rows": np.asarray(rows, dtype=np.int64)[:, None]}, values=values)

    def head(self, value: ort.OrtValue, count: int) -> ort.OrtValue:
        return value if count == value.shape()[0] else self._resize(value, 0, count, 0.0)

    def _run(self, op: str, value: ort.OrtValue, small: dict[str, np.ndarray],
             values: ort.OrtValue | None = None, axis: int = 0) -> ort.OrtValue:
        session = self._session(op, value.element_type(), axis)
        binding = session.io_binding()
        binding.bind_ortvalue_input("x", value)
        if values is not None:
            binding.bind_ortvalue_input("values", values)
        for name, array in small.items():
            self.bind_input(binding, name, array)
        binding.bind_output("y", self.device, self.device_id)
        session.run_with_iobinding(binding, self._run_options)
        out: ort.OrtValue = binding.get_outputs()[0]
        return out

    def _session(self, op: str, element: int, axis: int) -> ort.InferenceSession:
        key = (op, element, axis)
        if key not in self._sessions:
            model = edit_graph(op, element, axis)
            self._sessions[key] = ort.InferenceSession(
                model.SerializeToString(), self._options, providers=self._providers)
        return self._sessions[key]


def edit_graph(op: str, element: int, axis: int = 0) -> onnx.ModelProto:
    """The graph of a DeviceMemory edit over tensors of ONNX type `element` (any
    rank): grow (x, block: the added part's shape, fill; `fill` expanded to it and
    concatenated along `axis`: CUDA's Pad has no int64 kernel, Expand and Concat
    have every type), slice (x, starts, ends, axes), take (x, index: Gather on
    axis 0), put (x, rows (R, 1), values: ScatterND). Every op has a kernel for
    every element type used here on CPU and CUDA (ONNX Runtime's
    OperatorKernels.md), so no edit falls back to the host."""
    from onnx import TensorProto, helper
    ints = TensorProto.INT64

    def tensor(name: str, kind: int = element) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, kind, None)

    nodes = []
    if op == "grow":
        inputs = [tensor("x"), tensor("block", ints), helper.make_tensor_value_info(
            "fill", element, [])]
        nodes.append(helper.make_node("Expand", ["fill", "block"], ["added"]))
        node = helper.make_node("Concat", ["x", "added"], ["y"], axis=axis)
    elif op == "slice":
        inputs = [tensor("x"), tensor("starts", ints), tensor("ends", ints),
                  tensor("axes", ints)]
        node = helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])
    elif op == "take":
        inputs = [tensor("x"), tensor("index", ints)]
        node = helper.make_node("Gather", ["x", "index"], ["y"], axis=0)
    elif op == "put":
        inputs = [tensor("x"), tensor("rows", ints), tensor("values")]
        node = helper.make_node("ScatterND", ["x", "rows", "values"], ["y"])
    else:
        raise ValueError(f"no device edit {op!r}")
    graph = helper.make_graph([*nodes, node], f"device_{op}", inputs, [tensor("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=GRAPH_IR_VERSION)


# An OrtValue's element type (its data_type()) as numpy's, for the types a package's
# tensors have.
NUMPY_TYPES: dict[str, type] = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def numpy_type(value: ort.OrtValue) -> type:
    """The numpy scalar type of an OrtValue's elements."""
    return NUMPY_TYPES[value.data_type()]
