"""Batch items per second, end to end, with 2 workers and no-op items: kiln's batches against
Celery (Redis broker) and a raw JetStream work queue, on this machine, in one run.

    python bench/batch_throughput.py --kiln target/release/kiln [--items 200000]
        [--celery-items 5000] [--python PATH]

--python is an interpreter with celery, redis and nats-py (scripts/bench.sh installs the pinned
versions into target/bench-venv); nats-server must be on PATH or in $KILN_TOOLS/bin (default
~/.kiln/tools/bin, where scripts/setup.sh puts it), and redis-server (Debian's) on PATH.

- kiln: `kiln up --provider process` on a temp KILN_HOME; `kiln batch create --max-workers 2
  --cpu 0.1 --mem 64M -- kiln:noop`, then the clock runs from `kiln batch add --from FILE` (N
  URIs; intake alone is its own row: until the add returns) through `kiln batch seal` until
  `kiln batch status -o json` (polled every 0.2 s) says DONE with succeeded == N. The
  autoscaler starts the 2 workers (local kiln-agent processes) as soon as items are there, so
  their start-up is inside the figure. A second batch runs `-- true` (a real /bin/true process
  per item) with N/10 items.
- celery: redis-server on a free port (no persistence), `celery -A tasks worker --pool prefork
  --concurrency 2`, a no-op task that only increments a Redis counter (and stamps the time when
  the counter reaches N). The worker is up and answers a ping before the first send (its
  start-up is NOT in the figure); the clock runs from the first apply_async to that stamp.
- raw JetStream: a fresh `nats-server -js` on a free port; a work-queue stream and one durable
  pull consumer shared by 2 consumer processes that fetch(batch=100) and msg.ack() each message
  (then flush once per batch, so the stamp of the last ack is when the server has it). The
  publisher uses publish_async and awaits the PubAcks every 500 messages. Phase 1: consumers
  pull while the publisher publishes; the clock runs from the first publish to the last ack.
  Phase 2 (a second stream): publish all N first (publish rate), then pull+ack alone.
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile

from kiln_batch import POLL, TIMEOUT, Kiln
from procs import STARTED, Fail, free_port, start, stop, stop_all, tail, wait_port

JS_FETCH_BATCH = 100
JS_PUB_WINDOW = 500


# ------------------------------------------------------------------------------------------------
# kiln

def kiln_rows(args, workdir):
    """kiln's rows: intake alone, and add to done, for no-op items and for /bin/true ones."""
    runs = []
    with Kiln(args.kiln, workdir, "kiln-noop") as kiln:
        runs.append(kiln.run_batch("kiln (kiln:noop, add to done)", ["kiln:noop"], args.items))
    with Kiln(args.kiln, workdir, "kiln-true") as kiln:
        runs.append(kiln.run_batch("kiln (spawn /bin/true per item, add to done)", ["true"],
                                   max(1, args.items // 10)))
    rows = [{**run, "seconds": run["add_to_done_seconds"], "rate": run["items"] / run["add_to_done_seconds"],
             "seal_rate": run["rate"]} for run in runs]
    noop = rows[0]
    intake = {"label": "kiln intake alone (kiln batch add --from FILE)", "items": noop["items"],
              "seconds": noop["add_seconds"], "rate": noop["items"] / noop["add_seconds"]}
    return [intake, *rows]


# ------------------------------------------------------------------------------------------------
# celery + redis

TASKS = '''
import os, time
import redis
from celery import Celery

URL = os.environ["BENCH_REDIS_URL"]
app = Celery("tasks", broker=URL)
app.conf.task_ignore_result = True  # completions are counted in Redis by the task itself
_client = None


@app.task
def noop(n):
    """No work; counts itself done, and the one that makes the count n stamps the time."""
    global _client
    if _client is None:  # per worker process, after the fork
        _client = redis.Redis.from_url(URL)
    if _client.incr("bench:done") == n:
        _client.set("bench:last", repr(time.time()))
'''

CELERY_CLIENT = '''
import json, sys, time
import redis
from tasks import app, noop

n, timeout = int(sys.argv[1]), float(sys.argv[2])
r = redis.Redis.from_url(app.conf.broker_url)
deadline = time.monotonic() + 120
while not app.control.ping(timeout=0.5):
    if time.monotonic() > deadline:
        sys.exit("the celery worker did not answer a ping within 120 s")
r.delete("bench:done", "bench:last")
first = time.time()
for _ in range(n):
    noop.apply_async((n,))
sent = time.time()
deadline = time.monotonic() + timeout
while r.get("bench:last") is None:
    if time.monotonic() > deadline:
        sys.exit(f"celery: {int(r.get('bench:done') or 0)} of {n} tasks done after {timeout} s")
    time.sleep(0.02)
last = float(r.get("bench:last"))
time.sleep(0.5)
done = int(r.get("bench:done"))
if done != n:
    sys.exit(f"celery: {done} tasks counted, expected {n}")
print(json.dumps({"first": first, "sent": sent, "last": last, "done": done}))
'''


def redis_server_version(binary):
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    return "?"


def celery_row(args, workdir, versions):
    redis_server = shutil.which("redis-server")
    if not redis_server:
        raise Fail("redis-server is not on PATH (Debian: apt-get install -y redis-server)")
    cdir = os.path.join(workdir, "celery")
    os.makedirs(cdir)
    pathlib.Path(cdir, "tasks.py").write_text(TASKS)
    pathlib.Path(cdir, "client.py").write_text(CELERY_CLIENT)
    port = free_port()
    redis_log = os.path.join(cdir, "redis.log")
    worker_log = os.path.join(cdir, "worker.log")
    with open(redis_log, "wb") as log:
        server = start([redis_server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                        "--dir", cdir, "--daemonize", "no"], "redis-server", cwd=cdir, stdin=subprocess.DEVNULL,
                       stdout=log, stderr=subprocess.STDOUT)
    worker = None
    try:
        wait_port(port, server, "redis-server")
        env = {**os.environ, "BENCH_REDIS_URL": f"redis://127.0.0.1:{port}/0", "PYTHONPATH": cdir}
        with open(worker_log, "wb") as log:
            worker = start([args.python, "-m", "celery", "-A", "tasks", "worker", "--pool", "prefork", "--concurrency",
                            "2", "--loglevel", "WARNING", "--hostname", "bench@%h"], "celery worker", cwd=cdir, env=env,
                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        result = subprocess.run([args.python, "client.py", str(args.celery_items), str(TIMEOUT)], cwd=cdir, env=env,
                                capture_output=True, text=True)
        if result.returncode != 0 or worker.poll() is not None:
            raise Fail(f"celery run failed (client status {result.returncode}):\n{result.stdout}{result.stderr}\n"
                       f"--- tail of {worker_log} ---\n{tail(worker_log)}\n--- tail of {redis_log} ---\n{tail(redis_log)}")
        times = json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        for proc in (worker, server):
            if proc is not None:
                stop(proc)
                STARTED[:] = [(p, label) for p, label in STARTED if p is not proc]
    n = args.celery_items
    seconds = times["last"] - times["first"]
    return {
        "label": f"celery {versions['celery']} + redis {redis_server_version(redis_server)} (no-op task)",
        "items": n, "seconds": seconds, "rate": n / seconds, "send_seconds": times["sent"] - times["first"],
    }


# ------------------------------------------------------------------------------------------------
# raw JetStream work queue

JETSTREAM = '''
import asyncio, json, subprocess, sys, time
import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

FETCH, WINDOW = int(sys.argv[3]), int(sys.argv[4])


async def consume(url, stream, n):
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe_bind("workers", stream=stream)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    count, last = 0, 0.0
    while True:
        try:
            msgs = await sub.fetch(FETCH, timeout=0.25)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            info = await js.consumer_info(stream, "workers")
            if info.delivered.stream_seq >= n and info.num_pending == 0 and info.num_ack_pending == 0:
                break
            continue
        for msg in msgs:
            await msg.ack()
        await nc.flush()
        count += len(msgs)
        last = time.time()
    await nc.close()
    print(json.dumps({"count": count, "last": last}), flush=True)


async def publish(js, subject, n):
    pending = []
    for i in range(n):
        pending.append(await js.publish_async(subject, b"item-%08d" % i))
        if len(pending) == WINDOW or i == n - 1:
            for ack in await asyncio.gather(*pending):
                if ack.seq is None:
                    raise SystemExit(f"publish failed: {ack}")
            pending = []


def spawn_consumers(url, stream, n):
    procs = [subprocess.Popen([sys.executable, __file__, "consume", url, str(FETCH), str(WINDOW), sys.argv[5], stream, str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise SystemExit("a consumer did not start")
    return procs


def go(procs):
    for p in procs:
        p.stdin.write("go\\n")
        p.stdin.flush()


def collect(procs):
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=float(sys.argv[5]))
        if p.returncode != 0:
            raise SystemExit(f"a consumer exited with status {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return sum(r["count"] for r in results), max(r["last"] for r in results)


async def setup(js, stream, subject):
    await js.add_stream(StreamConfig(name=stream, subjects=[subject], retention=RetentionPolicy.WORK_QUEUE,
                                     storage=StorageType.FILE))
    await js.add_consumer(stream, ConsumerConfig(durable_name="workers", ack_policy=AckPolicy.EXPLICIT))


async def check(js, stream, n, count):
    state = (await js.stream_info(stream)).state
    if count < n or state.messages != 0:
        raise SystemExit(f"{stream}: {count} of {n} acked, {state.messages} messages left in the stream")


async def main(url, n):
    nc = await nats.connect(url)
    js = nc.jetstream()
    # 1: consumers pull while the publisher publishes; first publish to last ack
    await setup(js, "BENCH1", "bench1.items")
    procs = spawn_consumers(url, "BENCH1", n)
    go(procs)
    first = time.time()
    await publish(js, "bench1.items", n)
    published = time.time()
    count1, last1 = await asyncio.get_running_loop().run_in_executor(None, collect, procs)
    await check(js, "BENCH1", n, count1)
    # 2: publish everything first, then pull+ack alone
    await setup(js, "BENCH2", "bench2.items")
    began = time.time()
    await publish(js, "bench2.items", n)
    published2 = time.time()
    procs = spawn_consumers(url, "BENCH2", n)
    go(procs)
    pull_first = time.time()
    count2, last2 = await asyncio.get_running_loop().run_in_executor(None, collect, procs)
    await check(js, "BENCH2", n, count2)
    await nc.close()
    print(json.dumps({"e2e_seconds": last1 - first, "e2e_publish_seconds": published - first, "e2e_acked": count1,
                      "publish_seconds": published2 - began, "pull_seconds": last2 - pull_first, "pull_acked": count2}))


if sys.argv[1] == "consume":
    asyncio.run(consume(sys.argv[2], sys.argv[6], int(sys.argv[7])))
else:
    asyncio.run(main(sys.argv[2], int(sys.argv[6])))
'''


def nats_server_version(binary):
    return subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip().split()[-1]


def jetstream_rows(args, workdir, nats_server):
    jdir = os.path.join(workdir, "jetstream")
    os.makedirs(jdir)
    script = os.path.join(jdir, "js_bench.py")
    pathlib.Path(script).write_text(JETSTREAM)
    port = free_port()
    log_path = os.path.join(jdir, "nats.log")
    with open(log_path, "wb") as log:
        server = start([nats_server, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", os.path.join(jdir, "store")],
                       "nats-server", stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, server, "nats-server")
        url = f"nats://127.0.0.1:{port}"
        result = subprocess.run([args.python, script, "main", url, str(JS_FETCH_BATCH), str(JS_PUB_WINDOW),
                                 str(TIMEOUT), str(args.items)], capture_output=True, text=True, timeout=3 * TIMEOUT)
        if result.returncode != 0:
            raise Fail(f"the JetStream run failed (status {result.returncode}):\n{result.stdout}{result.stderr}\n"
                       f"--- tail of {log_path} ---\n{tail(log_path)}")
        times = json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        stop(server)
        STARTED[:] = [(p, label) for p, label in STARTED if p is not server]
    n = args.items
    for key in ("e2e_acked", "pull_acked"):
        if times[key] != n:
            print(f"note: JetStream acked {times[key]} deliveries for {n} messages (redeliveries)", file=sys.stderr)
    return [
        {"label": "raw jetstream work queue (publish+pull+ack)", "items": n, "seconds": times["e2e_seconds"],
         "rate": n / times["e2e_seconds"], "publish_seconds": times["e2e_publish_seconds"]},
        {"label": "raw jetstream work queue (pull+ack alone)", "items": n, "seconds": times["pull_seconds"],
         "rate": n / times["pull_seconds"], "publish_seconds": times["publish_seconds"]},
    ]


# ------------------------------------------------------------------------------------------------


def preflight(args):
    kiln = os.path.abspath(args.kiln)
    if not (os.path.isfile(kiln) and os.access(kiln, os.X_OK)):
        raise Fail(f"no kiln binary at {kiln} (cargo build --release -p kiln-cli)")
    agent = os.path.join(os.path.dirname(kiln), "kiln-agent")
    if not (os.path.isfile(agent) and os.access(agent, os.X_OK)):
        raise Fail(f"no kiln-agent beside kiln at {agent} (cargo build --release -p kiln-agent)")
    args.kiln = kiln
    python = os.path.abspath(args.python) if os.sep in args.python else shutil.which(args.python)
    if not python or not os.access(python, os.X_OK):
        raise Fail(f"no python interpreter at {args.python}")
    args.python = python  # not resolved further: a venv's python is a symlink that must stay one
    tools = os.environ.get("KILN_TOOLS") or os.path.join(os.environ.get("KILN_HOME") or os.path.expanduser("~/.kiln"),
                                                         "tools")
    os.environ["PATH"] = os.path.join(tools, "bin") + os.pathsep + os.environ.get("PATH", "")
    nats_server = shutil.which("nats-server")
    if not nats_server:
        raise Fail(f"nats-server is neither on PATH nor in {tools}/bin (scripts/setup.sh installs it)")
    if not shutil.which("redis-server"):
        raise Fail("redis-server is not on PATH (Debian: apt-get install -y redis-server)")
    probe = subprocess.run([args.python, "-c", "import json, celery, redis, nats.aio.client as n; print(json.dumps("
                            "{'celery': celery.__version__, 'redis': redis.__version__, 'nats': n.__version__}))"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise Fail(f"{args.python} lacks celery, redis or nats-py (scripts/bench.sh installs them):\n{probe.stderr}")
    return nats_server, json.loads(probe.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kiln", default="target/release/kiln", help="the kiln binary (kiln-agent beside it)")
    parser.add_argument("--items", type=int, default=200_000, help="items for kiln and JetStream (N/10 for /bin/true)")
    parser.add_argument("--celery-items", type=int, default=5_000, help="tasks for Celery")
    parser.add_argument("--python", default=sys.executable, help="an interpreter with celery, redis and nats-py")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, KILN_HOMEs) for a look")
    args = parser.parse_args()
    if args.items < 1 or args.celery_items < 1:
        parser.error("--items and --celery-items must be positive")

    def on_signal(signum, _frame):
        raise Fail(f"interrupted by signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workdir = tempfile.mkdtemp(prefix="kiln-batch-bench-")
    try:
        nats_server, versions = preflight(args)
        print(f"kiln {args.kiln}; nats-server {nats_server_version(nats_server)}; celery {versions['celery']}, "
              f"redis-py {versions['redis']}, nats-py {versions['nats']} ({args.python})", flush=True)
        rows = kiln_rows(args, workdir)
        print(f"kiln done: {rows[1]['rate']:,.0f} and {rows[2]['rate']:,.0f} items/s", flush=True)
        rows.append(celery_row(args, workdir, versions))
        print(f"celery done: {rows[-1]['rate']:,.0f} items/s", flush=True)
        rows.extend(jetstream_rows(args, workdir, nats_server))
    except Fail as e:
        stop_all()
        print(f"batch_throughput: FAILED: {e}", file=sys.stderr)
        if args.keep:
            print(f"batch_throughput: kept {workdir}", file=sys.stderr)
        sys.exit(1)
    finally:
        stop_all()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    intake, kiln_noop, kiln_true, celery, js, js_pull = rows
    width = max(len(r["label"]) for r in rows)
    print()
    print(f"batch items per second, end to end, 2 workers, {args.items} items "
          f"({kiln_true['items']} for /bin/true, {celery['items']} for celery)")
    print(f"{'system':{width}} {'items':>8} {'seconds':>9} {'items/s':>10}")
    for r in rows:
        print(f"{r['label']:{width}} {r['items']:>8} {r['seconds']:>9.2f} {r['rate']:>10,.0f}")
    print()
    print(f"{intake['label']}: `kiln batch add BATCH --from FILE` of {intake['items']} URIs into an open batch, "
          f"until it returns (every item recorded and on the queue); the workers start meanwhile")
    for r in (kiln_noop, kiln_true):
        print(f"{r['label']}: clock from `kiln batch add` to status DONE (polled every {POLL} s; sealed as soon as "
              f"the add returned); includes the 2 workers' start-up (autoscaler -> local kiln-agent processes, "
              f"peak {r['max_workers']} workers); all succeeded at {r['add_seconds'] + r['succeeded_seconds']:.2f} s; "
              f"from the seal alone: {r['seal_rate']:,.0f} items/s; "
              f"highest rate in `kiln batch status`: {r['kiln_rate']:,.0f} items/s")
    print(f"{celery['label']}: clock from the first apply_async to the last task's completion (stamped by the "
          f"task); sending took {celery['send_seconds']:.2f} s (inside the figure); worker (prefork, 2 processes) "
          f"started and answering before the first send (start-up not counted)")
    print(f"{js['label']}: clock from the first publish to the last ack, 2 consumer processes on one durable pull "
          f"consumer, fetch({JS_FETCH_BATCH}) + msg.ack(); publishing took {js['publish_seconds']:.2f} s")
    print(f"{js_pull['label']}: all {args.items} published first ({js_pull['publish_seconds']:.2f} s, "
          f"{args.items / js_pull['publish_seconds']:,.0f} msgs/s), then pull+ack only")
    print()
    print(f"kiln / celery = {kiln_noop['rate'] / celery['rate']:.1f}x (goal >= 10x); "
          f"kiln / raw jetstream = {100 * kiln_noop['rate'] / js['rate']:.0f}% (goal >= 50%; "
          f"{100 * kiln_noop['rate'] / js_pull['rate']:.0f}% of pull+ack alone)")


if __name__ == "__main__":
    main()
