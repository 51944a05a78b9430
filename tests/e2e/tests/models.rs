//! The model registry against the real stack (api, log-ingest, scheduler, a process runner):
//! a version's files are byte-identical to the job's synced outputs and saved artifacts, its
//! lineage is complete (job, config, code, datasets, owner, project, each metric's latest value
//! from log-ingest), aliases move atomically under concurrent calls, and bad requests get the
//! status that says why.

use std::collections::BTreeMap;

use futures::StreamExt;
use kiln_core::runs::ConfigValue;
use kiln_e2e::{Stack, bundle, output_files, spec, upload};
use kiln_proto::v1 as pb;
use object_store::ObjectStoreExt;
use sha2::Digest;
use tonic::Code;

/// Writes outputs of several files (one of 300 kB of random bytes) and a metric's steps.
const TRAIN: &str = r#"
mkdir -p "$KILN_OUTPUTS/model/sub"
head -c 300000 /dev/urandom > "$KILN_OUTPUTS/model/weights.bin"
printf '{"layers": 3}' > "$KILN_OUTPUTS/model/sub/config.json"
ls /kiln/data 2>/dev/null; echo trained > "$KILN_OUTPUTS/train.log"
"#;

async fn output_bytes(stack: &Stack, job_id: &str, path: &str) -> Vec<u8> {
    let request = pb::GetOutputRequest {
        job_id: job_id.into(),
        path: path.into(),
    };
    let mut chunks = stack.artifacts().await.get_output(request).await.unwrap().into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = chunks.next().await {
        data.extend(chunk.unwrap().data);
    }
    data
}

async fn file_bytes(stack: &Stack, name: &str, version: i64, path: &str) -> Vec<u8> {
    let request = pb::GetModelFileRequest {
        project: Default::default(),
        name: name.into(),
        version,
        path: path.into(),
    };
    let mut chunks = stack.models().await.get_model_file(request).await.unwrap().into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = chunks.next().await {
        data.extend(chunk.unwrap().data);
    }
    data
}

/// A run artifact the training job saves (`kiln.save`), beside its outputs.
const NOTES: &[u8] = b"trained for 5 steps";

/// Runs the training job (with code and a dataset), stores its config, saves a run artifact,
/// logs `val/loss` for it, and waits until log-ingest has stored its last step.
async fn trained_job(stack: &Stack) -> pb::Job {
    let (code, code_digest) = bundle(&[("train.sh", TRAIN)]);
    upload(&mut stack.artifacts().await, &code, &code_digest).await.unwrap();
    let (data, data_digest) = bundle(&[("digits.csv", "1,2,3")]);
    upload(&mut stack.artifacts().await, &data, &data_digest).await.unwrap();
    let request = pb::CreateDatasetRequest {
        name: "digits".into(),
        digest: data_digest,
        project: String::new(),
    };
    stack.datasets().await.create_dataset(request).await.unwrap();
    let mut job_spec = spec(&["sh", "train.sh"]);
    job_spec.code_digest = code_digest;
    job_spec.datasets = vec!["digits".into()];
    let job = stack.submit_spec(job_spec).await;
    let job = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    // What `kiln.init(config=...)` and `kiln.save(...)` would have stored.
    let config = [
        ("lr".to_string(), ConfigValue::Float(0.01)),
        ("model.layers".to_string(), ConfigValue::Int(3)),
    ];
    let request = pb::UpdateRunRequest {
        job_id: job.id.clone(),
        config: kiln_core::runs::config_to_proto(&config.into_iter().collect()),
        summary: Default::default(),
    };
    stack.jobs().await.update_run(request).await.unwrap();
    kiln_e2e::save_file(stack, &job.id, "notes.txt", NOTES).await;
    let job = stack.get(&job.id).await;
    let points = (0..5)
        .map(|step| pb::MetricPoint {
            key: "val/loss".into(),
            step,
            value: 1.0 / (step + 1) as f64,
            timestamp_ms: 0,
        })
        .collect();
    let request = pb::WriteMetricsRequest {
        job_id: job.id.clone(),
        points,
        columns: None,
    };
    stack.logs_client().await.write_metrics(request).await.unwrap();
    let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
    loop {
        let request = pb::LatestMetricsRequest {
            job_ids: vec![job.id.clone()],
            keys: vec!["val/loss".into()],
        };
        let latest = stack
            .logs_client()
            .await
            .latest_metrics(request)
            .await
            .unwrap()
            .into_inner();
        if latest.series.first().is_some_and(|s| s.points[0].step == 4) {
            return job;
        }
        assert!(tokio::time::Instant::now() < deadline, "val/loss never reached step 4");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn register(name: &str, job_id: &str, path: &str) -> pb::RegisterModelRequest {
    pb::RegisterModelRequest {
        name: name.into(),
        job_id: job_id.into(),
        path: path.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_is_the_jobs_outputs_byte_for_byte_with_complete_lineage() {
    versions_are_the_outputs(Stack::start().await).await;
}

/// The same on S3 (versitygw): blobs are copied server-side from the outputs.
#[tokio::test(flavor = "multi_thread")]
async fn on_s3_a_version_is_the_jobs_outputs_byte_for_byte() {
    versions_are_the_outputs(Stack::start_with_objects(kiln_core::testing::s3_objects_config("models")).await).await;
}

async fn versions_are_the_outputs(stack: Stack) {
    let objects = kiln_core::objects::open(&stack.objects).unwrap();
    let job = trained_job(&stack).await;
    let mut models = stack.models().await;
    let request = pb::RegisterModelRequest {
        description: "first cut".into(),
        tags: [("stage".to_string(), "dev".to_string())].into(),
        alias: "candidate".into(),
        ..register("digits-net", &job.id, "")
    };
    let version = models.register_model(request).await.unwrap().into_inner();
    assert_eq!(
        (version.version, version.aliases.clone()),
        (1, vec!["candidate".to_string()])
    );

    // Every output and the saved artifact, byte for byte, under the same paths.
    let mut sources: Vec<String> = output_files(&stack, &job.id)
        .await
        .into_iter()
        .map(|f| f.path)
        .collect();
    sources.push("notes.txt".into());
    sources.sort();
    let paths: Vec<&str> = version.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, sources);
    assert_eq!(
        paths,
        ["model/sub/config.json", "model/weights.bin", "notes.txt", "train.log"]
    );
    for file in &version.files {
        let original = if file.path == "notes.txt" {
            NOTES.to_vec()
        } else {
            output_bytes(&stack, &job.id, &file.path).await
        };
        let stored = file_bytes(&stack, "digits-net", 1, &file.path).await;
        assert!(original == stored, "{} differs from the job's output", file.path);
        assert_eq!(file.sha256, hex::encode(sha2::Sha256::digest(&original)));
        assert_eq!(file.size, original.len() as u64);
        let blob = kiln_core::objects::artifact_path(&file.sha256);
        let blob = objects.get(&blob).await.unwrap().bytes().await.unwrap();
        assert!(blob == original, "the content-addressed blob of {}", file.path);
    }
    let manifest: Vec<kiln_core::models::ManifestEntry> = version
        .files
        .iter()
        .map(|f| kiln_core::models::ManifestEntry {
            path: f.path.clone(),
            sha256: f.sha256.clone(),
            size: f.size,
        })
        .collect();
    assert_eq!(version.digest, kiln_core::models::manifest_digest(&manifest));

    // The lineage names everything the job ran with.
    let lineage = version.lineage.clone().unwrap();
    let spec = job.spec.clone().unwrap();
    assert_eq!(lineage.job_id, job.id);
    assert_eq!(lineage.code_digest, spec.code_digest);
    assert_eq!(lineage.image, spec.image);
    assert_eq!(
        (lineage.project.as_str(), lineage.job_owner.as_str()),
        ("default", "admin")
    );
    let dataset = stack.store.dataset("default", "digits").await.unwrap().unwrap();
    assert_eq!(
        lineage.datasets,
        [pb::DatasetRef {
            name: "digits".into(),
            digest: dataset.digest
        }]
    );
    assert_eq!(lineage.metrics.get("val/loss"), Some(&0.2), "{:?}", lineage.metrics);
    assert_eq!(lineage.config, job.config);
    assert_eq!(lineage.config.len(), 2);
    assert_eq!(lineage.sweep_id, "", "not a trial of a sweep");

    // A directory of the outputs, and a single file, by their paths below it.
    let sub = models
        .register_model(register("digits-net", &job.id, "model"))
        .await
        .unwrap()
        .into_inner();
    let sub_paths: Vec<&str> = sub.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!((sub.version, sub_paths), (2, vec!["sub/config.json", "weights.bin"]));
    assert_eq!(
        sub.files[1].sha256, version.files[1].sha256,
        "the same content, the same blob"
    );
    // A saved artifact alone, by its name.
    let notes = models
        .register_model(register("digits-net", &job.id, "notes.txt"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        notes
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.size))
            .collect::<Vec<_>>(),
        [("notes.txt", NOTES.len() as u64)]
    );
    let log = models
        .register_model(register("digits-net", &job.id, "train.log"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        log.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        ["train.log"]
    );
    // The same outputs again: a new number, the same digest.
    let again = models
        .register_model(register("digits-net", &job.id, ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.version, again.digest.as_str()), (5, version.digest.as_str()));

    // Read back by alias, by number, and the latest.
    let by_alias = pb::GetModelVersionRequest {
        project: Default::default(),
        name: "digits-net".into(),
        version: 0,
        alias: "candidate".into(),
    };
    assert_eq!(models.get_model_version(by_alias).await.unwrap().into_inner(), version);
    let latest = pb::GetModelVersionRequest {
        name: "digits-net".into(),
        ..Default::default()
    };
    assert_eq!(models.get_model_version(latest).await.unwrap().into_inner().version, 5);
    let tagged = pb::ListModelVersionsRequest {
        name: "digits-net".into(),
        tags: [("stage".to_string(), "dev".to_string())].into(),
        ..Default::default()
    };
    let listed = models.list_model_versions(tagged).await.unwrap().into_inner().versions;
    assert_eq!(listed.iter().map(|v| v.version).collect::<Vec<_>>(), [1]);
}

#[tokio::test(flavor = "multi_thread")]
async fn aliases_move_atomically_and_bad_requests_say_why() {
    let stack = Stack::start().await;
    let job = trained_job(&stack).await;
    let mut models = stack.models().await;
    for _ in 0..4 {
        models.register_model(register("net", &job.id, "model")).await.unwrap();
    }
    // 32 concurrent moves of `production` while a reader checks that one version holds it.
    let set = |version: i64| pb::SetModelAliasRequest {
        project: Default::default(),
        name: "net".into(),
        version,
        alias: "production".into(),
    };
    models.set_model_alias(set(1)).await.unwrap();
    let moves: Vec<_> = (0..32)
        .map(|i| {
            let mut client = models.clone();
            let request = set(i % 4 + 1);
            tokio::spawn(async move { client.set_model_alias(request).await.unwrap() })
        })
        .collect();
    let mut reads = 0;
    while !moves.iter().all(|m| m.is_finished()) || reads == 0 {
        let model = models
            .get_model(pb::GetModelRequest {
                project: Default::default(),
                name: "net".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!((1..=4).contains(&model.aliases["production"]), "{model:?}");
        let mut holders = 0;
        let page = pb::ListModelVersionsRequest {
            name: "net".into(),
            ..Default::default()
        };
        for version in models.list_model_versions(page).await.unwrap().into_inner().versions {
            holders += version.aliases.iter().filter(|a| *a == "production").count();
        }
        assert_eq!(holders, 1, "versions holding production at one read");
        reads += 1;
    }
    for m in moves {
        m.await.unwrap();
    }

    let code = |result: Result<tonic::Response<pb::ModelVersion>, tonic::Status>| {
        let status = result.unwrap_err();
        (status.code(), status.message().to_string())
    };
    let cases: Vec<(pb::RegisterModelRequest, Code, &str)> = vec![
        (
            register("bad name", &job.id, ""),
            Code::InvalidArgument,
            "model \"bad name\"",
        ),
        (
            register("net", &job.id, "../etc"),
            Code::InvalidArgument,
            "not a relative path",
        ),
        (
            register("net", &job.id, "nothing-here"),
            Code::FailedPrecondition,
            "no outputs or saved artifacts under nothing-here",
        ),
        (
            register("net", "01a22826-4a16-7345-8170-000000000000", ""),
            Code::NotFound,
            "not found",
        ),
        (
            pb::RegisterModelRequest {
                alias: "7".into(),
                ..register("net", &job.id, "")
            },
            Code::InvalidArgument,
            "start with a letter",
        ),
    ];
    for (request, expected, text) in cases {
        let (got, message) = code(models.register_model(request.clone()).await);
        assert_eq!(got, expected, "{request:?}: {message}");
        assert!(message.contains(text), "{request:?}: {message}");
    }
    let running = stack.submit(&["sleep", "30"]).await;
    stack.wait_for_state(&running.id, pb::JobState::Running).await;
    let (got, message) = code(models.register_model(register("net", &running.id, "")).await);
    assert_eq!(got, Code::FailedPrecondition, "{message}");
    assert!(message.contains("once it has ended"), "{message}");

    let get = |name: &str, version: i64, alias: &str| pb::GetModelVersionRequest {
        project: Default::default(),
        name: name.into(),
        version,
        alias: alias.into(),
    };
    let reads: Vec<(pb::GetModelVersionRequest, Code, &str)> = vec![
        (get("nope", 0, ""), Code::NotFound, "model nope not found"),
        (get("net", 9, ""), Code::NotFound, "has no version 9"),
        (get("net", 0, "staging"), Code::NotFound, "has no alias staging"),
        (get("net", 1, "production"), Code::InvalidArgument, "not both"),
    ];
    for (request, expected, text) in reads {
        let (got, message) = code(models.get_model_version(request.clone()).await);
        assert_eq!(got, expected, "{request:?}: {message}");
        assert!(message.contains(text), "{request:?}: {message}");
    }
    let to_missing = pb::SetModelAliasRequest {
        project: Default::default(),
        name: "net".into(),
        version: 12,
        alias: "production".into(),
    };
    let status = models.set_model_alias(to_missing).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let tags = pb::SetModelTagsRequest {
        project: Default::default(),
        name: "net".into(),
        version: 1,
        tags: BTreeMap::from([("bad key".to_string(), "v".to_string())])
            .into_iter()
            .collect(),
    };
    assert_eq!(
        models.set_model_tags(tags).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let file = pb::GetModelFileRequest {
        project: Default::default(),
        name: "net".into(),
        version: 1,
        path: "missing.bin".into(),
    };
    let status = models.get_model_file(file).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let long = pb::ListModelVersionsRequest {
        name: "net".into(),
        query: "x".repeat(300),
        ..Default::default()
    };
    let status = models.list_model_versions(long).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("longer than 256"), "{status:?}");
}

/// A file of a version, read with `token`.
async fn file_as(stack: &Stack, token: &str, name: &str, project: &str, path: &str) -> Result<Vec<u8>, tonic::Status> {
    let request = pb::GetModelFileRequest {
        name: name.into(),
        version: 1,
        path: path.into(),
        project: project.into(),
    };
    let mut chunks = stack.models_as(token).await.get_model_file(request).await?.into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = chunks.next().await {
        data.extend(chunk?.data);
    }
    Ok(data)
}

/// Model names are unique per project: alpha and beta each register `net` from a job of their
/// own, and each member reads its own by the bare name. From beta, alpha's `net` reads as an
/// unknown model whatever the form, until beta's member has a role in alpha: then it is
/// `alpha/net` (or `net` with project `alpha`), and the bare name asks which. A version is
/// registered only in its job's project.
#[tokio::test(flavor = "multi_thread")]
async fn two_projects_register_one_name_and_each_reads_its_own() {
    let stack = Stack::start().await;
    for project in ["alpha", "beta"] {
        stack.create_project(project).await;
    }
    let ada = stack.create_user("ada").await;
    stack.add_member("alpha", "ada", pb::Role::Member).await;
    let bob = stack.create_user("bob").await;
    stack.add_member("beta", "bob", pb::Role::Member).await;
    let mut jobs = BTreeMap::new();
    for (project, token) in [("alpha", &ada), ("beta", &bob)] {
        let script = format!("echo {project} > \"$KILN_OUTPUTS/w.txt\"");
        let job = stack
            .jobs_as(token)
            .await
            .submit_job(pb::SubmitJobRequest {
                spec: Some(pb::JobSpec {
                    project: project.into(),
                    ..spec(&["sh", "-c", &script])
                }),
                ..Default::default()
            })
            .await
            .expect("submit")
            .into_inner()
            .job
            .expect("a job");
        stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
        let version = stack
            .models_as(token)
            .await
            .register_model(register("net", &job.id, ""))
            .await
            .expect("register")
            .into_inner();
        assert_eq!((version.project.as_str(), version.version), (project, 1));
        jobs.insert(project, job.id);
    }
    let get = |name: &str, project: &str| pb::GetModelRequest {
        name: name.into(),
        project: project.into(),
    };
    // Each its own, by the bare name.
    for (token, project) in [(&ada, "alpha"), (&bob, "beta")] {
        let mut models = stack.models_as(token).await;
        let model = models.get_model(get("net", "")).await.expect("its own").into_inner();
        assert_eq!(model.project, project);
        assert_eq!(
            file_as(&stack, token, "net", "", "w.txt").await.expect("its file"),
            format!("{project}\n").into_bytes()
        );
        let listed = models
            .list_models(pb::ListModelsRequest::default())
            .await
            .expect("list")
            .into_inner()
            .models;
        assert_eq!(
            listed
                .iter()
                .map(|m| format!("{}/{}", m.project, m.name))
                .collect::<Vec<_>>(),
            [format!("{project}/net")]
        );
    }

    // From beta, alpha's reads as unknown: named as alpha's, or by project.
    let mut bobs = stack.models_as(&bob).await;
    let shape = |status: tonic::Status, value: &str| (status.code(), status.message().replace(value, "<ref>"));
    for (theirs, unknown) in [
        (get("alpha/net", ""), get("alpha/nope", "")),
        (get("net", "alpha"), get("nope", "alpha")),
    ] {
        let (theirs_name, unknown_name) = (theirs.name.clone(), unknown.name.clone());
        let theirs = bobs.get_model(theirs).await.unwrap_err();
        let unknown = bobs.get_model(unknown).await.unwrap_err();
        assert_eq!(theirs.code(), Code::NotFound, "{theirs:?}");
        assert_eq!(shape(theirs, &theirs_name), shape(unknown, &unknown_name));
    }
    let file = file_as(&stack, &bob, "alpha/net", "", "w.txt").await.unwrap_err();
    assert_eq!(file.code(), Code::NotFound, "{file:?}");
    let elsewhere = bobs
        .register_model(register("alpha/net", &jobs["beta"], ""))
        .await
        .unwrap_err();
    assert_eq!(elsewhere.code(), Code::InvalidArgument, "{elsewhere:?}");
    assert!(elsewhere.message().contains("its job's project, beta"), "{elsewhere:?}");

    // With a role in alpha: alpha's by its qualified name or project; the bare name asks which.
    stack.add_member("alpha", "bob", pb::Role::Viewer).await;
    let theirs = bobs
        .get_model(get("alpha/net", ""))
        .await
        .expect("alpha's")
        .into_inner();
    assert_eq!(theirs.project, "alpha");
    assert_eq!(
        bobs.get_model(get("net", "alpha"))
            .await
            .expect("by project")
            .into_inner()
            .project,
        "alpha"
    );
    assert_eq!(
        bobs.get_model(get("net", "beta"))
            .await
            .expect("its own")
            .into_inner()
            .project,
        "beta"
    );
    assert_eq!(
        file_as(&stack, &bob, "alpha/net", "", "w.txt")
            .await
            .expect("alpha's file"),
        b"alpha\n"
    );
    let ambiguous = bobs.get_model(get("net", "")).await.unwrap_err();
    assert_eq!(ambiguous.code(), Code::FailedPrecondition, "{ambiguous:?}");
    assert!(ambiguous.message().contains("(alpha, beta)"), "{ambiguous:?}");
    // A viewer there reads, and does not move aliases.
    let alias = bobs
        .set_model_alias(pb::SetModelAliasRequest {
            name: "alpha/net".into(),
            version: 1,
            alias: "production".into(),
            project: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(alias.code(), Code::PermissionDenied, "{alias:?}");
    // ada still sees alpha's only.
    let listed = stack
        .models_as(&ada)
        .await
        .list_models(pb::ListModelsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .models;
    assert_eq!(listed.len(), 1);
}
