"""Checks what tests/render rendered (the JSON of `tofu output -json`, on stdin): every user data
is valid bash (`bash -n`), every config is TOML whose keys are the ones deploy/compose/config gives
that service, plus the few that only the AWS deployment sets. A misspelt key would otherwise
show only on a booting instance, as the service refusing its config."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

TOPOLOGY = Path(__file__).resolve().parents[3] / "compose" / "config"
# The compose config file (the one the topology harness runs too) each rendered config is
# compared with.
TOPOLOGY_FILE = {
    "api": "api.toml",
    "scheduler": "scheduler.toml",
    "log-ingest": "log-ingest.toml",
    "item-batch": "item-batch.toml",
    "advisor": "advisor.toml",
    "predictor": "predictor.toml",
    "runner": "runner.toml",
}
# Keys the AWS deployment sets that the local topology leaves at their defaults.
EXTRA = {
    "metrics.listen",
    "objects.region",
    "scylla.replication-factor",
    # compose sets them in the environment (KILN_LOG_INGEST__SCYLLA__*).
    "scylla.username",
    "scylla.password-file",
    "agent-binary",
    "agent-path",
    "database.max-connections",
}


def keys(table, prefix=""):
    out = set()
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= keys(value, f"{name}.")
        else:
            out.add(name)
    return out


def topology_keys(name):
    return keys(tomllib.loads((TOPOLOGY / name).read_text()))


def main():
    outputs = json.load(sys.stdin)
    problems = []
    configs = outputs["configs"]["value"]
    for service, text in sorted(configs.items()):
        try:
            rendered = keys(tomllib.loads(text))
        except tomllib.TOMLDecodeError as error:
            problems.append(f"{service}: the rendered config is not TOML: {error}")
            continue
        known = topology_keys(TOPOLOGY_FILE[service]) | EXTRA
        # The database URL comes from the environment, so [database] url is never rendered.
        unknown = sorted(rendered - known)
        if unknown:
            problems.append(f"{service}: keys in no topology file: {', '.join(unknown)}")
        print(f"config {service}: {len(rendered)} keys, TOML")
    for kind, script in sorted(outputs["user_data"]["value"].items()):
        result = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        if result.returncode != 0:
            problems.append(f"user data {kind}: bash -n: {result.stderr.strip()}")
            continue
        # The Python helper inside the script (kiln-database-env), where there is one.
        if "<<'PY'\n" in script:
            helper = script.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
            try:
                compile(helper, f"{kind}:kiln-database-env", "exec")
            except SyntaxError as error:
                problems.append(f"user data {kind}: kiln-database-env: {error}")
                continue
        print(f"user data {kind}: {len(script.splitlines())} lines, bash -n ok")
    if len(configs) != len(TOPOLOGY_FILE):
        problems.append(f"rendered configs {sorted(configs)}, expected {sorted(TOPOLOGY_FILE)}")
    for problem in problems:
        print(f"render check: {problem}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
