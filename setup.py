"""Build hook: generate the gRPC/protobuf modules from protos/*.proto.

The generated files land beside the .proto in protos/ (git-ignored), so both a
wheel and an editable install carry them; they are never committed or edited.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def generate_protos() -> None:
    from grpc_tools import protoc  # a build requirement (pyproject.toml)

    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        # Compile from seq2serve/protos/ so the generated modules import each
        # other as `seq2serve.protos.X_pb2`, not as top-level modules.
        staged = Path(tmp, "src", "seq2serve", "protos")
        staged.mkdir(parents=True)
        out = Path(tmp, "out")
        out.mkdir()
        protos = sorted((ROOT / "protos").glob("*.proto"))
        for proto in protos:
            shutil.copyfile(proto, staged / proto.name)
        args = ["grpc_tools.protoc", f"-I{Path(tmp, 'src')}", f"-I{include}",
                f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}",
                *[f"seq2serve/protos/{p.name}" for p in protos]]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {[p.name for p in protos]}")
        for generated in (out / "seq2serve" / "protos").iterdir():
            shutil.copyfile(generated, ROOT / "protos" / generated.name)


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        generate_protos()
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
