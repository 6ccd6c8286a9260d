"""The session settings every CPU session of a package gets, wherever it runs (the
server's engine, the exporter's verification, the benchmarks' peers): part of the
package format, so that an int8 package decodes the same on every CPU.
"""

from __future__ import annotations

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
