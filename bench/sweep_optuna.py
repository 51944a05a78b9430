"""The Python side of sweep-bench: Optuna's figures and the digits learning curves.

Run by the Rust bin (bench/src/bin/sweep-bench), which prints them beside kiln's. Each mode
prints one JSON document on stdout:

  quality --functions branin,hartmann6,rosenbrock10 --seeds 20 --trials 100
      best value found per seed by Optuna's multivariate TPE, sequential and with 4 parallel
      suggestions (ask 4, then tell 4; constant_liar=True)
  curves --configs 200 --epochs 81 --seed 0
      per-epoch validation accuracy (%) of averaged-SGD linear classifiers on scikit-learn's
      digits, trained with partial_fit, one curve per random config
  overhead --trials 1000 --params 10
      p50 wall time of ask + tell per trial, Optuna's TPE in memory and on SQLite storage

Pinned in scripts/bench.sh: optuna==5.0.0, scikit-learn==1.9.1, numpy==2.4.6.
"""

import argparse
import json
import math
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
import optuna

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore")

# --- test functions (the same definitions as sweep-bench's functions.rs) -------------------------


def branin(x):
    x1, x2 = x
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


HARTMANN_ALPHA = [1.0, 1.2, 3.0, 3.2]
HARTMANN_A = [
    [10, 3, 17, 3.5, 1.7, 8],
    [0.05, 10, 17, 0.1, 8, 14],
    [3, 3.5, 1.7, 10, 17, 8],
    [17, 8, 0.05, 10, 0.1, 14],
]
HARTMANN_P = [
    [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
    [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
    [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
    [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
]


def hartmann6(x):
    total = 0.0
    for alpha, a, p in zip(HARTMANN_ALPHA, HARTMANN_A, HARTMANN_P):
        total -= alpha * math.exp(-sum(a[j] * (x[j] - p[j]) ** 2 for j in range(6)))
    return total


def rosenbrock(x):
    return sum(100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2 for i in range(len(x) - 1))


FUNCTIONS = {
    "branin": (branin, [(-5.0, 10.0), (0.0, 15.0)]),
    "hartmann6": (hartmann6, [(0.0, 1.0)] * 6),
    "rosenbrock10": (rosenbrock, [(-5.0, 10.0)] * 10),
}


def optimize(name, seed, trials, parallel):
    function, bounds = FUNCTIONS[name]
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=parallel > 1)
    study = optuna.create_study(sampler=sampler)
    best = math.inf
    done = 0
    while done < trials:
        batch = [study.ask() for _ in range(min(parallel, trials - done))]
        points = [[trial.suggest_float(f"x{i}", low, high) for i, (low, high) in enumerate(bounds)] for trial in batch]
        for trial, x in zip(batch, points):
            value = function(x)
            best = min(best, value)
            study.tell(trial, value)
        done += len(batch)
    return best


def quality(args):
    out = {}
    for name in args.functions.split(","):
        out[name] = {
            str(parallel): [optimize(name, seed, args.trials, parallel) for seed in range(args.seeds)]
            for parallel in (1, 4)
        }
    return out


# --- learning curves on digits ---------------------------------------------------------------------


def curves(args):
    from sklearn.datasets import load_digits
    from sklearn.linear_model import SGDClassifier
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)
    scaler = StandardScaler().fit(x_train)
    x_train, x_val = scaler.transform(x_train), scaler.transform(x_val)
    classes = np.unique(y)
    rng = np.random.default_rng(args.seed)
    out = []
    for number in range(args.configs):
        config = {
            "loss": str(rng.choice(["hinge", "log_loss", "modified_huber"])),
            "alpha": float(10 ** rng.uniform(-6, -1)),
            "learning_rate": str(rng.choice(["constant", "invscaling"])),
            "eta0": float(10 ** rng.uniform(-5, -1)),
        }
        # Averaged SGD: the averaged weights make a smooth curve, so a final score is the
        # config's, not one noisy epoch's.
        model = SGDClassifier(**config, average=True, random_state=number)
        order = np.random.default_rng(number)
        scores = []
        for _ in range(args.epochs):
            shuffled = order.permutation(len(x_train))
            model.partial_fit(x_train[shuffled], y_train[shuffled], classes=classes)
            scores.append(100.0 * model.score(x_val, y_val))
        out.append({"config": config, "scores": scores})
    return out


# --- advisor overhead ------------------------------------------------------------------------------


def overhead_p50(storage, trials, params):
    sampler = optuna.samplers.TPESampler(seed=0, multivariate=True)
    study = optuna.create_study(sampler=sampler, storage=storage)
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        trial = study.ask()
        x = [trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(params)]
        study.tell(trial, sum((v - 0.3) ** 2 for v in x))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0


def overhead(args):
    with tempfile.TemporaryDirectory() as directory:
        sqlite = "sqlite:///" + os.path.join(directory, "optuna.db")
        return {
            "memory_ms": overhead_p50(None, args.trials, args.params),
            "sqlite_ms": overhead_p50(sqlite, args.trials, args.params),
        }


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--functions", default="branin,hartmann6,rosenbrock10")
    q.add_argument("--seeds", type=int, default=20)
    q.add_argument("--trials", type=int, default=100)
    c = sub.add_parser("curves")
    c.add_argument("--configs", type=int, default=200)
    c.add_argument("--epochs", type=int, default=81)
    c.add_argument("--seed", type=int, default=0)
    o = sub.add_parser("overhead")
    o.add_argument("--trials", type=int, default=1000)
    o.add_argument("--params", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps({"quality": quality, "curves": curves, "overhead": overhead}[args.mode](args)))


if __name__ == "__main__":
    main()
