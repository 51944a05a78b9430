"""Generates the kiln/v1 gRPC stubs from the repository's proto/ tree while building."""

import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc  # a build requirement, see pyproject.toml

        protos = sorted(str(p) for p in (PROTO_ROOT / "kiln" / "v1").glob("*.proto"))
        if not protos:
            raise SystemExit(f"no .proto files under {PROTO_ROOT}: build from a kiln checkout")
        out = pathlib.Path(self.build_lib)
        args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"--python_out={out}", f"--grpc_python_out={out}", *protos]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        (out / "kiln" / "v1" / "__init__.py").touch()


setup(cmdclass={"build_py": BuildWithStubs})
