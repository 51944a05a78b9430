#!/usr/bin/env python3
"""CQL round trip against the node started by start.sh (manual check, not part of CI).

    python3 -m venv /tmp/cass-venv && /tmp/cass-venv/bin/pip install cassandra-driver==3.30.1
    /tmp/cass-venv/bin/python scripts/cassandra/cql_smoke.py     # CASSANDRA_NATIVE_PORT honoured

Uses native protocol v4, the only version the Rust `scylla` driver speaks.
"""
import datetime
import os
import sys

from cassandra.cluster import Cluster

port = int(os.environ.get("CASSANDRA_NATIVE_PORT", "9042"))
cluster = Cluster(["127.0.0.1"], port=port, protocol_version=4)
s = cluster.connect()
row = s.execute("SELECT release_version, cluster_name FROM system.local").one()
print(f"connected: Cassandra {row.release_version}, cluster {row.cluster_name!r}, protocol v{cluster.protocol_version}")

s.execute("DROP KEYSPACE IF EXISTS kiln_smoke")
s.execute("CREATE KEYSPACE kiln_smoke WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
s.execute(
    """
    CREATE TABLE kiln_smoke.samples (
        series text, ts timestamp, value double,
        PRIMARY KEY ((series), ts)
    ) WITH CLUSTERING ORDER BY (ts DESC)
      AND compaction = {'class': 'TimeWindowCompactionStrategy',
                        'compaction_window_unit': 'HOURS', 'compaction_window_size': 1}
      AND default_time_to_live = 86400
    """
)
ins = s.prepare("INSERT INTO kiln_smoke.samples (series, ts, value) VALUES (?, ?, ?)")
t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
for i in range(5):
    s.execute(ins, ("cpu", t0 + datetime.timedelta(seconds=10 * i), i * 1.5))

rows = list(s.execute("SELECT series, ts, value, TTL(value) AS ttl FROM kiln_smoke.samples WHERE series = 'cpu'"))
for r in rows:
    print(f"  {r.series} {r.ts.isoformat()} {r.value} ttl={r.ttl}")
opts = s.execute(
    "SELECT compaction, default_time_to_live FROM system_schema.tables "
    "WHERE keyspace_name = 'kiln_smoke' AND table_name = 'samples'"
).one()
print(f"table: compaction={opts.compaction['class']}, default_time_to_live={opts.default_time_to_live}")

ok = len(rows) == 5 and all(0 < r.ttl <= 86400 for r in rows) and opts.default_time_to_live == 86400
s.execute("DROP KEYSPACE kiln_smoke")
cluster.shutdown()
print("OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
