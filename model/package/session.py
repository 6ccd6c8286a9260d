"""The session settings every CPU session of a package gets, wherever it runs (the
server's engine, the exporter's verification, the benchmarks' peers): part of the
package format, so that an int8 package decodes the same on every CPU; and the
settings of sessions on a CUDA device (`CudaSettings`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path


def cpuinfo(field: str, root: Path = Path("/")) -> str | None:
    """The first `field` line's value in /proc/cpuinfo (None: no such file or line)."""
    try:
        for line in (root / "proc" / "cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# x86 instruction sets whose u8 x s8 dot products accumulate in int32 (vpdpbusd, AMX):
# ONNX Runtime's int8 kernels are exact on them without help.
EXACT_INT8_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def int8_needs_exact_kernels(root: Path = Path("/")) -> bool:
    """Whether this CPU is an x86 one without VNNI or AMX, where ONNX Runtime's u8s8
    kernels add pairs of products in int16 (vpmaddubsw) and saturate: True when
    /proc/cpuinfo has x86 flags (sse2) and none of EXACT_INT8_FLAGS."""
    flags = set((cpuinfo("flags", root) or "").split())
    return "sse2" in flags and not flags & EXACT_INT8_FLAGS


# Session settings every CPU session of a package gets (the server's, the exporter's
# verification, the profiler's), so that int8 results do not depend on the CPU: x86
# u8s8 kernels without VNNI (AVX2, AVX-512 before Cascade Lake) add pairs of
# u8 x s8 products in int16 (vpmaddubsw), which saturates; this option makes them
# exact there (u8u8). Issue 33: without it one greedy output in six of the shipped
# int8 en-de and en-fr changed on an AVX2-only CPU (ONNX Runtime PR #12088 added the
# option). Only there: where the kernels are exact already (VNNI, AMX, ARM) the
# option changes no output but costs time (shipped int8 en-de, beam 4, batch 32, one
# thread, Sapphire Rapids: 34.5 sentences per CPU-second with it, 55.9 without, the
# same 128 outputs).
EXACT_INT8_OPTION = {"session.x64quantprecision": "1"}
EXACT_INT8_CONFIG = EXACT_INT8_OPTION if int8_needs_exact_kernels() else {}


# -- sessions on a CUDA device ---------------------------------------------------------

# ONNX Runtime's names of its arena extension strategies, by the names settings use.
ARENA_STRATEGIES = {"next_power_of_two": "kNextPowerOfTwo",
                    "same_as_requested": "kSameAsRequested"}
# The shared arena's code for each (OrtArenaCfg's arena_extend_strategy).
_ARENA_CODES = {"next_power_of_two": 0, "same_as_requested": 1}
USE_ENV_ALLOCATORS = "session.use_env_allocators"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CudaSettings:
    """What a GPU operator sets for the CUDA provider's sessions.

    allow_tf32: let fp32 MatMuls and convolutions round their inputs to TF32 on
    Ampere and later (the CUDA provider's `use_tf32`, on by default in ONNX Runtime):
    off here, so an fp32 package computes fp32 on CUDA as on the CPU.
    gpu_mem_limit: the most bytes the device arena may hold (0: no limit).
    arena_extend_strategy: how the arena grows, one of ARENA_STRATEGIES.
    shared_arena: one arena per device for every session of the process (ONNX
    Runtime's environment allocator, `create_and_register_allocator_v2`, which a
    session takes with `session.use_env_allocators`), instead of one per session
    (a model's five or six sessions, times its engines, times the models)."""

    allow_tf32: bool = False
    gpu_mem_limit: int = 0
    arena_extend_strategy: str = "next_power_of_two"
    shared_arena: bool = True

    def problems(self) -> list[str]:
        found = []
        if self.arena_extend_strategy not in ARENA_STRATEGIES:
            found.append(f"arena_extend_strategy must be one of "
                         f"{', '.join(ARENA_STRATEGIES)}, got {self.arena_extend_strategy!r}")
        if self.gpu_mem_limit < 0:
            found.append(f"gpu_mem_limit must be >= 0 (0 = no limit), got {self.gpu_mem_limit}")
        return found

    def provider_options(self, device_id: int) -> dict[str, str]:
        """The CUDA provider's options (strings, as ONNX Runtime takes them)."""
        options = {"device_id": str(device_id), "use_tf32": "1" if self.allow_tf32 else "0",
                   "arena_extend_strategy": ARENA_STRATEGIES[self.arena_extend_strategy]}
        if self.gpu_mem_limit:
            options["gpu_mem_limit"] = str(self.gpu_mem_limit)
        return options

    def session_entries(self) -> dict[str, str]:
        return {USE_ENV_ALLOCATORS: "1"} if self.shared_arena else {}


_shared_arenas: dict[int, CudaSettings] = {}
_arena_lock = threading.Lock()


def share_cuda_arena(settings: CudaSettings, device_id: int) -> bool:
    """Register the process's one CUDA arena of `device_id` with ONNX Runtime's
    environment, once (sessions with `session.use_env_allocators` take it); False,
    logged, where this onnxruntime cannot (each session then has its own arena).
    A second registration with other settings is refused: the arena is one."""
    import onnxruntime as ort

    with _arena_lock:
        registered = _shared_arenas.get(device_id)
        if registered is not None:
            if registered != settings:
                raise ValueError(f"the shared CUDA arena of device {device_id} was made with "
                                 f"{registered}, not {settings}")
            return True
        memory = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, device_id,
                                   ort.OrtMemType.DEFAULT)
        arena = ort.OrtArenaCfg({"max_mem": settings.gpu_mem_limit,
                                 "arena_extend_strategy":
                                     _ARENA_CODES[settings.arena_extend_strategy]})
        try:
            ort.create_and_register_allocator_v2("CUDAExecutionProvider", memory,
                                                 settings.provider_options(device_id), arena)
        except RuntimeError as e:  # untried on a device yet: never the reason a start fails
            log.warning("no shared CUDA arena on device %d (%s): one arena per session",
                        device_id, e)
            return False
        _shared_arenas[device_id] = settings
        return True
