"""What open Runs pages cost the api: 10 simulated pages over 10,000 runs, polling ListJobs (the
page before the change feed) against reading the change feed (JobService/WatchJobs as
server-sent events), on one `kiln up`, in one run.

    python bench/change_feed.py --kiln target/release/kiln [--runs 10000] [--pages 10]
        [--window 60] [--churn 1] [--parallel 32] [--modes "no pages,polling,feed"]

`kiln up --provider process` on a temp KILN_HOME (SQLite stores); --runs runs are made with
JobService/CreateRun through the HTTP API (a run starts RUNNING, so each can be finished), from
--parallel threads. Then three windows of --window seconds each, with the same churn in each
(--churn runs a second finished with FinishRun, so the list changes):
- no pages: the churn alone, for reference;
- polling: each page POSTs ListJobs {all, everyone, limit 10,000} and reads the answer, 2 s
  after the previous answer (as the Runs page did, after a first call for the newest 200);
- feed: each page opens GET /api/v1/stream/JobService/WatchJobs?request={"list": the same} and
  reads it (the whole list once, in pages of 500, then the changed runs), and asks ListJobs for
  the newest 200 once, as the Runs page does; a watch that ends (the api ends one after 5
  minutes) is opened again with Last-Event-ID, as EventSource does.
Figures per window: the bytes the pages received (HTTP bodies; the api does not compress), the
CPU seconds (utime + stime) of the kiln up process and of its descendants (its nats-server),
the time to a page's first rows (its ListJobs of the newest 200) and to its whole list (the
first ListJobs of 10,000; the feed's last page of the list). After the feed window every page's
list (ids and states) must equal a final ListJobs.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import pathlib
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from procs import Fail, descendants, free_port, start, stop, tail, wait_port

POLL_INTERVAL = 2.0  # seconds between a polling page's answer and its next call (ui/src/lib/poll.ts)
LIST = {"all": True, "everyone": True, "limit": 10_000}
FIRST_PAGE = 200  # a page's first call asks for the newest runs alone
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Api:
    """The HTTP API of one kiln up, with a token; a keep-alive connection per thread."""

    def __init__(self, port, token):
        self.port, self.token, self.local = port, token, threading.local()

    def connect(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def post(self, service, method, request):
        """The answer's body (bytes); an answer but 200 fails."""
        body = json.dumps(request).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json", "X-Kiln-Csrf": "1"}
        for attempt in (1, 2):
            conn = getattr(self.local, "conn", None) or self.connect()
            self.local.conn = conn
            try:
                conn.request("POST", f"/api/v1/rpc/{service}/{method}", body, headers)
                response = conn.getresponse()
                data = response.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
                continue
            if response.status != 200:
                raise Fail(f"{service}/{method}: {response.status} {data[:300]!r}")
            return data

    def call(self, service, method, request):
        return json.loads(self.post(service, method, request))


class Kiln:
    """`kiln up --provider process` on a temp home; its HTTP API on a port of its own."""

    def __init__(self, binary, workdir):
        self.home = os.path.join(workdir, "home")
        os.makedirs(self.home)
        self.log = os.path.join(self.home, "up.log")
        self.http_port = free_port()
        addrs = ["--api-addr", "--logs-addr", "--batch-addr", "--advisor-addr", "--predictor-addr",
                 "--predictor-http-addr", "--metrics-addr"]
        flags = [part for flag in addrs for part in (flag, "127.0.0.1:0")]
        env = {**os.environ, "KILN_HOME": self.home, "KILN_LOG": "warn"}
        with open(self.log, "wb") as log:
            self.up = start([binary, "up", "--home", self.home, "--provider", "process", *flags,
                             "--http-addr", f"127.0.0.1:{self.http_port}"], "kiln up", env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        credentials = pathlib.Path(self.home) / "credentials.toml"
        deadline = time.monotonic() + 120
        token = None
        while token is None:
            if self.up.poll() is not None:
                raise self.fail(f"kiln up exited with status {self.up.returncode}")
            if time.monotonic() > deadline:
                raise self.fail("kiln up wrote no token within 120 s")
            text = credentials.read_text() if credentials.exists() else ""
            found = re.search(r'^token\s*=\s*"([^"]+)"', text, re.M)
            token = found and found.group(1)
            time.sleep(0.05)
        wait_port(self.http_port, self.up, "kiln up's HTTP API", seconds=120)
        self.api = Api(self.http_port, token)

    def cpu_seconds(self):
        """CPU seconds so far of kiln up itself, and of its live descendants together."""
        def of(pid):
            try:
                stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return 0.0
            fields = stat[stat.rindex(")") + 2:].split()
            return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        return of(self.up.pid), sum(of(pid) for pid in descendants(self.up.pid))

    def close(self):
        stop(self.up, sig=signal.SIGINT, grace=30)

    def fail(self, message):
        return Fail(f"{message}\n--- tail of {self.log} ---\n{tail(self.log)}")


class Page(threading.Thread):
    """An open Runs page: what it received, and when its first rows and its whole list were in."""

    def __init__(self, api, stopping):
        super().__init__(daemon=True)
        self.api, self.stopping = api, stopping
        self.bytes = 0
        self.list_bytes = 0  # the bytes until the whole list was in
        self.answers = 0  # ListJobs answers (polling), JobChanges messages (feed)
        self.first_rows = None
        self.whole = None

    def close(self):
        self.stopping.set()


class PollingPage(Page):
    """The Runs page before the feed: the whole list every POLL_INTERVAL after the last answer."""

    def run(self):
        began = time.monotonic()
        body = self.api.post("JobService", "ListJobs", {**LIST, "limit": FIRST_PAGE})
        self.bytes += len(body)
        self.answers += 1
        self.first_rows = time.monotonic() - began
        while not self.stopping.is_set():
            body = self.api.post("JobService", "ListJobs", LIST)
            self.bytes += len(body)
            self.answers += 1
            if self.whole is None:
                self.whole, self.list_bytes = time.monotonic() - began, self.bytes
            self.stopping.wait(POLL_INTERVAL)


class FeedPage(Page):
    """The Runs page on the feed: one WatchJobs stream, its JobChanges applied to a list."""

    def __init__(self, api, stopping):
        super().__init__(api, stopping)
        self.states = {}  # job id -> state
        self.seq = 0
        self.lock = threading.Lock()
        self.conn = None
        self.error = None

    def run(self):
        began = time.monotonic()
        query = urllib.parse.quote(json.dumps({"list": LIST}))
        try:
            while not self.stopping.is_set():
                headers = {"Authorization": f"Bearer {self.api.token}", "Accept": "text/event-stream"}
                if self.seq:
                    headers["Last-Event-ID"] = str(self.seq)
                self.conn = self.api.connect(timeout=None)
                self.conn.request("GET", f"/api/v1/stream/JobService/WatchJobs?request={query}", headers=headers)
                if self.first_rows is None:
                    # The page asks for its first screenfuls beside the feed, once.
                    self.bytes += len(self.api.post("JobService", "ListJobs", {**LIST, "limit": FIRST_PAGE}))
                    self.first_rows = time.monotonic() - began
                response = self.conn.getresponse()
                if response.status != 200:
                    raise Fail(f"WatchJobs: {response.status} {response.read()[:300]!r}")
                self.read_events(response, began)
                self.conn.close()
        except (OSError, http.client.HTTPException, ValueError) as e:
            if not self.stopping.is_set():
                self.error = e
        except Fail as e:
            self.error = e

    def read_events(self, response, began):
        """Reads server-sent events until the watch ends (`end`, or the connection is cut)."""
        buffer, event, data = b"", b"message", []
        while True:
            chunk = response.read1(1 << 16)
            if not chunk:
                return
            self.bytes += len(chunk)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    data.append(line[5:].removeprefix(b" "))
                elif line.startswith(b"event:"):
                    event = line[6:].strip()
                elif line:
                    continue  # id: (kept as the last seq), retry:, comments
                elif event == b"error":
                    raise Fail(f"WatchJobs sent an error: {b''.join(data)[:300]!r}")
                elif event == b"end":
                    return
                elif data:
                    self.apply(json.loads(b"\n".join(data)), began)
                if not line:
                    event, data = b"message", []

    def apply(self, changes, began):
        with self.lock:
            self.answers += 1
            if changes.get("reset"):
                self.states = {}
            for job in changes.get("jobs", []):
                self.states[job["id"]] = job["state"]
            if changes.get("seq"):
                self.seq = changes["seq"]
                if self.whole is None:
                    self.whole, self.list_bytes = time.monotonic() - began, self.bytes

    def listed(self, limit):
        """The list as the page shows it: the newest `limit` ids, with their states."""
        with self.lock:
            ids = sorted(self.states, reverse=True)[:limit]
            return {job_id: self.states[job_id] for job_id in ids}

    def close(self):
        super().close()
        if self.conn is not None and self.conn.sock is not None:
            try:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Churn(threading.Thread):
    """Finishes `rate` runs a second, from `victims`, until stopped."""

    def __init__(self, api, victims, rate, stopping):
        super().__init__(daemon=True)
        self.api, self.victims, self.rate, self.stopping = api, victims, rate, stopping
        self.finished = 0

    def run(self):
        next_at = time.monotonic()
        while not self.stopping.is_set() and self.victims and self.rate > 0:
            job_id = self.victims.pop()
            self.api.call("JobService", "FinishRun", {"jobId": job_id, "exitCode": self.finished % 2})
            self.finished += 1
            next_at += 1 / self.rate
            self.stopping.wait(max(0.0, next_at - time.monotonic()))


def create_runs(api, count, parallel):
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        jobs = list(pool.map(lambda i: api.call("JobService", "CreateRun", {"name": f"run-{i}"}), range(count)))
    return [job["id"] for job in jobs], time.monotonic() - began


def window(kiln, mode, args, victims):
    stopping = threading.Event()
    page_class = {"polling": PollingPage, "feed": FeedPage}.get(mode)
    pages = [page_class(kiln.api, stopping) for _ in range(args.pages)] if page_class else []
    churn_stopping = threading.Event()
    churn = Churn(kiln.api, victims, args.churn, churn_stopping)
    cpu_before = kiln.cpu_seconds()
    churn.start()
    for page in pages:
        page.start()
    time.sleep(args.window)
    cpu_after = kiln.cpu_seconds()
    received = sum(page.bytes for page in pages)
    churn_stopping.set()
    churn.join()
    row = {"mode": mode, "bytes": received, "up_cpu": cpu_after[0] - cpu_before[0],
           "child_cpu": cpu_after[1] - cpu_before[1], "finished": churn.finished,
           "answers": sum(page.answers for page in pages), "list_bytes": sum(page.list_bytes for page in pages),
           "first_rows": median(page.first_rows for page in pages), "whole": median(page.whole for page in pages)}
    if mode == "feed":
        check_feed(kiln, pages)
    for page in pages:
        page.close()
        page.join(timeout=30)
    return row


def check_feed(kiln, pages, seconds=30):
    """Every page's list must come to equal a final ListJobs (ids and states)."""
    deadline = time.monotonic() + seconds
    while True:
        final = kiln.api.call("JobService", "ListJobs", LIST)["jobs"]
        expected = {job["id"]: job["state"] for job in final}
        errors = [page.error for page in pages if page.error is not None]
        if errors:
            raise kiln.fail(f"a feed page failed: {errors[0]!r}")
        wrong = [page for page in pages if page.listed(LIST["limit"]) != expected]
        if not wrong:
            print(f"  feed check: all {len(pages)} pages list the same {len(expected):,} runs and states as ListJobs",
                  flush=True)
            return
        if time.monotonic() > deadline:
            listed = wrong[0].listed(LIST["limit"])
            missing = len(expected.keys() - listed.keys())
            extra = len(listed.keys() - expected.keys())
            states = sum(1 for job_id in expected.keys() & listed.keys() if listed[job_id] != expected[job_id])
            raise kiln.fail(f"{len(wrong)} feed pages differ from ListJobs after {seconds} s: the first lacks "
                            f"{missing} runs, has {extra} more and {states} in another state")
        time.sleep(0.5)


def median(values):
    values = [value for value in values if value is not None]
    return statistics.median(values) if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", required=True, help="the kiln binary (target/release/kiln)")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--window", type=float, default=60, help="seconds each mode is measured")
    parser.add_argument("--churn", type=float, default=1, help="runs finished a second, in every window")
    parser.add_argument("--parallel", type=int, default=32, help="CreateRun calls in flight at once")
    parser.add_argument("--modes", default="no pages,polling,feed", help="the windows, in order (comma-separated)")
    args = parser.parse_args()
    victims_needed = int(args.churn * args.window * 3) + 10
    if args.runs < victims_needed:
        raise Fail(f"--runs must be at least {victims_needed} (the churn finishes that many)")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-feed.") as workdir:
        kiln = Kiln(args.kiln, workdir)
        try:
            print(f"kiln {args.kiln}; the HTTP API at 127.0.0.1:{kiln.http_port}", flush=True)
            ids, seconds = create_runs(kiln.api, args.runs, args.parallel)
            print(f"  {len(ids):,} runs made with CreateRun in {seconds:.1f} s", flush=True)
            print(f"  one ListJobs of them: {len(kiln.api.post('JobService', 'ListJobs', LIST)) / 1e6:.2f} MB", flush=True)
            victims = ids[:]  # the newest last: pop() finishes the newest first, in view
            rows = []
            for mode in args.modes.split(","):
                row = window(kiln, mode, args, victims)
                print(f"  {mode}: {row['bytes'] / 1e6:.1f} MB to the pages ({row['list_bytes'] / 1e6:.1f} MB until their "
                      f"whole lists), kiln up {row['up_cpu']:.1f} CPU s (+{row['child_cpu']:.1f} s nats), "
                      f"{row['finished']} runs finished", flush=True)
                rows.append(row)
        finally:
            kiln.close()
    report(args, rows)


def report(args, rows):
    print(f"\n{args.pages} Runs pages over {args.runs:,} runs, {args.window:g} s each, "
          f"{args.churn:g} run/s finished (FinishRun) throughout")
    print(f"{'':<10}{'MB received':>13}{'answers':>9}{'kiln up CPU s':>15}{'nats CPU s':>12}"
          f"{'above none':>12}{'first rows s':>14}{'whole list s':>14}")
    by_mode = {row["mode"]: row for row in rows}
    cpu = {mode: row["up_cpu"] + row["child_cpu"] for mode, row in by_mode.items()}
    idle = cpu.get("no pages", 0.0)
    for row in rows:
        first = "" if row["first_rows"] is None else f"{row['first_rows']:.2f}"
        whole = "" if row["whole"] is None else f"{row['whole']:.2f}"
        print(f"{row['mode']:<10}{row['bytes'] / 1e6:>13.1f}{row['answers']:>9,}{row['up_cpu']:>15.1f}"
              f"{row['child_cpu']:>12.1f}{cpu[row['mode']] - idle:>12.1f}{first:>14}{whole:>14}")
    if {"polling", "feed"} <= by_mode.keys() and by_mode["feed"]["bytes"]:
        ratio = by_mode["polling"]["bytes"] / by_mode["feed"]["bytes"]
        above = (cpu["polling"] - idle, cpu["feed"] - idle)
        cpu_ratio = f"{above[0] / above[1]:.1f}x" if above[1] > 0 else "n/a (the feed's is within the noise)"
        print(f"polling / feed: bytes {ratio:.0f}x, CPU above no pages {cpu_ratio}")
    print("(answers: ListJobs answers for polling, JobChanges messages for the feed)")


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        sys.exit(f"change_feed: {e}")
