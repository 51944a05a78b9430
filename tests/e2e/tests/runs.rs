//! Run tracking through the api: config and summary merged and shown, sweep filters, saved
//! artifacts byte-identical on download, a job's own token acting on its own run only, and bad
//! input refused with the field named.

use futures::StreamExt;
use kiln_core::auth::Scope;
use kiln_core::runs::{ConfigValue, config_to_proto};
use kiln_core::store::NewJob;
use kiln_e2e::{Stack, upload};
use kiln_proto::v1 as pb;
use sha2::{Digest, Sha256};
use tonic::Code;

fn values(pairs: &[(&str, ConfigValue)]) -> std::collections::HashMap<String, pb::ConfigValue> {
    config_to_proto(&pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn file(path: &str, bytes: &[u8]) -> pb::RunArtifactFile {
    pb::RunArtifactFile {
        name: String::new(),
        path: path.into(),
        digest: sha256(bytes),
        size: bytes.len() as u64,
    }
}

async fn create_run(stack: &Stack, name: &str) -> pb::Job {
    let request = pb::CreateRunRequest {
        name: name.into(),
        project: String::new(),
    };
    stack.jobs().await.create_run(request).await.unwrap().into_inner()
}

#[tokio::test]
async fn a_runs_config_and_summary_merge_and_show_and_sweeps_filter() {
    let stack = Stack::start_without_runner().await;
    let mut jobs = stack.jobs().await;
    let run = create_run(&stack, "tracked").await;
    let first = pb::UpdateRunRequest {
        job_id: run.id.clone(),
        config: values(&[
            ("opt.lr", ConfigValue::Float(0.01)),
            ("opt.name", ConfigValue::Str("adam".into())),
        ]),
        summary: values(&[("epochs", ConfigValue::Int(3))]),
    };
    jobs.update_run(first).await.unwrap();
    let second = pb::UpdateRunRequest {
        job_id: run.id.clone(),
        config: values(&[("opt.lr", ConfigValue::Float(0.02))]),
        summary: values(&[("best/acc", ConfigValue::Float(0.9))]),
    };
    let updated = jobs.update_run(second).await.unwrap().into_inner();
    assert_eq!(updated.version, run.version, "not a state change");
    let shown = jobs
        .get_job(pb::GetJobRequest { job_id: run.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        shown.config,
        values(&[
            ("opt.lr", ConfigValue::Float(0.02)),
            ("opt.name", ConfigValue::Str("adam".into()))
        ])
    );
    assert_eq!(
        shown.summary,
        values(&[("epochs", ConfigValue::Int(3)), ("best/acc", ConfigValue::Float(0.9))])
    );

    // A trial of a sweep, as the advisor records one.
    let owner = stack.store.job(&run.id).await.unwrap().owner_id;
    let trial = stack
        .store
        .insert_job(NewJob {
            owner_id: owner,
            project: "default".into(),
            name: "trial".into(),
            command: vec!["true".into()],
            cpu_millis: 100,
            memory_bytes: 1 << 20,
            sweep_id: "sweep-a".into(),
            config: [("lr".to_string(), ConfigValue::Float(0.1))].into(),
            ..NewJob::default()
        })
        .await
        .unwrap();
    let listed = |sweep_id: &str| pb::ListJobsRequest {
        all: true,
        sweep_id: sweep_id.into(),
        ..Default::default()
    };
    let of_sweep = jobs.list_jobs(listed("sweep-a")).await.unwrap().into_inner().jobs;
    assert_eq!(
        of_sweep.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        [trial.id.as_str()]
    );
    assert_eq!(
        (of_sweep[0].sweep_id.as_str(), of_sweep[0].config.len()),
        ("sweep-a", 1)
    );
    assert_eq!(jobs.list_jobs(listed("")).await.unwrap().into_inner().jobs.len(), 2);
}

#[tokio::test]
async fn saved_files_and_directories_download_byte_identical_and_blobs_are_stored_once() {
    let stack = Stack::start_without_runner().await;
    let mut artifacts = stack.artifacts().await;
    let run = create_run(&stack, "saves").await;
    let weights: Vec<u8> = (0..3_000_017u32)
        .map(|n| (n.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let state = b"optimizer state".repeat(100);
    for bytes in [&weights[..], &state[..]] {
        assert!(upload(&mut artifacts, bytes, &sha256(bytes)).await.unwrap().created);
    }
    let save = |name: &str, files: Vec<pb::RunArtifactFile>| pb::SaveRunArtifactRequest {
        job_id: run.id.clone(),
        name: name.into(),
        files,
    };
    let saved = artifacts
        .save_run_artifact(save("model.bin", vec![file("", &weights)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((saved.files, saved.bytes), (1, weights.len() as u64));
    // A directory whose files share a blob: named twice, stored once.
    let directory = vec![
        file("./opt//state.bin", &state),
        file("copy.bin", &state),
        file("w.bin", &weights),
    ];
    artifacts.save_run_artifact(save("ckpt", directory)).await.unwrap();
    let stat = artifacts
        .stat_artifact(pb::StatArtifactRequest {
            digest: sha256(&state),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(stat.exists, "a client skips the upload of a stored blob");
    let blobs = std::fs::read_dir(stack.objects_dir().join("artifacts/sha256"))
        .unwrap()
        .count();
    assert_eq!(blobs, 2);

    let listed = artifacts
        .list_run_artifacts(pb::ListRunArtifactsRequest {
            job_id: run.id.clone(),
            name: "ckpt".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .files;
    let paths: Vec<&str> = listed.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["copy.bin", "opt/state.bin", "w.bin"], "paths are normalised");
    for (name, path, expected) in [
        ("model.bin", "", &weights[..]),
        ("ckpt", "opt/state.bin", &state[..]),
        ("ckpt", "w.bin", &weights[..]),
    ] {
        let request = pb::GetRunArtifactRequest {
            job_id: run.id.clone(),
            name: name.into(),
            path: path.into(),
        };
        let mut chunks = artifacts.get_run_artifact(request).await.unwrap().into_inner();
        let mut got = Vec::new();
        while let Some(chunk) = chunks.next().await {
            got.extend(chunk.unwrap().data);
        }
        assert!(got == expected, "{name}/{path} differs");
    }
    let missing = artifacts
        .get_run_artifact(pb::GetRunArtifactRequest {
            job_id: run.id.clone(),
            name: "ckpt".into(),
            path: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert!(
        missing.message().contains("saved no artifact ckpt with a file nope"),
        "{missing:?}"
    );
}

#[tokio::test]
async fn a_jobs_own_token_tracks_its_run_and_no_other() {
    let stack = Stack::start_without_runner().await;
    let mine = create_run(&stack, "mine").await;
    let other = create_run(&stack, "other").await;
    let owner = stack.store.job(&mine.id).await.unwrap().owner_id;
    let token = stack
        .store
        .create_token(&owner, "job", Scope::Job(mine.id.clone()))
        .await
        .unwrap()
        .token;
    let mut jobs = stack.jobs_as(&token).await;
    let update = |job_id: &str| pb::UpdateRunRequest {
        job_id: job_id.into(),
        config: values(&[("lr", ConfigValue::Float(0.1))]),
        summary: Default::default(),
    };
    jobs.update_run(update(&mine.id)).await.unwrap();
    let refused = jobs.update_run(update(&other.id)).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let mut artifacts = stack.artifacts_as(&token).await;
    let bytes = b"from inside the job".to_vec();
    upload(&mut artifacts, &bytes, &sha256(&bytes)).await.unwrap();
    let save = |job_id: &str| pb::SaveRunArtifactRequest {
        job_id: job_id.into(),
        name: "out.txt".into(),
        files: vec![file("", &bytes)],
    };
    artifacts.save_run_artifact(save(&mine.id)).await.unwrap();
    let refused = artifacts.save_run_artifact(save(&other.id)).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let files = stack.store.run_artifact_files(&mine.id).await.unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(
        files[0].digest,
        sha256(&bytes),
        "the registry copies blobs by these digests"
    );
}

#[tokio::test]
async fn bad_tracking_input_is_refused_with_the_field_named() {
    let stack = Stack::start_without_runner().await;
    let mut jobs = stack.jobs().await;
    let mut artifacts = stack.artifacts().await;
    let run = create_run(&stack, "bad").await;
    let cases = [
        (
            values(&[("lr", ConfigValue::Float(f64::NAN))]),
            "config key \"lr\" is NaN",
        ),
        (values(&[("", ConfigValue::Int(1))]), "config key \"\" must be 1 to 256"),
        (
            [("opt".to_string(), pb::ConfigValue { value: None })].into(),
            "config key \"opt\" has no value",
        ),
    ];
    for (config, says) in cases {
        let request = pb::UpdateRunRequest {
            job_id: run.id.clone(),
            config,
            summary: Default::default(),
        };
        let status = jobs.update_run(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    upload(&mut artifacts, b"x", &sha256(b"x")).await.unwrap();
    let never_uploaded = b"never uploaded";
    let bad = [
        (
            "model",
            vec![file("", never_uploaded)],
            Code::FailedPrecondition,
            "is not uploaded",
        ),
        ("a/b", vec![file("", b"x")], Code::InvalidArgument, "without '/'"),
        ("ckpt", vec![], Code::InvalidArgument, "1 to 20000 files"),
        (
            "ckpt",
            vec![file("../up", b"x"), file("b", b"x")],
            Code::InvalidArgument,
            "not a relative path",
        ),
        (
            "ckpt",
            vec![file("a", b"x"), file("./a", b"x")],
            Code::InvalidArgument,
            "names the file a twice",
        ),
    ];
    for (name, files, code, says) in bad {
        let request = pb::SaveRunArtifactRequest {
            job_id: run.id.clone(),
            name: name.into(),
            files,
        };
        let status = artifacts.save_run_artifact(request).await.unwrap_err();
        assert_eq!(status.code(), code, "{name}: {status:?}");
        assert!(status.message().contains(says), "{name}: {status:?}");
    }
    let unknown = jobs
        .update_run(pb::UpdateRunRequest {
            job_id: "01a22826-4a16-7345-8170-000000000000".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}
