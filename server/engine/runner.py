"""The Runner owns the ONNX Runtime sessions of one model package.

Five sessions, one per graph of the package: the encoder, the decoder step,
the cache's reorder and move graphs, and select (TopK). The runner keeps their
tensors where the provider computes them; it makes no decoding or scheduling
decisions (see engine.py). At load it checks every session's inputs and
outputs against the manifest's graph specs (names, dtypes, ranks, and the
model's sizes where the graph fixes them) and refuses a package that does not
match, naming the file and the tensor.

Providers: `cpu`, `cuda` (CUDAExecutionProvider), or `auto` (CUDA when this
onnxruntime build has it, logged either way). What lives on the device (the
cache, the cross K/V, the log-probs) is the runner's `memory` (device.py): on
the CPU provider host arrays (HostMemory), on CUDA, or on the CPU emulating a
device for the tests (`RunnerConfig.emulate_device`), OrtValues on the device
(DeviceMemory), which is the one place data crosses and counts it. Both go
through I/O binding: encoder outputs and the self-attention cache are bound as
the next step's inputs. On the CPU the decoder writes its (N, V) log-probs
into one reused host buffer (`step`); on a device they stay there and the pick
graph (pick.py) applies the step's processing, sent as short lists (edits.py),
and returns each row's k best (`step_picked`). Tokens, positions, beam origins
and those lists are the small arrays that go down per step.

The self-attention cache: one (N, H, Tc, Dh) tensor per layer and per K/V;
row r keeps step t in slot t, so rows at different steps share one call. Row
r of a call continues cache row r, and the step writes each row's new slot
into the cache's own buffer: the runner binds each cache tensor once as both
the decoder's input and its output, and the binding lives across steps. In a
format 7 package the decoder's self-attention is ONNX Runtime's fused
GroupQueryAttention, which reads each row's slots 0..position only and, given
one buffer as past and present, writes the new slots in place on CPU and CUDA
(`past_present_share_buffer`, as onnxruntime-genai binds it): a step copies no
cache and its cost does not grow with the cache's length. In a format 6
package (still served) a ScatterND writes the slots (in place on CPU only;
on CUDA its outputs are fresh device tensors, one copy) and the plain
attention masks every slot after the row's position.
When rows moved (beam search reordering hypotheses, rows joining past the
cache's rows, a compaction) the reorder graph gathers the rows, one copy.
When the rows stay the same and only some moved (beam search: 28% of rows per
step in the benchmark's decoding), the move graph rewrites just those rows,
in place on CPU.

The select graph (TopK) gives beam search each row's best log-probs on the
CPU: ONNX Runtime's TopK on the intra-op threads takes 1.4 ms for 64 x 58k
log-probs where numpy took 3.9 ms. The runner resizes Tc where the cache lives
(`cache_slots`, `resize_cache`):
it grows when a row's position reaches it and shrinks once a whole block lies
past every live row's position (a running batch's longest row left). Format 6
attends to every slot, so Tc is the longest row in whole blocks of
CACHE_BLOCK slots (a copy every CACHE_BLOCK steps); format 7 attends to a
row's own slots only and takes the same length, one block more where that is
a multiple of 64 slots (`cache_slots`). A row that joins later continues
whatever row it is placed on; its stale slots are masked, and each is written
before the row reaches it.

Finished sources leave the batch: their rows idle (engine.py) until a
newcomer takes them or the batch compacts; the cross K/V keep one slot per
source (source_slots.py), written when a source is admitted: on a device by a
small graph from the encoder's outputs there, so they never cross to the host.

A format 8 package also has a vocabulary shortlist (model/package/shortlist.py): its
table, and a second decoder graph whose log-probs are over each source's
candidates only. A batch runs one of the two decoders. For a shortlist batch
`shortlist_columns` gathers each admitted source's candidates and their
projection columns once (host arrays, padded to whole WIDTH_MULTIPLE blocks),
which the source's slot keeps (source_slots.py) and every step binds, and the
step returns log-probs (N, C) over the candidates.

Every run gets the runner's RunOptions: `terminate()` ends the runs in
progress (ONNX Runtime checks the flag between kernels) and fails every later
one with RunTerminated, so a stopping server can join its engine threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from types import TracebackType
from typing import Any

import numpy as np
import onnxruntime as ort

from seq2serve.model.config import ModelConfig
from seq2serve.model.package import shortlist as lexical
from seq2serve.model.package.manifest import (
    MANIFEST,
    GraphSpec,
    ModelPackage,
    PackageError,
    TensorSpec,
)
from seq2serve.model.package.session import EXACT_INT8_CONFIG, CudaSettings, share_cuda_arena
from seq2serve.server.engine.device import DeviceMemory, HostMemory, Memory
from seq2serve.server.engine.edits import StepEdits
from seq2serve.server.engine.pick import Picker
from seq2serve.server.resources import (
    PROVIDERS,
    Provider,
    usable_cores,
)

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
# ONNX Runtime's tensor element types by the numpy names the manifest uses.
_ORT_DTYPES = {"float": "float32", "double": "float64"}
# Source widths are padded to a multiple of this. ONNX Runtime's CPU kernels
# reduce over the source axis (cross-attention softmax and weighted sum) in
# vector blocks with a scalar tail, so a row's floats depended on how far its
# batch padded it (measured: 2 of 10 sentences changed log-probs with the
# width). Widths that are whole blocks only add exact zeros to each lane, so a
# source gives bit-identical results alone or padded next to a longer one
# (0 of 180 mismatches at multiples of 4; 16 covers AVX-512's 16 lanes).
SOURCE_WIDTH_MULTIPLE = 16
# The self-attention cache grows by whole blocks for the same reason: its
# softmax and weighted sum reduce over the slots, and a row's masked slots only
# add exact zeros per lane when the cache length is a whole number of blocks.
CACHE_BLOCK = SOURCE_WIDTH_MULTIPLE
# Format 7's cache length is never a multiple of this many slots (`cache_slots`).
CACHE_ALIAS_SLOTS = 64


def padded_width(longest: int, multiple: int = SOURCE_WIDTH_MULTIPLE) -> int:
    """The axis length for a batch whose longest source (or row history) is `longest`."""
    return -(-longest // multiple) * multiple


@dataclass(frozen=True)
class RunnerConfig:
    provider: str = Provider.AUTO.value
    intra_op_threads: int = 0  # 0 = the usable cores (resources.usable_cores)
    inter_op_threads: int = 1  # the graphs are sequential chains; parallelism is intra-op
    graph_optimization: str = "all"
    device_id: int = 0
    warmup: bool = True
    # Off: ORT's idle intra-op threads spin after each run, and with two sessions
    # (encoder, decoder) plus the engine's numpy and the gRPC loop on few cores,
    # the spinning pools take cores from the thread that has work. Measured on
    # 2 cores (shipped en-de, greedy, 32 live sources, engine loop): 1.75x the
    # tokens/s iteration-level, 1.2x request-level with spinning off.
    allow_spinning: bool = False
    # For tests: the CPU takes every branch a device takes (device.DeviceMemory:
    # tensors never aliased by host arrays, log-probs kept "on the device" and
    # reduced there to each row's candidates) and counts every host<->device
    # crossing, so the device path's traffic is proven without a GPU.
    emulate_device: bool = False
    cuda: CudaSettings = CudaSettings()  # the CUDA provider's sessions (TF32 off, arena)

    def validate(self) -> RunnerConfig:
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {PROVIDERS}, got {self.provider!r}")
        for problem in self.cuda.problems():
            raise ValueError(problem)
        if self.graph_optimization not in OPTIMIZATION_LEVELS:
            raise ValueError(f"graph_optimization must be one of {tuple(OPTIMIZATION_LEVELS)}, "
                             f"got {self.graph_optimization!r}")
        for name in ("intra_op_threads", "inter_op_threads", "device_id"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        return self


def choose_provider(requested: str, available: list[str] | None = None) -> str:
    available = ort.get_available_providers() if available is None else available
    if requested == Provider.CPU:
        return CPU
    if requested == Provider.CUDA:
        if CUDA not in available:
            raise RuntimeError("provider 'cuda' requested but this onnxruntime has no "
                               f"{CUDA} (available: {', '.join(available)}); install "
                               "onnxruntime-gpu or use provider 'cpu'")
        _load_cuda_libraries()
        return CUDA
    chosen = CUDA if CUDA in available else CPU
    if chosen == CUDA:
        _load_cuda_libraries()
    log.info("provider auto: using %s (available: %s)", chosen, ", ".join(available))
    return chosen


def _load_cuda_libraries() -> None:
    """CUDA and cuDNN installed as NVIDIA's PyPI wheels (`onnxruntime-gpu[cuda,cudnn]`,
    the `gpu` extra) are not on the loader's path; onnxruntime >= 1.21 finds and
    loads them. Libraries from a CUDA base image or the system are found anyway."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as e:  # noqa: BLE001 - the system's libraries may still do
            log.warning("onnxruntime.preload_dlls failed (%s); relying on the system's "
                        "CUDA libraries", e)


@dataclass(frozen=True)
class ShortlistColumns:
    """Sources' vocabulary shortlists as a shortlist decoder step takes them:
    candidates (B, C) int64 on the host (ascending ids, then PAD_CANDIDATE), the
    output projection's columns of those ids, weight (B, D, C), and their bias
    (B, C) float32, -inf at the padded slots, as OrtValues."""

    candidates: np.ndarray
    weight: ort.OrtValue
    bias: ort.OrtValue

    @property
    def width(self) -> int:
        return int(self.candidates.shape[1])


@dataclass(frozen=True)
class EncoderState:
    """One batch's encoder results, kept where the provider computed them.
    cross_k/cross_v, per layer (B, H, S, Dh), and src_mask (B, S) as OrtValues;
    lengths (B,) the source lengths on the host; shortlist: the sources'
    candidates when the batch decodes over its shortlist (None: the vocabulary)."""

    cross_k: tuple[ort.OrtValue, ...]
    cross_v: tuple[ort.OrtValue, ...]
    src_mask: ort.OrtValue
    lengths: np.ndarray
    shortlist: ShortlistColumns | None = None

    @property
    def sources(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def width(self) -> int:
        return int(self.src_mask.shape()[1])


@dataclass(frozen=True)
class DecoderCache:
    """The self-attention cache: self_k/self_v, per layer an (N, H, Tc, Dh) OrtValue."""

    self_k: tuple[ort.OrtValue, ...]
    self_v: tuple[ort.OrtValue, ...]

    # An OrtValue's shape never changes; asked several times a step.
    @cached_property
    def rows(self) -> int:
        return int(self.self_k[0].shape()[0])

    @cached_property
    def length(self) -> int:
        return int(self.self_k[0].shape()[2])


@dataclass(frozen=True)
class Picked:
    """A step's candidates as a device brings them back: per row the k best
    processed log-probs (N, k) float32, sorted descending, and their columns
    (N, k) int64 (ids over the vocabulary; a shortlist step's candidate columns)."""

    values: np.ndarray
    ids: np.ndarray

    def rows(self, at: slice | np.ndarray) -> Picked:
        return Picked(self.values[at], self.ids[at])


class RunTerminated(RuntimeError):
    """A run ended, or was refused, because the runner was terminated."""


class _Terminable:
    """Around every run (each passes `options`): refused once terminated, and a
    run the flag ended raises RunTerminated. A plain context manager, reused:
    a generator-based one costs several microseconds, and a step makes 2-3 runs."""

    def __init__(self, options: ort.RunOptions):
        self.options = options

    def __enter__(self) -> None:
        if self.options.terminate:
            raise RunTerminated("the runner was terminated: the server is stopping")

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        # ONNX Runtime's own error names only its flag
        if isinstance(error, Exception) and self.options.terminate:
            raise RunTerminated("the run was terminated: the server is stopping") from error


@dataclass(frozen=True)
class Sessions:
    """One model's ONNX Runtime sessions, one per graph. A model's engines share
    them (`Runner(package, config, first.sessions)`): `InferenceSession.run` is thread-safe,
    and with one intra-op thread each run executes on its caller's thread, so the
    weights are held once while each runner keeps its own bindings, buffers, cache
    and RunOptions (`terminate` ends that runner's runs only)."""

    encoder: ort.InferenceSession
    decoder: ort.InferenceSession
    reorder: ort.InferenceSession
    move: ort.InferenceSession
    select: ort.InferenceSession
    shortlist_decoder: ort.InferenceSession | None  # format 8's decoder over candidates


class Runner:
    def __init__(self, package: ModelPackage, config: RunnerConfig | None = None,
                 shared: Sessions | None = None):
        """shared: another runner's sessions, of the same package and config; None
        opens this runner's own."""
        self.config = (config or RunnerConfig()).validate()
        self.package = package
        self.provider = choose_provider(self.config.provider)
        self.threads = self.config.intra_op_threads or usable_cores()
        self._run_options = ort.RunOptions()
        # onnxruntime's Python wrapper reads this entry before every run; unset, the
        # lookup raises and catches a C++ exception, 40 us per run (5% of a lone
        # sentence's decoding). -1 is its documented "no graph capture" value, which
        # is what this runner does anyway (no CUDA or WebGPU graphs).
        self._run_options.add_run_config_entry("gpu_graph_id", "-1")
        self._terminable = _Terminable(self._run_options)  # around every run
        self.memory = self._memory()
        self.device, self.device_id = self.memory.device, self.memory.device_id
        spec = package.manifest.shortlist
        self.sessions = shared or Sessions(
            self._session(str(package.encoder_path)), self._session(str(package.decoder_path)),
            self._session(str(package.reorder_path)), self._session(str(package.move_path)),
            # Selection runs on the host's log-probs (processed there), so always on CPU.
            self._session(str(package.select_path), cpu_only=True),
            None if spec is None else self._session(str(package.path / spec.decoder.file)))
        self.encoder = self.sessions.encoder
        self.decoder = self.sessions.decoder
        self.reorder = self.sessions.reorder
        self.move = self.sessions.move
        self.select = self.sessions.select
        cfg = package.manifest.config
        graphs = package.manifest.graphs
        sessions = [(graphs.encoder, self.encoder), (graphs.decoder, self.decoder),
                    (graphs.reorder, self.reorder), (graphs.move, self.move),
                    (graphs.select, self.select)]
        # Format 8: the decoder over each source's candidates, and their table.
        self.shortlist: lexical.Shortlist | None = None
        self.shortlist_decoder: ort.InferenceSession | None = None
        if spec is not None and self.sessions.shortlist_decoder is not None:
            self.shortlist_decoder = self.sessions.shortlist_decoder
            sessions.append((spec.decoder, self.shortlist_decoder))
            try:
                self.shortlist = lexical.load(
                    package.path / spec.table,
                    lexical.ShortlistSettings(spec.first, spec.best, spec.threshold))
            except ValueError as e:
                raise PackageError(package.path, [str(e)]) from None
        check_sessions(package, sessions)
        self.layers = cfg.decoder_layers
        self.heads = cfg.decoder_heads
        self.head_dim = cfg.heads_dim(self.heads)
        self.vocab_size = cfg.tgt_vocab_size
        self.max_positions = cfg.max_positions
        self.decoder_start_id = cfg.decoder_start_id
        self.eos_id = cfg.eos_id
        cache_spec = {s.name: s for s in graphs.decoder.inputs}["self_k.0"]
        self.cache_dtype = np.dtype(cache_spec.dtype)
        self.output_names = [o.name for o in graphs.decoder.outputs]
        self.cache_outputs = [n for n in self.output_names if n.startswith("new_self_")]
        # Format 7's decoder writes the cache in place on every provider (its
        # GroupQueryAttention shares past and present); format 6's ScatterND on CPU.
        self.fused_attention = package.manifest.fused_attention
        self.in_place = self.memory.host_outputs or self.fused_attention
        # The move graph's ScatterND rewrites rows in place on CPU only.
        self.move_in_place = self.memory.host_outputs
        # On a device: the step's log-probs reduced to each row's candidates there.
        self.picker = Picker(self.memory, self._session_options(), self._providers(),
                             self._run_options, self.vocab_size)
        # Per layer: the (self_k, self_v, cross_k, cross_v) input names, built once.
        self._layer_inputs = [(f"self_k.{i}", f"self_v.{i}", f"cross_k.{i}", f"cross_v.{i}")
                              for i in range(self.layers)]
        self._move_names = [*(f"self_k.{i}" for i in range(self.layers)),
                            *(f"self_v.{i}" for i in range(self.layers))]
        self.cross_outputs = [o.name for o in graphs.encoder.outputs
                              if o.name.startswith("cross_")]
        self._buffer = np.empty(0, dtype=np.float32)  # reused host buffers
        self._log_probs = self._buffer.reshape(0, 0)  # the step's view of _buffer
        self._alignment = np.empty(0, dtype=np.int64)
        # The decoder's binding of the last step and what it binds (cache, encoder
        # state, log-prob buffer): the next step over the same ones rebinds only
        # tokens and positions (on CPU the cache is written in place, so most steps).
        self._step_binding: tuple[DecoderCache, EncoderState, np.ndarray | None,
                                  ort.InferenceSession, ort.IOBinding,
                                  tuple[int, int]] | None = None
        self._last_log_probs: ort.OrtValue | None = None  # step_picked's, on the device
        self._moves: tuple[DecoderCache, ort.IOBinding] | None = None  # the move graph's
        self.warmup_seconds = 0.0
        if self.config.warmup:
            self.warmup_seconds = self._warmup()

    # -- stopping ----------------------------------------------------------------------

    def terminate(self) -> None:
        """End the runs in progress and refuse later ones (RunTerminated). Safe to
        call from any thread; the runner cannot run again."""
        self._run_options.terminate = True

    @property
    def terminated(self) -> bool:
        return bool(self._run_options.terminate)

    def _memory(self) -> Memory:
        """Where the decoding's tensors live: the host on the CPU provider (unless
        emulating a device), else the device."""
        if self.provider == CUDA:
            return DeviceMemory("cuda", self.config.device_id, self._providers(),
                                self._session_options(), self._run_options)
        if self.config.emulate_device:
            return DeviceMemory("cpu", 0, [CPU], self._session_options(), self._run_options)
        return HostMemory()

    def _providers(self) -> list[Any]:
        if self.provider == CUDA:  # TF32 off unless allowed, the arena as set
            return [(CUDA, self.config.cuda.provider_options(self.config.device_id)), CPU]
        return [CPU]

    def _session_options(self) -> ort.SessionOptions:
        """The small graphs' (device.py, pick.py) options: one thread, quiet."""
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return opts

    def _session(self, path: str, cpu_only: bool = False) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = self.config.inter_op_threads
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = OPTIMIZATION_LEVELS[self.config.graph_optimization]
        on_device = self.provider == CUDA and not cpu_only
        # On a device ONNX Runtime's warnings say which nodes it left to the CPU and
        # where it copies between host and device: never hidden there.
        opts.log_severity_level = 2 if on_device else 3
        opts.add_session_config_entry("session.intra_op.allow_spinning",
                                      "1" if self.config.allow_spinning else "0")
        for key, value in EXACT_INT8_CONFIG.items():
            opts.add_session_config_entry(key, value)
        providers = self._providers() if on_device else [CPU]
        if on_device:
            cuda = self.config.cuda
            if cuda.shared_arena and share_cuda_arena(cuda, self.device_id):
                for key, value in cuda.session_entries().items():
                    opts.add_session_config_entry(key, value)
        session = ort.InferenceSession(path, opts, providers=providers)
        wanted = [p if isinstance(p, str) else p[0] for p in providers]
        if session.get_providers() != wanted:  # every provider of the list, in order
            raise RuntimeError(f"{path}: onnxruntime enabled {session.get_providers()}, "
                               f"not {wanted}")
        return session

    def _warmup(self) -> float:
        """First runs allocate arenas and (on CUDA) pick kernels; do it before serving."""
        start = time.perf_counter()
        ids = np.array([[self.eos_id, self.eos_id]], dtype=np.int64)
        enc = self.encode(ids, np.ones_like(ids))
        cache = self.empty_cache(1)
        for step in range(2):
            tokens = np.full(1, self.decoder_start_id, dtype=np.int64)
            _, cache, _ = self.step(tokens, np.full(1, step, dtype=np.int64), cache, enc)
        cache = self.reorder_cache(cache, np.zeros(2, dtype=np.int64))
        self.reorder_cache(cache, np.array([1, 0], dtype=np.int64))  # the move graph
        self.top_k(np.zeros((2, self.vocab_size), dtype=np.float32), 2)
        if self.memory.on_device:  # the pick graphs built and run (rows 2 = beams of 1)
            for renormalize in (False, True):
                _, cache, _ = self.step_picked(np.full(2, self.decoder_start_id, dtype=np.int64),
                                               np.full(2, 2, dtype=np.int64), cache, enc,
                                               StepEdits.none(2, renormalize), 2)
        if self.shortlist is not None:
            enc = replace(enc, shortlist=self.shortlist_columns([ids[0]]))
            cache = self.empty_cache(1)
            for step in range(2):
                tokens = np.full(1, self.decoder_start_id, dtype=np.int64)
                _, cache, _ = self.step(tokens, np.full(1, step, dtype=np.int64), cache, enc)
        return time.perf_counter() - start

    # -- tensors -----------------------------------------------------------------------

    def to_device(self, array: np.ndarray) -> ort.OrtValue:
        return self.memory.upload(array)

    def empty_cache(self, rows: int, length: int = 0) -> DecoderCache:
        """Zeros; every tensor its own buffer (steps write into them in place)."""
        def empty() -> ort.OrtValue:
            return self.memory.zeros((rows, self.heads, length, self.head_dim),
                                     self.cache_dtype)

        return DecoderCache(tuple(empty() for _ in range(self.layers)),
                            tuple(empty() for _ in range(self.layers)))

    def resize_cache(self, cache: DecoderCache, length: int) -> DecoderCache:
        """The cache with `length` slots: new slots zero-filled, or the slots past
        `length` dropped (one copy, where the cache lives)."""
        def resize(value: ort.OrtValue) -> ort.OrtValue:
            return self.memory.resize(value, 2, length)  # (N, H, Tc, Dh)

        return DecoderCache(tuple(map(resize, cache.self_k)), tuple(map(resize, cache.self_v)))

    # -- the graphs --------------------------------------------------------------------

    def encode(self, src_ids: np.ndarray, src_mask: np.ndarray) -> EncoderState:
        """src_ids, src_mask (B, S) int64, sources left-aligned and right-padded."""
        binding = self.encoder.io_binding()
        self.memory.bind_input(binding, "src_ids", np.ascontiguousarray(src_ids, dtype=np.int64))
        mask = np.ascontiguousarray(src_mask, dtype=np.int64)
        mask_value = self.to_device(mask)  # one upload: the encoder's and the decoder's
        binding.bind_ortvalue_input("src_mask", mask_value)
        for name in self.cross_outputs:  # the memory output is not bound: nobody reads it
            binding.bind_output(name, self.device, self.device_id)
        with self._terminable:
            self.encoder.run_with_iobinding(binding, self._run_options)
        cross = tuple(binding.get_outputs())
        return EncoderState(cross[:self.layers], cross[self.layers:], mask_value,
                            mask.sum(axis=1).astype(np.int64))

    def shortlist_columns(self, sources: Sequence[Sequence[int] | np.ndarray],
                          settings: lexical.ShortlistSettings | None = None
                          ) -> ShortlistColumns:
        """Each source's candidates (its table's setting, or `settings`) and their
        projection columns, gathered once for the source's whole decoding."""
        if self.shortlist is None:
            raise ValueError(f"{self.package.path} has no vocabulary shortlist")
        table = self.shortlist.table
        use = settings or self.shortlist.settings
        candidates = lexical.padded_candidates([table.candidates(s, use) for s in sources])
        weight, bias = self.shortlist.projection.gather(candidates)
        return ShortlistColumns(candidates, self.to_device(weight), self.to_device(bias))

    def reorder_cache(self, cache: DecoderCache, beam_origin: np.ndarray) -> DecoderCache:
        """The cache rows picked by beam_origin (N,), the row each new row
        continues (a row at position 0 may continue any row: its slots are
        masked). On the provider's device; the old cache must not be used after.

        Same rows in and out: `cache` itself when no row moved; on CPU only the
        rows that moved are rewritten, in place (the move graph). Otherwise one
        copy of the picked rows."""
        origin = np.ascontiguousarray(beam_origin, dtype=np.int64)
        if origin.shape[0] == cache.rows:
            moved = np.flatnonzero(origin != np.arange(origin.shape[0]))
            if moved.size == 0:
                return cache
            if self.move_in_place:
                binding = self._move_binding(cache)
                self.memory.bind_input(binding, "moved_rows", moved[:, None])
                self.memory.bind_input(binding, "moved_from", origin[moved])
                with self._terminable:
                    self.move.run_with_iobinding(binding, self._run_options)
                return cache
        binding = self.reorder.io_binding()
        for i in range(self.layers):
            binding.bind_ortvalue_input(f"self_k.{i}", cache.self_k[i])
            binding.bind_ortvalue_input(f"self_v.{i}", cache.self_v[i])
        self.memory.bind_input(binding, "beam_origin", origin)
        for output in self.reorder.get_outputs():
            binding.bind_output(output.name, self.device, self.device_id)
        with self._terminable:
            self.reorder.run_with_iobinding(binding, self._run_options)
        moved_values = binding.get_outputs()  # reordered_self_k.*, reordered_self_v.*
        return DecoderCache(tuple(moved_values[:self.layers]),
                            tuple(moved_values[self.layers:]))

    def _move_binding(self, cache: DecoderCache) -> ort.IOBinding:
        """The move graph's binding of the cache's tensors, in place: the last
        move's when it bound this very cache (written in place, it lives across
        steps; a new binding costs ~20 calls)."""
        if self._moves is not None and self._moves[0] is cache:
            return self._moves[1]
        binding = self.move.io_binding()
        for name, value in zip(self._move_names, (*cache.self_k, *cache.self_v), strict=True):
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(f"moved_{name}", value)  # in place
        self._moves = (cache, binding)
        return binding

    def top_k(self, log_probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's k best values of log_probs (N, V) float32 on the host, sorted
        descending (ties: the lower id first), and their ids (N, k) int64."""
        feeds = {"log_probs": np.ascontiguousarray(log_probs, dtype=np.float32),
                 "k": np.array([min(k, log_probs.shape[1])], dtype=np.int64)}
        with self._terminable:
            values, ids = self.select.run(None, feeds, self._run_options)
        return values, ids

    def step(self, tokens: np.ndarray, positions: np.ndarray, cache: DecoderCache,
             enc: EncoderState) -> tuple[np.ndarray, DecoderCache, np.ndarray]:
        """One decoder step for N = len(tokens) rows (a multiple of enc.sources);
        row r continues cache row r (`reorder_cache` first when rows moved).

        positions (N,) are the rows' steps; the cache grows to hold them. Written
        in place (on CPU, and on CUDA for a format 7 package) the returned cache
        is `cache` itself (or its resized copy): the caller must not keep using
        the old one as it was.
        With `enc.shortlist` the step runs the shortlist decoder: log_probs are
        (N, C), over each row's source's candidates (`enc.shortlist.candidates`).
        Returns log_probs (N, V) float32 on the host (on CPU in a buffer this
        runner reuses: valid until the next call, and free for the caller to
        modify in place; on a device brought over whole: `step_picked` is the
        device's way), the new cache, and alignment (N,) int64 on the host: per
        row, the source position the last layer's cross-attention weighed most
        for this step's token.
        """
        log_probs, cache, alignment = self._run_decoder(tokens, positions, cache, enc)
        if isinstance(log_probs, ort.OrtValue):
            return self.memory.download(log_probs), cache, alignment
        return log_probs, cache, alignment

    def step_picked(self, tokens: np.ndarray, positions: np.ndarray, cache: DecoderCache,
                    enc: EncoderState, edits: StepEdits, k: int
                    ) -> tuple[Picked, DecoderCache, np.ndarray]:
        """`step`, with the log-probs processed by `edits` and reduced to each
        row's k best where the decoder left them (pick.py): what a device brings
        back. The log-probs stay available to `last_log_probs` until the next step."""
        log_probs, cache, alignment = self._run_decoder(tokens, positions, cache, enc)
        value = log_probs if isinstance(log_probs, ort.OrtValue) \
            else self.memory.upload(log_probs)
        values, ids = self.picker.pick(value, edits, k)
        self._last_log_probs = value
        return Picked(values, ids), cache, alignment

    def last_log_probs(self) -> np.ndarray:
        """The last `step_picked`'s raw log-probs, brought to the host (the rare
        step whose processing the candidates cannot decide)."""
        if self._last_log_probs is None:
            raise ValueError("no step_picked ran")
        return self.memory.download(self._last_log_probs)

    def _run_decoder(self, tokens: np.ndarray, positions: np.ndarray, cache: DecoderCache,
                     enc: EncoderState
                     ) -> tuple[np.ndarray | ort.OrtValue, DecoderCache, np.ndarray]:
        """The decoder run of `step`: log-probs in the host buffer (CPU) or where
        the device wrote them."""
        rows = int(tokens.shape[0])
        if cache.rows != rows:
            raise ValueError(f"a step of {rows} rows got a cache of {cache.rows} rows")
        self._last_log_probs = None
        longest = int(positions.max()) + 1 if rows else 0
        wanted = self.cache_slots(longest)
        # Shrink too, once a whole block is past every row: in a running batch the
        # longest row leaves and newer rows are far behind it; in format 6 every
        # slot costs each row attention, and in both each resize or reorder a copy.
        if cache.length < longest or cache.length > wanted:
            cache = self.resize_cache(cache, wanted)
        width = self.vocab_size if enc.shortlist is None else enc.shortlist.width
        host = self.memory.host_outputs
        log_probs = self._log_probs_buffer(rows, width) if host else None
        decoder = self.decoder
        if enc.shortlist is not None:
            if self.shortlist_decoder is None:
                raise ValueError(f"{self.package.path} has no vocabulary shortlist")
            decoder = self.shortlist_decoder
        binding = self._decoder_binding(cache, enc, log_probs, decoder, (rows, width))
        self.memory.bind_input(binding, "tokens", np.ascontiguousarray(tokens, dtype=np.int64))
        self.memory.bind_input(binding, "positions",
                               np.ascontiguousarray(positions, dtype=np.int64))
        with self._terminable:
            decoder.run_with_iobinding(binding, self._run_options)
        if host and self.in_place and log_probs is not None:
            # Every output went into our buffers: the cache in place, the log-probs
            # and the alignment into the host buffers (no get_outputs() per step).
            return log_probs, cache, self._alignment[:rows].copy()
        out, *new_cache, alignment = binding.get_outputs()  # in binding order
        if not self.in_place:
            cache = DecoderCache(tuple(new_cache[:self.layers]),
                                 tuple(new_cache[self.layers:]))
        if host and log_probs is not None:
            return log_probs, cache, alignment.numpy()
        return out, cache, self.memory.download(alignment)

    def _log_probs_buffer(self, rows: int, width: int) -> np.ndarray:
        """The (rows, width) view of the reused host buffer the decoder writes its
        log-probs into: the same view object while the shape stays (the decoder's
        binding of the last step is recognised by it). The alignment buffer grows
        with it."""
        if self._log_probs.shape != (rows, width):
            size = rows * width
            if self._buffer.size < size or self._alignment.size < rows:
                self._buffer = np.empty(max(size, self._buffer.size), dtype=np.float32)
                self._alignment = np.empty(max(rows, self._alignment.size), dtype=np.int64)
            self._log_probs = self._buffer[:size].reshape(rows, width)
        return self._log_probs

    def cache_slots(self, longest: int) -> int:
        """The cache length Tc for rows whose longest history is `longest` slots:
        whole blocks of CACHE_BLOCK.

        Format 6 attends to every slot, and whole blocks make a row's masked slots
        add exact zeros per vector lane (batch invariance). Format 7 reads a row's
        slots 0..position only, so any Tc gives the same bits; spare slots still
        cost every copy of a row (beam search's moves, reorders, resizes: growing
        four blocks at a time cost 13% of the sentences/s at batch 32, beam 4),
        so Tc stays as tight, except that it is never a multiple of
        CACHE_ALIAS_SLOTS: consecutive (row, head) blocks 16 KiB apart (Dh = 64)
        made GroupQueryAttention's reads collide in the CPU's caches (alone, 128
        rows at 128 slots, one thread: 2.6 ms at Tc = 128, 1.7 ms at 144)."""
        slots = padded_width(longest, CACHE_BLOCK) if longest else 0
        if self.fused_attention and slots and slots % CACHE_ALIAS_SLOTS == 0:
            slots += CACHE_BLOCK
        return slots

    def _decoder_binding(self, cache: DecoderCache, enc: EncoderState,
                         log_probs: np.ndarray | None, decoder: ort.InferenceSession,
                         shape: tuple[int, int]) -> ort.IOBinding:
        """The decoder's binding of everything but tokens and positions: the last
        step's when it bound these very tensors (a new binding costs ~20 calls).
        log_probs: the host buffer to write them into (CPU), None: on the device."""
        last = self._step_binding
        if last is not None and last[0] is cache and last[1] is enc \
                and last[2] is log_probs and last[3] is decoder and last[5] == shape:
            return last[4]
        binding = decoder.io_binding()
        for i, (sk, sv, ck, cv) in enumerate(self._layer_inputs):
            binding.bind_ortvalue_input(sk, cache.self_k[i])
            binding.bind_ortvalue_input(sv, cache.self_v[i])
            binding.bind_ortvalue_input(ck, enc.cross_k[i])
            binding.bind_ortvalue_input(cv, enc.cross_v[i])
        binding.bind_ortvalue_input("src_mask", enc.src_mask)
        if enc.shortlist is not None:
            binding.bind_ortvalue_input("shortlist_weight", enc.shortlist.weight)
            binding.bind_ortvalue_input("shortlist_bias", enc.shortlist.bias)
        if log_probs is not None:
            # Written straight into our host buffer: no per-step allocation or extra copy.
            binding.bind_output("log_probs", "cpu", 0, np.float32, list(log_probs.shape),
                                log_probs.ctypes.data)
        else:
            binding.bind_output("log_probs", self.device, self.device_id)
        old = (*cache.self_k, *cache.self_v)
        for name, value in zip(self.cache_outputs, old, strict=True):  # new_self_k.*, v.*
            if self.in_place:
                binding.bind_ortvalue_output(name, value)
            else:
                binding.bind_output(name, self.device, self.device_id)
        if log_probs is not None and self.in_place:
            binding.bind_output("alignment", "cpu", 0, np.int64, [log_probs.shape[0]],
                                self._alignment.ctypes.data)
        elif log_probs is not None:
            binding.bind_output("alignment", "cpu")
        else:
            binding.bind_output("alignment", self.device, self.device_id)
        # Only the in-place cache outlives the step as the same tensors.
        self._step_binding = ((cache, enc, log_probs, decoder, binding, shape)
                              if self.in_place else None)
        return binding


# -- the sessions against the manifest -------------------------------------------------


def check_sessions(package: ModelPackage, sessions: list[tuple[GraphSpec, Any]]) -> None:
    """Raise PackageError unless every session's inputs and outputs are the ones
    its graph spec in the manifest lists: the same names, dtypes and ranks, fixed
    axes the same size, and the model's sizes (H, Dh, D, V) those of its config.
    Each problem names the file and the tensor."""
    sizes = model_sizes(package.manifest.config)
    problems: list[str] = []
    for spec, session in sessions:
        problems += _io_problems(spec.file, "input", spec.inputs, session.get_inputs(), sizes)
        problems += _io_problems(spec.file, "output", spec.outputs, session.get_outputs(), sizes)
    if problems:
        raise PackageError(package.path, problems)


def model_sizes(config: ModelConfig) -> dict[str, int]:
    """What the graph specs' model-size symbols stand for in this model."""
    return {"H": config.decoder_heads, "Dh": config.decoder_head_dim,
            "D": config.d_model, "V": config.tgt_vocab_size}


def ort_dtype(ort_type: str) -> str:
    """"tensor(float)" -> "float32", "tensor(int64)" -> "int64"."""
    element = ort_type.removeprefix("tensor(").removesuffix(")")
    return _ORT_DTYPES.get(element, element)


def _io_problems(file: str, kind: str, specs: tuple[TensorSpec, ...], args: list[Any],
                 sizes: dict[str, int]) -> list[str]:
    graph = {a.name: a for a in args}
    listed = {s.name: s for s in specs}
    problems = [f"{file}: {kind} {name!r} is listed in {MANIFEST} but the graph has no such "
                f"{kind} (it has {', '.join(graph) or 'none'})"
                for name in listed if name not in graph]
    problems += [f"{file}: the graph's {kind} {name!r} is not listed in {MANIFEST}"
                 for name in graph if name not in listed]
    for name in listed.keys() & graph.keys():
        problems += _tensor_problems(f"{file}: {kind} {name!r}", listed[name], graph[name],
                                     sizes)
    return problems


def _tensor_problems(where: str, spec: TensorSpec, arg: Any, sizes: dict[str, int]) -> list[str]:
    dtype = ort_dtype(arg.type)
    if dtype != spec.dtype:
        return [f"{where} is {dtype} in the graph but {spec.dtype} in {MANIFEST}"]
    shape = list(arg.shape)
    if len(shape) != len(spec.shape):
        return [f"{where} has {len(shape)} axes in the graph but {len(spec.shape)} in "
                f"{MANIFEST} {list(spec.shape)}"]
    problems = []
    for axis, (have, want) in enumerate(zip(shape, spec.shape, strict=True)):
        size = sizes.get(want) if isinstance(want, str) else want
        # A symbolic axis of the graph (or one it leaves unnamed) takes any size.
        if size is not None and isinstance(have, int) and have != size:
            what = f"{want} = {size} in the model config" if isinstance(want, str) else str(size)
            problems.append(f"{where} axis {axis} is {have} in the graph, expected {what}")
    return problems
