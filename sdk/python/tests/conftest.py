"""The `up` fixture the tests that drive kiln share: a real `kiln up` (local processes) on free
ports with a temp KILN_HOME, which the SDK finds as it finds any `kiln up`. (test_sdk.py keeps
its own, which test_serve_cli.py imports.)"""

import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
KILN = os.environ.get("KILN_BIN", str(REPO / "target" / "debug" / "kiln"))
# Every address on a free port, the web UI's too: another `kiln up` on this machine does not clash.
ADDRESS_FLAGS = ("--api-addr", "--logs-addr", "--batch-addr", "--advisor-addr", "--predictor-addr",
                 "--predictor-http-addr", "--http-addr")


@pytest.fixture(scope="module")
def up(request):
    """A `kiln up` on a temp KILN_HOME for the module; the SDK finds it through KILN_HOME (the
    variables that would point elsewhere are unset while it runs). Yields the home."""
    if not pathlib.Path(KILN).exists():
        pytest.fail(f"{KILN} does not exist: run the tests through scripts/test.sh, which builds it")
    home = tempfile.mkdtemp(prefix=f"kiln-sdk-{request.module.__name__.removeprefix('test_')}-")
    log = open(pathlib.Path(home) / "up.log", "w")
    process = subprocess.Popen(
        [KILN, "up", "--provider", "process", *(arg for flag in ADDRESS_FLAGS for arg in (flag, "127.0.0.1:0"))],
        env={**os.environ, "KILN_HOME": home, "KILN_LOG": "warn"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    credentials = pathlib.Path(home) / "credentials.toml"
    deadline = time.monotonic() + 60
    while not credentials.exists():
        assert process.poll() is None, (pathlib.Path(home) / "up.log").read_text()
        assert time.monotonic() < deadline, "kiln up did not start"
        time.sleep(0.05)
    saved = {name: os.environ.get(name) for name in ("KILN_HOME", "KILN_ADDR", "KILN_TOKEN", "KILN_LOGS_ADDR",
                                                     "KILN_JOB_ID", "KILN_ADVISOR_ADDR", "KILN_PREDICTOR_ADDR",
                                                     "KILN_BATCH_ADDR")}
    for name in saved:
        os.environ.pop(name, None)
    os.environ["KILN_HOME"] = home
    yield home
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    log.close()
    shutil.rmtree(home)
