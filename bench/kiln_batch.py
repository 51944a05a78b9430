"""A `kiln up` on a temp KILN_HOME for the batch benchmarks, and a batch run through its CLI
from `kiln batch create` to DONE."""

import json
import os
import pathlib
import signal
import subprocess
import time

from procs import STARTED, Fail, descendants, kill_group, pgid_of, start, stop, tail

POLL = 0.2  # seconds between `kiln batch status` polls
TIMEOUT = 900  # seconds any one system may take before the benchmark gives up


class Kiln:
    def __init__(self, binary, workdir, name, extra_flags=()):
        self.binary = binary
        self.extra_flags = list(extra_flags)
        self.home = os.path.join(workdir, name)
        os.makedirs(self.home)
        self.log = os.path.join(self.home, "up.log")
        self.env = {**os.environ, "KILN_HOME": self.home, "KILN_LOG": "info"}
        self.up = None
        self.workers = {}  # pid -> pgid of kiln up's descendants seen so far

    def __enter__(self):
        with open(self.log, "wb") as log:
            self.up = start([self.binary, "up", "--provider", "process", "--api-addr", "127.0.0.1:0",
                             "--logs-addr", "127.0.0.1:0", "--batch-addr", "127.0.0.1:0", *self.extra_flags], "kiln up",
                            env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        credentials = pathlib.Path(self.home) / "credentials.toml"
        deadline = time.monotonic() + 120
        while not self.credentials_complete(credentials):
            if self.up.poll() is not None:
                raise self.fail(f"kiln up exited with status {self.up.returncode} before it wrote credentials.toml")
            if time.monotonic() > deadline:
                raise self.fail("kiln up did not write a complete credentials.toml within 120 s")
            time.sleep(0.05)
        return self

    @staticmethod
    def credentials_complete(path):
        try:
            text = path.read_text()
        except OSError:
            return False
        keys = {line.split("=", 1)[0].strip() for line in text.splitlines() if "=" in line}
        return {"api", "logs", "batches", "token"} <= keys

    def __exit__(self, *exc):
        self.shutdown()

    def shutdown(self):
        if self.up is None:
            return
        if self.up.poll() is None:
            self.workers.update(descendants(self.up.pid))
        stop(self.up, sig=signal.SIGINT, grace=30)
        for pid, pgid in self.workers.items():
            if pgid_of(pid) == pgid and pgid != os.getpgid(0):
                kill_group(pgid, signal.SIGKILL)
        STARTED[:] = [(p, label) for p, label in STARTED if p is not self.up]
        self.up = None

    def fail(self, message):
        return Fail(f"{message}\n--- tail of {self.log} ---\n{tail(self.log)}")

    def cli(self, *args):
        result = subprocess.run([self.binary, *args], env=self.env, capture_output=True, text=True,
                                stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise self.fail(f"`kiln {' '.join(args)}` exited with status {result.returncode}:\n"
                            f"stdout: {result.stdout.strip()}\nstderr: {result.stderr.strip()}")
        return result.stdout

    def status(self, batch):
        out = self.cli("batch", "status", batch, "-o", "json")
        try:
            return json.loads(out)
        except ValueError:
            raise self.fail(f"`kiln batch status {batch} -o json` printed no JSON: {out!r}")

    def run_batch(self, label, command, n):
        batch = self.cli("batch", "create", "--name", "bench", "--max-workers", "2", "--cpu", "0.1", "--mem", "64M",
                         "--", *command).strip()
        if not batch or len(batch.split()) != 1:
            raise self.fail(f"`kiln batch create` printed no batch id: {batch!r}")
        items = os.path.join(self.home, f"items-{batch}.txt")
        with open(items, "w") as f:
            f.writelines(f"noop://bench/{i:08d}\n" for i in range(n))
        began = time.monotonic()
        self.cli("batch", "add", batch, "--from", items)
        add_seconds = time.monotonic() - began
        status = self.status(batch)
        if status.get("total") != n or status.get("state") != "OPEN":
            raise self.fail(f"after adding {n} items the batch is {status}")

        t0 = time.monotonic()
        self.cli("batch", "seal", batch)
        first_succeeded_at = all_succeeded_at = None
        max_workers, max_rate = 0, 0.0
        while True:
            status = self.status(batch)
            now = time.monotonic()
            self.workers.update(descendants(self.up.pid))
            max_workers = max(max_workers, status.get("workers", 0))
            max_rate = max(max_rate, status.get("items_per_second") or 0.0)
            if first_succeeded_at is None and status.get("succeeded", 0) > 0:
                first_succeeded_at = now
            if all_succeeded_at is None and status.get("succeeded") == n:
                all_succeeded_at = now
            state = status.get("state")
            if state == "DONE":
                if status.get("succeeded") != n:
                    raise self.fail(f"batch {batch} ({label}) is DONE but not every item succeeded: {status}")
                break
            if state not in ("SEALED", "OPEN") or status.get("dead", 0) or status.get("failed", 0):
                raise self.fail(f"batch {batch} ({label}) went wrong: {status}")
            if now - t0 > TIMEOUT:
                raise self.fail(f"batch {batch} ({label}) not DONE after {TIMEOUT} s: {status}")
            if self.up.poll() is not None:
                raise self.fail(f"kiln up exited with status {self.up.returncode} during the batch")
            time.sleep(POLL)
        seconds = now - t0
        return {
            "label": label, "items": n, "seconds": seconds, "rate": n / seconds, "add_seconds": add_seconds,
            "add_to_done_seconds": now - began,
            "first_seconds": first_succeeded_at - t0, "succeeded_seconds": all_succeeded_at - t0,
            "kiln_rate": max_rate,
            "max_workers": max_workers,
        }
