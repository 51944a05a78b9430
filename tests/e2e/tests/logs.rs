//! WriteLogs, TailLogs and GetLogs resumed: lines written by a job's own code join its log,
//! once; the tail of a log comes back in order, and a log resumed after a line sends only what
//! follows it.

use std::time::Duration;

use futures::StreamExt;
use kiln_core::auth::Scope;
use kiln_e2e::{PATIENCE, Stack};
use kiln_proto::v1 as pb;
use tonic::Code;

fn entries(texts: &[&str]) -> Vec<pb::LogEntry> {
    texts
        .iter()
        .map(|text| pb::LogEntry {
            stream: 0,
            timestamp_ms: 0,
            text: (*text).into(),
        })
        .collect()
}

/// Reads a job's lines until there are `n` of them.
async fn lines_eventually(stack: &Stack, job_id: &str, n: usize) -> Vec<pb::LogLine> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let lines = stack.log_lines(job_id, false).await;
        if lines.len() >= n {
            return lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} lines arrived",
            lines.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn tail(stack: &Stack, job_id: &str, lines: u32) -> Vec<String> {
    let mut stream = stack
        .logs_client()
        .await
        .tail_logs(pb::TailLogsRequest {
            job_id: job_id.into(),
            lines,
            follow: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(line) = stream.next().await {
        out.push(line.unwrap().text);
    }
    out
}

#[tokio::test]
async fn a_job_token_writes_lines_once_and_only_to_its_own_job() {
    let stack = Stack::start_without_runner().await;
    let job = stack.submit(&["true"]).await;
    let other = stack.submit(&["true"]).await;
    let owner = stack.store.job(&job.id).await.unwrap().owner_id;
    let token = stack
        .store
        .create_token(&owner, "job", Scope::Job(job.id.clone()))
        .await
        .unwrap()
        .token;
    let write = |job_id: &str, first_index: u64, texts: &[&str]| pb::WriteLogsRequest {
        job_id: job_id.into(),
        writer: "trainer-0".into(),
        first_index,
        lines: entries(texts),
    };
    let mut logs = stack.logs_as(&token).await;
    let accepted = logs
        .write_logs(write(&job.id, 0, &["epoch 1", "epoch 2"]))
        .await
        .unwrap()
        .into_inner()
        .accepted;
    assert_eq!(accepted, 2);
    // A retry of the same lines, then the next ones.
    logs.write_logs(write(&job.id, 0, &["epoch 1", "epoch 2"]))
        .await
        .unwrap();
    logs.write_logs(write(&job.id, 2, &["epoch 3"])).await.unwrap();
    let lines = lines_eventually(&stack, &job.id, 3).await;
    let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
    assert_eq!(texts, ["epoch 1", "epoch 2", "epoch 3"]);
    assert!(
        lines
            .iter()
            .all(|l| l.stream == pb::LogStream::Stdout as i32 && l.timestamp_ms > 0)
    );
    assert_eq!(tail(&stack, &job.id, 2).await, ["epoch 2", "epoch 3"]);

    // Another job does not exist for a job's token.
    let status = logs.write_logs(write(&other.id, 0, &["x"])).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let long = "x".repeat(16 * 1024 + 1);
    let status = logs.write_logs(write(&job.id, 9, &[&long])).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("16 KiB"), "{status:?}");
    let mut bad_writer = write(&job.id, 9, &["x"]);
    bad_writer.writer = "a.b".into();
    let status = logs.write_logs(bad_writer).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap();
    stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    let status = logs.write_logs(write(&job.id, 3, &["late"])).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(stack.log_lines(&job.id, false).await.len(), 3);
}

#[tokio::test]
async fn tail_gives_the_last_lines_then_follows_to_the_end() {
    let stack = Stack::start().await;
    let job = stack
        .submit(&[
            "sh",
            "-c",
            "i=1; while [ $i -le 200 ]; do echo line $i; i=$((i+1)); done; sleep 1; echo last",
        ])
        .await;
    // Follow from the tail while the job runs: the stream ends with the job, at its last line.
    lines_eventually(&stack, &job.id, 200).await;
    let mut stream = stack
        .logs_client()
        .await
        .tail_logs(pb::TailLogsRequest {
            job_id: job.id.clone(),
            lines: 3,
            follow: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut followed = Vec::new();
    while let Some(line) = tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("the tail stalled")
    {
        followed.push(line.unwrap().text);
    }
    // Three lines of the tail, plus "last" when it came after the tail was read.
    let mut all: Vec<String> = (1..=200).map(|i| format!("line {i}")).collect();
    all.push("last".into());
    assert!((3..=4).contains(&followed.len()), "{followed:?}");
    assert_eq!(
        followed,
        all[all.len() - followed.len()..],
        "the tail, in order, to the end"
    );

    assert_eq!(tail(&stack, &job.id, 2).await, ["line 200", "last"]);
    assert_eq!(tail(&stack, &job.id, 0).await.len(), 10, "0 means 10 lines");
    assert_eq!(tail(&stack, &job.id, 1000).await.len(), 201);
    // GetLogs resumed after a line (its seq, as an SSE reader's Last-Event-ID): only the lines
    // after it, which log-ingest starts at rather than sending the log again.
    let lines = stack.log_lines(&job.id, false).await;
    assert_eq!(lines.len(), 201);
    let seen = lines.iter().find(|l| l.text == "line 150").expect("line 150").seq;
    let mut resumed = stack
        .logs_client()
        .await
        .get_logs(pb::GetLogsRequest {
            job_id: job.id.clone(),
            after_seq: seen,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut after = Vec::new();
    while let Some(line) = resumed.next().await {
        after.push(line.unwrap().text);
    }
    assert_eq!(after, all[150..], "the lines after line 150, in order");
    let status = stack
        .logs_client()
        .await
        .tail_logs(pb::TailLogsRequest {
            job_id: kiln_core::ids::new_id(),
            lines: 1,
            follow: false,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
}

/// Replicas of log-ingest store batches of `KILN_LOGS` side by side, so a job's later line can be
/// stored while an earlier one is still with a slow replica. A follower shows neither until the
/// earlier one is stored, then both in order (it used to show the later one at once).
#[tokio::test]
async fn a_follower_never_shows_a_line_before_an_earlier_one_still_being_stored() {
    use async_nats::jetstream::{self, AckKind, consumer::pull};
    use kiln_core::subjects::{CONSUMER_LOG_INGEST, STREAM_LOGS};
    use prost::Message as _;

    let mut stack = Stack::start_without_runner().await;
    let job = stack.submit(&["true"]).await;
    let js = jetstream::new(stack.nats.client().await);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut consumer = loop {
        if let Ok(stream) = js.get_stream(STREAM_LOGS).await
            && let Ok(consumer) = stream.get_consumer::<pull::Config>(CONSUMER_LOG_INGEST).await
        {
            break consumer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "log-ingest never made its consumer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stack.logs.take().expect("log-ingest runs").stop().await;
    for text in ["earlier", "later"] {
        let record = pb::LogRecord {
            job_id: job.id.clone(),
            attempt: job.attempt,
            stream: pb::LogStream::Stdout as i32,
            timestamp_ms: kiln_core::ids::now_ms(),
            text: text.into(),
            ..Default::default()
        };
        kiln_core::streams::publish(
            &js,
            kiln_core::subjects::logs(&job.id),
            &format!("{}:{text}", job.id),
            record.encode_to_vec().into(),
        )
        .await
        .unwrap();
    }
    // The slow replica: it holds the earlier line, unacknowledged.
    let earlier = consumer
        .fetch()
        .max_messages(1)
        .messages()
        .await
        .unwrap()
        .next()
        .await
        .expect("a message")
        .unwrap();
    stack.restart_logs().await;
    // The restarted replica stores the later line (it acks only after the write).
    loop {
        let info = consumer.info().await.unwrap();
        if info.num_ack_pending == 1 && info.delivered.stream_sequence == earlier.info().unwrap().stream_sequence + 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the later line was never stored: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut follower = stack
        .logs_client()
        .await
        .get_logs(pb::GetLogsRequest {
            job_id: job.id.clone(),
            follow: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Let the follower read the store while only the later line is in it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    earlier.ack_with(AckKind::Nak(None)).await.unwrap();
    let mut shown = Vec::new();
    while shown.len() < 2 {
        let line = tokio::time::timeout(PATIENCE, follower.next())
            .await
            .expect("the follower stalled")
            .expect("the stream goes on")
            .unwrap();
        shown.push(line.text);
    }
    assert_eq!(shown, ["earlier", "later"]);
}
