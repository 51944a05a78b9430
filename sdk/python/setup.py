"""Builds kiln-sdk, whose gRPC stubs and version come from the kiln repository around it.

In a kiln checkout (../../proto and ../../Cargo.toml are there), the sdist and build_py steps
(build_py is what wheels and editable installs run) first write into this folder:
  - kiln/v1/*_pb2.py and *_pb2_grpc.py, from ../../proto/kiln/v1/*.proto, by grpcio-tools, and
    their typed stubs *_pb2.pyi and *_pb2_grpc.pyi by mypy-protobuf's protoc plugins
    (protoc-gen-mypy, protoc-gen-mypy_grpc), so that `mypy --strict -p kiln` checks the hand-written
    modules' calls to the stubs (both pinned in pyproject.toml's [build-system] requires)
  - kiln/_version.py, from `[workspace.package] version` of ../../Cargo.toml
Neither is committed (STYLE.md: no committed codegen). Both go into the sdist, so a wheel builds
from the sdist alone: an unpacked sdist (it has PKG-INFO) uses the files it carries.
"""

import importlib.util
import logging
import os
import pathlib
import re
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
CARGO_TOML = HERE.parent.parent / "Cargo.toml"
STUBS = HERE / "kiln" / "v1"
VERSION_PY = HERE / "kiln" / "_version.py"
# A checkout: proto/ and Cargo.toml around, and no PKG-INFO (which marks an unpacked sdist).
IN_REPO = (PROTO_ROOT / "kiln" / "v1").is_dir() and CARGO_TOML.is_file() and not (HERE / "PKG-INFO").exists()
MISSING = (
    "kiln-sdk: kiln/v1's gRPC stubs (and their .pyi) and kiln/_version.py are generated from the kiln repository's "
    "proto/ and Cargo.toml, and they are missing here: build from a kiln checkout (sdk/python) or from the sdist"
)


def version():
    """The version: the workspace's in a checkout, else the one kiln/_version.py carries."""
    if IN_REPO:
        section = None
        for line in CARGO_TOML.read_text().splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[workspace.package]":
                found = re.match(r'version\s*=\s*"([^"]+)"', line)
                if found:
                    return found.group(1)
        raise SystemExit(f"kiln-sdk: no version under [workspace.package] in {CARGO_TOML}")
    found = VERSION_PY.is_file() and re.search(r'^__version__ = "(.+)"$', VERSION_PY.read_text(), re.M)
    if not found:
        raise SystemExit(MISSING)
    return found.group(1)


def mypy_plugin(name):
    """The path of one of mypy-protobuf's protoc plugins (console scripts, not modules protoc can run).

    A build env puts its scripts first on PATH (pip's and build's isolated envs); a venv used without
    isolation has them beside its interpreter even when it is not activated.
    """
    if importlib.util.find_spec("mypy_protobuf") is None:
        raise SystemExit("kiln-sdk: the typed stubs need mypy-protobuf (pyproject.toml's [build-system] requires)")
    search = os.pathsep.join([os.environ.get("PATH", ""), str(pathlib.Path(sys.executable).parent)])
    found = shutil.which(name, path=search)
    if not found:
        raise SystemExit(f"kiln-sdk: mypy-protobuf's {name} is on neither PATH nor beside {sys.executable}")
    return found


def generate(command):
    """Writes kiln/v1's stubs and kiln/_version.py in a checkout; elsewhere checks they are here."""
    if not IN_REPO:
        if not VERSION_PY.is_file() or not all(any(STUBS.glob(f"*_pb2_grpc.{ext}")) for ext in ("py", "pyi")):
            raise SystemExit(MISSING)
        command.announce("kiln-sdk: using the gRPC stubs and kiln/_version.py the sdist carries", logging.INFO)
        return
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        raise SystemExit("kiln-sdk: the stubs need grpcio-tools (pyproject.toml's [build-system] requires)")
    plugins = {name: mypy_plugin(name) for name in ("protoc-gen-mypy", "protoc-gen-mypy_grpc")}
    protos = sorted(str(p) for p in (PROTO_ROOT / "kiln" / "v1").glob("*.proto"))
    if not protos:
        raise SystemExit(f"kiln-sdk: no .proto files under {PROTO_ROOT / 'kiln' / 'v1'}")
    # A proto that is gone leaves no stub behind.
    for old in [*STUBS.glob("*_pb2*.py"), *STUBS.glob("*_pb2*.pyi")]:
        old.unlink()
    # grpc_tools' _proto holds the well-known types (google/protobuf/*.proto).
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}"]
    args += [f"--plugin={name}={path}" for name, path in plugins.items()]
    # quiet: the plugins otherwise say "Writing mypy to ..." for each file on stderr.
    args += [f"--python_out={HERE}", f"--grpc_python_out={HERE}", f"--mypy_out=quiet:{HERE}",
             f"--mypy_grpc_out=quiet:{HERE}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("kiln-sdk: protoc failed on " + " ".join(protos))
    VERSION_PY.write_text(
        f'# Written by setup.py from [workspace.package] in Cargo.toml: do not edit.\n__version__ = "{VERSION}"\n'
    )
    command.announce(f"kiln-sdk: generated kiln/v1 ({len(protos)} protos, typed) and kiln/_version.py ({VERSION})",
                     logging.INFO)


class Sdist(sdist):
    def run(self):
        generate(self)  # before the sdist's file list is made, so that it carries them
        super().run()


class BuildPy(build_py):
    def run(self):
        generate(self)
        super().run()


VERSION = version()
setup(version=VERSION, cmdclass={"sdist": Sdist, "build_py": BuildPy})
