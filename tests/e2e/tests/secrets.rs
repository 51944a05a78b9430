//! Project secrets end to end: a job gets its secret as an environment variable, and the value
//! appears in no API response, in no database column in clear, in no file the stack keeps, and
//! in no stored log line (the runner and kiln-agent ship it as `***`).

use std::path::Path;
use std::time::Duration;

use kiln_e2e::{Stack, spec};
use kiln_proto::v1 as pb;
use sha2::Digest;
use tonic::Code;

const NAME: &str = "API_TOKEN";
const VALUE: &str = "tok-3f9a1c7e-very-secret";

async fn set(stack: &Stack, name: &str, value: &str) -> Result<pb::Secret, tonic::Status> {
    let request = pb::SetSecretRequest {
        project: String::new(),
        name: name.into(),
        value: value.into(),
        ..Default::default()
    };
    Ok(stack.secrets().await.set_secret(request).await?.into_inner())
}

/// A shell command that prints the secret (to be masked) and exits 0 only when its variable
/// holds the value; the value itself is not in the command (the spec is stored in clear).
fn checking_command() -> Vec<String> {
    let digest = hex::encode(sha2::Sha256::digest(VALUE.as_bytes()));
    let script = format!(
        "echo \"token is ${NAME} and again ${NAME}\"; echo \"names=$KILN_SECRET_NAMES\"; \
         [ \"$(printf %s \"${NAME}\" | sha256sum | cut -d' ' -f1)\" = {digest} ]"
    );
    vec!["sh".into(), "-c".into(), script]
}

/// Fails when `VALUE` is in any text or blob of any table of the SQLite file at `path`.
fn assert_not_in_tables(path: &Path) {
    let db = rusqlite::Connection::open(path).expect("open the database file");
    let mut tables = db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap();
    let names: Vec<String> = tables
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(!names.is_empty(), "{} has no tables", path.display());
    let mut cells = 0;
    for table in names {
        let mut select = db.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let columns = select.column_count();
        let mut rows = select.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            for index in 0..columns {
                let bytes: &[u8] = match row.get_ref(index).unwrap() {
                    rusqlite::types::ValueRef::Text(text) => text,
                    rusqlite::types::ValueRef::Blob(blob) => blob,
                    _ => continue,
                };
                cells += 1;
                assert!(
                    !contains(bytes, VALUE.as_bytes()),
                    "{}: table {table} column {index} holds the secret in clear",
                    path.display()
                );
            }
        }
    }
    assert!(cells > 0, "{} had no text to scan", path.display());
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

/// Fails when `VALUE` is in the bytes of any file under `dir` (databases with their WAL,
/// objects, the runner's work dir).
fn assert_not_in_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            assert_not_in_files(&path);
        } else if let Ok(bytes) = std::fs::read(&path) {
            assert!(
                !contains(&bytes, VALUE.as_bytes()),
                "{} holds the secret",
                path.display()
            );
        }
    }
}

#[tokio::test]
async fn a_job_gets_its_secret_and_nothing_kiln_keeps_or_answers_shows_it() {
    let stack = Stack::start().await;
    // Bad requests are refused with what to do.
    for (name, value, why) in [
        ("1BAD", VALUE, "not valid"),
        ("KILN_X", VALUE, "reserved"),
        (NAME, "abc", "at least 4"),
        (NAME, "a\0bcdef", "NUL"),
    ] {
        let refused = set(&stack, name, value).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(why), "{refused:?}");
    }
    let too_big = set(&stack, NAME, &"x".repeat(64 * 1024 + 1)).await.unwrap_err();
    assert_eq!(too_big.code(), Code::InvalidArgument);

    // A job naming a secret the project lacks is refused at submit, saying how to set it.
    let mut job_spec = spec(&[]);
    job_spec.command = checking_command();
    job_spec.secrets = vec![NAME.into()];
    let missing = stack
        .jobs()
        .await
        .submit_job(pb::SubmitJobRequest {
            spec: Some(job_spec.clone()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::FailedPrecondition, "{missing:?}");
    assert!(missing.message().contains("kiln secret set API_TOKEN"), "{missing:?}");

    let saved = set(&stack, NAME, VALUE).await.unwrap();
    assert_eq!((saved.project.as_str(), saved.name.as_str()), ("default", NAME));
    let mut responses = vec![format!("{saved:?}")];

    let job = stack.submit_spec(job_spec).await;
    let mut watch = stack
        .jobs()
        .await
        .watch_job(pb::WatchJobRequest { job_id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    let lines = stack.log_lines(&job.id, true).await;
    let done = stack.get(&job.id).await;
    assert_eq!(
        done.state,
        pb::JobState::Succeeded as i32,
        "the job saw another value: {done:?} {lines:?}"
    );
    assert_eq!(done.spec.as_ref().unwrap().secrets, [NAME]);
    let texts: Vec<&str> = lines.iter().map(|line| line.text.as_str()).collect();
    assert!(texts.contains(&"token is *** and again ***"), "{texts:?}");
    assert!(texts.contains(&"names=API_TOKEN"), "{texts:?}");
    assert!(texts.iter().all(|text| !text.contains(VALUE)), "{texts:?}");

    // Every read answers names only.
    while let Ok(Ok(Some(update))) = tokio::time::timeout(Duration::from_secs(2), watch.message()).await {
        responses.push(format!("{update:?}"));
    }
    assert!(responses.len() > 1, "WatchJob sent nothing");
    responses.push(format!("{done:?}"));
    let listed_jobs = stack
        .jobs()
        .await
        .list_jobs(pb::ListJobsRequest {
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    responses.push(format!("{listed_jobs:?}"));
    let listed = stack
        .secrets()
        .await
        .list_secrets(pb::ListSecretsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.secrets.len(), 1);
    assert_eq!(listed.secrets[0].name, NAME);
    responses.push(format!("{listed:?}"));
    let grep = stack
        .logs_client()
        .await
        .search_logs(pb::SearchLogsRequest {
            job_id: job.id.clone(),
            pattern: "token".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    responses.push(format!("{grep:?}"));
    for response in &responses {
        assert!(!response.contains(VALUE), "a response holds the secret: {response}");
    }

    // At rest: sealed in its row, in no column of any table, in no file of the stack.
    let row = stack.store.secret("default", NAME).await.unwrap().unwrap();
    assert!(!row.sealed.is_empty() && !contains(&row.sealed, VALUE.as_bytes()));
    assert_not_in_tables(&stack.dir.path().join("kiln.db"));
    assert_not_in_tables(&stack.dir.path().join("logs.db"));
    assert_not_in_files(stack.dir.path());
    // Nor in any message of any stream (launch requests, log records, job events).
    assert_not_in_files(stack.nats.store_dir().expect("the stack's nats-server"));

    // Removed, it is gone for new jobs (and a second removal says it is not there).
    let removed = stack
        .secrets()
        .await
        .delete_secret(pb::DeleteSecretRequest {
            project: String::new(),
            name: NAME.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(removed.name, NAME);
    let again = stack
        .secrets()
        .await
        .delete_secret(pb::DeleteSecretRequest {
            project: String::new(),
            name: NAME.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::NotFound, "{again:?}");
}

#[tokio::test]
async fn batch_workers_get_the_batch_secrets_and_item_logs_mask_them() {
    let mut stack = Stack::start().await;
    stack.start_item_batch(stack.item_batch_config()).await;
    let batch_spec = pb::BatchSpec {
        name: "secretive".into(),
        command: vec!["sh".into(), "-c".into(), format!("echo item {{item}} ${NAME}")],
        cpu_millis: 100,
        memory_mb: 64,
        max_attempts: 1,
        max_workers: 1,
        secrets: vec![NAME.into()],
        ..Default::default()
    };
    let create = |spec: pb::BatchSpec| {
        let stack = &stack;
        async move {
            stack
                .batches_client()
                .await
                .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
                .await
        }
    };
    let missing = create(batch_spec.clone()).await.unwrap_err();
    assert_eq!(missing.code(), Code::FailedPrecondition, "{missing:?}");
    assert!(missing.message().contains("kiln secret set API_TOKEN"), "{missing:?}");
    set(&stack, NAME, VALUE).await.unwrap();
    let batch = create(batch_spec).await.unwrap().into_inner();
    let mut batches = stack.batches_client().await;
    let item = pb::Item {
        key: "one".into(),
        uri: "mem://one".into(),
        params: Default::default(),
    };
    batches
        .add_items(futures::stream::iter([pb::AddItemsRequest {
            batch_id: batch.id.clone(),
            items: vec![item],
        }]))
        .await
        .unwrap();
    batches
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let run = kiln_e2e::run_batch_to_done(&mut batches, &batch.id, deadline)
        .await
        .expect("the batch ends");
    assert_eq!(run.done.counts.unwrap().succeeded, 1, "{:?}", run.done);
    let logs = batches
        .get_item_logs(pb::GetItemLogsRequest {
            batch_id: batch.id.clone(),
            key: "one".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let texts: Vec<&str> = logs.lines.iter().map(|line| line.text.as_str()).collect();
    assert_eq!(texts, ["item one ***"], "the item saw its secret, masked in its log");
    let workers = stack.store.live_batch_workers(&batch.id).await.unwrap();
    let all_workers = stack
        .jobs()
        .await
        .list_jobs(pb::ListJobsRequest {
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let worker = all_workers
        .jobs
        .iter()
        .find(|job| job.spec.as_ref().is_some_and(|spec| spec.name == "secretive-worker"))
        .unwrap_or_else(|| panic!("no worker job: {workers:?} {all_workers:?}"));
    assert_eq!(worker.spec.as_ref().unwrap().secrets, [NAME]);
    assert!(!format!("{all_workers:?} {logs:?}").contains(VALUE));
    assert_not_in_tables(&stack.dir.path().join("kiln.db"));
    assert_not_in_files(stack.dir.path());
}

#[tokio::test]
async fn without_a_key_setting_and_starting_say_which_setting_is_missing() {
    let mut stack = Stack::start_without_runner().await;
    // A runner without [secrets]: a job naming a secret fails to start, saying what to set.
    let keyless_runner = kiln_runner::Config {
        secrets: Default::default(),
        ..stack.runner_config("runner-1")
    };
    stack.runner = Some(stack.spawn_runner(keyless_runner).await);
    set(&stack, NAME, VALUE).await.unwrap();
    let mut job_spec = spec(&["true"]);
    job_spec.secrets = vec![NAME.into()];
    let job = stack.submit_spec(job_spec).await;
    let failed = stack.wait_for_state(&job.id, pb::JobState::Failed).await;
    assert!(failed.reason.contains("[secrets] key-file"), "{failed:?}");
    assert!(failed.reason.contains("this runner"), "{failed:?}");

    // An api without [secrets] refuses to set one, saying what to set.
    let keyless_api = kiln_api::Api::bind(kiln_api::Config {
        grpc: kiln_core::config::GrpcConfig::at(([127, 0, 0, 1], 0).into()),
        database: stack.database.clone(),
        nats: stack.nats.service_config(kiln_core::nats_auth::Service::Api),
        objects: stack.objects.clone(),
        bootstrap_token_file: stack.dir.path().join("unused.token"),
        ..Default::default()
    })
    .await
    .expect("an api without a secrets key binds");
    let addr = keyless_api.local_addr();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn(keyless_api.serve(shutdown.clone()));
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut secrets = pb::secret_service_client::SecretServiceClient::with_interceptor(
        channel,
        kiln_core::auth::BearerInterceptor::new(&stack.token),
    );
    let refused = secrets
        .set_secret(pb::SetSecretRequest {
            project: String::new(),
            name: NAME.into(),
            value: VALUE.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("[secrets] key-file"), "{refused:?}");
    shutdown.cancel();
    let _ = serving.await;
}

/// The scans above find a value in clear where there is one (so their passing means something).
#[test]
fn the_scans_find_a_value_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let db = rusqlite::Connection::open(&path).unwrap();
    db.execute_batch(&format!(
        "CREATE TABLE t (a TEXT, b BLOB); INSERT INTO t VALUES ('x', 'pre{VALUE}post');"
    ))
    .unwrap();
    drop(db);
    assert!(std::panic::catch_unwind(|| assert_not_in_tables(&path)).is_err());
    assert!(std::panic::catch_unwind(|| assert_not_in_files(dir.path())).is_err());
}
