"""`mypy --strict -p kiln` over the whole package: the hand-written modules, and kiln/v1's
generated stubs through the .pyi that mypy-protobuf writes beside them (setup.py), so that every
call the SDK makes to a stub, and every field it reads or sets, is checked. Run from sdk/python
(the package's source tree, as a checkout or an unpacked sdist has it), with the versions the
`typecheck` extra pins (pyproject.toml). scripts/sdk-package-check.sh checks the installed wheel
the same way."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

SDK = pathlib.Path(__file__).resolve().parents[1]


def mypy(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install 'kiln-sdk[test]' (or [typecheck]) from sdk/python")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "mypy-cache"), *args],
        cwd=SDK, capture_output=True, text=True, timeout=600,
    )


def test_the_whole_package_passes_mypy_strict(tmp_path):
    for stub in ("job_pb2.pyi", "job_pb2_grpc.pyi"):
        assert (SDK / "kiln" / "v1" / stub).is_file(), f"kiln/v1/{stub} is missing: reinstall the SDK (setup.py writes it)"
    assert (SDK / "kiln" / "py.typed").is_file()
    checked = mypy(tmp_path, "-p", "kiln")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("Success: no issues found"), checked.stdout


def test_the_generated_stubs_are_typed(tmp_path):
    """A misuse of a message or a service stub is an error, not Any: the check above checks something."""
    misuse = (
        "from kiln.v1 import job_pb2, job_pb2_grpc\n"
        "job_pb2.ListJobsRequest(no_such_field=1)\n"
        "def read(stub: job_pb2_grpc.JobServiceStub) -> str:\n"
        "    return stub.GetJob(job_pb2.GetJobRequest()).no_such_field\n"
    )
    checked = mypy(tmp_path, "-c", misuse)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert 'Unexpected keyword argument "no_such_field" for "ListJobsRequest"' in checked.stdout, checked.stdout
    assert '"Job" has no attribute "no_such_field"' in checked.stdout, checked.stdout
