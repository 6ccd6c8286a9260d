"""The CUDA provider's kernel registrations of an onnxruntime-gpu release, read on a
machine without a GPU: refreshes the vendored table (kernels.DATA) from the wheel
itself, so the table is exactly the pinned release's.

`get_all_opkernel_def` creates each provider of the build and reads its kernel
registry. On a CPU-only machine the CUDA provider's library does not load (it
links the driver's libcuda.so.1), and creating the provider calls the CUDA runtime
(cudaSetDevice, cudaGetDeviceProperties, ...), which fails without a device. So the
wheel's libraries are loaded beside stand-ins compiled here: a libcuda.so.1 with the
driver symbols the provider links, a libcudart.so.13 whose every entry point the
provider calls answers success with a device of zeroed properties, and TensorRT's
libnvinfer/libnvonnxparser (the build's TensorRT provider is created too). None of
this runs a kernel: registration only builds the (op, domain, versions, types)
definitions, which is all the table holds.

    python -m seq2serve.model.package.kernels_from_wheel 1.31.1

needs gcc, readelf and PyPI; it makes a throwaway virtualenv with
onnxruntime-gpu[cuda,cudnn]==VERSION (constrained by deploy/constraints.txt when
given) and runs `kernels --from-runtime` in it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

from seq2serve.model.package import kernels

# The runtime entry points that must write their out-parameters for the provider's
# constructor to go on (the rest return cudaSuccess and write nothing).
_CUDART_BODIES = {
    "__cudaRegisterFatBinary": "void** __cudaRegisterFatBinary(void* f) "
                               "{ static void* h[4]; return h; }",
    "cudaGetDeviceCount": "int cudaGetDeviceCount(int* n) { *n = 1; return 0; }",
    "cudaGetDevice": "int cudaGetDevice(int* d) { *d = 0; return 0; }",
    # cudaDeviceProp is under 1,100 bytes in CUDA 12 and 13; the caller's is zeroed.
    "cudaGetDeviceProperties": "int cudaGetDeviceProperties(void* p, int d) "
                               "{ memset(p, 0, 1008); return 0; }",
    "cudaMemGetInfo": "int cudaMemGetInfo(size_t* f, size_t* t) "
                      "{ *f = (size_t)1 << 36; *t = (size_t)1 << 36; return 0; }",
    "cudaDriverGetVersion": "int cudaDriverGetVersion(int* v) { *v = 13000; return 0; }",
    "cudaRuntimeGetVersion": "int cudaRuntimeGetVersion(int* v) { *v = 13000; return 0; }",
    "cudaGetErrorString": "const char* cudaGetErrorString(int e) { return \"stand-in\"; }",
    "cudaGetErrorName": "const char* cudaGetErrorName(int e) { return \"stand-in\"; }",
    "cudaMalloc": "int cudaMalloc(void** p, size_t n) { *p = calloc(1, n ? n : 1); return 0; }",
    "cudaMallocHost": "int cudaMallocHost(void** p, size_t n) "
                      "{ *p = calloc(1, n ? n : 1); return 0; }",
    "cudaHostAlloc": "int cudaHostAlloc(void** p, size_t n, unsigned f) "
                     "{ *p = calloc(1, n ? n : 1); return 0; }",
    "cudaStreamCreate": "int cudaStreamCreate(void** s) { *s = calloc(1, 64); return 0; }",
    "cudaStreamCreateWithFlags": "int cudaStreamCreateWithFlags(void** s, unsigned f) "
                                 "{ *s = calloc(1, 64); return 0; }",
    "cudaEventCreate": "int cudaEventCreate(void** s) { *s = calloc(1, 64); return 0; }",
    "cudaEventCreateWithFlags": "int cudaEventCreateWithFlags(void** s, unsigned f) "
                                "{ *s = calloc(1, 64); return 0; }",
    "cudaDeviceGetAttribute": "int cudaDeviceGetAttribute(int* v, int a, int d) "
                              "{ *v = 0; return 0; }",
}


def _undefined(library: Path) -> list[tuple[str, str]]:
    """The dynamic symbols `library` takes from others: (name, version tag or "")."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], check=True,
                         capture_output=True, text=True).stdout
    return sorted({cols[7].partition("@")[::2] for line in out.splitlines()
                   if len(cols := line.split()) >= 8 and cols[6] == "UND"})


def _taken_from(library: Path, version_tag: str) -> list[str]:
    """What `library` takes from the library of that version tag (readelf's name@tag)."""
    return [name for name, tag in _undefined(library) if tag == version_tag]


def _unversioned(library: Path, prefixes: tuple[str, ...]) -> list[str]:
    """Unversioned symbols `library` takes, those with one of `prefixes`."""
    return [name for name, tag in _undefined(library) if not tag and name.startswith(prefixes)]


def _compile(c_source: str, soname: str, out: Path, version_node: str | None = None) -> None:
    src = out / (soname + ".c")
    src.write_text("#include <stdlib.h>\n#include <string.h>\n#include <stddef.h>\n"
                   + c_source, encoding="utf-8")
    cmd = ["gcc", "-shared", "-fPIC", "-w", "-o", str(out / soname), f"-Wl,-soname,{soname}",
           str(src)]
    if version_node:
        script = out / (soname + ".map")
        script.write_text(f"{version_node} {{ global: *; }};\n", encoding="utf-8")
        cmd.insert(-1, f"-Wl,--version-script={script}")
    subprocess.run(cmd, check=True)


def stand_ins(capi: Path, out: Path) -> None:
    """Compile the stand-in libraries for the provider libraries in `capi` into `out`."""
    cuda = capi / "libonnxruntime_providers_cuda.so"
    trt = capi / "libonnxruntime_providers_tensorrt.so"
    cudart = "\n".join(_CUDART_BODIES.get(name, f"int {name}(void) {{ return 0; }}")
                       for name in _taken_from(cuda, "libcudart.so.13"))
    _compile(cudart + "\n", "libcudart.so.13", out, version_node="libcudart.so.13")
    # The driver: what the provider links from it directly (no device answers: 100 is
    # CUDA_ERROR_NO_DEVICE).
    driver = "\n".join(f"int {name}(void) {{ return 100; }}"
                       for name in _unversioned(cuda, ("cu",))
                       if name[2:3].isupper())
    _compile(driver + "\n", "libcuda.so.1", out)
    if trt.exists():
        infer = _unversioned(trt, ("create", "get"))
        nvinfer = [n for n in infer if "Parser" not in n]
        parser = [n for n in infer if "Parser" in n]
        # TensorRT 10.13's version number; the builder and runtime are never made.
        _compile("\n".join("int getInferLibVersion(void) { return 101300; }"
                           if n == "getInferLibVersion" else f"void* {n}(void) {{ return 0; }}"
                           for n in nvinfer) + "\n", "libnvinfer.so.10", out)
        _compile("\n".join(f"void* {n}(void) {{ return 0; }}" for n in parser) + "\n",
                 "libnvonnxparser.so.10", out)


def refresh(version: str, out: Path, constraints: Path | None, work: Path) -> None:
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q",
               f"onnxruntime-gpu[cuda,cudnn]=={version}"]
    if constraints:
        install[4:4] = ["-c", str(constraints)]
    subprocess.run(install, check=True)
    site = Path(subprocess.run(
        [str(python), "-c", "import onnxruntime, pathlib; "
         "print(pathlib.Path(onnxruntime.__file__).parent.parent)"],
        check=True, capture_output=True, text=True).stdout.strip())
    stubs = work / "stand-ins"
    stubs.mkdir()
    stand_ins(site / "onnxruntime" / "capi", stubs)
    nvidia = sorted(str(p.parent) for p in (site / "nvidia").rglob("*.so*"))
    library_path = os.pathsep.join([str(stubs), *dict.fromkeys(nvidia)])
    # kernels.py imports nothing of seq2serve, so it runs as a file in that venv.
    subprocess.run([str(python), str(Path(kernels.__file__)), "--from-runtime",
                    "--source", f"onnxruntime-gpu {version} wheel from PyPI, "
                    "get_all_opkernel_def (model/package/kernels_from_wheel.py)",
                    "--out", str(out)],
                   check=True, env={**os.environ, "LD_LIBRARY_PATH": library_path})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="the onnxruntime-gpu release (the pinned one)")
    parser.add_argument("--constraints", type=Path,
                        help="pip constraints for its CUDA wheels (deploy/constraints.txt)")
    parser.add_argument("--out", type=Path, default=kernels.DATA)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kernels-") as work:
        refresh(args.version, args.out, args.constraints, Path(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
