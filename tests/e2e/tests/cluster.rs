//! kiln on a three-node NATS cluster (`nats.replicas = 3`): its streams and buckets are
//! replicated, and the nodes dying one after another under load lose nothing and do nothing
//! twice.

use std::time::Duration;

use kiln_core::streams::{BUCKETS, bucket_stream, stream_configs};
use kiln_core::subjects;
use kiln_core::testing::NatsCluster;
use kiln_e2e::{PATIENCE, Stack, job_events, metric_batches, spec};
use kiln_proto::v1 as pb;
use kiln_runner::collector::HOST_CPU_PERCENT;

const JOBS: usize = 20;
const LINES: usize = 20;

/// Job `n` logs `line-1` … `line-20` over two seconds and exits with `n % 3`.
fn job_spec(n: usize) -> pb::JobSpec {
    let script = format!(
        "i=1; while [ $i -le {LINES} ]; do echo line-$i; i=$((i+1)); sleep 0.1; done; exit {}",
        n % 3
    );
    spec(&["sh", "-c", &script])
}

#[tokio::test]
async fn streams_and_buckets_are_replicated_three_ways() {
    let stack = Stack::start_on_cluster().await;
    let js = async_nats::jetstream::new(stack.nats.client().await);
    let mut names: Vec<String> = stream_configs(3).into_iter().map(|c| c.name).collect();
    names.extend(BUCKETS.iter().map(|(bucket, _)| bucket_stream(bucket)));
    for name in names {
        let info = js
            .get_stream(&name)
            .await
            .expect("stream")
            .info()
            .await
            .expect("info")
            .clone();
        assert_eq!(info.config.num_replicas, 3, "{name}");
        let cluster = info.cluster.expect("cluster info");
        assert!(cluster.leader.is_some(), "{name}: {cluster:?}");
        assert_eq!(cluster.replicas.len(), 2, "{name}: {cluster:?}");
    }
}

#[tokio::test]
async fn jobs_run_through_each_node_dying_once() {
    let mut stack = Stack::start_on_cluster().await;
    // Jobs come in while the nodes die: one every 1.5 s for 30 s.
    let mut jobs_client = stack.jobs().await;
    let submitter = tokio::spawn(async move {
        let mut ids = Vec::new();
        for n in 0..JOBS {
            let request = pb::SubmitJobRequest {
                spec: Some(job_spec(n)),
                ..Default::default()
            };
            let job = jobs_client
                .submit_job(request)
                .await
                .expect("submit")
                .into_inner()
                .job
                .unwrap();
            ids.push(job.id);
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        ids
    });
    // Each round kills the node leading a stream the running jobs write to, so that their
    // publishes meet an election, and starts it again two seconds later.
    let js = async_nats::jetstream::new(stack.nats.client().await);
    for stream in [subjects::STREAM_METRICS, subjects::STREAM_LOGS, subjects::STREAM_JOBS] {
        tokio::time::sleep(Duration::from_secs(4)).await;
        let index = leader_of(&js, stream).await;
        stack.nats.cluster().kill(index);
        tokio::time::sleep(Duration::from_secs(2)).await;
        stack.nats.cluster().restart(index).await;
    }
    let ids = submitter.await.expect("submitter");

    for (n, id) in ids.iter().enumerate() {
        let code = (n % 3) as i32;
        let want = if code == 0 {
            pb::JobState::Succeeded
        } else {
            pb::JobState::Failed
        };
        let job = stack
            .wait_for(id, "the job to end", |job| {
                pb::JobState::try_from(job.state).is_ok_and(|state| {
                    matches!(
                        state,
                        pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Lost | pb::JobState::Stopped
                    )
                })
            })
            .await;
        assert_eq!(job.state, want as i32, "job {n}: {job:?}");
        assert_eq!(job.exit_code, Some(code), "job {n}: {job:?}");
        assert_eq!(job.attempt, 1, "job {n} ran more than once: {job:?}");

        // Ended once: one event per version, one of them terminal.
        let events = job_events(&stack, &job).await;
        let versions: Vec<i64> = events.iter().map(|e| e.version).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "job {n}: {versions:?}");
        let ended = events.iter().filter(|e| e.state == want as i32).count();
        assert_eq!(ended, 1, "job {n}: {events:?}");

        assert_lines_once(&stack, n, id).await;
        assert_points_once(&stack, n, id).await;
    }
}

/// The index of the node leading `stream` (asked again while it has none).
async fn leader_of(js: &async_nats::jetstream::Context, stream: &str) -> usize {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(mut handle) = js.get_stream(stream).await
            && let Ok(info) = handle.info().await
            && let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone())
        {
            return (0..NatsCluster::SIZE)
                .find(|index| NatsCluster::server_name(*index) == leader)
                .expect("a node of the cluster leads");
        }
        assert!(tokio::time::Instant::now() < deadline, "{stream} has no leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every line of the job is in the log store, once, in order (log-ingest may still be taking
/// some in: they are waited for).
async fn assert_lines_once(stack: &Stack, n: usize, job_id: &str) {
    let want: Vec<String> = (1..=LINES).map(|i| format!("line-{i}")).collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let lines: Vec<String> = stack
            .log_lines(job_id, false)
            .await
            .into_iter()
            .map(|line| line.text)
            .filter(|text| text.starts_with("line-"))
            .collect();
        if lines == want {
            return;
        }
        assert!(
            lines.len() < want.len() && want.starts_with(&lines) && tokio::time::Instant::now() < deadline,
            "job {n}'s lines: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every system metric batch is on `KILN_METRICS` once, its steps 1, 2, … without a gap, and
/// each of its points is in the metric store (the runner may still be publishing the last
/// batches, and log-ingest taking them in: they are waited for).
async fn assert_points_once(stack: &Stack, n: usize, job_id: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let published: Vec<i64> = metric_batches(stack, job_id)
            .await
            .iter()
            .filter_map(|batch| batch.points.first().map(|p| p.step))
            .collect();
        let want: Vec<i64> = (1..=published.len() as i64).collect();
        assert_eq!(
            published,
            want,
            "job {n}'s metric steps on {}",
            subjects::STREAM_METRICS
        );
        let request = pb::QueryMetricsRequest {
            job_ids: vec![job_id.to_string()],
            keys: vec![HOST_CPU_PERCENT.to_string()],
            ..Default::default()
        };
        let series = stack
            .logs_client()
            .await
            .query_metrics(request)
            .await
            .expect("query metrics")
            .into_inner()
            .series;
        let stored: Vec<i64> = series.iter().flat_map(|s| &s.points).map(|p| p.step).collect();
        if !published.is_empty() && stored == published {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {n}'s stored {HOST_CPU_PERCENT} steps: {stored:?}, published: {published:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
