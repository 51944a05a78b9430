//! Datasets through the runner's cache: a process job reads its dataset read-only from the
//! cache and a second job reuses it; a dataset is deleted once no live job names it; a 1 GiB
//! dataset reaches a job while the runner (a separate process, measured) stays small.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_e2e::{Stack, bundle, spec, upload};
use kiln_proto::v1 as pb;
use sha2::Digest;

async fn create_dataset(stack: &Stack, name: &str, digest: &str) {
    stack
        .datasets()
        .await
        .create_dataset(pb::CreateDatasetRequest {
            name: name.into(),
            digest: digest.into(),
            ..Default::default()
        })
        .await
        .expect("create dataset");
}

async fn delete_dataset(stack: &Stack, name: &str) -> Result<pb::DeleteDatasetResponse, tonic::Status> {
    stack
        .datasets()
        .await
        .delete_dataset(pb::DeleteDatasetRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

/// Runs a job to its end; returns its state and stdout lines.
async fn run(stack: &Stack, job_spec: pb::JobSpec) -> (pb::Job, Vec<String>) {
    let job = stack.submit_spec(job_spec).await;
    let lines = stack.log_lines(&job.id, true).await;
    let done = stack.get(&job.id).await;
    let stdout = lines
        .into_iter()
        .filter(|l| l.stream == pb::LogStream::Stdout as i32)
        .map(|l| l.text)
        .collect();
    (done, stdout)
}

fn blob(stack: &Stack, digest: &str) -> PathBuf {
    stack.objects_dir().join("artifacts/sha256").join(digest)
}

/// The cache of the stack's runner: under the work root when it isolates process jobs (as
/// root), else `<work-dir>/.datasets`.
fn cache_dir(stack: &Stack) -> PathBuf {
    stack
        .runner_config("runner-1")
        .dataset_cache_dir()
        .canonicalize()
        .expect("the runner's dataset cache")
}

#[tokio::test]
async fn a_process_job_reads_its_dataset_read_only_from_the_cache_and_the_next_reuses_it() {
    let stack = Stack::start().await;
    let (bytes, digest) = bundle(&[("train/x.txt", "1,2,3\n")]);
    upload(&mut stack.artifacts().await, &bytes, &digest).await.unwrap();
    create_dataset(&stack, "numbers", &digest).await;
    // Its content, where it is, and how many of its paths anyone may write (by mode).
    let script = r#"cat "$KILN_DATA/numbers/train/x.txt"; readlink -f "$KILN_DATA/numbers"; find "$KILN_DATA/numbers/" -perm /222 | wc -l"#;
    let mut job_spec = spec(&["sh", "-c", script]);
    job_spec.datasets = vec!["numbers".into()];
    let (first, stdout) = run(&stack, job_spec.clone()).await;
    assert_eq!(first.state, pb::JobState::Succeeded as i32, "{first:?}");
    let cached = cache_dir(&stack).join(&digest);
    assert_eq!(stdout, ["1,2,3", &cached.display().to_string(), "0"]);

    // With the archive gone from the object store, a second job can only have the cached copy.
    std::fs::remove_file(blob(&stack, &digest)).unwrap();
    let (second, again) = run(&stack, job_spec).await;
    assert_eq!(second.state, pb::JobState::Succeeded as i32, "{second:?}");
    assert_eq!(again, stdout);
}

#[tokio::test]
async fn a_dataset_is_deleted_once_no_live_job_names_it() {
    let stack = Stack::start().await;
    let (bytes, digest) = bundle(&[("x.txt", "x\n")]);
    upload(&mut stack.artifacts().await, &bytes, &digest).await.unwrap();
    create_dataset(&stack, "a", &digest).await;
    create_dataset(&stack, "b", &digest).await;
    let mut sleeper = spec(&["sleep", "30"]);
    sleeper.datasets = vec!["a".into()];
    let job = stack.submit_spec(sleeper).await;
    stack.wait_for_state(&job.id, pb::JobState::Running).await;
    assert!(cache_dir(&stack).join(&digest).try_exists().unwrap());

    let refused = delete_dataset(&stack, "a").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains(&job.id), "{refused:?}");
    // A member of the project may not delete another member's dataset.
    let ada_token = stack.member("ada").await;
    let denied = stack
        .datasets_as(&ada_token)
        .await
        .delete_dataset(pb::DeleteDatasetRequest {
            name: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");

    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap();
    stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    // b names the same archive: it stays.
    assert!(!delete_dataset(&stack, "a").await.unwrap().archive_deleted);
    assert!(blob(&stack, &digest).try_exists().unwrap());
    assert!(delete_dataset(&stack, "b").await.unwrap().archive_deleted);
    assert!(!blob(&stack, &digest).try_exists().unwrap());
    assert_eq!(
        delete_dataset(&stack, "b").await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    let stat = stack
        .artifacts()
        .await
        .stat_artifact(pb::StatArtifactRequest {
            digest: digest.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!stat.exists);

    // The runner drops the deleted archive's copy when it next evicts (after its next fetch).
    let (bytes, other) = bundle(&[("y.txt", "y\n")]);
    upload(&mut stack.artifacts().await, &bytes, &other).await.unwrap();
    create_dataset(&stack, "c", &other).await;
    let mut reader = spec(&["sh", "-c", r#"cat "$KILN_DATA/c/y.txt""#]);
    reader.datasets = vec!["c".into()];
    let (done, stdout) = run(&stack, reader).await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    assert_eq!(stdout, ["y"]);
    assert!(!cache_dir(&stack).join(&digest).try_exists().unwrap());
    assert!(cache_dir(&stack).join(&other).try_exists().unwrap());
}

/// Incompressible bytes from a seeded PRNG.
struct Noise(rand::rngs::StdRng);

impl std::io::Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        rand::RngCore::fill_bytes(&mut self.0, buf);
        Ok(buf.len())
    }
}

/// Writes a tar.gz holding `data.bin` of `size` noise bytes, gzip-stored (no compression, so
/// it is quick), hashing as it goes. Returns the digest and the archive's size.
fn write_noise_archive(path: &Path, size: u64) -> (String, u64) {
    use std::io::{Read, Write};
    struct Hashing(std::io::BufWriter<std::fs::File>, sha2::Sha256, u64);
    impl Write for Hashing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = self.0.write(buf)?;
            self.1.update(&buf[..n]);
            self.2 += n as u64;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.0.flush()
        }
    }
    let file = std::fs::File::create(path).unwrap();
    let hashing = Hashing(std::io::BufWriter::with_capacity(1 << 20, file), sha2::Sha256::new(), 0);
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(hashing, flate2::Compression::none()));
    let mut header = tar::Header::new_gnu();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_cksum();
    let noise = Noise(rand::SeedableRng::seed_from_u64(12));
    builder.append_data(&mut header, "data.bin", noise.take(size)).unwrap();
    let mut hashing = builder.into_inner().unwrap().finish().unwrap();
    hashing.flush().unwrap();
    (hex::encode(hashing.1.finalize()), hashing.2)
}

/// Uploads a file through `ArtifactService`, streamed in 1 MiB chunks.
async fn upload_file(stack: &Stack, path: &Path, digest: &str, size: u64) {
    use pb::upload_artifact_request::Part;
    use tokio::io::AsyncReadExt;
    let header = pb::UploadArtifactRequest {
        part: Some(Part::Header(pb::ArtifactHeader {
            digest: digest.into(),
            size,
            ..Default::default()
        })),
    };
    let file = tokio::fs::File::open(path).await.unwrap();
    let chunks = futures::stream::unfold(file, |mut file| async move {
        let mut buffer = vec![0u8; 1 << 20];
        let n = file.read(&mut buffer).await.unwrap();
        (n > 0).then(|| {
            buffer.truncate(n);
            let message = pb::UploadArtifactRequest {
                part: Some(Part::Chunk(buffer)),
            };
            (message, file)
        })
    });
    let messages = futures::StreamExt::chain(futures::stream::once(async { header }), chunks);
    stack.artifacts().await.upload_artifact(messages).await.expect("upload");
}

/// The peak resident set of a process, in bytes (VmHWM).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[tokio::test]
async fn a_1_gib_dataset_reaches_a_job_while_the_runner_stays_under_200_mb() {
    const SIZE: u64 = 1 << 30;
    let stack = Stack::start_without_runner().await;
    // The archive and its blob, then the blob and the unpacked copy, are on the disk together.
    let cache = stack.runner_config("runner-big").dataset_cache_dir();
    for dir in [
        stack.dir.path(),
        cache.ancestors().find(|dir| dir.try_exists().unwrap_or(false)).unwrap(),
    ] {
        let stat = nix::sys::statvfs::statvfs(dir).unwrap();
        let free = stat.blocks_available() * stat.fragment_size();
        assert!(
            free > 2 * SIZE + (256 << 20),
            "this test needs 2.25 GiB free on the filesystem of {}; it has {} MiB",
            dir.display(),
            free >> 20
        );
    }
    let archive = stack.dir.path().join("big.tar.gz");
    let written = archive.clone();
    let (digest, archive_size) = tokio::task::spawn_blocking(move || write_noise_archive(&written, SIZE))
        .await
        .unwrap();
    let before_upload = peak_rss(std::process::id());
    upload_file(&stack, &archive, &digest, archive_size).await;
    std::fs::remove_file(&archive).unwrap();
    let after_upload = peak_rss(std::process::id());
    create_dataset(&stack, "big", &digest).await;

    // The runner in its own process, so its memory is its own.
    let config = stack.runner_config("runner-big");
    let config_file = stack.dir.path().join("runner.toml");
    std::fs::write(&config_file, toml::to_string(&config).unwrap()).unwrap();
    let mut runner = tokio::process::Command::new(kiln_e2e::workspace_binary("kiln-runner"))
        .arg("--config")
        .arg(&config_file)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .expect("kiln-runner starts");
    let pid = runner.id().unwrap();

    let mut job_spec = spec(&["sh", "-c", r#"wc -c < "$KILN_DATA/big/data.bin""#]);
    job_spec.datasets = vec!["big".into()];
    let job = stack.submit_spec(job_spec).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let done = loop {
        let current = stack.get(&job.id).await;
        if current.state == pb::JobState::Succeeded as i32 || current.state == pb::JobState::Failed as i32 {
            break current;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job did not end: {current:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let runner_peak = peak_rss(pid);
    let lines = stack.log_lines(&job.id, false).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(30), runner.wait()).await;

    eprintln!(
        "1 GiB dataset: runner peak RSS {} MiB; test process (api in-process) peak RSS {} MiB before the upload, {} MiB after",
        runner_peak >> 20,
        before_upload >> 20,
        after_upload >> 20
    );
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?} {lines:?}");
    let stdout: Vec<&str> = lines.iter().map(|l| l.text.trim()).collect();
    assert_eq!(stdout, [SIZE.to_string()]);
    assert!(
        runner_peak < 200 << 20,
        "the runner peaked at {} MiB",
        runner_peak >> 20
    );
    // Upload through the api streams too: the test process (api included) grew by far less
    // than the archive.
    assert!(
        after_upload.saturating_sub(before_upload) < 200 << 20,
        "the upload grew the api's process by {} MiB",
        (after_upload - before_upload) >> 20
    );
}
