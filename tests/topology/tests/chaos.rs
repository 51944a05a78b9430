//! The mixed workload on the topology while a seeded chaos loop SIGKILLs a random service
//! replica or NATS node every 5 s and restarts it 2 s later, and Postgres is restarted once.
//! At the end: every job terminal once with the right exit code, the batch's counters exact
//! (and adding up at every poll), every metric point stored once, every log line once and in
//! order, and no process of a job left behind.
//!
//! `KILN_CHAOS_SCALE=10` runs ten times the workload; `KILN_CHAOS_SEED` picks another seed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_proto::v1 as pb;
use kiln_topology::{Options, Topology};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{client, workload};
use client::Clients;
use workload::{
    Kind, get_batch, get_job, leftover_job_processes, sdk_job, sdk_python, spec, start_batch, stored_lines,
    stored_points, submit, terminal,
};

/// How long the whole workload may take before the test gives up (per unit of scale).
const PATIENCE: Duration = Duration::from_secs(600);

fn scale() -> usize {
    std::env::var("KILN_CHAOS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// The chaos loop: every 5 s a seeded pick among every service instance and NATS node is
/// SIGKILLed and started again 2 s later; Postgres is restarted once, at the third round.
/// Returns what it did, for the report.
fn chaos(topology: Arc<Mutex<Topology>>, seed: u64, done: Arc<AtomicBool>) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the chaos loop");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut log = Vec::new();
    let mut round = 0;
    let nats_nodes = kiln_core::testing::NatsCluster::SIZE;
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_secs(5));
        if done.load(Ordering::SeqCst) {
            break;
        }
        round += 1;
        if round == 3 {
            topology.lock().expect("topology lock").postgres.restart();
            log.push("postgres restarted".to_string());
            continue;
        }
        let instances = topology.lock().expect("topology lock").instances();
        let pick = rng.random_range(0..instances.len() + nats_nodes);
        let target = if pick < instances.len() {
            Target::Instance(instances[pick].clone())
        } else {
            Target::Nats(pick - instances.len())
        };
        {
            let mut topology = topology.lock().expect("topology lock");
            match &target {
                Target::Instance(name) => topology.kill(name),
                Target::Nats(node) => topology.nats.kill(*node),
            }
        }
        std::thread::sleep(Duration::from_secs(2));
        let mut topology = topology.lock().expect("topology lock");
        match &target {
            Target::Instance(name) => {
                topology.restart(name);
                log.push(format!("{name} killed and restarted"));
            }
            Target::Nats(node) => {
                topology.nats.start_node(*node);
                runtime.block_on(topology.nats.wait_healthy(*node));
                log.push(format!("nats-{node} killed and restarted"));
            }
        }
    }
    log
}

enum Target {
    Instance(String),
    Nats(usize),
}

#[test]
fn a_mixed_workload_survives_a_chaos_loop() {
    let scale = scale();
    let seed: u64 = std::env::var("KILN_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let (jobs, items, points, lines) = (100 * scale, 20_000 * scale, 200_000 * scale, 20_000 * scale);
    let python = sdk_python();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let topology = runtime.block_on(Topology::start(Options::from_env()));
    let dir = topology.dir.clone();
    let clients = Clients {
        token: topology.token.clone(),
        api: vec![topology.url("api-1"), topology.url("api-2")],
        logs: vec![topology.url("log-ingest-1"), topology.url("log-ingest-2")],
        batches: vec![topology.url("item-batch-1"), topology.url("item-batch-2")],
    };
    let topology = Arc::new(Mutex::new(topology));
    let done = Arc::new(AtomicBool::new(false));
    let chaos_loop = {
        let (topology, done) = (topology.clone(), done.clone());
        std::thread::spawn(move || chaos(topology, seed, done))
    };
    let started = Instant::now();
    let outcome = runtime.block_on(async {
        let batch_id = start_batch(&clients, items).await;
        let sdk = submit(&clients, spec("sdk", sdk_job(&python, points, lines))).await;
        let mut submitted: BTreeMap<String, Kind> = BTreeMap::new();
        for n in 0..jobs {
            let kind = Kind::of(n);
            let job = submit(&clients, spec(&format!("job-{n}"), kind.command())).await;
            submitted.insert(job.id, kind);
        }
        // Poll until every job is terminal and the batch is done; the counters add up at every poll.
        let deadline = Instant::now() + PATIENCE * u32::try_from(scale).unwrap_or(1);
        let mut ended: BTreeMap<String, pb::Job> = BTreeMap::new();
        let mut batch;
        loop {
            batch = get_batch(&clients, &batch_id).await;
            let counts = batch.counts.expect("counts");
            assert_eq!(
                counts.pending + counts.running + counts.succeeded + counts.failed + counts.dead,
                counts.total,
                "the counters add up at every poll: {counts:?}"
            );
            for id in submitted.keys().chain(std::iter::once(&sdk.id)) {
                if !ended.contains_key(id) {
                    let job = get_job(&clients, id).await;
                    if terminal(&job) {
                        ended.insert(id.clone(), job);
                    }
                }
            }
            let batch_done = batch.state == pb::BatchState::Done as i32;
            if batch_done && ended.len() == submitted.len() + 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the workload did not finish: {} of {} jobs ended, batch {counts:?}",
                ended.len(),
                submitted.len() + 1
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        (batch, sdk.id, submitted, ended)
    });
    done.store(true, Ordering::SeqCst);
    let chaos_log = chaos_loop.join().expect("the chaos loop");
    let (batch, sdk_id, submitted, ended) = outcome;
    eprintln!(
        "chaos: workload done in {:.0} s, {} faults: {}",
        started.elapsed().as_secs_f64(),
        chaos_log.len(),
        chaos_log.join(", ")
    );

    // Every job ended once, as its kind says.
    for (id, kind) in &submitted {
        let job = &ended[id];
        let (state, code) = kind.expected();
        assert_eq!(
            (pb::JobState::try_from(job.state).unwrap(), job.exit_code),
            (state, Some(code)),
            "job {id} ({kind:?}) ended wrongly: {job:?}"
        );
    }
    let sdk = &ended[&sdk_id];
    assert_eq!(
        pb::JobState::try_from(sdk.state).unwrap(),
        pb::JobState::Succeeded,
        "the SDK job: {sdk:?}"
    );
    // Every submit made one job, however often it was retried.
    let listed = runtime.block_on(async {
        clients
            .jobs("list jobs", |mut client| async move {
                let request = pb::ListJobsRequest {
                    all: true,
                    limit: 10_000,
                    ..Default::default()
                };
                client.list_jobs(request).await.map(|r| r.into_inner().jobs)
            })
            .await
            .expect("list jobs")
    });
    let mut made: BTreeMap<String, usize> = BTreeMap::new();
    for job in &listed {
        let name = job.spec.as_ref().map(|spec| spec.name.clone()).unwrap_or_default();
        if name == "sdk" || name.starts_with("job-") {
            *made.entry(name).or_default() += 1;
        }
    }
    assert_eq!(made.len(), jobs + 1, "jobs made: {made:?}");
    assert!(
        made.values().all(|count| *count == 1),
        "a submit made two jobs: {made:?}"
    );
    // Terminal means terminal: nothing moved any job after it ended.
    runtime.block_on(async {
        for (id, first) in &ended {
            let again = get_job(&clients, id).await;
            assert_eq!(
                (again.state, again.version),
                (first.state, first.version),
                "job {id} changed after it ended"
            );
        }
    });

    // The batch: exact counters.
    let counts = batch.counts.expect("counts");
    let dead = (0..items).filter(|n| n % 1000 == 0).count() as u64;
    assert_eq!(
        (
            counts.total,
            counts.succeeded,
            counts.dead,
            counts.failed,
            counts.pending,
            counts.running
        ),
        (items as u64, items as u64 - dead, dead, 0, 0, 0),
        "batch counters: {counts:?}"
    );

    // Every metric point stored once, every log line of the last attempt once and in order.
    let (stored, log_lines) = runtime.block_on(async {
        (
            stored_points(&clients, &sdk_id, points).await,
            stored_lines(&clients, &sdk_id, sdk.attempt).await,
        )
    });
    assert_eq!(stored.len(), points, "metric points stored");
    for (n, point) in stored.iter().enumerate() {
        assert_eq!((point.step, point.value), (n as i64, n as f64), "point {n}");
    }
    let printed: Vec<String> = log_lines.into_iter().filter(|line| line.starts_with("line ")).collect();
    let expected: Vec<String> = (0..lines).map(|n| format!("line {n}")).collect();
    assert!(
        printed == expected,
        "log lines: {} stored, {} printed",
        printed.len(),
        expected.len()
    );

    // No process of a job is left (batch workers leave by themselves once idle).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut left = leftover_job_processes(&dir);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        left = leftover_job_processes(&dir);
    }
    assert!(left.is_empty(), "job processes left behind: {left:?}");
    let mut topology = Arc::try_unwrap(topology)
        .ok()
        .expect("the chaos loop ended")
        .into_inner()
        .expect("topology lock");
    topology.stop();
}
