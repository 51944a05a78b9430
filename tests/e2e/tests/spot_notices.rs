//! A runner on a (mocked) spot instance: it reads what it is from a real
//! amazon-ec2-metadata-mock (`KILN_TEST_AEMM`, one per test), reports it, and acts on the
//! notices the test makes AEMM give: a rebalance recommendation cordons it and asks its jobs to
//! checkpoint, killing nothing; an interruption notice stops its jobs as spot preemptions,
//! which are queued again and resume, on another runner, from the outputs synced at the stop.

use std::time::Duration;

use futures::StreamExt;
use kiln_core::capacity::{CapacityReport, InstanceNotice};
use kiln_core::subjects;
use kiln_core::testing::{Aemm, AemmInstance, AemmNotice};
use kiln_e2e::{PATIENCE, Stack, job_events, job_writable_dir, job_writable_file, output, spec, wait_for_line};
use kiln_proto::v1 as pb;

/// A runner `spot-1` reading its instance metadata from `aemm`, polling every 200 ms.
async fn spot_runner(stack: &mut Stack, aemm: &Aemm) {
    let mut config = stack.runner_config("spot-1");
    config.imds.enabled = true;
    config.imds.endpoint = aemm.endpoint.clone();
    config.imds.poll_interval_ms = 200;
    stack.runner = Some(stack.spawn_runner(config).await);
}

/// Waits for the capacity report of `runner_id` that `done` accepts.
async fn report_of(stack: &Stack, runner_id: &str, done: impl Fn(&CapacityReport) -> bool) -> CapacityReport {
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.expect("nats");
    let kv = nats.jetstream.get_key_value(subjects::BUCKET_CAPACITY).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(bytes) = kv.get(runner_id).await.unwrap() {
            let report: CapacityReport = serde_json::from_slice(&bytes).unwrap();
            if done(&report) {
                return report;
            }
            assert!(tokio::time::Instant::now() < deadline, "{report:?}");
        }
        assert!(tokio::time::Instant::now() < deadline, "no report of {runner_id}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Restarts `aemm` with `notices` given now (blocking: it waits for the process).
async fn trigger(aemm: Aemm, notices: &'static [AemmNotice]) -> Aemm {
    tokio::task::spawn_blocking(move || {
        let mut aemm = aemm;
        aemm.trigger(notices);
        aemm
    })
    .await
    .unwrap()
}

/// Traps USR1: copies its control file to `$MARK` and checkpoints into its outputs; runs on.
const CHECKPOINT_ON_USR1: &str = r#"
trap 'cat "$KILN_CONTROL_FILE" > "$MARK"; mkdir -p "$KILN_OUTPUTS/ckpt"; echo usr1 > "$KILN_OUTPUTS/ckpt/step.txt"' USR1
echo ready
while :; do sleep 0.2; done
"#;

#[tokio::test]
async fn a_rebalance_recommendation_cordons_the_runner_and_asks_its_jobs_to_checkpoint() {
    let mut stack = Stack::start_without_runner().await;
    let aemm = Aemm::start(AemmInstance::spot());
    spot_runner(&mut stack, &aemm).await;
    let report = report_of(&stack, "spot-1", |_| true).await;
    assert_eq!(report.instance_id.as_deref(), Some(aemm.instance.instance_id.as_str()));
    assert_eq!(
        (
            report.instance_type.as_deref(),
            report.zone.as_deref(),
            report.market.as_deref()
        ),
        (Some("c5.large"), Some("us-east-1b"), Some("spot"))
    );
    assert!(report.spot && !report.cordoned, "{report:?}");

    let marks = job_writable_dir();
    let mark = job_writable_file(marks.path(), "usr1");
    let mut job_spec = spec(&["sh", "-c", CHECKPOINT_ON_USR1]);
    job_spec.env.insert("MARK".into(), mark.display().to_string());
    let job = stack.submit_spec(job_spec).await;
    wait_for_line(&stack, &job.id, "ready").await;
    // Control: nothing asked it anything yet.
    assert_eq!(std::fs::read_to_string(&mark).unwrap(), "");

    let _aemm = trigger(aemm, &[AemmNotice::Rebalance]).await;
    report_of(&stack, "spot-1", |report| report.cordoned).await;
    // The job got SIGUSR1 and read its control file; its checkpoint was synced while it runs.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !std::fs::read_to_string(&mark)
        .unwrap()
        .contains("KILN_CHECKPOINT_NOW=1")
    {
        assert!(tokio::time::Instant::now() < deadline, "the job never got SIGUSR1");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        std::fs::read_to_string(&mark)
            .unwrap()
            .contains("KILN_NOTICE=rebalance")
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while output(&stack, &job.id, "ckpt/step.txt").await.as_deref().ok() != Some("usr1\n") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the checkpoint was never synced"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing was killed: the job runs on, in its first attempt.
    let running = stack.get(&job.id).await;
    assert_eq!(
        (running.state, running.attempt),
        (pb::JobState::Running as i32, 1),
        "{running:?}"
    );
    // A cordoned runner takes nothing new: a job submitted now waits.
    let waiting = stack.submit(&["true"]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let waiting = stack.get(&waiting.id).await;
    assert_eq!(waiting.state, pb::JobState::Queued as i32, "{waiting:?}");
    assert_eq!(stack.get(&job.id).await.state, pb::JobState::Running as i32);
    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap();
    stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
}

/// Checkpoints on SIGTERM and ends; a resumed attempt prints where it resumes from and ends.
const CHECKPOINT_ON_TERM: &str = r#"
if [ -n "$KILN_RESUME_FROM" ]; then
  echo "resumed $KILN_ATTEMPT $(cat "$KILN_RESUME_FROM/ckpt/step.txt")"
  exit 0
fi
trap 'mkdir -p "$KILN_OUTPUTS/ckpt"; echo step-7 > "$KILN_OUTPUTS/ckpt/step.txt"; exit 0' TERM
echo ready
while :; do sleep 0.2; done
"#;

#[tokio::test]
async fn an_interruption_notice_preempts_the_jobs_which_resume_elsewhere_from_their_sync() {
    let mut stack = Stack::start_without_runner().await;
    let aemm = Aemm::start(AemmInstance::spot());
    let instance = aemm.instance.clone();
    spot_runner(&mut stack, &aemm).await;
    report_of(&stack, "spot-1", |report| report.instance_id.is_some()).await;
    let job = stack.submit_spec(spec(&["sh", "-c", CHECKPOINT_ON_TERM])).await;
    wait_for_line(&stack, &job.id, "ready").await;
    let harness = stack.nats.client().await;
    let mut notices = harness.subscribe(subjects::INSTANCE_NOTICE_ALL).await.unwrap();
    harness.flush().await.unwrap();

    let _aemm = trigger(aemm, &[AemmNotice::Interruption]).await;
    let message = tokio::time::timeout(PATIENCE, notices.next())
        .await
        .expect("an instance notice in time")
        .unwrap();
    assert_eq!(message.subject.as_str(), subjects::instance_notice("local"));
    let notice: InstanceNotice = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(
        (
            notice.runner_id.as_str(),
            notice.instance_id.as_str(),
            notice.action.as_str()
        ),
        ("spot-1", instance.instance_id.as_str(), "terminate")
    );
    assert_eq!(
        (notice.instance_type.as_str(), notice.zone.as_str()),
        ("c5.large", "us-east-1b")
    );
    assert_eq!(notice.jobs, std::slice::from_ref(&job.id));

    // The job stops as a spot preemption: synced, PREEMPTED naming the offering, queued again.
    let requeued = stack.wait_for(&job.id, "a second attempt", |j| j.attempt >= 2).await;
    assert_eq!(requeued.preemptions, 1, "{requeued:?}");
    // QUEUED is published on kiln.job.queued: the events read go up to the PREEMPTED before it.
    let preempted_version = pb::Job {
        version: requeued.version - 1,
        ..requeued.clone()
    };
    let events = job_events(&stack, &preempted_version).await;
    let at = events
        .iter()
        .position(|e| e.state == pb::JobState::Preempted as i32)
        .expect("a PREEMPTED event");
    assert_eq!(events[at - 1].state, pb::JobState::Syncing as i32, "{events:?}");
    let preempted = &events[at];
    assert_eq!(preempted.reason, kiln_core::scheduling::SPOT_PREEMPTION);
    assert_eq!(
        (preempted.instance_type.as_str(), preempted.zone.as_str()),
        ("c5.large", "us-east-1b")
    );
    assert_eq!(output(&stack, &job.id, "ckpt/step.txt").await.unwrap(), "step-7\n");
    report_of(&stack, "spot-1", |report| report.cordoned).await;

    // The cordoned runner does not take it back; a runner that joins does, and the attempt
    // resumes from the checkpoint synced at the stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(stack.get(&job.id).await.attempt, 2);
    let mut plain = stack.runner_config("plain-1");
    plain.work_dir = stack.dir.path().join("work-plain");
    let _plain = stack.spawn_runner(plain).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!(done.attempt, 2);
    let lines = stack.log_lines(&job.id, true).await;
    assert!(lines.iter().any(|l| l.text == "resumed 2 step-7"), "{lines:?}");

    // The scheduler learnt the rate of the offering beside the pool's.
    let kv = kiln_core::streams::connect(&stack.nats.config())
        .await
        .unwrap()
        .jetstream
        .get_key_value(subjects::BUCKET_SCHEDULER)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let saved = kv.get(subjects::KEY_PREEMPTION_RATES).await.unwrap();
        let keys: Vec<String> = saved
            .map(|bytes| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes).unwrap())
            .map(|rates| rates.keys().cloned().collect())
            .unwrap_or_default();
        if keys.iter().any(|key| key == "local/c5.large/us-east-1b") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "rates saved: {keys:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
