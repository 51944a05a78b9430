"""Metric points per second, end to end (client -> durable -> queryable): kiln against the
MLflow tracking server, on this machine, in one run, with 1 and 4 client processes.

    python bench/metrics_throughput.py --kiln target/release/kiln [--points 200000]
        [--mlflow-points 10000] [--cassandra HOST:PORT] [--no-mlflow] [--markers 200]
        [--load-points 1000000] [--latency-only]

MLflow's SQLite backend stores a few thousand points per second, so its clients send fewer
points (--mlflow-points) to keep the run short; the rates are per second either way.

- kiln: `kiln up --provider process` on a temp KILN_HOME (SQLite stores; with --cassandra,
  also `--metric-store scylla --log-store scylla`, the stores replicas share). Each client
  process creates a run and hands its points to the SDK's `Run` (batch_points=1000, so
  requests of 1,000 points) either 1,000 at a time with `log_series` (as MLflow's client hands
  1,000 to `log_batch`: like for like) or one at a time with `log` (a training loop's shape;
  the interpreter's cost per call dominates);
  the clock stops when QueryMetrics counts every point.
- MLflow: `mlflow server` with its SQLite backend on 127.0.0.1; each client creates a run and
  sends `log_batch` requests of 1,000 points; the clock stops when every client is done
  (log_batch commits before it answers) and a count of the stored points agrees.
- Every client imports and creates its run first; all start writing together.
- Memory: the peak resident size (VmHWM) of the `kiln up` process, which holds log-ingest and
  every other service, so it bounds log-ingest's own.
- Log -> visible latency (first, each on a fresh `kiln up`): a marker run (the SDK's `Run`,
  default options) logs a point at the next step every 20 ms (idle, `--markers` of them) or
  every 10 ms while 4 client processes write `--load-points` points each with log_series as in
  the throughput rows (under load), while a reader thread polls LatestMetrics (each answer
  comes once the writers have stored what came before it; 1 ms apart); a marker is visible at
  the first answer showing its step or a later one, so its latency includes up to one poll's
  round trip and pause.
  p50 and p99.
"""

import argparse
import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KILN_CLIENT = """
import sys, time
from kiln._run import Run, _endpoints, _target
import grpc
from kiln.v1 import job_pb2, job_pb2_grpc
n, mode = int(sys.argv[1]), sys.argv[2]
api, logs, token = _endpoints()
md = (("authorization", f"Bearer {token}"),)
with grpc.insecure_channel(_target(api)) as channel:
    job = job_pb2_grpc.JobServiceStub(channel).CreateRun(job_pb2.CreateRunRequest(name="bench"), metadata=md)
run = Run(job_id=job.id, logs_address=logs, token=token, api_address=api, external=True, batch_points=1000)
print("ready", flush=True)
sys.stdin.readline()
if mode == "log":
    for step in range(n):
        run.log({"loss": step * 0.001}, step=step)
else:  # the shape of MLflow's client below: 1,000 points handed over per call
    for start in range(0, n, 1000):
        steps = range(start, min(n, start + 1000))
        run.log_series("loss", [step * 0.001 for step in steps], steps)
run.finish()
print(job.id)
"""

MLFLOW_CLIENT = """
import sys, time
from mlflow.tracking import MlflowClient
from mlflow.entities import Metric
n, uri = int(sys.argv[1]), sys.argv[2]
client = MlflowClient(uri)
run = client.create_run("0")  # the default experiment: clients start at once, none creates one
print("ready", flush=True)
sys.stdin.readline()
now = int(time.time() * 1000)
for start in range(0, n, 1000):
    client.log_batch(run.info.run_id, metrics=[Metric("loss", step * 0.001, now, step) for step in range(start, min(n, start + 1000))])
print(run.info.run_id)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"port {port} did not open")


def peak_rss_mb(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_clients(python, script, count, points, extra_args, env):
    """Starts the clients and lets them write together once every one is ready (imports done,
    run created: interpreter start-up is not part of the measure); returns when they began
    writing, and their run ids."""
    clients = [subprocess.Popen([python, "-c", script, str(points), *extra_args], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(count)]
    for client in clients:
        if client.stdout.readline().strip() != "ready":
            client.wait()
            raise SystemExit(client.stderr.read())
    started = time.time()
    for client in clients:
        client.stdin.write("go\n")
        client.stdin.flush()
    ids = []
    for client in clients:
        out, err = client.communicate()
        if client.returncode != 0:
            raise SystemExit(err)
        ids.append(out.split()[-1])
    return started, ids


class Scraper:
    """Scrapes the /metrics that `kiln up` printed in its log every `interval` seconds, as a
    Prometheus would, while a benchmark runs; counts the scrapes and the bytes read."""

    def __init__(self, log_path, interval=1.0):
        import threading
        self.log_path, self.interval = log_path, interval
        self.scrapes, self.bytes, self.url = 0, 0, None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def find_url(self):
        for line in pathlib.Path(self.log_path).read_text(errors="replace").splitlines():
            if line.strip().startswith("metrics:"):
                return line.split()[-1]
        return None

    def run(self):
        import urllib.request
        # The first scrape as soon as kiln up has printed its address, then one a interval.
        while True:
            self.url = self.url or self.find_url()
            if self.url:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    self.bytes += len(response.read())
                self.scrapes += 1
            if self.stopped.wait(self.interval if self.url else 0.05):
                return

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=10)
        return self.scrapes


@contextlib.contextmanager
def kiln_up(args, extra_flags, label, count):
    """A `kiln up --provider process` on a temp KILN_HOME; yields (its process, the clients'
    environment, a LogService stub and the metadata to call it with). Prints its log's tail
    when what runs inside fails."""
    home = tempfile.mkdtemp(prefix="kiln-bench-")
    env = {**os.environ, "KILN_HOME": home, "KILN_LOG": "warn"}
    log = open(pathlib.Path(home) / "up.log", "w")
    up = subprocess.Popen([args.kiln, "up", "--provider", "process", "--api-addr", "127.0.0.1:0",
                           "--logs-addr", "127.0.0.1:0", "--batch-addr", "127.0.0.1:0", *extra_flags], env=env,
                          stdout=log, stderr=subprocess.STDOUT)
    credentials = pathlib.Path(home) / "credentials.toml"
    while not credentials.exists():
        if up.poll() is not None:
            raise SystemExit("kiln up exited")
        time.sleep(0.05)
    try:
        sys.path.insert(0, "")
        os.environ["KILN_HOME"] = home
        import grpc
        from kiln._run import _endpoints, _target
        from kiln.v1 import log_pb2_grpc
        _, logs, token = _endpoints()
        stub = log_pb2_grpc.LogServiceStub(grpc.insecure_channel(_target(logs)))
        yield up, env, stub, (("authorization", f"Bearer {token}"),)
    except BaseException:
        print(f"kiln up's log ({label}, {count} clients):", file=sys.stderr)
        print((pathlib.Path(home) / "up.log").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)


def kiln_rate(args, count, mode, extra_flags, label, scrape=False):
    """With `scrape`, a Scraper reads /metrics every second during the run (the run fails when
    kiln up printed no metrics address)."""
    from kiln.v1 import log_pb2
    with kiln_up(args, extra_flags, label, count) as (up, env, stub, md):
        scraper = Scraper(pathlib.Path(env["KILN_HOME"]) / "up.log") if scrape else None
        started, ids = run_clients(sys.executable, KILN_CLIENT, count, args.points, [mode], env)
        expected = count * args.points
        while True:
            series = stub.QueryMetrics(log_pb2.QueryMetricsRequest(job_ids=ids, max_points=10), metadata=md).series
            total = sum(s.total_points for s in series)
            if total >= expected:
                break
            time.sleep(0.05)
        elapsed = time.time() - started
        assert total == expected, (total, expected)
        if scraper is not None and scraper.stop() == 0:
            raise SystemExit(f"{label}: kiln up printed no metrics address, or /metrics never answered")
        return label, count, expected / elapsed, peak_rss_mb(up.pid)


def markers(stub, md, run, count, gap, until=lambda: False):
    """Logs up to `count` marker points through the SDK's `Run` (default options), one every
    `gap` seconds, while a reader thread polls LatestMetrics: a marker is visible once an
    answer shows its step or a later one. Returns the log -> visible latencies, in ms (each
    includes up to one poll's round trip)."""
    from kiln.v1 import log_pb2
    request = log_pb2.LatestMetricsRequest(job_ids=[run.job_id], keys=["marker"])
    logged, latencies = [], []
    stop = threading.Event()

    def read():
        while True:
            finished = stop.is_set()
            series = stub.LatestMetrics(request, metadata=md).series
            now = time.perf_counter()
            seen = series[0].points[0].step + 1 if series else 0
            latencies.extend((now - at) * 1000 for at in logged[len(latencies):seen])
            if finished and len(latencies) == len(logged):
                return
            time.sleep(0.001)  # leaves the interpreter to the SDK's threads between polls

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for step in range(count):
        if until():
            break
        logged.append(time.perf_counter())
        run.log({"marker": float(step)}, step=step)
        time.sleep(gap)
    stop.set()
    reader.join()
    return latencies


def kiln_latency(args, load, extra_flags, label):
    """Log -> visible of a marker run's points: idle (`load` 0), or while `load` client
    processes write as in the throughput rows (log_series of 1,000). Returns (label, clients,
    p50 ms, p99 ms, markers)."""
    import grpc
    from kiln._run import Run, _endpoints, _target
    from kiln.v1 import job_pb2, job_pb2_grpc
    with kiln_up(args, extra_flags, label, load) as (_, env, stub, md):
        api, logs, token = _endpoints()
        with grpc.insecure_channel(_target(api)) as channel:
            job = job_pb2_grpc.JobServiceStub(channel).CreateRun(job_pb2.CreateRunRequest(name="marker"), metadata=md)
        run = Run(job_id=job.id, logs_address=logs, token=token, api_address=api, external=True)
        if load == 0:
            latencies = markers(stub, md, run, args.markers, 0.02)
        else:
            done = threading.Event()

            def write_load():
                try:
                    run_clients(sys.executable, KILN_CLIENT, load, args.load_points, ["series"], env)
                finally:
                    done.set()

            loader = threading.Thread(target=write_load, daemon=True)
            loader.start()
            time.sleep(0.5)  # the clients' interpreters start, create their runs, begin writing
            latencies = markers(stub, md, run, 1_000_000, 0.01, until=done.is_set)
            loader.join()
        run.finish()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    return label, load, pick(0.5), pick(0.99), len(latencies)


def mlflow_rate(args, count):
    workdir = tempfile.mkdtemp(prefix="mlflow-bench-")
    port = free_port()
    server = subprocess.Popen([args.mlflow, "server", "--backend-store-uri", f"sqlite:///{workdir}/mlflow.db",
                               "--default-artifact-root", f"{workdir}/artifacts", "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_port(port)
        uri = f"http://127.0.0.1:{port}"
        started, ids = run_clients(args.mlflow_python, MLFLOW_CLIENT, count, args.mlflow_points, [uri], os.environ)
        elapsed = time.time() - started
        check = subprocess.run([args.mlflow_python, "-c",
                                "import sys; from mlflow.tracking import MlflowClient; c = MlflowClient(sys.argv[1]); "
                                "print(sum(len(c.get_metric_history(r, 'loss')) for r in sys.argv[2:]))", uri, *ids],
                               capture_output=True, text=True, check=True)
        stored = int(check.stdout.strip())
        assert stored == count * args.mlflow_points, (stored, count * args.mlflow_points)
        return "mlflow (sqlite backend)", count, stored / elapsed, float("nan")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kiln", required=True)
    parser.add_argument("--mlflow", default="mlflow")
    parser.add_argument("--mlflow-python", default=sys.executable)
    parser.add_argument("--points", type=int, default=200_000, help="points per kiln client process")
    parser.add_argument("--mlflow-points", type=int, default=10_000, help="points per MLflow client process")
    parser.add_argument("--cassandra", help="host:port of a CQL node, to also measure the ScyllaDB store")
    parser.add_argument("--no-mlflow", action="store_true", help="kiln's rows alone, without the ratios")
    parser.add_argument("--markers", type=int, default=200, help="marker points of the idle latency rows")
    parser.add_argument("--load-points", type=int, default=1_000_000,
                        help="points per load client while the latency under load is measured")
    parser.add_argument("--latency-only", action="store_true", help="the latency rows alone")
    parser.add_argument("--no-latency", action="store_true", help="the throughput rows alone")
    args = parser.parse_args()
    latency = []
    for flags, store in [([], "sqlite")] + ([(["--metric-store", "scylla", "--log-store", "scylla", "--scylla-nodes",
                                               args.cassandra], "scylla on cassandra 5")] if args.cassandra else []):
        for load in () if args.no_latency else (0, 4):
            latency.append(kiln_latency(args, load, flags, f"kiln ({store}), {'idle' if load == 0 else 'under load'}"))
    if not args.latency_only:
        throughput(args)
    if args.no_latency:
        return
    print("log -> visible: marker points logged through the SDK's Run while a reader polls LatestMetrics;")
    print(f"idle: {args.markers} markers 20 ms apart; under load: a marker every 10 ms while 4 clients each write "
          f"{args.load_points:,} points with log_series")
    print(f"{'':42} {'clients':>7} {'p50':>9} {'p99':>9} {'markers':>8}")
    for label, load, p50, p99, count in latency:
        print(f"{label:42} {load:>7} {p50:>6.1f} ms {p99:>6.1f} ms {count:>8}")


def throughput(args):
    rows = []
    like_for_like, per_step = "kiln (sqlite), log_series of 1,000", "kiln (sqlite), log() per point"
    for count in (1, 4):
        rows.append(kiln_rate(args, count, "series", [], like_for_like))
        rows.append(kiln_rate(args, count, "log", [], per_step))
        if args.cassandra:
            flags = ["--metric-store", "scylla", "--log-store", "scylla", "--scylla-nodes", args.cassandra]
            rows.append(kiln_rate(args, count, "series", flags, "kiln (scylla on cassandra 5), log_series"))
        if not args.no_mlflow:
            rows.append(mlflow_rate(args, count))
    print("metric points per second, end to end (client -> durable -> queryable), requests of 1,000 points;")
    print(f"{args.points} points per kiln client, {args.mlflow_points} per MLflow client")
    print(f"{'':42} {'clients':>7} {'points/s':>12} {'peak RSS':>10}")
    for label, count, rate, rss in rows:
        memory = "" if rss != rss else f"{rss:.0f} MB"
        print(f"{label:42} {count:>7} {rate:>12,.0f} {memory:>10}")
    for count in () if args.no_mlflow else (1, 4):
        rate = {label: r for label, c, r, _ in rows if c == count}
        mlflow = rate["mlflow (sqlite backend)"]
        print(f"{count} client(s): kiln / mlflow = {rate[like_for_like] / mlflow:,.0f}x with 1,000 points per call "
              f"on both sides (goal: >= 100x), {rate[per_step] / mlflow:,.0f}x with kiln's log() per point")

if __name__ == "__main__":
    main()
