//! Jobs end to end on the `process` provider: code, environment, logs, exit codes, stop.

use kiln_e2e::{Stack, bundle, pid_of, preempted_and_resumed, process_alive, spec, upload};
use kiln_proto::v1 as pb;

fn texts(lines: &[pb::LogLine], stream: pb::LogStream) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.stream == stream as i32)
        .map(|l| l.text.clone())
        .collect()
}

#[tokio::test]
async fn a_job_runs_its_code_and_its_logs_are_kept() {
    let stack = Stack::start().await;
    let (bytes, digest) = bundle(&[
        ("data/hello.txt", "hello from the bundle\n"),
        ("run.sh", "cat data/hello.txt\n"),
    ]);
    upload(&mut stack.artifacts().await, &bytes, &digest).await.unwrap();
    let mut job_spec = spec(&[
        "sh",
        "-c",
        "sh run.sh; echo \"id=$KILN_JOB_ID seed=$SEED api=$KILN_API\"; echo oops >&2; exit 3",
    ]);
    job_spec.code_digest = digest;
    job_spec.env.insert("SEED".into(), "42".into());
    let job = stack.submit_spec(job_spec).await;

    let lines = stack.log_lines(&job.id, true).await;
    let done = stack.get(&job.id).await;
    assert_eq!(done.state, pb::JobState::Failed as i32, "{done:?}");
    assert_eq!(done.exit_code, Some(3));
    assert_eq!(done.reason, "exited with code 3");
    assert_eq!(
        texts(&lines, pb::LogStream::Stdout),
        [
            "hello from the bundle".to_string(),
            format!("id={} seed=42 api=http://{}", job.id, stack.api_addr)
        ]
    );
    assert_eq!(texts(&lines, pb::LogStream::Stderr), ["oops"]);
    // The work dir is cleaned up (the dataset cache, `.datasets`, stays).
    let left: Vec<_> = std::fs::read_dir(stack.dir.path().join("work"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .filter(|name| name != ".datasets")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn exit_zero_succeeds_and_missing_programs_fail_clearly() {
    let stack = Stack::start().await;
    let ok = stack.submit(&["true"]).await;
    let missing = stack.submit(&["definitely-not-a-program"]).await;
    let ok = stack.wait_for(&ok.id, "the end", |j| j.finished_at_ms > 0).await;
    assert_eq!((ok.state, ok.exit_code), (pb::JobState::Succeeded as i32, Some(0)));
    let missing = stack.wait_for(&missing.id, "the end", |j| j.finished_at_ms > 0).await;
    assert_eq!(
        (missing.state, missing.exit_code),
        (pb::JobState::Failed as i32, Some(127))
    );
    assert!(missing.reason.contains("definitely-not-a-program"), "{missing:?}");
    let lines = stack.log_lines(&missing.id, true).await;
    assert!(lines.iter().any(|l| l.text.contains("cannot start")), "{lines:?}");
}

#[tokio::test]
async fn a_stopped_job_gets_sigterm_and_its_processes_are_gone() {
    let stack = Stack::start().await;
    // The job traps SIGTERM and says so, so we know it got SIGTERM before anything else.
    let job = stack
        .submit(&[
            "sh",
            "-c",
            "trap 'echo got SIGTERM; exit 0' TERM; echo ready; sleep 600 & wait",
        ])
        .await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    let pid = pid_of(&running);
    assert!(process_alive(pid));
    let stopping = stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(stopping.stop_requested);
    let stopped = stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    assert_eq!(stopped.reason, "stopped by user");
    // It ended from its own trap (0), inside the grace period, not by SIGKILL (137).
    assert_eq!(stopped.exit_code, Some(0), "{stopped:?}");
    assert!(!process_alive(pid), "the job's process {pid} is still there");
    let lines = stack.log_lines(&job.id, true).await;
    let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
    assert_eq!(texts, ["ready", "got SIGTERM"]);
}

#[tokio::test]
async fn a_job_ignoring_sigterm_is_killed_after_the_grace_period() {
    let stack = Stack::start().await;
    let job = stack
        .submit(&["sh", "-c", "trap '' TERM; echo ready; while true; do sleep 1; done"])
        .await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap();
    let stopped = stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    assert_eq!(stopped.exit_code, Some(128 + 9), "{stopped:?}");
    assert!(!process_alive(pid_of(&running)));
}

#[tokio::test]
async fn a_queued_job_stops_at_once() {
    let stack = Stack::start_without_runner().await;
    let job = stack.submit(&["sleep", "600"]).await;
    let stopped = stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stopped.state, pb::JobState::Stopped as i32);
    // Stopping again is harmless.
    let again = stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.version, stopped.version);
}

#[tokio::test]
async fn following_logs_gets_every_line_once_in_order() {
    let stack = Stack::start().await;
    let job = stack
        .submit(&[
            "sh",
            "-c",
            "i=1; while [ $i -le 3000 ]; do echo line $i; i=$((i+1)); done",
        ])
        .await;
    // Follow from the start, while the job runs.
    let lines = stack.log_lines(&job.id, true).await;
    let expected: Vec<String> = (1..=3000).map(|i| format!("line {i}")).collect();
    let texts: Vec<String> = lines.iter().map(|l| l.text.clone()).collect();
    assert_eq!(texts, expected);
    let seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    // Reading again without follow gives the same.
    assert_eq!(stack.log_lines(&job.id, false).await, lines);
}

#[tokio::test]
async fn watch_streams_state_changes_until_the_end() {
    use futures::StreamExt;
    let stack = Stack::start().await;
    let job = stack.submit(&["sh", "-c", "sleep 0.3"]).await;
    let mut stream = stack
        .jobs()
        .await
        .watch_job(pb::WatchJobRequest { job_id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    let mut versions = Vec::new();
    let mut last = None;
    while let Some(update) = stream.next().await {
        let update = update.unwrap();
        versions.push(update.version);
        last = Some(update.state);
    }
    assert_eq!(last, Some(pb::JobState::Succeeded as i32));
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
}

#[tokio::test]
async fn logs_can_be_searched() {
    let stack = Stack::start().await;
    let job = stack
        .submit(&[
            "sh",
            "-c",
            "for i in 1 2 3 4 5; do echo step $i loss 0.$i; done; echo oops >&2",
        ])
        .await;
    let lines = stack.log_lines(&job.id, true).await;
    let search = |pattern: &str, regex: bool, limit: u32| pb::SearchLogsRequest {
        job_id: job.id.clone(),
        pattern: pattern.into(),
        regex,
        limit,
        ..Default::default()
    };
    let mut logs = stack.logs_client().await;
    let found = logs
        .search_logs(search("loss 0.3", false, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        found.lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(),
        ["step 3 loss 0.3"]
    );
    let found = logs
        .search_logs(search(r"^step [24] ", true, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.lines.len(), 2);
    let found = logs.search_logs(search("step", false, 2)).await.unwrap().into_inner();
    assert_eq!((found.lines.len(), found.truncated), (2, true));
    let status = logs.search_logs(search("(unclosed", true, 0)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // A time range that ends before the job began finds nothing.
    let mut before = search("step", false, 0);
    before.until_ms = lines[0].timestamp_ms;
    assert!(logs.search_logs(before).await.unwrap().into_inner().lines.is_empty());
}

#[tokio::test]
async fn a_preempted_job_finds_its_checkpoint_in_its_next_attempt() {
    let stack = Stack::start().await;
    let (done, resumed) = preempted_and_resumed(&stack, spec(&[])).await;
    assert_eq!(done.resume_from, format!("outputs/{}", done.id), "{done:?}");
    // The checkpoint of attempt 1 is in attempt 2's outputs directory, which KILN_RESUME_FROM
    // names (the process provider's KILN_OUTPUTS, on the runner's host); and it is synced
    // again with attempt 2's outputs.
    // Under the work root when the runner isolates process jobs (as root), else its work dir.
    let config = stack.runner_config("runner-1");
    let root = match config.isolates_processes() {
        true => config.process.work_root,
        false => config.work_dir,
    };
    let outputs = root.join(format!("{}-2/outputs", done.id));
    assert_eq!(resumed, format!("2 step-42 {}", outputs.display()));
}

#[tokio::test]
async fn a_job_runs_only_on_the_pool_it_names() {
    let stack = Stack::start().await;
    let mut nowhere = spec(&["true"]);
    nowhere.pool = "gpu-big".into();
    let waiting = stack.submit_spec(nowhere).await;
    let mut here = spec(&["true"]);
    here.pool = "local".into();
    let ran = stack.submit_spec(here).await;
    let done = stack.wait_for_state(&ran.id, pb::JobState::Succeeded).await;
    assert_eq!(done.pool, "local");
    assert_eq!(done.spec.unwrap().pool, "local");
    // The other one waits, and says why.
    let still = stack.get(&waiting.id).await;
    assert_eq!(still.state, pb::JobState::Queued as i32, "{still:?}");
    let explanation = stack
        .jobs()
        .await
        .explain_job(pb::GetJobRequest {
            job_id: waiting.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        explanation.summary.contains("it asks for pool gpu-big"),
        "{explanation:?}"
    );
    // A pool name that cannot be a pool is refused at submit.
    let mut bad = spec(&["true"]);
    bad.pool = "no spaces".into();
    let status = stack.try_submit(bad).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
}
