"""The SDK against a real `kiln up` (its own nats-server, SQLite, local processes)."""

import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import grpc
import pytest

import kiln
from kiln._run import Run, _endpoints, _target
from kiln.v1 import job_pb2, job_pb2_grpc, log_pb2, log_pb2_grpc

# `up` (a real `kiln up`) is conftest.py's fixture.
from conftest import KILN


def stubs():
    api, logs, token = _endpoints()
    metadata = (("authorization", f"Bearer {token}"),)
    jobs = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(_target(api)))
    points = log_pb2_grpc.LogServiceStub(grpc.insecure_channel(_target(logs)))
    return jobs, points, metadata


def series(job_id, key, total, max_points=100_000):
    """Waits until `total` points of the series are stored, then returns it."""
    _, points, metadata = stubs()
    deadline = time.monotonic() + 30
    while True:
        request = log_pb2.QueryMetricsRequest(job_ids=[job_id], keys=[key], max_points=max_points)
        found = points.QueryMetrics(request, metadata=metadata).series
        if found and found[0].total_points >= total:
            assert found[0].total_points == total
            return found[0]
        assert time.monotonic() < deadline, f"only {found[0].total_points if found else 0} of {total} points stored"
        time.sleep(0.05)


def test_a_run_outside_kiln_logs_every_point_once(up):
    run = kiln.init(config={"lr": 0.001}, name="notebook")
    assert kiln.config == {"lr": 0.001}
    for step in range(20_000):
        kiln.log({"train/loss": 1.0 / (step + 1), "train/acc": step / 20_000})
    kiln.log({"special": math.nan}, step=0)
    kiln.log({"special": math.inf}, step=1)
    kiln.log({"special": -math.inf}, step=2)
    job_id = run.job_id
    kiln.finish()

    loss = series(job_id, "train/loss", 20_000)
    assert [p.step for p in loss.points[:3]] == [0, 1, 2]
    assert loss.points[9].value == pytest.approx(0.1)
    special = series(job_id, "special", 3)
    assert math.isnan(special.points[0].value)
    assert [p.value for p in special.points[1:]] == [math.inf, -math.inf]
    jobs, _, metadata = stubs()
    job = jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), metadata=metadata)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED
    assert job.spec.name == "notebook"


def small_run(name, batch_points, buffer_points):
    """A run outside kiln with a buffer of the given size, flushed every 10 ms."""
    api, logs, token = _endpoints()
    jobs, _, metadata = stubs()
    created = jobs.CreateRun(job_pb2.CreateRunRequest(name=name), metadata=metadata)
    return Run(job_id=created.id, logs_address=logs, token=token, api_address=api, external=True,
               batch_points=batch_points, buffer_points=buffer_points, interval=0.01)


def test_a_full_buffer_waits_rather_than_drops(up):
    run = small_run("tiny-buffer", batch_points=5, buffer_points=10)
    for step in range(2_000):
        run.log({"x": float(step)}, step=step)
        assert run._logged - run._settled <= 10, "the buffer holds at most buffer_points points"
    run.finish()
    assert series(run.job_id, "x", 2_000).total_points == 2_000


def test_log_series_stores_many_values_at_once_and_waits_for_room(up):
    # A buffer smaller than the series: it goes in parts, each waiting for room.
    run = small_run("series", batch_points=100, buffer_points=1_000)
    run.log({"lr": 0.5})  # step 0
    run.log_series("lr", (0.1 * n for n in range(5_000)))  # steps 1 to 5,000
    run.log_series("lr", [math.nan, math.inf], steps=[10_000, 20_000])
    run.log({"lr": 7.0})  # after the largest step so far
    with pytest.raises(ValueError, match="2 steps for 3 values"):
        run.log_series("lr", [1, 2, 3], steps=[1, 2])
    run.finish()
    lr = series(run.job_id, "lr", 5_004)
    steps = [p.step for p in lr.points]
    assert steps == list(range(5_001)) + [10_000, 20_000, 20_001]
    assert lr.points[0].value == 0.5 and lr.points[5_000].value == pytest.approx(499.9)
    assert math.isnan(lr.points[5_001].value) and lr.points[5_002].value == math.inf
    assert lr.points[5_003].value == 7.0


def test_an_idle_run_sends_a_point_at_once(up):
    """With no request in flight, a point leaves at once: were it held for `interval` (an
    hour here), `series` would give up waiting."""
    api, logs, token = _endpoints()
    jobs, _, metadata = stubs()
    created = jobs.CreateRun(job_pb2.CreateRunRequest(name="fresh"), metadata=metadata)
    run = Run(job_id=created.id, logs_address=logs, token=token, api_address=api, external=True, interval=3600)
    for step in range(3):
        run.log({"fresh": float(step)}, step=step)
        assert series(run.job_id, "fresh", step + 1).points[-1].step == step
    run.finish()


def latest_steps(points, metadata, job_id, keys=()):
    request = log_pb2.LatestMetricsRequest(job_ids=[job_id], keys=list(keys))
    latest = points.LatestMetrics(request, metadata=metadata).series
    return {s.key: s.points[0].step for s in latest}


def test_once_finish_returned_every_point_is_visible_at_once(up):
    """Read-your-writes: 100,000 points, `finish()`, then straight away (no polling)
    LatestMetrics shows the last step of every key and QueryMetrics counts every point; 20
    runs, never stale."""
    _, points, metadata = stubs()
    keys, steps = [f"k{n}" for n in range(4)], 25_000
    for n in range(20):
        run = kiln.init(name=f"read-your-writes-{n}")
        for step in range(steps):
            kiln.log({key: step * 0.5 for key in keys}, step=step)
        job_id = run.job_id
        kiln.finish()
        assert latest_steps(points, metadata, job_id) == {key: steps - 1 for key in keys}, f"run {n} is stale"
        request = log_pb2.QueryMetricsRequest(job_ids=[job_id], max_points=10)
        totals = {s.key: s.total_points for s in points.QueryMetrics(request, metadata=metadata).series}
        assert totals == {key: steps for key in keys}, f"run {n} is stale"


def test_once_a_job_is_terminal_its_last_step_is_visible(up):
    """A job that logs and exits without calling finish (the SDK finishes at exit): once it is
    terminal, LatestMetrics shows its last step straight away."""
    script = (
        "import kiln\n"
        "kiln.init()\n"
        "for step in range(30_000):\n"
        "    kiln.log({'inside/loss': 1.0 / (step + 1), 'inside/acc': step * 1e-5}, step=step)\n"
    )
    jobs, points, metadata = stubs()
    for n in range(3):
        done = subprocess.run(
            [KILN, "run", "--no-code", "--", sys.executable, "-c", script],
            env={**os.environ, "KILN_HOME": up}, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.split()[-1]
        deadline = time.monotonic() + 120
        while True:
            job = jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), metadata=metadata)
            if job.state in TERMINAL:
                break
            assert time.monotonic() < deadline, f"job {job_id} did not end: {job}"
            time.sleep(0.02)
        assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
        keys = ["inside/acc", "inside/loss"]  # the runner's sys/* keys aside
        assert latest_steps(points, metadata, job_id, keys) == dict.fromkeys(keys, 29_999), f"job {n}"


TERMINAL = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_STOPPED, job_pb2.JOB_STATE_LOST)


def test_a_job_logs_with_its_own_token(up):
    script = (
        "import kiln\n"
        "kiln.init()\n"
        "for step in range(100):\n"
        "    kiln.log({'inside/loss': step * 0.5}, step=step)\n"
        "kiln.finish()\n"
        "print('logged')\n"
    )
    done = subprocess.run(
        [KILN, "run", "-f", "--no-code", "--", sys.executable, "-c", script],
        env={**os.environ, "KILN_HOME": up}, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "logged\n"
    job_id = done.stderr.splitlines()[0].split()[1]
    inside = series(job_id, "inside/loss", 100)
    assert inside.points[-1].value == 49.5


def test_bad_input_is_refused(up):
    api, logs, token = _endpoints()
    _, points, metadata = stubs()
    jobs, _, _ = stubs()
    created = jobs.CreateRun(job_pb2.CreateRunRequest(name="bad"), metadata=metadata)
    with pytest.raises(grpc.RpcError) as error:
        points.WriteMetrics(
            log_pb2.WriteMetricsRequest(job_id=created.id, points=[log_pb2.MetricPoint(key="k" * 251, step=0, value=1.0)]),
            metadata=metadata,
        )
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "250" in error.value.details()


WRITER = """
import kiln, sys
n, name = int(sys.argv[1]), sys.argv[2]
run = kiln.init(name=name)
for step in range(n // 4):
    kiln.log({"a": float(step), "b": 1.0, "c": 2.0, "d": 3.0}, step=step)
kiln.finish()
print(run.job_id)
"""


def total_points(job_ids):
    _, points, metadata = stubs()
    request = log_pb2.QueryMetricsRequest(job_ids=job_ids, max_points=10)
    return sum(s.total_points for s in points.QueryMetrics(request, metadata=metadata).series)


def wait_for_total(job_ids, expected, seconds=180):
    deadline = time.monotonic() + seconds
    while True:
        total = total_points(job_ids)
        if total >= expected:
            return total
        assert time.monotonic() < deadline, f"{total} of {expected} points stored"
        time.sleep(0.5)


def run_writers(count, points_each, env):
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(points_each), f"writer-{n}"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(count)
    ]
    return writers


def job_ids_of(writers):
    ids = []
    for writer in writers:
        out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
        ids.append(out.strip())
    return ids


def test_a_million_points_from_eight_processes_are_stored_exactly_once(up):
    writers = run_writers(8, 125_000, {**os.environ, "KILN_HOME": up})
    job_ids = job_ids_of(writers)
    assert wait_for_total(job_ids, 1_000_000) == 1_000_000
    time.sleep(1)
    assert total_points(job_ids) == 1_000_000, "nothing arrives twice"


def test_killing_log_ingest_mid_load_loses_nothing_and_duplicates_nothing(up):
    """A second log-ingest replica (the standalone binary) takes the writes and shares the
    durable consumers; SIGKILL it mid-load, start it again: every point is stored once."""
    home = pathlib.Path(up)
    nats = next(line.split()[1] for line in (home / "up.log").read_text().splitlines() if line.strip().startswith("nats:"))
    port = free_port()
    env = {
        **os.environ,
        "KILN_LOG": "warn",
        "KILN_LOG_INGEST__DATABASE__URL": f"sqlite://{home / 'kiln.db'}?mode=rwc",
        "KILN_LOG_INGEST__NATS__URL": nats,
        # kiln up's nats-server admits each service with its own NKey (docs/security/nats.md).
        "KILN_LOG_INGEST__NATS__NKEY_SEED_FILE": str(home / "nats-users" / "log-ingest.nk"),
        # The same SQLite files as kiln up's log-ingest: the same holder of the log-ingest lease.
        "KILN_LOG_INGEST__SQLITE__LOGS_PATH": str(home / "logs.db"),
        "KILN_LOG_INGEST__SQLITE__METRICS_PATH": str(home / "metrics.db"),
    }
    binary = str(pathlib.Path(KILN).with_name("kiln-log-ingest"))

    def start_replica():
        replica = subprocess.Popen([binary, "--listen", f"127.0.0.1:{port}"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not port_open(port):
            assert replica.poll() is None, "the replica exited"
            assert time.monotonic() < deadline, "the replica did not start"
            time.sleep(0.05)
        return replica

    replica = start_replica()
    writers = run_writers(4, 150_000, {**os.environ, "KILN_HOME": up, "KILN_LOGS_ADDR": f"http://127.0.0.1:{port}"})
    time.sleep(2)
    replica.send_signal(signal.SIGKILL)
    replica.wait()
    time.sleep(1)
    replica = start_replica()
    try:
        job_ids = job_ids_of(writers)
        assert wait_for_total(job_ids, 600_000) == 600_000
        time.sleep(1)
        assert total_points(job_ids) == 600_000
    finally:
        replica.send_signal(signal.SIGTERM)
        replica.wait(timeout=30)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port):
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_million_steps_come_back_as_at_most_500_points_with_the_extremes(up):
    script = """
import kiln
run = kiln.init(name="long")
for step in range(1_000_000):
    value = 1000.0 if step == 424_242 else -1000.0 if step == 777_777 else (step % 1000) / 1000.0
    kiln.log({"loss": value}, step=step)
kiln.finish()
print(run.job_id)
"""
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "KILN_HOME": up},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    downsampled = series(job_id, "loss", 1_000_000, max_points=500)
    assert len(downsampled.points) <= 500
    values = {(p.step, p.value) for p in downsampled.points}
    assert (424_242, 1000.0) in values and (777_777, -1000.0) in values


def test_a_batch_from_python_runs_every_item_and_keeps_its_dead_letter(up):
    with kiln.Client() as client:
        batch = client.batches.create(["sh", "-c", "[ {item} != bad ] || {{ echo broken {uri}; exit 3; }}"],
                                      cpu=0.1, memory_mb=64, max_attempts=2, max_workers=2)
        uris = [f"mem://{n}" for n in range(300)] + [{"key": "bad", "uri": "mem://bad", "params": {"size": "9"}}]
        added = batch.add(iter(uris), chunk=100)
        assert (added.added, added.duplicates, added.total) == (301, 0, 301)
        assert batch.add(uris[:10]).duplicates == 10, "adding again is harmless"
        with pytest.raises(grpc.RpcError) as refused:
            batch.add([{"key": "bad", "uri": "mem://other"}])
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        batch.seal()
        final = batch.wait(poll=0.2, timeout=300)
        assert final.state == "DONE"
        assert (final.total, final.succeeded, final.dead, final.failed, final.pending, final.running) == (301, 300, 1, 0, 0, 0)
        dead = list(batch.items(state="dead"))
        assert [(i.key, i.exit_code, i.attempts) for i in dead] == [("bad", 3, 2)]
        assert batch.logs("bad") == ["broken mem://bad", "broken mem://bad"]
        # log-ingest searches every attempt's lines: the first failed (and was retried), the last made it dead.
        found = batch.search_logs("broken")
        assert [(m.key, m.attempt, m.text, m.state) for m in found.lines] == [
            ("bad", 1, "broken mem://bad", "failed"), ("bad", 2, "broken mem://bad", "dead")]
        assert not found.truncated
        assert [m.attempt for m in batch.search_logs(r"^broken mem://\w+$", regex=True, state="dead").lines] == [2]
        assert batch.search_logs("broken", limit=1).truncated
        assert sum(1 for _ in batch.items()) == 301, "pages cover every item once"
        assert batch.id in [b.id for b in client.batches.list(all=True)]
        with pytest.raises(grpc.RpcError) as empty:
            client.batches.create([])
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A worker's /dev/shm counts against its memory (64M times 2 slots here), as a job's does.
        with pytest.raises(grpc.RpcError) as shm:
            client.batches.create(["kiln:noop"], memory_mb=64, slots=2, shm="129M")
        assert shm.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "shm_bytes" in shm.value.details()
        with pytest.raises(grpc.RpcError) as disk:
            client.batches.create(["kiln:noop"], disk="1G")
        assert disk.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "needs an image" in disk.value.details()


def test_retry_rules_and_usage_from_python(up):
    with kiln.Client() as client:
        batch = client.batches.create(["sh", "-c", "[ {item} != bad ] || exit 3"], cpu=0.1, memory_mb=64,
                                      max_attempts=3, retry_rules=[kiln.RetryRule("fail", on="exit", exit_codes=[3])])
        batch.add([f"mem://{n}" for n in range(4)] + [{"key": "bad", "uri": "mem://bad"}])
        batch.seal()
        final = batch.wait(poll=0.2, timeout=300)
        assert (final.succeeded, final.dead) == (4, 1)
        [dead] = list(batch.items(state="dead"))
        assert (dead.key, dead.exit_code, dead.attempts) == ("bad", 3, 1), "exit 3 is not retried"
        assert "retry rule 1 (fail on exit 3)" in dead.reason
        assert all(item.peak_memory_bytes > 0 for item in batch.items()), "each item is measured"
        usage = batch.usage()
        assert usage.items == 5 and usage.sizing_hint.startswith("items used p95"), usage
        with pytest.raises(ValueError):
            kiln.RetryRule("maybe")._proto()


def test_an_address_and_a_token_are_enough(up, monkeypatch, tmp_path):
    """Without a credentials file, KILN_ADDR and KILN_TOKEN reach every service: the others'
    addresses (item-batch and log-ingest listen on ports of their own) come from the api."""
    from kiln._run import _discovered, _home_credentials

    credentials = _home_credentials()
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    monkeypatch.setenv("KILN_ADDR", credentials["api"])
    monkeypatch.setenv("KILN_TOKEN", credentials["token"])
    _discovered.clear()
    with kiln.Client() as client:
        batch = client.batches.create(["kiln:noop"], cpu=0.1, memory_mb=64)
        batch.add(["mem://a"])
        batch.seal()
        assert batch.wait(poll=0.2, timeout=120).succeeded == 1
        assert client._logs_address == credentials["logs"], "log-ingest's address came from the api"
    assert _discovered, "the api was asked"
