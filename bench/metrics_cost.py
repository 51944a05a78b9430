"""What metrics cost: the metric-ingest and batch benchmarks on kiln without metrics (a build
of the commit before them) and on kiln with them, its /metrics scraped every second, in one
run, alternating the two so that the machine's drift falls on both.

    python bench/metrics_cost.py --kiln target/release/kiln --baseline /path/to/old/kiln \\
        [--rounds 3] [--points 200000] [--items 20000]

Rows: 4 clients sending requests of 1,000 points (metrics_throughput.py's like-for-like row,
SQLite stores), and kiln:noop items through 2 workers (batch_throughput.py's first row, timed
from the first `kiln batch add` to DONE). Each
prints the median of its rounds and the ratio with metrics over without (goal: >= 0.97).
"""

import argparse
import statistics
import sys
import tempfile

import kiln_batch
import metrics_throughput

METRICS_FLAGS = ["--metrics-addr", "127.0.0.1:0"]


def ingest(args, binary, scrape):
    flags = METRICS_FLAGS if scrape else []
    label = "metrics on" if scrape else "metrics off"
    bench = argparse.Namespace(kiln=binary, points=args.points)
    return metrics_throughput.kiln_rate(bench, 4, "series", flags, label, scrape=scrape)[2]


def batch(args, binary, scrape, workdir, round_):
    flags = METRICS_FLAGS if scrape else []
    name = f"{'on' if scrape else 'off'}-{round_}"
    with kiln_batch.Kiln(binary, workdir, name, flags) as kiln:
        scraper = metrics_throughput.Scraper(kiln.log) if scrape else None
        row = kiln.run_batch(name, ["kiln:noop"], args.items)
        if scraper is not None and scraper.stop() == 0:
            raise SystemExit("kiln up printed no metrics address, or /metrics never answered")
    # From the first `kiln batch add` to DONE: workers start while the batch is still open, so
    # with many items most are done before the seal, and a rate from the seal alone says little.
    return row["items"] / (row["add_seconds"] + row["seconds"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kiln", required=True, help="kiln with metrics")
    parser.add_argument("--baseline", required=True, help="kiln built from the commit before metrics")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--points", type=int, default=200_000, help="points per client")
    parser.add_argument("--items", type=int, default=20_000)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="kiln-metrics-cost-")
    rates = {key: [] for key in ("ingest off", "ingest on", "batch off", "batch on")}
    for round_ in range(args.rounds):
        for scrape, binary in ((False, args.baseline), (True, args.kiln)):
            side = "on" if scrape else "off"
            rates[f"ingest {side}"].append(ingest(args, binary, scrape))
            rates[f"batch {side}"].append(batch(args, binary, scrape, workdir, round_))
            print(f"round {round_ + 1}, metrics {side}: ingest {rates[f'ingest {side}'][-1]:,.0f} points/s, "
                  f"batch {rates[f'batch {side}'][-1]:,.0f} items/s", file=sys.stderr, flush=True)
    print(f"median of {args.rounds} rounds; metrics on = /metrics scraped every second")
    print(f"{'':58} {'metrics off':>12} {'metrics on':>12} {'on/off':>7}")
    for what, unit in (("ingest", "points/s, 4 clients x 1,000-point requests"), ("batch", "items/s, kiln:noop, 2 workers, add to done")):
        off, on = statistics.median(rates[f"{what} off"]), statistics.median(rates[f"{what} on"])
        print(f"{what + ' (' + unit + ')':58} {off:>12,.0f} {on:>12,.0f} {on / off:>7.3f}")
    print("every round:", {key: [round(r) for r in values] for key, values in rates.items()})


if __name__ == "__main__":
    main()
