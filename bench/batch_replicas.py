"""Do replicas of item-batch add up? The same batch run through one replica of item-batch and
through two, on the production topology on this machine (scripts/cluster.sh: two replicas of
every service, Postgres, three clustered nats-servers, Cassandra, versitygw), with the release
builds of the services.

    python bench/batch_replicas.py --kiln target/release/kiln [--items 200000] [--rounds 2]

Each run creates a batch of kiln:noop items (`--max-workers 2`) and adds N URIs from two
`kiln batch add --from FILE` clients at once, N/2 each: both through item-batch-1 ("one
replica"), or one through item-batch-1 and one through item-batch-2 ("two replicas"). Intake
is the time until both adds return; add to done runs on until `kiln batch status` (polled every
0.2 s) reads DONE with every item succeeded. The workers (kiln-agent processes of the topology's
process runners) open their sessions at a replica each picks at random, in both cases alike, so
the figures differ only in where the items come in. One and two replicas alternate, `--rounds`
times each (1 2, then 2 1, ...), after a warm-up batch of a tenth of the items that is not
counted. The services are the release builds in the kiln binary's directory
(`cargo build --release -p kiln-api -p kiln-scheduler -p kiln-runner -p kiln-log-ingest
-p kiln-item-batch -p kiln-advisor -p kiln-predictor -p kiln-agent`); target/debug/kiln-topology
starts them (`cargo build -p kiln-topology`).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from kiln_batch import POLL, TIMEOUT
from procs import Fail

REPO = pathlib.Path(__file__).resolve().parents[1]


class Cluster:
    """scripts/cluster.sh up/down on a directory of its own, with the release services."""

    def __init__(self, kiln, workdir):
        # Postgres runs as its own user and must reach its data directory under this one.
        os.chmod(workdir, 0o711)
        self.kiln = kiln
        self.dir = os.path.join(workdir, "cluster")
        self.env = {**os.environ, "KILN_CLUSTER_DIR": self.dir,
                    "KILN_TOPOLOGY_BIN": str(pathlib.Path(kiln).resolve().parent)}
        self.cli_env = None
        self.batches = {}

    def __enter__(self):
        up = subprocess.run([str(REPO / "scripts" / "cluster.sh"), "up"], env=self.env, capture_output=True,
                            text=True, stdin=subprocess.DEVNULL)
        if up.returncode != 0:
            log = pathlib.Path(self.dir, "topology.log")
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            panics = [n for n, line in enumerate(lines) if "panicked" in line]
            why = "\n".join(lines[panics[0]:panics[0] + 8]) if panics else ""
            self.down()
            raise Fail(f"scripts/cluster.sh up failed:\n{up.stderr.strip()}\n{why}")
        exports = up.stdout.strip().removeprefix("export ").split()
        self.cli_env = {**os.environ, "KILN_HOME": os.path.join(self.dir, "cli-home"), "KILN_LOG": "warn"}
        self.cli_env.update(pair.split("=", 1) for pair in exports)
        instances = json.loads(pathlib.Path(self.dir, "topology", "instances.json").read_text())
        self.batches = {replica: instances[f"item-batch-{replica}"] for replica in (1, 2)}
        return self

    def __exit__(self, *exc):
        self.down()

    def down(self):
        subprocess.run([str(REPO / "scripts" / "cluster.sh"), "down"], env=self.env, capture_output=True)

    def fail(self, message):
        logs = pathlib.Path(self.dir, "topology", "logs")
        return Fail(f"{message}\n(the services' logs are in {logs})")

    def start_cli(self, args, replica=1):
        env = {**self.cli_env, "KILN_BATCH_ADDR": self.batches[replica]}
        return subprocess.Popen([self.kiln, *args], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def cli(self, *args, replica=1):
        process = self.start_cli(args, replica)
        out, err = process.communicate()
        if process.returncode != 0:
            raise self.fail(f"`kiln {' '.join(args)}` exited with status {process.returncode}:\n{out}{err}")
        return out

    def status(self, batch):
        return json.loads(self.cli("batch", "status", batch, "-o", "json"))

    def run(self, replicas, n, workdir):
        batch = self.cli("batch", "create", "--name", f"replicas-{replicas}", "--max-workers", "2", "--cpu", "0.1",
                         "--mem", "64M", "--", "kiln:noop").strip()
        files = []
        for half in (0, 1):
            path = os.path.join(workdir, f"items-{batch}-{half}.txt")
            with open(path, "w") as f:
                f.writelines(f"noop://bench/{i:08d}\n" for i in range(half, n, 2))
            files.append(path)
        began = time.monotonic()
        adds = [self.start_cli(["batch", "add", batch, "--from", path], replica=1 + half * (replicas - 1))
                for half, path in enumerate(files)]
        for add in adds:
            out, err = add.communicate()
            if add.returncode != 0:
                raise self.fail(f"`kiln batch add` exited with status {add.returncode}:\n{out}{err}")
        intake = time.monotonic() - began
        self.cli("batch", "seal", batch)
        while True:
            status = self.status(batch)
            now = time.monotonic()
            if status.get("state") == "DONE":
                if status.get("succeeded") != n:
                    raise self.fail(f"batch {batch} is DONE but not every item succeeded: {status}")
                break
            if status.get("state") not in ("OPEN", "SEALED") or status.get("dead") or status.get("failed"):
                raise self.fail(f"batch {batch} went wrong: {status}")
            if now - began > TIMEOUT:
                raise self.fail(f"batch {batch} not DONE after {TIMEOUT} s: {status}")
            time.sleep(POLL)
        return {"replicas": replicas, "intake": n / intake, "done": n / (now - began)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", required=True, help="the release kiln binary; the services are beside it")
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-replicas.") as workdir, Cluster(args.kiln, workdir) as cluster:
        print(f"kiln {args.kiln}; the topology of scripts/cluster.sh with the release services", flush=True)
        # A batch first, not counted: the first after the cluster starts ran at half the rate of
        # the next ones (caches, the workers' first sessions), whichever count of replicas it had.
        warm = cluster.run(2, max(args.items // 10, 1000), workdir)
        print(f"  warm-up: intake {warm['intake']:,.0f}/s, add to done {warm['done']:,.0f}/s (not counted)", flush=True)
        runs = []
        # Rates rose from run to run (Postgres's statistics of a growing table), so the order
        # alternates (1 2, 2 1, ...) rather than always measuring one replica first.
        for round_ in range(args.rounds):
            for replicas in ((1, 2) if round_ % 2 == 0 else (2, 1)):
                run = cluster.run(replicas, args.items, workdir)
                print(f"  {replicas} replica(s): intake {run['intake']:,.0f}/s, add to done {run['done']:,.0f}/s",
                      flush=True)
                runs.append(run)
    print(f"\nitem-batch replicas, {args.items} kiln:noop items from 2 clients, 2 workers, "
          f"median of {args.rounds} runs each")
    print(f"{'item-batch replicas taking the adds':<40}{'intake items/s':>16}{'add to done items/s':>22}")
    medians = {}
    for replicas in (1, 2):
        mine = [run for run in runs if run["replicas"] == replicas]
        medians[replicas] = (statistics.median(r["intake"] for r in mine), statistics.median(r["done"] for r in mine))
        print(f"{replicas:<40}{medians[replicas][0]:>16,.0f}{medians[replicas][1]:>22,.0f}")
    print(f"two / one: intake {medians[2][0] / medians[1][0]:.2f}x, add to done {medians[2][1] / medians[1][1]:.2f}x")


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        sys.exit(f"batch_replicas: {e}")
