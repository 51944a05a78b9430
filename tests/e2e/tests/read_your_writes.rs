//! Read-your-writes of metrics across log-ingest replicas: once the SDK's `kiln.finish()` has
//! returned, or a job is terminal, LatestMetrics and QueryMetrics show every point it logged,
//! whichever replica answers (another than the one that took the points). Three log-ingest
//! replicas on the shared ScyllaDB stores (played by Cassandra, `KILN_TEST_SCYLLA_NODES`), a real
//! nats-server, and the Python SDK (`KILN_TEST_PYTHON`, a venv with ./sdk/python installed).

use std::net::SocketAddr;

use kiln_core::auth::BearerInterceptor;
use kiln_core::config::GrpcConfig;
use kiln_e2e::{ServiceHandle, Stack};
use kiln_log_ingest::scylla_store::ScyllaConfig;
use kiln_log_ingest::{Config, LogIngest, StoreKind};
use kiln_proto::v1 as pb;
use kiln_proto::v1::log_service_client::LogServiceClient;

/// Runs in the loop, points per run, keys they are spread over.
const RUNS: usize = 20;
const POINTS: usize = 100_000;
const KEYS: usize = 4;
/// How long a read may wait for the writers here: far longer than they can lag.
const READ_WAIT_MS: u64 = 120_000;

/// Logs `POINTS` points per run in `runs` runs outside kiln through the replica KILN_LOGS_ADDR,
/// and right after each `finish()` asks another replica (CHECK_ADDRS, in turn) for the latest
/// step and the count of every key: exits 1 at the first stale answer.
const LOG_THEN_READ: &str = r#"
import os, sys
import grpc, kiln
from kiln.v1 import log_pb2, log_pb2_grpc
runs, points, keys = map(int, sys.argv[1:4])
readers = [log_pb2_grpc.LogServiceStub(grpc.insecure_channel(a)) for a in os.environ["CHECK_ADDRS"].split(",")]
md = (("authorization", f"Bearer {os.environ['KILN_TOKEN']}"),)
steps = points // keys
want_latest = {f"k{k}": steps - 1 for k in range(keys)}
want_total = {f"k{k}": steps for k in range(keys)}
for n in range(runs):
    run = kiln.init(name=f"read-your-writes-{n}")
    for step in range(steps):
        kiln.log({f"k{k}": step * 0.5 + k for k in range(keys)}, step=step)
    kiln.finish()
    reader = readers[n % len(readers)]
    latest = reader.LatestMetrics(log_pb2.LatestMetricsRequest(job_ids=[run.job_id]), metadata=md).series
    got_latest = {s.key: s.points[0].step for s in latest}
    query = reader.QueryMetrics(log_pb2.QueryMetricsRequest(job_ids=[run.job_id], max_points=10), metadata=md).series
    got_total = {s.key: s.total_points for s in query}
    if got_latest != want_latest or got_total != want_total:
        print(f"stale after finish, run {n} ({run.job_id}): latest {got_latest}, totals {got_total}", flush=True)
        sys.exit(1)
    print(run.job_id, flush=True)
"#;

fn python() -> String {
    std::env::var("KILN_TEST_PYTHON").expect(
        "KILN_TEST_PYTHON is not set: run the tests through scripts/test.sh, which installs the SDK into a venv",
    )
}

/// The shared stores in Cassandra, in a keyspace of this test's own.
fn cassandra() -> ScyllaConfig {
    let nodes = std::env::var("KILN_TEST_SCYLLA_NODES")
        .expect("KILN_TEST_SCYLLA_NODES is not set: run the tests through scripts/test.sh, which starts Cassandra");
    ScyllaConfig {
        nodes: nodes.split(',').map(str::to_string).collect(),
        keyspace: format!("kiln_test_{}", kiln_core::ids::new_id().replace('-', "")),
        ..Default::default()
    }
}

/// Replaces the stack's log-ingest (SQLite stores) with `count` replicas on the Scylla stores,
/// sharing the intakes' consumers; the stack's `logs_addr` becomes the first one's.
async fn replicas(stack: &mut Stack, count: usize) -> (Vec<ServiceHandle>, Vec<SocketAddr>) {
    if let Some(sole) = stack.logs.take() {
        sole.stop().await;
    }
    let scylla = cassandra();
    let (mut handles, mut addrs) = (Vec::new(), Vec::new());
    // One after the other: the first applies the CQL schema, the others find it.
    for _ in 0..count {
        let replica = LogIngest::bind(Config {
            grpc: GrpcConfig::local(0),
            database: stack.database.clone(),
            nats: stack.nats.service_config(kiln_core::nats_auth::Service::LogIngest),
            log_store: StoreKind::Scylla,
            metric_store: StoreKind::Scylla,
            // Slow writers: one message at a time, one write request in flight, so they lag
            // behind JetStream (the case read-your-writes is for), and reads wait as long as
            // it takes (a stale answer here is a broken promise, not a slow machine).
            scylla: ScyllaConfig {
                write_concurrency: 1,
                ..scylla.clone()
            },
            batch_size: 1,
            read_wait_ms: READ_WAIT_MS,
            ..Default::default()
        })
        .await
        .expect("a log-ingest replica binds");
        addrs.push(replica.local_addr());
        handles.push(ServiceHandle::spawn(|token| replica.serve(token)));
    }
    stack.logs_addr = addrs[0];
    (handles, addrs)
}

fn urls(addrs: &[SocketAddr]) -> String {
    addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",")
}

async fn logs_at(addr: SocketAddr, token: &str) -> LogServiceClient<kiln_e2e::Authed> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("a URL")
        .connect()
        .await
        .expect("a replica answers");
    LogServiceClient::with_interceptor(channel, BearerInterceptor::new(token))
}

#[tokio::test]
async fn after_finish_every_replica_shows_every_point_at_once() {
    let mut stack = Stack::start_without_runner().await;
    let (_replicas, addrs) = replicas(&mut stack, 3).await;
    let output = tokio::process::Command::new(python())
        .args([
            "-c",
            LOG_THEN_READ,
            &RUNS.to_string(),
            &POINTS.to_string(),
            &KEYS.to_string(),
        ])
        .env("KILN_HOME", stack.dir.path().join("sdk-home"))
        .env("KILN_ADDR", format!("http://{}", stack.api_addr))
        .env("KILN_TOKEN", &stack.token)
        .env("KILN_LOGS_ADDR", format!("http://{}", addrs[0]))
        .env("CHECK_ADDRS", urls(&addrs[1..]))
        .env_remove("KILN_JOB_ID")
        .output()
        .await
        .expect("the SDK's python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.lines().count(), RUNS, "{stdout}");
}

/// Each job logs this many steps of two keys, then exits (the SDK finishes at exit).
const JOB_STEPS: i64 = 30_000;
const JOB: &str = r#"
import sys
import kiln
kiln.init()
for step in range(int(sys.argv[1])):
    kiln.log({"loss": 1.0 / (step + 1), "acc": step * 1e-5}, step=step)
"#;

#[tokio::test]
async fn once_a_job_is_terminal_another_replica_shows_its_last_step() {
    let mut stack = Stack::start_without_runner().await;
    let (_replicas, addrs) = replicas(&mut stack, 3).await;
    // The runner gives its jobs the first replica's address (KILN_LOGS).
    stack.runner = Some(stack.spawn_runner(stack.runner_config("runner-1")).await);
    let python = python();
    let steps = JOB_STEPS.to_string();
    for (n, reader) in addrs[1..].iter().cycle().take(4).enumerate() {
        let job = stack.submit(&[&python, "-c", JOB, &steps]).await;
        let done = stack
            .wait_for(&job.id, "the job's end", |job| {
                use pb::JobState::*;
                matches!(
                    pb::JobState::try_from(job.state),
                    Ok(Succeeded | Failed | Stopped | Lost)
                )
            })
            .await;
        assert_eq!(done.state, pb::JobState::Succeeded as i32, "job {n}: {done:?}");
        let mut logs = logs_at(*reader, &stack.token).await;
        let keys = vec!["acc".to_string(), "loss".to_string()];
        let latest = logs
            .latest_metrics(pb::LatestMetricsRequest {
                job_ids: vec![job.id.clone()],
                keys: keys.clone(),
            })
            .await
            .expect("latest metrics")
            .into_inner()
            .series;
        let steps: Vec<(String, i64)> = latest.iter().map(|s| (s.key.clone(), s.points[0].step)).collect();
        assert_eq!(
            steps,
            [("acc".into(), JOB_STEPS - 1), ("loss".into(), JOB_STEPS - 1)],
            "job {n} is terminal: its last step must show at once"
        );
        let totals: Vec<u64> = logs
            .query_metrics(pb::QueryMetricsRequest {
                job_ids: vec![job.id.clone()],
                keys,
                max_points: 10,
                ..Default::default()
            })
            .await
            .expect("query metrics")
            .into_inner()
            .series
            .iter()
            .map(|s| s.total_points)
            .collect();
        assert_eq!(totals, [JOB_STEPS as u64; 2], "job {n}");
    }
}
