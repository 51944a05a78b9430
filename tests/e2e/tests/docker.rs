//! Jobs in containers on a real Docker Engine (the one scripts/test.sh starts), with the test
//! image built locally from busybox.

use std::time::Duration;

use kiln_e2e::{
    Stack, bundle, docker, labelled, output, output_files, preempt, preempted_and_resumed, spec, test_image, upload,
    wait_for_line,
};
use kiln_proto::v1 as pb;
use kiln_runner::provider::docker::{LABEL_JOB, LABEL_RUNNER};

fn image_spec(command: &[&str]) -> pb::JobSpec {
    let mut spec = spec(command);
    spec.image = test_image();
    spec.resources = Some(pb::Resources {
        cpu_millis: 500,
        memory_bytes: 96 << 20,
        ..Default::default()
    });
    spec
}

async fn assert_nothing_left(runner_id: &str) {
    let (containers, volumes) = labelled(&docker().await, LABEL_RUNNER, runner_id).await;
    assert!(
        containers.is_empty() && volumes.is_empty(),
        "left on the engine: {containers:?} {volumes:?}"
    );
}

#[tokio::test]
async fn a_container_job_runs_with_its_limits_and_its_outputs_are_synced() {
    let stack = Stack::start_docker().await;
    let (bytes, digest) = bundle(&[
        ("train.sh", "echo training on $(cat /kiln/code/data.txt)\n"),
        ("data.txt", "mnist\n"),
    ]);
    upload(&mut stack.artifacts().await, &bytes, &digest).await.unwrap();
    let script = "sh train.sh; echo oops >&2; mkdir -p /kiln/outputs/ckpt; echo weights > /kiln/outputs/model.txt; \
                  echo step > /kiln/outputs/ckpt/1.txt; pwd; id -u; test -S /var/run/docker.sock || echo no-socket; sleep 2";
    let mut job_spec = image_spec(&["sh", "-c", script]);
    job_spec.code_digest = digest;
    let job = stack.submit_spec(job_spec).await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    assert!(running.instance_id.starts_with("docker:"), "{running:?}");

    // The engine holds the limits asked for, and none of the privileges.
    let container = running.instance_id.trim_start_matches("docker:");
    let inspected = docker().await.inspect_container(container, None).await.unwrap();
    let host = inspected.host_config.unwrap();
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.memory, Some(96 << 20));
    assert_eq!(host.privileged, Some(false));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    let labels = inspected.config.unwrap().labels.unwrap();
    assert_eq!(labels.get(LABEL_JOB), Some(&job.id));

    let lines = stack.log_lines(&job.id, true).await;
    let done = stack.get(&job.id).await;
    assert_eq!(
        (done.state, done.exit_code),
        (pb::JobState::Succeeded as i32, Some(0)),
        "{done:?}"
    );
    // stdout and stderr are ordered each, not against each other.
    let stream = |which: pb::LogStream| -> Vec<&str> {
        lines
            .iter()
            .filter(|l| l.stream == which as i32)
            .map(|l| l.text.as_str())
            .collect()
    };
    assert_eq!(
        stream(pb::LogStream::Stdout),
        ["training on mnist", "/kiln/code", "0", "no-socket"]
    );
    assert_eq!(stream(pb::LogStream::Stderr), ["oops"]);
    let files = output_files(&stack, &job.id).await;
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["ckpt/1.txt", "model.txt"]);
    assert_eq!(output(&stack, &job.id, "model.txt").await.unwrap(), "weights\n");
    assert_eq!(
        output(&stack, &job.id, "nope.txt").await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    assert_nothing_left(&stack.docker_runner_id()).await;
}

#[tokio::test]
async fn a_stopped_container_gets_sigterm_and_its_outputs_are_synced() {
    let stack = Stack::start_docker().await;
    let script =
        "trap 'echo stopped > /kiln/outputs/marker.txt; exit 0' TERM; echo ready; while true; do sleep 0.2; done";
    let job = stack.submit_spec(image_spec(&["sh", "-c", script])).await;
    stack.wait_for_state(&job.id, pb::JobState::Running).await;
    stack.wait_for(&job.id, "the job's first line", |_| true).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap();
    let stopped = stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    assert_eq!(stopped.reason, "stopped by user");
    assert_eq!(stopped.exit_code, Some(0), "the job exited from its trap: {stopped:?}");
    assert_eq!(output(&stack, &job.id, "marker.txt").await.unwrap(), "stopped\n");
    assert_nothing_left(&stack.docker_runner_id()).await;
}

/// A container asks for a sync of its outputs by touching `.kiln-sync`: the runner reads the
/// marker through the engine's archive API and syncs the outputs while the job runs, without the
/// marker itself.
#[tokio::test]
async fn a_container_asks_for_a_sync_with_its_marker_file() {
    let stack = Stack::start_docker().await;
    let script = "echo 7 > /kiln/outputs/step && touch /kiln/outputs/.kiln-sync && while true; do sleep 0.2; done";
    let job = stack.submit_spec(image_spec(&["sh", "-c", script])).await;
    stack.wait_for_state(&job.id, pb::JobState::Running).await;
    let synced = stack
        .wait_for(&job.id, "its sync recorded", |j| j.outputs_synced_at_ms > 0)
        .await;
    assert_eq!(synced.state, pb::JobState::Running as i32, "{synced:?}");
    assert_eq!(synced.outputs_synced_bytes, 2, "{synced:?}");
    assert_eq!(output(&stack, &job.id, "step").await.unwrap(), "7\n");
    let marker = output(&stack, &job.id, ".kiln-sync").await;
    assert_eq!(marker.unwrap_err().code(), tonic::Code::NotFound);
    stack.stop_job(&job.id).await;
    stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    assert_nothing_left(&stack.docker_runner_id()).await;
}

#[tokio::test]
async fn a_job_past_its_max_runtime_ends_stopped_with_reason_timeout() {
    let stack = Stack::start_docker().await;
    let mut job_spec = image_spec(&["sleep", "600"]);
    job_spec.max_runtime_secs = 1;
    let job = stack.submit_spec(job_spec).await;
    let stopped = stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    assert_eq!(stopped.reason, "timeout");
    assert_nothing_left(&stack.docker_runner_id()).await;
}

#[tokio::test]
async fn a_dataset_is_mounted_read_only() {
    let stack = Stack::start_docker().await;
    let (bytes, digest) = bundle(&[("train/x.txt", "1,2,3\n")]);
    upload(&mut stack.artifacts().await, &bytes, &digest).await.unwrap();
    let mut datasets = kiln_proto::v1::dataset_service_client::DatasetServiceClient::with_interceptor(
        tonic::transport::Channel::from_shared(format!("http://{}", stack.api_addr))
            .unwrap()
            .connect()
            .await
            .unwrap(),
        kiln_core::auth::BearerInterceptor::new(&stack.token),
    );
    datasets
        .create_dataset(pb::CreateDatasetRequest {
            name: "numbers".into(),
            digest: digest.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let again = datasets
        .create_dataset(pb::CreateDatasetRequest {
            name: "numbers".into(),
            digest,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists);

    let mut job_spec = image_spec(&[
        "sh",
        "-c",
        // The content, the mount's first option (a read-only bind of the runner's cache entry),
        // and a write that must fail.
        r#"cat /kiln/data/numbers/train/x.txt; awk '$5 == "/kiln/data/numbers" { split($6, o, ","); print o[1] }' /proc/self/mountinfo; echo more >> /kiln/data/numbers/train/x.txt"#,
    ]);
    job_spec.datasets = vec!["numbers".into()];
    let job = stack.submit_spec(job_spec).await;
    let lines = stack.log_lines(&job.id, true).await;
    let done = stack.get(&job.id).await;
    assert_eq!(done.state, pb::JobState::Failed as i32, "{done:?}");
    let stdout: Vec<&str> = lines
        .iter()
        .filter(|l| l.stream == pb::LogStream::Stdout as i32)
        .map(|l| l.text.as_str())
        .collect();
    assert_eq!(stdout, ["1,2,3", "ro"]);
    assert!(
        // The files' modes refuse it first (no capability overrides them); the mount would too.
        lines
            .iter()
            .any(|l| l.text.contains("Permission denied") || l.text.contains("Read-only file system")),
        "{lines:?}"
    );

    let mut missing = image_spec(&["true"]);
    missing.datasets = vec!["nope".into()];
    let status = stack
        .jobs()
        .await
        .submit_job(pb::SubmitJobRequest {
            spec: Some(missing),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_nothing_left(&stack.docker_runner_id()).await;
}

#[tokio::test]
async fn an_escaping_code_bundle_is_rejected_before_anything_runs() {
    let stack = Stack::start_docker().await;
    // One bundle with an escaping symlink, one with a `../` entry (written raw, as an attacker
    // would: the tar builder refuses such paths).
    let mut symlink = tar::Header::new_gnu();
    symlink.set_entry_type(tar::EntryType::Symlink);
    symlink.set_size(0);
    symlink.set_mode(0o777);
    symlink.set_link_name("../../../etc").unwrap();
    let mut dotdot = tar::Header::new_old();
    dotdot.as_old_mut().name[..13].copy_from_slice(b"../escape.txt");
    dotdot.set_entry_type(tar::EntryType::Regular);
    dotdot.set_size(1);
    dotdot.set_mode(0o644);
    for (header, name, data, expected) in [
        (symlink, "escape", &b""[..], "points outside"),
        (dotdot, "", &b"x"[..], "leaves the destination"),
    ] {
        let mut header = header;
        header.set_cksum();
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        if name.is_empty() {
            builder.append(&header, data).unwrap();
        } else {
            builder.append_data(&mut header, name, data).unwrap();
        }
        let bytes = builder.into_inner().unwrap().finish().unwrap();
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        upload(&mut stack.artifacts().await, &bytes, &digest).await.unwrap();
        let mut job_spec = image_spec(&["true"]);
        job_spec.code_digest = digest;
        let job = stack.submit_spec(job_spec).await;
        let failed = stack.wait_for_state(&job.id, pb::JobState::Failed).await;
        assert!(
            failed.reason.contains("bad code bundle") && failed.reason.contains(expected),
            "{failed:?}"
        );
        assert!(failed.started_at_ms == 0, "it never ran: {failed:?}");
        let (containers, volumes) = labelled(&docker().await, LABEL_JOB, &job.id).await;
        assert!(
            containers.is_empty() && volumes.is_empty(),
            "nothing was created: {containers:?} {volumes:?}"
        );
    }
    assert_nothing_left(&stack.docker_runner_id()).await;
}

#[tokio::test]
async fn a_missing_image_fails_with_a_clear_reason() {
    let stack = Stack::start_docker().await;
    let mut job_spec = image_spec(&["true"]);
    job_spec.image = "kiln-test/does-not-exist:1".into();
    let job = stack.submit_spec(job_spec).await;
    let failed = stack.wait_for_state(&job.id, pb::JobState::Failed).await;
    assert!(
        failed.reason.starts_with("image not found: kiln-test/does-not-exist:1"),
        "{failed:?}"
    );
    let lines = stack.log_lines(&job.id, true).await;
    assert!(lines.iter().any(|l| l.text.contains("image not found")), "{lines:?}");
    assert_nothing_left(&stack.docker_runner_id()).await;
}

#[tokio::test]
async fn a_runner_killed_mid_job_ends_it_lost_and_leaves_nothing_on_the_engine() {
    let mut stack = Stack::start_docker().await;
    let script = "echo step1 > /kiln/outputs/progress.txt; echo started; sleep 600";
    let job = stack.submit_spec(image_spec(&["sh", "-c", script])).await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    stack.runner.take().unwrap().crash().await;
    let (containers, _) = labelled(&docker().await, LABEL_JOB, &job.id).await;
    assert_eq!(containers.len(), 1, "the container outlives the crashed runner");

    stack.runner = Some(
        stack
            .spawn_runner(stack.docker_runner_config(&stack.docker_runner_id()))
            .await,
    );
    let lost = stack.wait_for_state(&job.id, pb::JobState::Lost).await;
    assert_eq!(lost.reason, "the runner restarted while the job ran");
    assert_eq!(lost.instance_id, running.instance_id);
    // What it wrote before is kept.
    assert_eq!(output(&stack, &job.id, "progress.txt").await.unwrap(), "step1\n");
    assert_nothing_left(&stack.docker_runner_id()).await;
}

#[tokio::test]
async fn a_job_without_an_image_fails_on_a_docker_runner() {
    let stack = Stack::start_docker().await;
    let job = stack.submit(&["true"]).await;
    let failed = stack.wait_for_state(&job.id, pb::JobState::Failed).await;
    assert!(failed.reason.contains("must name an image"), "{failed:?}");
}

#[tokio::test]
async fn an_auto_runner_runs_image_jobs_in_containers_and_the_rest_as_processes() {
    let mut stack = Stack::start_without_runner().await;
    let runner_id = stack.docker_runner_id();
    let mut config = stack.docker_runner_config(&runner_id);
    config.provider = kiln_runner::ProviderKind::Auto;
    stack.runner = Some(stack.spawn_runner(config).await);
    let container = stack.submit_spec(image_spec(&["sh", "-c", "sleep 1"])).await;
    let process = stack.submit(&["sh", "-c", "sleep 1"]).await;
    let container = stack.wait_for_state(&container.id, pb::JobState::Succeeded).await;
    let process = stack.wait_for_state(&process.id, pb::JobState::Succeeded).await;
    assert!(container.instance_id.starts_with("docker:"), "{container:?}");
    assert!(process.instance_id.starts_with("pid:"), "{process:?}");
    assert_nothing_left(&runner_id).await;
}

#[tokio::test]
async fn a_preempted_container_finds_its_checkpoint_in_its_next_attempt() {
    let stack = Stack::start_docker().await;
    let (_, resumed) = preempted_and_resumed(&stack, image_spec(&[])).await;
    assert_eq!(resumed, "2 step-42 /kiln/outputs");
    assert_nothing_left(&stack.docker_runner_id()).await;
}

#[tokio::test]
async fn a_job_run_as_a_user_owns_its_outputs_and_what_it_restored() {
    let mut stack = Stack::start_without_runner().await;
    let mut config = stack.docker_runner_config(&stack.docker_runner_id());
    config.docker.user = "1000:1001".into();
    stack.runner = Some(stack.spawn_runner(config).await);
    // The second attempt writes over its restored checkpoint and adds a file beside it.
    let script = r#"
if [ -n "$KILN_RESUME_FROM" ]; then
  echo "resumed as $(id -u):$(id -g) from $(cat "$KILN_RESUME_FROM/ckpt/step.txt")"
  echo step-43 > "$KILN_OUTPUTS/ckpt/step.txt" && touch "$KILN_OUTPUTS/ckpt/more" && echo rewrote
  exit 0
fi
trap 'mkdir -p "$KILN_OUTPUTS/ckpt" && echo step-42 > "$KILN_OUTPUTS/ckpt/step.txt"; exit 0' TERM
echo ready
sleep 60 &
wait
"#;
    let job = stack.submit_spec(image_spec(&["sh", "-c", script])).await;
    wait_for_line(&stack, &job.id, "ready").await;
    preempt(&stack, &job.id).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!((done.attempt, done.preemptions), (2, 1), "{done:?}");
    let lines: Vec<String> = stack
        .log_lines(&job.id, true)
        .await
        .into_iter()
        .map(|l| l.text)
        .collect();
    assert!(
        lines.contains(&"resumed as 1000:1001 from step-42".to_string()),
        "{lines:?}"
    );
    assert!(lines.contains(&"rewrote".to_string()), "{lines:?}");
    assert_eq!(output(&stack, &job.id, "ckpt/step.txt").await.unwrap(), "step-43\n");
    assert_nothing_left(&stack.docker_runner_id()).await;
}

/// `--disk`: a job writing past its own disk fails with that reason, and its disk (a
/// loop-mounted file under the runner's work dir) is gone after; the control, the same job
/// without `--disk`, fills the runner's disk instead and succeeds. `--shm` sizes /dev/shm.
#[tokio::test]
async fn a_job_writing_past_its_disk_fails_with_that_reason_and_shm_is_sized() {
    let stack = Stack::start_docker().await;
    // Refused at submit, saying why.
    for (disk_bytes, shm_bytes, image, why) in [
        (1 << 20, 0, test_image(), "at least 16777216"),
        (32 << 20, 0, String::new(), "--disk needs an image"),
        (0, 512 << 20, test_image(), "more than the memory"),
    ] {
        let mut bad = image_spec(&["true"]);
        bad.image = image;
        bad.resources = Some(pb::Resources {
            cpu_millis: 500,
            memory_bytes: 96 << 20,
            disk_bytes,
            shm_bytes,
        });
        let refused = stack.try_submit(bad).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(why), "{refused:?}");
    }

    let writer = "dd if=/dev/zero of=/kiln/outputs/big bs=1M count=48 && df -k /dev/shm /kiln/outputs";
    let mut on_disk = image_spec(&["sh", "-c", writer]);
    on_disk.resources = Some(pb::Resources {
        cpu_millis: 500,
        memory_bytes: 1536 << 20,
        disk_bytes: 32 << 20,
        shm_bytes: 1 << 30,
    });
    let job = stack.submit_spec(on_disk).await;
    let running = stack.wait_for(&job.id, "its end", |j| j.finished_at_ms > 0).await;
    assert_eq!(running.state, pb::JobState::Failed as i32, "{running:?}");
    assert!(running.reason.contains("its disk is full"), "{running:?}");
    let disks = stack.dir.path().join("work").join("disks");
    let left: Vec<_> = std::fs::read_dir(&disks)
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "disks left under {}: {left:?}", disks.display());

    // /dev/shm is 1 GiB (1048576 KiB blocks) when asked.
    let mut shm = image_spec(&["sh", "-c", "df -k /dev/shm | tail -n 1"]);
    shm.resources = Some(pb::Resources {
        cpu_millis: 500,
        memory_bytes: 1536 << 20,
        shm_bytes: 1 << 30,
        ..Default::default()
    });
    let shm_job = stack.submit_spec(shm).await;
    let lines = stack.log_lines(&shm_job.id, true).await;
    let shm_done = stack.get(&shm_job.id).await;
    assert_eq!(shm_done.state, pb::JobState::Succeeded as i32, "{shm_done:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.text.split_whitespace().nth(1) == Some("1048576")),
        "{lines:?}"
    );

    // The control: without --disk the same write lands on the runner's disk and succeeds.
    let unbounded = stack.submit_spec(image_spec(&["sh", "-c", writer])).await;
    stack.log_lines(&unbounded.id, true).await;
    let unbounded = stack.get(&unbounded.id).await;
    assert_eq!(unbounded.state, pb::JobState::Succeeded as i32, "{unbounded:?}");
    assert_nothing_left(&stack.docker_runner_id()).await;
}
