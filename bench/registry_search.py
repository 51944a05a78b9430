"""The model-registry searches of `registry-search` (bench/src/registry_search.rs) on MLflow's
registry with its SQLite backend, in process (MlflowClient on sqlite:///...), on the same data:
10,000 versions of one model, each with tags stage (prod every 50th), team and run, then each
search timed `--runs` times. MLflow's version search has no text match on descriptions, so the
text rows are kiln's only.

    target/registry-bench-venv/bin/python bench/registry_search.py [--versions 10000]
"""

import argparse
import logging
import os
import tempfile
import time
import warnings

MODEL = "bench-model"


def stage(i):
    if i % 50 == 0:
        return "prod"
    return "staging" if i % 50 < 10 else "dev"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    import mlflow
    from mlflow import MlflowClient

    home = tempfile.mkdtemp(prefix="mlflow-registry-")
    uri = f"sqlite:///{os.path.join(home, 'mlflow.db')}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(MODEL)
    started = time.perf_counter()
    for i in range(1, args.versions + 1):
        version = client.create_model_version(
            MODEL,
            source=f"file://{home}/artifacts/{i}",
            tags={"stage": stage(i), "team": f"team-{i % 10}", "run": f"run-{i}"},
            description=f"resnet lr={0.1 / (1 + i % 97):.5f} seed={i}",
        )
        if i == 1:
            client.set_registered_model_alias(MODEL, "production", version.version)
    recorded = time.perf_counter() - started
    print(f"mlflow {mlflow.__version__}: recorded {args.versions} versions of {MODEL} in {recorded:.1f}s "
          f"({recorded * 1000 / args.versions:.2f} ms per version)")
    searches = [
        ("newest page (100)", f"name='{MODEL}'"),
        ("tag stage=prod (200 match)", f"name='{MODEL}' AND tags.stage='prod'"),
        ("tag run=run-4242 (1 match)", f"name='{MODEL}' AND tags.run='run-4242'"),
        ("two tags stage+team", f"name='{MODEL}' AND tags.stage='staging' AND tags.team='team-3'"),
    ]
    print(f"{'search':<32} {'found':>7} {'p50 ms':>9} {'p99 ms':>9}")
    for name, filter_string in searches:
        times = []
        found = 0
        for _ in range(args.runs):
            start = time.perf_counter()
            page = client.search_model_versions(filter_string, max_results=100, order_by=["version_number DESC"])
            found = len(page)
            times.append(time.perf_counter() - start)
        times.sort()
        p50 = times[round((len(times) - 1) * 0.5)] * 1000
        p99 = times[round((len(times) - 1) * 0.99)] * 1000
        print(f"{name:<32} {found:>7} {p50:>9.3f} {p99:>9.3f}")


if __name__ == "__main__":
    main()
