"""Loads the UI benchmark's data into an MLflow tracking server through MLflow's own client
(REST: create_experiment, create_run, log_batch, set_terminated), the same series bench.mjs
writes to kiln through its HTTP API:

- experiment "bench-million": one run "million" with N points of "train/loss";
- experiment "bench-compare": R runs "compare-i", each with K keys "metric/k" of P points;
- experiment "bench-runs": M finished runs "run-i" with no metrics.

Values are those of bench.mjs: scale * (exp(-step / (count / 4)) + 0.05 * sin(step)), step 7 NaN,
timestamps T0 + step ms. log_batch takes at most 1000 metrics a call (MLflow's limit).
Prints one JSON object (ids and load times) on its last line of stdout.
"""

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric  # noqa: E402

BATCH = 1000  # MLflow's most metrics per log_batch
# MLflow 3 shows an experiment as a GenAI one (traces, no runs table) unless it is tagged a
# model-training one; this is the tag its own UI sets when one picks "Model training".
KIND = {"mlflow.experimentKind": "custom_model_development"}
T0 = 1_760_000_000_000


def value(step, count, scale=1.0):
    if step == 7:
        return float("nan")
    return scale * (math.exp(-step / (count / 4)) + 0.05 * math.sin(step))


def log_series(client, pool, run_id, keys, count, scale=1.0):
    """All points of `keys` (count each), 1000 metrics a log_batch, batches in parallel."""

    def batch(first_flat):
        metrics = []
        for flat in range(first_flat, min(first_flat + BATCH, count * len(keys))):
            key, step = keys[flat // count], flat % count
            metrics.append(Metric(key, value(step, count, scale), T0 + step, step))
        client.log_batch(run_id, metrics=metrics, synchronous=True)

    list(pool.map(batch, range(0, count * len(keys), BATCH)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--compare-runs", type=int, default=20)
    parser.add_argument("--compare-keys", type=int, default=10)
    parser.add_argument("--compare-points", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()

    client = MlflowClient(args.url)
    out = {"url": args.url}
    with ThreadPoolExecutor(args.threads) as pool:
        start = time.time()
        exp = client.create_experiment("bench-million", tags=KIND)
        run = client.create_run(exp, run_name="million")
        log_series(client, pool, run.info.run_id, ["train/loss"], args.points)
        client.set_terminated(run.info.run_id)
        out["million"] = {"experiment_id": exp, "run_id": run.info.run_id, "seconds": time.time() - start}
        print(f"mlflow: {args.points} points in {time.time() - start:.1f} s", file=sys.stderr, flush=True)

        start = time.time()
        exp = client.create_experiment("bench-compare", tags=KIND)
        keys = [f"metric/{k}" for k in range(args.compare_keys)]
        ids = []
        for i in range(args.compare_runs):
            run = client.create_run(exp, run_name=f"compare-{i}")
            log_series(client, pool, run.info.run_id, keys, args.compare_points, 1 + i / args.compare_runs)
            client.set_terminated(run.info.run_id)
            ids.append(run.info.run_id)
        out["compare"] = {"experiment_id": exp, "run_ids": ids, "keys": keys, "seconds": time.time() - start}
        print(f"mlflow: {args.compare_runs} runs x {args.compare_keys} keys in {time.time() - start:.1f} s", file=sys.stderr, flush=True)

        start = time.time()
        exp = client.create_experiment("bench-runs", tags=KIND)

        def one(i):
            run = client.create_run(exp, run_name=f"run-{i}")
            client.set_terminated(run.info.run_id)
            return run.info.run_id

        ids = list(pool.map(one, range(args.runs)))
        out["runs"] = {"experiment_id": exp, "first": ids[0], "last": ids[-1], "seconds": time.time() - start}
        print(f"mlflow: {args.runs} runs in {time.time() - start:.1f} s", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
