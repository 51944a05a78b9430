use std::path::Path;

use super::*;

fn spec(dir: &Path, command: &[&str]) -> InstanceSpec {
    InstanceSpec {
        job_id: "j1".into(),
        attempt: 1,
        runner_id: "r".into(),
        owner_id: "u".into(),
        project: "default".into(),
        pull: None,
        disk_bytes: 0,
        shm_bytes: 0,
        image: String::new(),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::from([("KILN_JOB_ID".to_string(), "j1".to_string())]),
        cpu_millis: 1000,
        memory_bytes: 1 << 30,
        gpus: 0,
        market: kiln_core::scheduling::Market::OnDemand,
        gpu_devices: Vec::new(),
        code: None,
        datasets: Vec::new(),
        agent: None,
        scratch_dir: dir.join("j1-1"),
        restore: None,
    }
}

fn provider(dir: &Path) -> ProcessProvider {
    ProcessProvider::new(
        Capacity {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            gpus: 0,
            disk_bytes: 0,
        },
        dir.to_path_buf(),
        JobUsers::Trusted("u".into()),
    )
}

#[tokio::test]
async fn children_get_only_the_env_they_are_given_and_die_with_their_group() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider(dir.path());
    let spec = spec(dir.path(), &["sh", "-c", "echo $KILN_JOB_ID $HOME; sleep 5 & wait"]);
    let mut instance = provider.provision(&spec).await.unwrap();
    let mut output = provider.start(&mut instance).await.unwrap();
    let pid = instance_pid(&instance.id).unwrap();
    let (stream, first) = output.next().await.unwrap();
    assert_eq!(stream, LogStream::Stdout);
    assert!(String::from_utf8_lossy(&first).starts_with("j1 "), "{first:?}");
    assert!(is_job_process(pid, "j1"));
    assert!(!is_job_process(pid, "j2"));
    provider.signal(&instance, Signal::SIGTERM).await.unwrap();
    assert_eq!(provider.wait(&instance).await.unwrap().code, 128 + 15);
    provider.release(&instance).await.unwrap();
    assert!(!instance.scratch_dir.try_exists().unwrap());
}

#[tokio::test]
async fn a_runner_that_cannot_isolate_refuses_the_jobs_of_other_users() {
    let dir = tempfile::tempdir().unwrap();
    for trusted in ["u", ""] {
        let provider = ProcessProvider::new(
            provider(dir.path()).capacity,
            dir.path().to_path_buf(),
            JobUsers::Trusted(trusted.into()),
        );
        let stranger = InstanceSpec {
            owner_id: "someone-else".into(),
            ..spec(dir.path(), &["true"])
        };
        let error = provider.provision(&stranger).await.expect_err("refused");
        assert_eq!(error.kind(), kiln_core::ErrorKind::FailedPrecondition);
        let message = error.to_string();
        for words in [
            "someone-else",
            "process.trusted-owner",
            "[process] isolation",
            "--image",
        ] {
            assert!(message.contains(words), "{message:?} lacks {words:?}");
        }
        assert!(!stranger.scratch_dir.join("code").try_exists().unwrap());
    }
    // The control: the trusted owner's job runs.
    let provider = provider(dir.path());
    let mut instance = provider.provision(&spec(dir.path(), &["true"])).await.unwrap();
    let _output = provider.start(&mut instance).await.unwrap();
    assert_eq!(provider.wait(&instance).await.unwrap().code, 0);
    provider.release(&instance).await.unwrap();
}

#[tokio::test]
async fn missing_programs_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider(dir.path());
    let mut instance = provider
        .provision(&spec(dir.path(), &["/definitely/not/here"]))
        .await
        .unwrap();
    let error = provider.start(&mut instance).await.err().unwrap();
    assert!(error.to_string().contains("/definitely/not/here"), "{error}");
}

#[tokio::test]
async fn leftovers_of_other_jobs_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["keep-1", "gone-1"] {
        std::fs::create_dir_all(dir.path().join(name).join("data/ro")).unwrap();
        set_writable(&dir.path().join(name).join("data"), false).unwrap();
    }
    let released = provider(dir.path())
        .release_leftovers("r", &["keep".to_string()])
        .await
        .unwrap();
    assert_eq!(released, 1);
    assert!(dir.path().join("keep-1").try_exists().unwrap());
    assert!(!dir.path().join("gone-1").try_exists().unwrap());
}

#[tokio::test]
async fn the_process_of_a_leftover_is_killed_by_a_new_provider() {
    let dir = tempfile::tempdir().unwrap();
    // Started by the provider of a runner that crashed since.
    let crashed = provider(dir.path());
    let mut instance = crashed.provision(&spec(dir.path(), &["sleep", "600"])).await.unwrap();
    let _output = crashed.start(&mut instance).await.unwrap();
    let pid = instance_pid(&instance.id).unwrap();
    assert!(is_job_process(pid, "j1"));
    let released = provider(dir.path()).release_leftovers("r", &[]).await.unwrap();
    assert_eq!(released, 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while is_job_process(pid, "j1") && !is_zombie(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the leftover process {pid} lives on"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A killed child of this test process stays a zombie until its waiter reaps it.
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(true)
}

#[test]
fn instance_ids_hold_pids() {
    assert_eq!(instance_pid("pid:42"), Some(42));
    assert_eq!(instance_pid("docker:abc"), None);
}
