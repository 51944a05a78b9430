"""Builds kiln-sdk, whose gRPC stubs and version come from the kiln repository around it.

In a kiln checkout (../../proto and ../../Cargo.toml are there), the sdist and build_py steps
(build_py is what wheels and editable installs run) first write into this folder:
  - kiln/v1/*_pb2.py and *_pb2_grpc.py, from ../../proto/kiln/v1/*.proto, by grpcio-tools
    (pinned in pyproject.toml's [build-system] requires)
  - kiln/_version.py, from `[workspace.package] version` of ../../Cargo.toml
Neither is committed (STYLE.md: no committed codegen). Both go into the sdist, so a wheel builds
from the sdist alone: an unpacked sdist (it has PKG-INFO) uses the files it carries.
"""

import logging
import pathlib
import re

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
    "kiln-sdk: kiln/v1's gRPC stubs and kiln/_version.py are generated from the kiln repository's "
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


def generate(command):
    """Writes kiln/v1's stubs and kiln/_version.py in a checkout; elsewhere checks they are here."""
    if not IN_REPO:
        if not VERSION_PY.is_file() or not any(STUBS.glob("*_pb2_grpc.py")):
            raise SystemExit(MISSING)
        command.announce("kiln-sdk: using the gRPC stubs and kiln/_version.py the sdist carries", logging.INFO)
        return
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        raise SystemExit("kiln-sdk: the stubs need grpcio-tools (pyproject.toml's [build-system] requires)")
    protos = sorted(str(p) for p in (PROTO_ROOT / "kiln" / "v1").glob("*.proto"))
    if not protos:
        raise SystemExit(f"kiln-sdk: no .proto files under {PROTO_ROOT / 'kiln' / 'v1'}")
    for old in STUBS.glob("*_pb2*.py"):  # a proto that is gone leaves no stub behind
        old.unlink()
    # grpc_tools' _proto holds the well-known types (google/protobuf/*.proto).
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}"]
    args += [f"--python_out={HERE}", f"--grpc_python_out={HERE}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("kiln-sdk: protoc failed on " + " ".join(protos))
    VERSION_PY.write_text(
        f'# Written by setup.py from [workspace.package] in Cargo.toml: do not edit.\n__version__ = "{VERSION}"\n'
    )
    command.announce(f"kiln-sdk: generated kiln/v1 ({len(protos)} protos) and kiln/_version.py ({VERSION})", logging.INFO)


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
