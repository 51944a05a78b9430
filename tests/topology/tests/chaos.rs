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

mod client;
use client::Clients;

/// How long the whole workload may take before the test gives up (per unit of scale).
const PATIENCE: Duration = Duration::from_secs(600);

fn scale() -> usize {
    std::env::var("KILN_CHAOS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// What a job of the workload does, and how it must end.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Sleeps and succeeds.
    Plain,
    /// Sleeps and exits with this code.
    Fails(i32),
    /// Counts to six, checkpointing each step to its outputs; a resumed attempt carries on from
    /// the checkpoint.
    Checkpoints,
}

impl Kind {
    fn of(n: usize) -> Kind {
        match n % 5 {
            0 => Kind::Fails(i32::try_from(n % 7).unwrap_or(0) + 1),
            1 => Kind::Checkpoints,
            _ => Kind::Plain,
        }
    }

    fn command(self) -> Vec<String> {
        let script = match self {
            Kind::Plain => "sleep 1".to_string(),
            Kind::Fails(code) => format!("sleep 1; exit {code}"),
            Kind::Checkpoints => concat!(
                "s=0; if [ -n \"$KILN_RESUME_FROM\" ] && [ -f \"$KILN_RESUME_FROM/ckpt\" ]; then s=$(cat \"$KILN_RESUME_FROM/ckpt\"); echo resumed at $s; fi; ",
                "while [ $s -lt 6 ]; do s=$((s+1)); echo $s > \"$KILN_OUTPUTS/ckpt\"; sleep 0.5; done"
            )
            .to_string(),
        };
        vec!["sh".into(), "-c".into(), script]
    }

    fn expected(self) -> (pb::JobState, i32) {
        match self {
            Kind::Fails(code) => (pb::JobState::Failed, code),
            Kind::Plain | Kind::Checkpoints => (pb::JobState::Succeeded, 0),
        }
    }
}

/// The batch's per-item command: `f-*` items fail their first two attempts, `d-*` items always
/// fail (dead letters), the rest succeed.
fn item_command() -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        "case {item} in f-*) [ {attempt} -ge 3 ] ;; d-*) exit 7 ;; *) exit 0 ;; esac".into(),
    ]
}

/// The job that writes metric points through the Python SDK and prints log lines.
fn sdk_job(python: &str, points: usize, lines: usize) -> Vec<String> {
    let script = format!(
        "import kiln\n\
         kiln.init()\n\
         for i in range({points}):\n    kiln.log({{'chaos/x': float(i)}}, step=i)\n\
         kiln.finish()\n\
         import sys\n\
         for i in range({lines}):\n    sys.stdout.write(f'line {{i}}\\n')\n\
         sys.stdout.flush()\n"
    );
    vec![python.to_string(), "-c".into(), script]
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

/// The Python with the kiln SDK installed (scripts/test.sh makes the venv first).
fn sdk_python() -> String {
    std::env::var("KILN_TEST_PYTHON").expect(
        "KILN_TEST_PYTHON is not set: run the tests through scripts/test.sh, which installs the SDK into a venv",
    )
}

fn spec(name: &str, command: Vec<String>) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        command,
        resources: Some(pb::Resources {
            cpu_millis: 250,
            memory_bytes: 128 << 20,
        }),
        // The process runners' pool: the sim pool would simulate these commands, not run them.
        pool: "local".into(),
        ..Default::default()
    }
}

/// Submits a job, retried on other api replicas under the same idempotency key, so a submit
/// whose answer was lost with its replica is not made twice.
async fn submit(clients: &Clients, spec: pb::JobSpec) -> pb::Job {
    let key = format!("chaos-{}", spec.name);
    clients
        .jobs("submit", |mut client| {
            let request = pb::SubmitJobRequest {
                spec: Some(spec.clone()),
                idempotency_key: key.clone(),
            };
            async move { client.submit_job(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("submit")
        .job
        .expect("a job")
}

async fn get_job(clients: &Clients, job_id: &str) -> pb::Job {
    clients
        .jobs("get job", |mut client| {
            let request = pb::GetJobRequest { job_id: job_id.into() };
            async move { client.get_job(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("get job")
}

fn terminal(job: &pb::Job) -> bool {
    matches!(
        pb::JobState::try_from(job.state).unwrap_or_default(),
        pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Stopped | pb::JobState::Lost
    )
}

async fn get_batch(clients: &Clients, batch_id: &str) -> pb::Batch {
    clients
        .batches("get batch", |mut client| {
            let request = pb::BatchRef {
                batch_id: batch_id.into(),
            };
            async move { client.get_batch(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("get batch")
}

/// Creates the batch, adds its items (idempotent by key, so retried freely) and seals it.
async fn start_batch(clients: &Clients, items: usize) -> String {
    let batch = clients
        .batches("create batch", |mut client| {
            let request = pb::CreateBatchRequest {
                spec: Some(pb::BatchSpec {
                    name: "chaos".into(),
                    command: item_command(),
                    cpu_millis: 250,
                    memory_mb: 64,
                    max_attempts: 3,
                    max_workers: 6,
                    pool: "local".into(),
                    ..Default::default()
                }),
            };
            async move { client.create_batch(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("create batch");
    let keys: Vec<String> = (0..items)
        .map(|n| match n % 1000 {
            0 => format!("d-{n}"),
            m if m % 100 == 1 => format!("f-{n}"),
            _ => format!("ok-{n}"),
        })
        .collect();
    for chunk in keys.chunks(2000) {
        let requests: Vec<pb::AddItemsRequest> = chunk
            .chunks(500)
            .map(|part| pb::AddItemsRequest {
                batch_id: batch.id.clone(),
                items: part
                    .iter()
                    .map(|key| pb::Item {
                        key: key.clone(),
                        uri: format!("mem://{key}"),
                        params: Default::default(),
                    })
                    .collect(),
            })
            .collect();
        clients
            .batches("add items", |mut client| {
                let requests = requests.clone();
                async move {
                    client
                        .add_items(futures::stream::iter(requests))
                        .await
                        .map(|r| r.into_inner())
                }
            })
            .await
            .expect("add items");
    }
    clients
        .batches("seal", |mut client| {
            let request = pb::BatchRef {
                batch_id: batch.id.clone(),
            };
            async move { client.seal_batch(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("seal");
    batch.id
}

/// Every point of the SDK job's series, read back raw in windows.
async fn stored_points(clients: &Clients, job_id: &str, points: usize) -> Vec<pb::MetricPoint> {
    let mut out = Vec::new();
    let window = 50_000i64;
    let mut from = 0i64;
    while from < i64::try_from(points).unwrap_or(i64::MAX) {
        let series = clients
            .logs("query metrics", |mut client| {
                let request = pb::QueryMetricsRequest {
                    job_ids: vec![job_id.into()],
                    keys: vec!["chaos/x".into()],
                    min_step: Some(from),
                    max_step: Some(from + window - 1),
                    max_points: 100_000,
                };
                async move { client.query_metrics(request).await.map(|r| r.into_inner()) }
            })
            .await
            .expect("query metrics");
        for one in series.series {
            out.extend(one.points);
        }
        from += window;
    }
    out
}

/// The log lines of one attempt of a job.
async fn stored_lines(clients: &Clients, job_id: &str, attempt: i32) -> Vec<String> {
    use futures::StreamExt;
    let lines = clients
        .logs("get logs", |mut client| {
            let request = pb::GetLogsRequest {
                job_id: job_id.into(),
                follow: false,
            };
            async move {
                let mut stream = client.get_logs(request).await?.into_inner();
                let mut lines = Vec::new();
                while let Some(line) = stream.next().await {
                    lines.push(line?);
                }
                Ok(lines)
            }
        })
        .await
        .expect("get logs");
    let mut ours: Vec<pb::LogLine> = lines.into_iter().filter(|line| line.attempt == attempt).collect();
    ours.sort_by_key(|line| line.seq);
    ours.into_iter().map(|line| line.text).collect()
}

/// Processes on this machine that are jobs of the topology (their `KILN_OUTPUTS` is under its
/// directory), still alive.
fn leftover_job_processes(dir: &std::path::Path) -> Vec<String> {
    let marker = format!("KILN_OUTPUTS={}", dir.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let has_marker = environ
            .split(|byte| *byte == 0)
            .any(|var| var.starts_with(marker.as_bytes()));
        if has_marker {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(format!(
                "pid {}: {}",
                entry.file_name().to_string_lossy(),
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            ));
        }
    }
    found
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
