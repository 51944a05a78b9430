//! Runners that die are noticed: a runner whose lease expires has its jobs ended (or queued
//! again) by the scheduling leader and its capacity forgotten; a runner that comes back finds
//! its jobs taken and kills what it still runs of them without writing their state.

use kiln_core::events::publish_job_change;
use kiln_core::store::{Change, JobRecord};
use kiln_core::{JobState, subjects};
use kiln_e2e::{Stack, pid_of, process_alive, wait_for_line};
use kiln_proto::v1 as pb;

/// A runner of this stack's pool `local` with a 1 s lease and a work dir of its own (a process
/// runner removes what it does not hold from its work dir when it starts).
fn leased_runner(stack: &Stack, runner_id: &str, on_lost: kiln_runner::OnLost) -> kiln_runner::Config {
    kiln_runner::Config {
        lease_ttl_ms: 1_000,
        on_lost,
        work_dir: stack.dir.path().join(format!("work-{runner_id}")),
        ..stack.runner_config(runner_id)
    }
}

/// Kills what a crashed runner left running (a test's own cleanup).
fn kill_group(pid: i32) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

async fn pools(stack: &Stack) -> std::collections::BTreeMap<String, kiln_core::capacity::PoolCapacity> {
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.expect("nats");
    kiln_core::capacity::pools(&nats).await.expect("pools")
}

/// The reasons of the job's QUEUED changes (published on `kiln.job.queued`), in order.
async fn queued_reasons(stack: &Stack, job_id: &str) -> Vec<String> {
    use prost::Message;
    let messages = kiln_e2e::stored_messages(stack, subjects::STREAM_JOBS, subjects::JOB_QUEUED.into()).await;
    messages
        .iter()
        .map(|payload| pb::JobEvent::decode(payload.as_ref()).expect("a job event"))
        .filter(|event| event.job_id == job_id)
        .map(|event| event.reason)
        .collect()
}

/// Waits until process `pid` is gone.
async fn wait_gone(pid: i32, what: &str) {
    let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
    while process_alive(pid) {
        assert!(tokio::time::Instant::now() < deadline, "{what}: process {pid} lives on");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_runner_that_never_comes_back_has_its_job_ended_lost_and_its_capacity_forgotten() {
    let mut stack = Stack::start_without_runner().await;
    let config = leased_runner(&stack, "runner-1", kiln_runner::OnLost::Fail);
    stack.runner = Some(stack.spawn_runner(config).await);
    let job = stack.submit(&["sleep", "600"]).await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    assert!(pools(&stack).await.contains_key("local"));

    stack.runner.take().unwrap().crash().await;
    let lost = stack.wait_for_state(&job.id, pb::JobState::Lost).await;
    assert_eq!(lost.reason, "its runner runner-1 stopped renewing its lease");
    assert_eq!(lost.attempt, 1);
    // Its report is still in the bucket (60 s max age), but it no longer counts.
    let pools = pools(&stack).await;
    assert!(
        !pools.contains_key("local"),
        "the dead runner's pool still counts: {pools:?}"
    );
    kill_group(pid_of(&running));
}

#[tokio::test]
async fn with_requeue_a_job_whose_runner_never_comes_back_resumes_on_another_runner() {
    let mut stack = Stack::start_without_runner().await;
    let first = leased_runner(&stack, "runner-1", kiln_runner::OnLost::Requeue);
    stack.runner = Some(stack.spawn_runner(first).await);
    // Checkpoints the attempt number when stopped; the third attempt ends once it has resumed.
    let script = r#"
if [ -f "$KILN_RESUME_FROM/ckpt" ]; then
  echo "attempt $KILN_ATTEMPT resumes $(cat "$KILN_RESUME_FROM/ckpt")"
  [ "$KILN_ATTEMPT" = 3 ] && exit 0
fi
trap 'echo step-$KILN_ATTEMPT > "$KILN_OUTPUTS/ckpt"; exit 0' TERM
echo ready
sleep 600 &
wait
"#;
    let job = stack.submit(&["sh", "-c", script]).await;
    stack.wait_for_state(&job.id, pb::JobState::Running).await;
    wait_for_line(&stack, &job.id, "ready").await;
    // A preemption syncs the first attempt's checkpoint; the second runs on runner-1 too.
    kiln_e2e::preempt(&stack, &job.id).await;
    let second = stack
        .wait_for(&job.id, "the second attempt", |j| {
            j.attempt == 2 && j.state == pb::JobState::Running as i32
        })
        .await;
    assert_eq!(second.runner_id, "runner-1");
    wait_for_line(&stack, &job.id, "attempt 2 resumes step-1").await;

    let other = leased_runner(&stack, "runner-2", kiln_runner::OnLost::Requeue);
    let other = stack.spawn_runner(other).await;
    stack.runner.take().unwrap().crash().await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!((done.attempt, done.runner_id.as_str()), (3, "runner-2"), "{done:?}");
    assert_eq!(done.resume_from, format!("outputs/{}", job.id));
    let lines = stack.log_lines(&job.id, false).await;
    assert!(
        lines
            .iter()
            .any(|l| l.attempt == 3 && l.text == "attempt 3 resumes step-1"),
        "{lines:?}"
    );
    // The scheduler queued it again, saying why.
    let reasons = queued_reasons(&stack, &job.id).await;
    assert_eq!(
        reasons.last().map(String::as_str),
        Some("its runner runner-1 stopped renewing its lease; queued again"),
        "{reasons:?}"
    );
    kill_group(pid_of(&second));
    other.stop().await;
}

/// Reads what a job's outputs hold at `path` in the stack's object store, once it is there.
async fn synced_output(stack: &Stack, job_id: &str, path: &str) -> String {
    let file = stack.objects_dir().join("outputs").join(job_id).join(path);
    let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} was never synced",
            file.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A job killed without notice (its runner SIGKILLed, requeue on) resumes from the last
/// periodic sync of its outputs: the first attempt never ended, so nothing else could have
/// synced them. With `outputs-sync-interval-secs = 0` nothing is restored (the control).
#[tokio::test]
async fn a_job_lost_without_notice_resumes_from_its_last_periodic_sync() {
    let mut stack = Stack::start_without_runner().await;
    let first = kiln_runner::Config {
        outputs_sync_interval_secs: 1,
        ..leased_runner(&stack, "runner-1", kiln_runner::OnLost::Requeue)
    };
    stack.runner = Some(stack.spawn_runner(first).await);
    // Counts steps into its outputs (a rename, so a sync never reads half a file).
    let script = r#"
if [ -f "$KILN_RESUME_FROM/step" ]; then
  echo "attempt $KILN_ATTEMPT resumes at step $(cat "$KILN_RESUME_FROM/step")"
  exit 0
fi
i=0
while true; do
  i=$((i+1)); echo $i > "$KILN_OUTPUTS/.step"; mv "$KILN_OUTPUTS/.step" "$KILN_OUTPUTS/step"; sleep 0.1
done
"#;
    let job = stack.submit(&["sh", "-c", script]).await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    let step: u64 = synced_output(&stack, &job.id, "step").await.trim().parse().unwrap();
    let recorded = stack
        .wait_for(&job.id, "its sync recorded", |j| j.outputs_synced_at_ms > 0)
        .await;
    assert!(recorded.outputs_synced_bytes > 0, "{recorded:?}");

    let other = kiln_runner::Config {
        outputs_sync_interval_secs: 1,
        ..leased_runner(&stack, "runner-2", kiln_runner::OnLost::Requeue)
    };
    let other = stack.spawn_runner(other).await;
    stack.runner.take().unwrap().crash().await;
    kill_group(pid_of(&running));
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!((done.attempt, done.runner_id.as_str()), (2, "runner-2"), "{done:?}");
    let lines = stack.log_lines(&job.id, false).await;
    let resumed = lines
        .iter()
        .find_map(|l| l.text.strip_prefix("attempt 2 resumes at step "))
        .unwrap_or_else(|| panic!("attempt 2 did not resume: {lines:?}"));
    let resumed: u64 = resumed.parse().unwrap();
    assert!(resumed >= step, "resumed at {resumed}, before the sync seen at {step}");
    other.stop().await;
}

/// A job that touches `$KILN_OUTPUTS/.kiln-sync` has its outputs synced at once (periodic
/// syncs off here), without the marker itself, and the job's record says how much it held.
#[tokio::test]
async fn a_job_asks_for_a_sync_with_its_marker_file() {
    let mut stack = Stack::start_without_runner().await;
    let config = kiln_runner::Config {
        outputs_sync_interval_secs: 0,
        ..stack.runner_config("runner-1")
    };
    stack.runner = Some(stack.spawn_runner(config).await);
    let script = r#"
head -c 100000 /dev/zero > "$KILN_OUTPUTS/weights"; echo 1 > "$KILN_OUTPUTS/step"; touch "$KILN_OUTPUTS/.kiln-sync"
exec sleep 600
"#;
    let job = stack.submit(&["sh", "-c", script]).await;
    stack.wait_for_state(&job.id, pb::JobState::Running).await;
    assert_eq!(synced_output(&stack, &job.id, "step").await, "1\n");
    let synced = stack
        .wait_for(&job.id, "its sync recorded", |j| j.outputs_synced_at_ms > 0)
        .await;
    assert_eq!(synced.outputs_synced_bytes, 100_002, "{synced:?}");
    let marker = stack.objects_dir().join("outputs").join(&job.id).join(".kiln-sync");
    assert!(!marker.try_exists().unwrap(), "the marker was synced");
    stack.stop_job(&job.id).await;
    stack.wait_for(&job.id, "stopped", |j| j.finished_at_ms > 0).await;
}

#[tokio::test]
async fn a_runner_whose_lease_lapsed_kills_its_taken_job_and_takes_no_launch_until_it_holds_it() {
    let mut stack = Stack::start_without_runner().await;
    let config = leased_runner(&stack, "runner-1", kiln_runner::OnLost::Fail);
    let (runner, lease) = stack.spawn_runner_pausable(config).await;
    stack.runner = Some(runner);
    let job = stack.submit(&["sleep", "600"]).await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    let pid = pid_of(&running);

    // Cut off from NATS as far as its lease goes; it runs on and finds its job taken.
    lease.pause();
    let lost = stack.wait_for_state(&job.id, pb::JobState::Lost).await;
    assert_eq!(lost.reason, "its runner runner-1 stopped renewing its lease");
    wait_gone(pid, "the taken job").await;
    assert!(!lease.is_held());

    // A launch placed on it now is not taken (it is naked, and the scheduler queues the job
    // again as its runner's lease lapsed) until the runner holds its lease again.
    let next = stack.submit(&["true"]).await;
    let record = stack.store.job(&next.id).await.unwrap();
    let change = Change {
        pool: Some("local".into()),
        runner_id: Some("runner-1".into()),
        ..Change::default()
    };
    let scheduled = stack
        .store
        .transition(&record, JobState::Scheduled, change)
        .await
        .expect("nothing scheduled it: the pool has no live runner");
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    publish_job_change(&nats, &stack.store, &scheduled).await.unwrap();
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = stack.get(&next.id).await;
        assert!(
            [pb::JobState::Scheduled as i32, pb::JobState::Queued as i32].contains(&now.state),
            "a runner without its lease took a launch: {now:?}"
        );
    }
    lease.resume();
    stack.wait_for_state(&next.id, pb::JobState::Succeeded).await;

    // The taken job's state is the scheduler's: LOST, not changed since.
    let after = stack.get(&job.id).await;
    assert_eq!((after.state, after.version), (lost.state, lost.version), "{after:?}");
    let events = kiln_e2e::job_events(&stack, &after).await;
    assert_eq!(
        events.last().map(|e| e.state),
        Some(pb::JobState::Lost as i32),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_runner_back_after_its_job_was_queued_again_kills_the_old_attempt() {
    let mut stack = Stack::start_without_runner().await;
    let config = leased_runner(&stack, "runner-1", kiln_runner::OnLost::Requeue);
    stack.runner = Some(stack.spawn_runner(config.clone()).await);
    let job = stack.submit(&["sleep", "600"]).await;
    let first = stack.wait_for_state(&job.id, pb::JobState::Running).await;

    stack.runner.take().unwrap().crash().await;
    // Queued again; no runner is left to take it.
    let queued = stack
        .wait_for(&job.id, "the job queued again", |j| {
            j.attempt == 2 && j.state == pb::JobState::Queued as i32
        })
        .await;
    assert!(process_alive(pid_of(&first)), "the crashed runner's job died with it");

    stack.runner = Some(stack.spawn_runner(config).await);
    let second = stack
        .wait_for(&job.id, "the second attempt", |j| {
            j.attempt == 2 && j.state == pb::JobState::Running as i32
        })
        .await;
    // The restarted runner killed the first attempt's process instead of ending the job again.
    wait_gone(pid_of(&first), "the first attempt").await;
    assert_ne!(pid_of(&first), pid_of(&second));
    assert_eq!(
        queued.reason,
        "its runner runner-1 stopped renewing its lease; queued again"
    );
    // Queued once, by the scheduler (the submit's QUEUED has no reason).
    let reasons = queued_reasons(&stack, &job.id).await;
    assert_eq!(reasons, ["", queued.reason.as_str()], "{reasons:?}");
    stack.stop_job(&job.id).await;
}

/// Submits `command` and moves the job through the store as runner `runner-gone` (which holds no
/// lease) moves it: placed on it, started, then `last`. The scheduler is stopped meanwhile (a job
/// of a runner without a lease is the scheduler's to take back at any step); a test starts one.
async fn moved_by_a_runner_gone(command: &[&str], last: (JobState, Change)) -> (Stack, JobRecord) {
    let mut stack = Stack::start_without_runner().await;
    stack.scheduler.take().unwrap().stop().await;
    let job = stack.submit(command).await;
    let mut record = stack.store.job(&job.id).await.unwrap();
    let placed = Change {
        pool: Some("local".into()),
        runner_id: Some("runner-gone".into()),
        ..Change::default()
    };
    for (state, change) in [
        (JobState::Scheduled, placed),
        (JobState::Provisioning, Change::default()),
        (JobState::Running, Change::default()),
        last,
    ] {
        record = stack.store.transition(&record, state, change).await.unwrap();
    }
    (stack, record)
}

/// A runner ends a job PREEMPTED (its instance is being taken back) and dies before it queues
/// the job again: once the runner's lease has lapsed, the scheduler queues the job again as its
/// next attempt, which its runner would have done.
#[tokio::test]
async fn a_job_left_preempted_by_a_runner_gone_is_queued_again() {
    let preempted = Change {
        reason: Some(kiln_core::scheduling::SPOT_PREEMPTION.into()),
        preempted: true,
        ..Change::default()
    };
    let (stack, record) = moved_by_a_runner_gone(&["sleep", "600"], (JobState::Preempted, preempted)).await;
    assert_eq!((record.state.as_str(), record.attempt), ("PREEMPTED", 1));

    let _scheduler = kiln_e2e::spawn_scheduler(stack.scheduler_config("scheduler-2")).await;
    let queued = stack.wait_for_state(&record.id, pb::JobState::Queued).await;
    assert_eq!(queued.attempt, 2, "queued again as its next attempt");
    assert!(
        queued.reason.contains("runner-gone stopped renewing its lease"),
        "{}",
        queued.reason
    );
}

/// A runner that committed a job's end and went away before publishing it (its instance taken
/// back between the two) left a change nothing downstream hears of: once its lease has lapsed,
/// the scheduling leader publishes it.
#[tokio::test]
async fn a_change_a_runner_gone_committed_and_never_published_is_published() {
    let succeeded = Change {
        exit_code: Some(0),
        ..Change::default()
    };
    let (stack, record) = moved_by_a_runner_gone(&["true"], (JobState::Succeeded, succeeded)).await;
    assert!(
        record.published_version < record.version,
        "nothing published the runner's changes"
    );

    let _scheduler = kiln_e2e::spawn_scheduler(stack.scheduler_config("scheduler-2")).await;
    let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
    while stack.store.job(&record.id).await.unwrap().published_version < record.version {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runner's last change was never published"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let js = async_nats::jetstream::new(stack.nats.client().await);
    let stream = js.get_stream(subjects::STREAM_JOBS).await.unwrap();
    let message = stream
        .get_last_raw_message_by_subject(&subjects::job_event(&record.id))
        .await
        .unwrap();
    let event = <pb::JobEvent as prost::Message>::decode(message.payload.as_ref()).unwrap();
    assert_eq!(
        (event.version, event.state),
        (record.version, pb::JobState::Succeeded as i32)
    );
}
