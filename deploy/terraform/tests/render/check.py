"""Checks what tests/render rendered (the JSON of `tofu output -json`, on stdin): every user data
is valid bash (`bash -n`), every config is TOML whose keys are the ones deploy/compose/config gives
that service, plus the few that only the AWS deployment sets. provisioner.toml, which compose
does not run yet, is checked against the pool keys kiln_cloud::PoolSpec reads
(services/cloud/src/pool.rs and types.rs). A misspelt key would otherwise show only on a booting instance,
as the service refusing its config. The provisioner's launch ARNs (statement LaunchFromThePools
of its role) must name the placement group of each pool that has one, and no other."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
TOPOLOGY = REPO / "deploy" / "compose" / "config"
POOL_SPEC = REPO / "services" / "cloud" / "src" / "pool.rs"
REQUIREMENTS = REPO / "services" / "cloud" / "src" / "types.rs"
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
    # The runner's instance metadata poller, on EC2 only (compose runners have no IMDS).
    "imds.enabled",
    # The pool's ECR repositories pulled with the instance role (compose has no instance role).
    "ecr.registries",
}

# provisioner.toml: the service's own keys, and each [[pools]] entry's (docs/provisioner.md
# section 6). Every pool key rendered must be a field of kiln_cloud::PoolSpec.
PROVISIONER_KEYS = {
    "instance-name",
    "cluster",
    "grpc.listen",
    "metrics.enabled",
    "metrics.listen",
    "nats.url",
    "nats.replicas",
    "nats.nkey-seed-file",
}
POOL_REQUIRED = {
    "name",
    "cloud",
    "region",
    "subnets",
    "capacity-types",
    "launch-template",
    "max-instances",
    "idle-timeout-secs",
    "boot-timeout-secs",
    "labels",
    "on-demand-prices",
    "disk",
}
POOL_KEYS = POOL_REQUIRED | {"instance-types", "requirements", "placement-group"}
DISK_KEYS = {"max-job-gib", "root-gib", "root-device"}
# An EC2 placement group's ARN, as IAM matches it: by the group's name, not its pg- id.
PLACEMENT_GROUP_ARN = re.compile(r"^arn:[a-z-]+:ec2:([a-z0-9-]+):([0-9]{12}):placement-group/(.+)$")
REQUIREMENT_RANGES = {"vcpu", "memory-gib", "gpus"}
REQUIREMENT_LISTS = {"gpu-model", "families"}


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


def rust_struct_fields(source, name):
    """The kebab-case field names of `pub struct NAME { ... }` in Rust source (serde's
    rename_all = "kebab-case"), or None when the struct is not there."""
    match = re.search(r"pub struct " + name + r" \{(.*?)\n\}", source, re.S)
    if match is None:
        return None
    return {field.replace("_", "-") for field in re.findall(r"^\s*pub (\w+):", match.group(1), re.M)}


def check_pool(index, pool):
    """Problems with one [[pools]] entry of provisioner.toml."""
    where = f"provisioner: [[pools]] {index} ({pool.get('name', '?')})"
    problems = []
    missing = sorted(POOL_REQUIRED - pool.keys())
    unknown = sorted(pool.keys() - POOL_KEYS)
    if missing:
        problems.append(f"{where}: missing {', '.join(missing)}")
    if unknown:
        problems.append(f"{where}: unknown keys {', '.join(unknown)}")
    if pool.get("cloud") != "ec2":
        problems.append(f"{where}: cloud is {pool.get('cloud')!r}, not 'ec2'")
    if ("instance-types" in pool) == ("requirements" in pool):
        problems.append(f"{where}: needs instance-types or requirements, exactly one")
    if "instance-types" in pool and not (
        pool["instance-types"] and all(isinstance(t, str) for t in pool["instance-types"])
    ):
        problems.append(f"{where}: instance-types must be a non-empty list of names")
    requirements = pool.get("requirements", {})
    if not isinstance(requirements, dict) or requirements.keys() - REQUIREMENT_RANGES - REQUIREMENT_LISTS:
        problems.append(f"{where}: requirements must be a table of {sorted(REQUIREMENT_RANGES | REQUIREMENT_LISTS)}")
        requirements = {}
    for key in REQUIREMENT_RANGES & requirements.keys():
        value = requirements[key]
        if not (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            and 0 <= value[0] <= value[1]
        ):
            problems.append(f"{where}: requirements.{key} must be [lo, hi] with 0 <= lo <= hi, not {value!r}")
    for key in REQUIREMENT_LISTS & requirements.keys():
        if not all(isinstance(v, str) for v in requirements[key]):
            problems.append(f"{where}: requirements.{key} must be a list of strings")
    capacity = pool.get("capacity-types", [])
    if not capacity or len(set(capacity)) != len(capacity) or set(capacity) - {"spot", "on-demand"}:
        problems.append(f"{where}: capacity-types must be 'spot' and/or 'on-demand', not {capacity!r}")
    if not pool.get("subnets") or not all(isinstance(s, str) for s in pool.get("subnets", [])):
        problems.append(f"{where}: subnets must be a non-empty list of ids")
    for key in ("max-instances", "idle-timeout-secs", "boot-timeout-secs"):
        value = pool.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            problems.append(f"{where}: {key} must be an integer of at least 1, not {value!r}")
    if not isinstance(pool.get("labels"), dict) or not all(
        isinstance(v, str) for v in pool.get("labels", {}).values()
    ):
        problems.append(f"{where}: labels must be a table of strings")
    prices = pool.get("on-demand-prices")
    if not isinstance(prices, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in prices.values()
    ):
        problems.append(f"{where}: on-demand-prices must be a table of positive numbers")
    group = pool.get("placement-group")
    if "placement-group" in pool and not (
        isinstance(group, str) and 0 < len(group) <= 255 and group.isascii() and "*" not in group
    ):
        problems.append(f"{where}: placement-group must be a placement group's name (1 to 255 ASCII characters), not {group!r}")
    disk = pool.get("disk")
    if not isinstance(disk, dict) or disk.keys() != DISK_KEYS:
        problems.append(f"{where}: disk must be a table of {sorted(DISK_KEYS)}, not {disk!r}")
    else:
        whole = lambda v, least: isinstance(v, int) and not isinstance(v, bool) and v >= least
        if not (whole(disk["max-job-gib"], 0) and whole(disk["root-gib"], 1)):
            problems.append(f"{where}: disk's max-job-gib must be a whole number of GiB, root-gib at least 1: {disk!r}")
        if not (isinstance(disk["root-device"], str) and disk["root-device"].startswith("/dev/")):
            problems.append(f"{where}: disk.root-device must be a device path, not {disk['root-device']!r}")
    return problems


def check_provisioner(config):
    """Problems with the rendered provisioner.toml (already parsed)."""
    problems = []
    top = {k: v for k, v in config.items() if k != "pools"}
    unknown = sorted(keys(top) - PROVISIONER_KEYS)
    if unknown:
        problems.append(f"provisioner: unknown keys {', '.join(unknown)}")
    if not config.get("cluster"):
        problems.append("provisioner: no cluster")
    pools = config.get("pools")
    if not isinstance(pools, list) or not pools:
        problems.append("provisioner: no [[pools]] (the sample renders two)")
        return problems
    for index, pool in enumerate(pools):
        problems += check_pool(index, pool)
    if not any("instance-types" in p for p in pools) or not any("requirements" in p for p in pools):
        problems.append("provisioner: the sample must render a pool of each kind (instance-types, requirements)")
    # A null placement_group writes no key at all (the provisioner reads a missing key as none).
    if not any("placement-group" in p for p in pools) or all("placement-group" in p for p in pools):
        problems.append("provisioner: the sample must render a pool with placement-group (cluster_placement) and one without")
    fields = rust_struct_fields(POOL_SPEC.read_text(), "PoolSpec") if POOL_SPEC.exists() else None
    if fields is None:
        problems.append(f"provisioner: no `pub struct PoolSpec` in {POOL_SPEC} to compare the pool keys with")
    elif POOL_KEYS - fields:
        problems.append(f"provisioner: pool keys kiln_cloud::PoolSpec does not have: {', '.join(sorted(POOL_KEYS - fields))}")
    disk_fields = rust_struct_fields(POOL_SPEC.read_text(), "PoolDisk") if POOL_SPEC.exists() else None
    if disk_fields is None or DISK_KEYS - disk_fields:
        problems.append(f"provisioner: disk keys kiln_cloud::PoolDisk does not have: {', '.join(sorted(DISK_KEYS - (disk_fields or set())))}")
    requirements = rust_struct_fields(REQUIREMENTS.read_text(), "Requirements") if REQUIREMENTS.exists() else None
    if requirements is not None and (REQUIREMENT_RANGES | REQUIREMENT_LISTS) - requirements:
        problems.append(
            "provisioner: requirement keys kiln_cloud::Requirements does not have: "
            + ", ".join(sorted((REQUIREMENT_RANGES | REQUIREMENT_LISTS) - requirements))
        )
    return problems


def check_launch(pools, resources):
    """The provisioner may launch into each pool's placement group (by its name's ARN, in the
    pool's region) and into no other: a group of a pool without cluster_placement, or a
    wildcard, would let it place runners where the pool did not ask."""
    problems = []
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        return [f"provisioner launch: the resources must be a list of ARNs, not {resources!r}"]
    granted = set()
    for arn in resources:
        if ":placement-group/" not in arn:
            continue
        match = PLACEMENT_GROUP_ARN.match(arn)
        if match is None or "*" in arn:
            problems.append(f"provisioner launch: {arn} is not one placement group's ARN (arn:PARTITION:ec2:REGION:ACCOUNT:placement-group/NAME)")
            continue
        granted.add((match.group(1), match.group(3)))
    wanted = {(p.get("region"), p["placement-group"]) for p in pools if isinstance(p.get("placement-group"), str)}
    for region, group in sorted(wanted - granted):
        problems.append(f"provisioner launch: no ARN of the placement group {group} (region {region}) in LaunchFromThePools")
    for region, group in sorted(granted - wanted):
        problems.append(f"provisioner launch: the placement group {group} (region {region}) is no pool's placement-group")
    return problems


def check_runner(config):
    """The runner of a pool's launch template polls the instance metadata and names its pool."""
    problems = []
    if config.get("imds", {}).get("enabled") is not True:
        problems.append("runner: [imds] enabled is not true")
    if not config.get("pool"):
        problems.append("runner: no pool")
    return problems


def main():
    outputs = json.load(sys.stdin)
    problems = []
    configs = outputs["configs"]["value"]
    launch = outputs["provisioner_launch"]["value"]
    for service, text in sorted(configs.items()):
        try:
            parsed = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            problems.append(f"{service}: the rendered config is not TOML: {error}")
            continue
        if service == "provisioner":
            problems += check_provisioner(parsed)
            pools = [p for p in parsed.get("pools", []) if isinstance(p, dict)]
            problems += check_launch(pools, launch)
            groups = [p["placement-group"] for p in pools if "placement-group" in p]
            print(f"config provisioner: {len(pools)} pools, TOML; placement groups {groups}, each in LaunchFromThePools")
            continue
        if service == "runner":
            problems += check_runner(parsed)
        rendered = keys(parsed)
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
    expected = sorted([*TOPOLOGY_FILE, "provisioner"])
    if sorted(configs) != expected:
        problems.append(f"rendered configs {sorted(configs)}, expected {expected}")
    for problem in problems:
        print(f"render check: {problem}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
