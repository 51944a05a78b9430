//! The chaos workload: what its jobs and items do, and the calls that submit it and read it
//! back, each through the replica-hopping [`Clients`].

use kiln_proto::v1 as pb;

use crate::client::Clients;

/// What a job of the workload does, and how it must end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Sleeps and succeeds.
    Plain,
    /// Sleeps and exits with this code.
    Fails(i32),
    /// Counts to six, checkpointing each step to its outputs; a resumed attempt carries on from
    /// the checkpoint.
    Checkpoints,
}

impl Kind {
    pub fn of(n: usize) -> Kind {
        match n % 5 {
            0 => Kind::Fails(i32::try_from(n % 7).unwrap_or(0) + 1),
            1 => Kind::Checkpoints,
            _ => Kind::Plain,
        }
    }

    pub fn command(self) -> Vec<String> {
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

    pub fn expected(self) -> (pb::JobState, i32) {
        match self {
            Kind::Fails(code) => (pb::JobState::Failed, code),
            Kind::Plain | Kind::Checkpoints => (pb::JobState::Succeeded, 0),
        }
    }
}

/// The batch's per-item command: `f-*` items fail their first two attempts, `d-*` items always
/// fail (dead letters), the rest succeed.
pub fn item_command() -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        "case {item} in f-*) [ {attempt} -ge 3 ] ;; d-*) exit 7 ;; *) exit 0 ;; esac".into(),
    ]
}

/// The job that writes metric points through the Python SDK and prints log lines.
pub fn sdk_job(python: &str, points: usize, lines: usize) -> Vec<String> {
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

/// The Python with the kiln SDK installed (scripts/test.sh makes the venv first).
pub fn sdk_python() -> String {
    std::env::var("KILN_TEST_PYTHON").expect(
        "KILN_TEST_PYTHON is not set: run the tests through scripts/test.sh, which installs the SDK into a venv",
    )
}

pub fn spec(name: &str, command: Vec<String>) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        command,
        resources: Some(pb::Resources {
            cpu_millis: 250,
            memory_bytes: 128 << 20,
            ..Default::default()
        }),
        // The process runners' pool: the sim pool would simulate these commands, not run them.
        pool: "local".into(),
        ..Default::default()
    }
}

/// Submits a job, retried on other api replicas under the same idempotency key, so a submit
/// whose answer was lost with its replica is not made twice.
pub async fn submit(clients: &Clients, spec: pb::JobSpec) -> pb::Job {
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

pub async fn get_job(clients: &Clients, job_id: &str) -> pb::Job {
    clients
        .jobs("get job", |mut client| {
            let request = pb::GetJobRequest { job_id: job_id.into() };
            async move { client.get_job(request).await.map(|r| r.into_inner()) }
        })
        .await
        .expect("get job")
}

pub fn terminal(job: &pb::Job) -> bool {
    matches!(
        pb::JobState::try_from(job.state).unwrap_or_default(),
        pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Stopped | pb::JobState::Lost
    )
}

pub async fn get_batch(clients: &Clients, batch_id: &str) -> pb::Batch {
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
pub async fn start_batch(clients: &Clients, items: usize) -> String {
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
pub async fn stored_points(clients: &Clients, job_id: &str, points: usize) -> Vec<pb::MetricPoint> {
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
                    bands: false,
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
pub async fn stored_lines(clients: &Clients, job_id: &str, attempt: i32) -> Vec<String> {
    use futures::StreamExt;
    let lines = clients
        .logs("get logs", |mut client| {
            let request = pb::GetLogsRequest {
                job_id: job_id.into(),
                follow: false,
                ..Default::default()
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
pub fn leftover_job_processes(dir: &std::path::Path) -> Vec<String> {
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
