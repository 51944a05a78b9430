//! Jobs for the tests: specs, code bundles, their processes, outputs, preemptions and logs.

use super::*;

/// A spec for a small job without code.
pub fn spec(command: &[&str]) -> pb::JobSpec {
    pb::JobSpec {
        command: command.iter().map(|s| s.to_string()).collect(),
        resources: Some(pb::Resources {
            cpu_millis: 500,
            memory_bytes: 64 << 20,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Builds a tar.gz code bundle from (path, content) pairs and returns it with its sha256.
pub fn bundle(files: &[(&str, &str)]) -> (Vec<u8>, String) {
    use sha2::Digest;
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for (path, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, path, content.as_bytes())
            .expect("append");
    }
    let bytes = builder.into_inner().expect("tar").finish().expect("gzip");
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    (bytes, digest)
}

/// Uploads a bundle through `ArtifactService` to the `default` project.
pub async fn upload(
    client: &mut ArtifactServiceClient<Authed>,
    bytes: &[u8],
    digest: &str,
) -> Result<pb::UploadArtifactResponse, tonic::Status> {
    upload_to(client, bytes, digest, "").await
}

/// Uploads a bundle through `ArtifactService` to `project` (empty: `default`, or a job's own).
pub async fn upload_to(
    client: &mut ArtifactServiceClient<Authed>,
    bytes: &[u8],
    digest: &str,
    project: &str,
) -> Result<pb::UploadArtifactResponse, tonic::Status> {
    use pb::upload_artifact_request::Part;
    let mut messages = vec![pb::UploadArtifactRequest {
        part: Some(Part::Header(pb::ArtifactHeader {
            digest: digest.into(),
            size: bytes.len() as u64,
            project: project.into(),
        })),
    }];
    messages.extend(bytes.chunks(1000).map(|c| pb::UploadArtifactRequest {
        part: Some(Part::Chunk(c.to_vec())),
    }));
    client
        .upload_artifact(futures::stream::iter(messages))
        .await
        .map(|r| r.into_inner())
}

/// Saves `bytes` as the one-file run artifact `name` of `job_id`, as `kiln.save` does: the blob
/// uploaded first, then named.
pub async fn save_file(stack: &Stack, job_id: &str, name: &str, bytes: &[u8]) {
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(bytes));
    let mut artifacts = stack.artifacts().await;
    upload(&mut artifacts, bytes, &digest).await.expect("upload the blob");
    let file = pb::RunArtifactFile {
        name: String::new(),
        path: String::new(),
        digest,
        size: bytes.len() as u64,
    };
    let request = pb::SaveRunArtifactRequest {
        job_id: job_id.into(),
        name: name.into(),
        files: vec![file],
    };
    artifacts
        .save_run_artifact(request)
        .await
        .expect("save the run artifact");
}

/// Tells whether a process with this pid exists (zombies count as gone).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// The pid in an instance id `pid:<n>`.
pub fn pid_of(job: &pb::Job) -> i32 {
    job.instance_id
        .strip_prefix("pid:")
        .and_then(|p| p.parse().ok())
        .expect("a process instance id")
}

/// Reads a job's synced output file.
pub async fn output(stack: &Stack, job_id: &str, path: &str) -> Result<String, tonic::Status> {
    use futures::StreamExt;
    let request = pb::GetOutputRequest {
        job_id: job_id.into(),
        path: path.into(),
    };
    let mut chunks = stack.artifacts().await.get_output(request).await?.into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = chunks.next().await {
        data.extend(chunk?.data);
    }
    Ok(String::from_utf8_lossy(&data).into_owned())
}

/// The files a job's synced outputs hold, through `ListOutputs`, sorted by path.
pub async fn output_files(stack: &Stack, job_id: &str) -> Vec<pb::OutputFile> {
    let request = pb::ListOutputsRequest {
        job_id: job_id.into(),
        prefix: String::new(),
    };
    let response = stack.artifacts().await.list_outputs(request).await;
    response.expect("list outputs").into_inner().files
}

/// Preempts a running job as a higher priority would (ACTION_PREEMPT to its runner): SIGTERM,
/// the grace period, outputs synced, queued again with `resume_from` set.
pub async fn preempt(stack: &Stack, job_id: &str) {
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.expect("nats");
    let job = stack.store.job(job_id).await.expect("job record");
    kiln_core::events::preempt_job(&nats, &job, "a-test")
        .await
        .expect("preempt");
}

/// Waits until a job has logged a line starting with `prefix`.
pub async fn wait_for_line(stack: &Stack, job_id: &str, prefix: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let lines = stack.log_lines(job_id, false).await;
        if lines.iter().any(|l| l.text.starts_with(prefix)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no line {prefix:?} in {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A job script that checkpoints `step-42` into its outputs when it is stopped, and, as a
/// resumed attempt, prints `resumed <attempt> <checkpoint> <KILN_RESUME_FROM>` and ends.
pub const CHECKPOINTING_SCRIPT: &str = r#"
if [ -n "$KILN_RESUME_FROM" ]; then
  echo "resumed $KILN_ATTEMPT $(cat "$KILN_RESUME_FROM/ckpt/step.txt") $KILN_RESUME_FROM"
  exit 0
fi
trap 'mkdir -p "$KILN_OUTPUTS/ckpt"; echo step-42 > "$KILN_OUTPUTS/ckpt/step.txt"; exit 0' TERM
echo ready
sleep 60 &
wait
"#;

/// Runs [`CHECKPOINTING_SCRIPT`] as `job_spec` (its command replaced), preempts its first
/// attempt once ready, and checks that the second succeeds, finds the checkpoint and syncs it
/// again. Returns the job and the second attempt's `resumed …` line, for the caller to check
/// where `KILN_RESUME_FROM` pointed.
pub async fn preempted_and_resumed(stack: &Stack, mut job_spec: pb::JobSpec) -> (pb::Job, String) {
    job_spec.command = ["sh", "-c", CHECKPOINTING_SCRIPT].map(String::from).to_vec();
    let job = stack.submit_spec(job_spec).await;
    wait_for_line(stack, &job.id, "ready").await;
    preempt(stack, &job.id).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!((done.attempt, done.preemptions), (2, 1), "{done:?}");
    let lines = stack.log_lines(&job.id, true).await;
    let resumed: Vec<&str> = lines.iter().filter_map(|l| l.text.strip_prefix("resumed ")).collect();
    let [resumed] = resumed[..] else {
        panic!("one resumed line in {lines:?}");
    };
    assert_eq!(output(stack, &job.id, "ckpt/step.txt").await.unwrap(), "step-42\n");
    let resumed = resumed.to_string();
    (done, resumed)
}

/// A directory jobs can write to (a marker, a count of runs): when the tests run as root, process
/// jobs run as uids of their own, which cannot write in a test's temp dir. Not sticky, so that
/// [`job_writable_file`]s made there can be appended to by every attempt's uid.
pub fn job_writable_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("open the temp dir to jobs");
    dir
}

/// An empty file in `dir` that jobs of any uid may append to (attempts of one job run as
/// different uids).
pub fn job_writable_file(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, "").expect("a marker file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("open the marker to jobs");
    path
}
