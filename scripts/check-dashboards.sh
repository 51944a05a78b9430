#!/usr/bin/env bash
# Checks kiln's Grafana dashboards and Prometheus files:
#  - dashboards (deploy/compose/grafana/dashboards/*.json): generated from
#    deploy/dashboards-check/src, type-checked against @grafana/schema (pinned in
#    deploy/dashboards-check/package.json, locked by its package-lock.json) with
#    `tsc --noEmit --strict`, every panel on the provisioned Prometheus with a PromQL expr that
#    promtool parses (written as recording rules, variables filled in);
#  - alerting rules (deploy/compose/prometheus/rules.yml): `promtool check rules` and their unit
#    tests (`promtool test rules deploy/compose/prometheus/tests/*.yml`);
#  - the compose stack's scrape config: `promtool check config`.
# Needs node/npm (the npm registry, or a warm npm cache) and promtool (Debian `prometheus`, 2.42).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v promtool >/dev/null || { echo "promtool not found: apt-get install prometheus" >&2; exit 1; }
command -v npm >/dev/null || { echo "npm not found: apt-get install npm (Node 20 or later)" >&2; exit 1; }
queries=$(mktemp --suffix=.yml)
trap 'rm -f "$queries"' EXIT

echo "== dashboards"
(
  cd deploy/dashboards-check
  npm ci --no-audit --no-fund --loglevel=error
  npm run --silent check
  node check.mjs --rules "$queries"
)
promtool check rules "$queries"

echo "== prometheus"
promtool --version 2>&1 | head -1
cd deploy/compose/prometheus
promtool check rules rules.yml
promtool test rules tests/*.yml
# check config reads rule_files relative to the config file.
promtool check config prometheus.yml
