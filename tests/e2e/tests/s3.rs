//! The services on S3 (the versitygw of scripts/test.sh, `KILN_TEST_S3_*`): a job's code
//! bundle goes up through the api, the runner streams it down, the job's outputs (one of them
//! in several parts) are synced up and read back through the api, and a preempted job's next
//! attempt is restored from what its first attempt synced.

use futures::StreamExt;
use kiln_core::testing::s3_objects_config;
use kiln_e2e::{Stack, bundle, output, output_files, preempted_and_resumed, spec, upload};
use kiln_proto::v1 as pb;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

/// Larger than the runner's 8 MiB part, so it goes up as a multipart upload.
const BIG_BYTES: u64 = 20 << 20;

#[tokio::test]
async fn a_job_on_s3_gets_its_code_and_its_outputs_come_back() {
    let stack = Stack::start_with_objects(s3_objects_config("e2e")).await;
    let (bytes, digest) = bundle(&[
        ("data/hello.txt", "hello from the bundle\n"),
        (
            "run.sh",
            "cat data/hello.txt\nmkdir -p \"$KILN_OUTPUTS/ckpt\"\necho done > \"$KILN_OUTPUTS/ckpt/result.txt\"\n\
             head -c 20971520 /dev/zero | tr '\\0' k > \"$KILN_OUTPUTS/big.bin\"\n",
        ),
    ]);
    upload(&mut stack.artifacts().await, &bytes, &digest).await.unwrap();
    let mut job_spec = spec(&["sh", "run.sh"]);
    job_spec.code_digest = digest.clone();
    let job = stack.submit_spec(job_spec).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    let lines = stack.log_lines(&job.id, true).await;
    assert!(
        lines.iter().any(|line| line.text == "hello from the bundle"),
        "{done:?} {lines:?}"
    );

    // Read back through the api.
    assert_eq!(output(&stack, &job.id, "ckpt/result.txt").await.unwrap(), "done\n");
    let files = output_files(&stack, &job.id).await;
    let listed: Vec<(&str, u64)> = files.iter().map(|file| (file.path.as_str(), file.size)).collect();
    assert_eq!(listed, [("big.bin", BIG_BYTES), ("ckpt/result.txt", 5)]);
    let mut chunks = stack
        .artifacts()
        .await
        .get_output(pb::GetOutputRequest {
            job_id: job.id.clone(),
            path: "big.bin".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut received: u64 = 0;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.unwrap();
        assert!(chunk.data.iter().all(|b| *b == b'k'), "big.bin holds only k");
        received += chunk.data.len() as u64;
    }
    assert_eq!(received, BIG_BYTES);

    // The blobs are in the bucket, and nothing went to a local directory.
    let objects = kiln_core::objects::open(&stack.objects).unwrap();
    let code = ObjectPath::from(format!("artifacts/sha256/{digest}"));
    assert_eq!(objects.head(&code).await.unwrap().size, bytes.len() as u64);
    let big = ObjectPath::from(format!("outputs/{}/big.bin", job.id));
    assert_eq!(objects.head(&big).await.unwrap().size, BIG_BYTES);
    assert!(!stack.dir.path().join("objects").try_exists().unwrap());
}

#[tokio::test]
async fn a_preempted_job_on_s3_is_restored_from_its_synced_outputs() {
    let stack = Stack::start_with_objects(s3_objects_config("e2e")).await;
    let (job, resumed) = preempted_and_resumed(&stack, spec(&[])).await;
    // Under the work root when the runner isolates process jobs (as root), else its work dir.
    let config = stack.runner_config("runner-1");
    let root = match config.isolates_processes() {
        true => config.process.work_root,
        false => config.work_dir,
    };
    let outputs = root.join(format!("{}-2/outputs", job.id));
    assert_eq!(resumed, format!("2 step-42 {}", outputs.display()));
}
