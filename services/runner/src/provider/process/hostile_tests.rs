//! A hostile process job against kiln's files and another job, isolated (each job a uid of its
//! own) and, as the control that shows each probe works, not isolated (as the runner's user).
//! Root is needed to isolate; CI runs the tests as root.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::config::{Isolation, ProcessConfig, UidRange};
use super::isolation::{processes_of, resolve};
use super::*;

/// Reads a file for each probe and says which it could read.
const HOSTILE: &str = r#"
probe() { if cat "$2" >/dev/null 2>&1; then echo "read $1"; else echo "denied $1"; fi; }
probe relative-token "$KILN_CODE/../../../admin.token"
probe token "$KILN_HOME_DIR/admin.token"
probe secrets-key "$KILN_HOME_DIR/secrets.key"
probe database "$KILN_HOME_DIR/kiln.db"
probe jetstream "$KILN_HOME_DIR/jetstream/KILN_JOBS/msgs/1.blk"
probe victim-outputs "$VICTIM_DIR/outputs/secret.txt"
probe victim-code "$VICTIM_DIR/code/train.py"
probe victim-environ "/proc/$VICTIM_PID/environ"
if ls "$(dirname "$(readlink "$KILN_DATA/d")")" >/dev/null 2>&1; then echo "read dataset-listing"; else echo "denied dataset-listing"; fi
cat "$KILN_DATA/d/rows.csv"
echo "mine" > "$KILN_OUTPUTS/mine.txt" && cat "$KILN_CODE/train.py"
grep '^Groups:' /proc/self/status
echo "uid $(id -u) gid $(id -g)"
touch /tmp/kiln-hostile-left-$$
setsid sleep 600 </dev/null >/dev/null 2>&1 &
"#;

/// What the hostile job reads, as kiln would have made it: the files root's kiln keeps 0600 in
/// its home (itself 0755 as `create_dir_all` makes it), the runner's work dir inside.
struct KilnHome {
    dir: tempfile::TempDir,
}

impl KilnHome {
    fn new() -> KilnHome {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = home.join("jetstream/KILN_JOBS/msgs");
        std::fs::create_dir_all(&store).unwrap();
        for (path, text) in [
            ("admin.token", "kiln_admin_token"),
            ("secrets.key", "sealing key"),
            ("kiln.db", "SQLite format 3"),
            ("jetstream/KILN_JOBS/msgs/1.blk", "job tokens in messages"),
        ] {
            std::fs::write(home.join(path), text).unwrap();
            std::fs::set_permissions(home.join(path), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        KilnHome { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn capacity() -> Capacity {
    Capacity {
        cpu_millis: 1000,
        memory_bytes: 1 << 30,
        gpus: 0,
        disk_bytes: 0,
    }
}

/// A dataset entry as the cache leaves it: read-only for everyone, under a root of mode 0711.
fn dataset(root: &Path) -> PathBuf {
    let entry = root.join("ab12");
    std::fs::create_dir_all(&entry).unwrap();
    std::fs::write(entry.join("rows.csv"), "a,b\n").unwrap();
    crate::datasets::fetch::seal(&entry).unwrap();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711)).unwrap();
    entry
}

fn job(home: &Path, id: &str, owner: &str, command: &[&str], datasets: Vec<(String, PathBuf)>) -> InstanceSpec {
    let code = home.join(format!("{id}.tar.gz"));
    let mut archive = tar::Builder::new(flate2::write::GzEncoder::new(
        std::fs::File::create(&code).unwrap(),
        flate2::Compression::fast(),
    ));
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o644);
    header.set_size(9);
    header.set_cksum();
    archive
        .append_data(&mut header, "train.py", &b"print(1)\n"[..])
        .unwrap();
    archive.into_inner().unwrap().finish().unwrap();
    InstanceSpec {
        job_id: id.into(),
        attempt: 1,
        runner_id: "r".into(),
        owner_id: owner.into(),
        project: "default".into(),
        pull: None,
        disk_bytes: 0,
        shm_bytes: 0,
        image: String::new(),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::from([
            ("KILN_JOB_ID".to_string(), id.to_string()),
            ("KILN_TOKEN".to_string(), format!("token-of-{id}")),
        ]),
        cpu_millis: 1000,
        memory_bytes: 1 << 30,
        gpus: 0,
        market: kiln_core::scheduling::Market::OnDemand,
        gpu_devices: Vec::new(),
        code: Some(code),
        datasets,
        agent: None,
        scratch_dir: home.join("work").join(format!("{id}-1")),
        restore: None,
    }
}

/// Runs a victim job and the hostile one beside it on `provider`; returns the hostile job's
/// output and its uid, once both are released.
async fn attack(provider: &ProcessProvider, home: &Path, owner: &str, dataset: PathBuf) -> String {
    let victim_spec = job(
        home,
        "victim",
        owner,
        &["sh", "-c", "echo s > $KILN_OUTPUTS/secret.txt; exec sleep 600"],
        vec![],
    );
    let mut victim = provider.provision(&victim_spec).await.unwrap();
    let _victim_output = provider.start(&mut victim).await.unwrap();
    let victim_dir = provider.job_dir(&victim.scratch_dir);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !victim_dir.join("outputs/secret.txt").try_exists().unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "the victim never wrote its secret"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let victim_pid = instance_pid(&victim.id).unwrap();
    let mut hostile_spec = job(
        home,
        "hostile",
        owner,
        &["sh", "-c", HOSTILE],
        vec![("d".into(), dataset)],
    );
    hostile_spec.env.extend([
        ("KILN_HOME_DIR".to_string(), home.display().to_string()),
        ("VICTIM_DIR".to_string(), victim_dir.display().to_string()),
        ("VICTIM_PID".to_string(), victim_pid.to_string()),
    ]);
    let mut hostile = provider.provision(&hostile_spec).await.unwrap();
    let output = provider.start(&mut hostile).await.unwrap();
    let exit = provider.wait(&hostile).await.unwrap();
    assert_eq!(exit.code, 0);
    let text: Vec<u8> = output
        .take_until(tokio::time::sleep(std::time::Duration::from_secs(5)))
        .flat_map(|(_, bytes)| futures::stream::iter(bytes.to_vec()))
        .collect()
        .await;
    let text = String::from_utf8_lossy(&text).into_owned();
    // The outputs the runner syncs: the job's own, readable by the runner.
    let Outputs::Dir(outputs) = provider.outputs(&hostile).await.unwrap() else {
        panic!("a directory of outputs");
    };
    assert_eq!(std::fs::read_to_string(outputs.join("mine.txt")).unwrap(), "mine\n");
    for instance in [&hostile, &victim] {
        provider.signal(instance, Signal::SIGKILL).await.unwrap();
        provider.release(instance).await.unwrap();
    }
    text
}

const PROBES: [&str; 9] = [
    "relative-token",
    "token",
    "secrets-key",
    "database",
    "jetstream",
    "victim-outputs",
    "victim-code",
    "victim-environ",
    "dataset-listing",
];

/// Isolating process jobs needs root: not root, the test fails saying so.
fn assert_root() {
    assert!(
        isolation::effective_uid() == Some(0),
        "isolating process jobs needs root: run the tests as root (CI does, through scripts/test.sh)"
    );
}

#[tokio::test]
async fn an_isolated_job_reads_neither_kiln_nor_another_job_and_leaves_nothing() {
    assert_root();
    let home = KilnHome::new();
    let work_root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(work_root.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    // A range of this test's own: tests of other work roots run beside it.
    let range = UidRange {
        first: 2_100_000_000,
        last: 2_100_000_099,
    };
    let config = ProcessConfig {
        isolation: Isolation::Uid,
        uid_range: range,
        work_root: work_root.path().join("jobs"),
        trusted_owner: String::new(),
        firewall: false,
    };
    let isolated = resolve(&config, &home.path().join("work"))
        .unwrap()
        .expect("isolated as root");
    let entry = dataset(&isolated.runner_root.join("datasets"));
    let provider = ProcessProvider::new(
        capacity(),
        home.path().join("work"),
        JobUsers::Isolated(isolated.clone()),
    );
    let output = attack(&provider, home.path(), "anyone", entry).await;
    for probe in PROBES {
        assert!(
            output.contains(&format!("denied {probe}\n")),
            "{probe} was not denied:\n{output}"
        );
    }
    // What the job may do: read its dataset and its code, write its outputs, as a uid of the
    // range with no supplementary group.
    assert!(output.contains("a,b\nprint(1)\n"), "{output}");
    let groups = output.lines().find(|line| line.starts_with("Groups:")).expect(&output);
    assert_eq!(groups.trim(), "Groups:", "{output}");
    let ids = output.lines().find(|line| line.starts_with("uid ")).expect(&output);
    let uid: u32 = ids.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(range.contains(uid), "{ids}");
    assert_eq!(ids, format!("uid {uid} gid {uid}"));
    // Released: no process of the uid (the one that left its group included), no file of it
    // at the top of /tmp, the uid free again.
    assert!(processes_of(uid).is_empty());
    let left = std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("kiln-hostile-left-"))
        .filter(|entry| std::os::unix::fs::MetadataExt::uid(&entry.metadata().unwrap()) == uid)
        .count();
    assert_eq!(left, 0);
    assert_eq!(
        std::fs::read_dir(work_root.path().join("jobs/.uids")).unwrap().count(),
        0
    );
    assert!(!work_root.path().join("jobs/hostile-1").try_exists().unwrap());
}

#[tokio::test]
async fn the_control_a_job_run_as_the_runner_reads_all_of_it() {
    let home = KilnHome::new();
    let cache = tempfile::tempdir().unwrap();
    let entry = dataset(&cache.path().join("datasets"));
    let provider = ProcessProvider::new(capacity(), home.path().join("work"), JobUsers::Trusted("me".into()));
    let output = attack(&provider, home.path(), "me", entry).await;
    for probe in PROBES {
        assert!(
            output.contains(&format!("read {probe}\n")),
            "{probe} was not read:\n{output}"
        );
    }
}

#[test]
fn uid_ranges_that_hold_users_or_root_are_refused() {
    assert_root();
    let work_root = tempfile::tempdir().unwrap();
    for range in ["0-70000", "65534-65534"] {
        let config = ProcessConfig {
            isolation: Isolation::Uid,
            uid_range: range.parse().unwrap(),
            work_root: work_root.path().join("jobs"),
            trusted_owner: String::new(),
            firewall: false,
        };
        let error = resolve(&config, &work_root.path().join("work")).unwrap_err();
        assert!(error.to_string().contains("process.uid-range"), "{error}");
    }
}

#[tokio::test]
async fn a_new_runner_gives_back_the_uid_of_a_job_left_by_a_crash() {
    assert_root();
    let home = KilnHome::new();
    let work_root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(work_root.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let config = ProcessConfig {
        isolation: Isolation::Uid,
        uid_range: UidRange {
            first: 2_100_000_100,
            last: 2_100_000_199,
        },
        work_root: work_root.path().join("jobs"),
        trusted_owner: String::new(),
        firewall: false,
    };
    let work_dir = home.path().join("work");
    let isolated = resolve(&config, &work_dir).unwrap().expect("isolated as root");
    // Started by the provider of a runner that crashed since; one process left its group.
    let crashed = ProcessProvider::new(capacity(), work_dir.clone(), JobUsers::Isolated(isolated.clone()));
    let script = "setsid sleep 600 </dev/null >/dev/null 2>&1 & exec sleep 600";
    let mut instance = crashed
        .provision(&job(home.path(), "left", "anyone", &["sh", "-c", script], vec![]))
        .await
        .unwrap();
    let _output = crashed.start(&mut instance).await.unwrap();
    let uid = isolated.recorded_uid(&instance.scratch_dir).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while processes_of(uid).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the job never forked");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let restarted = ProcessProvider::new(capacity(), work_dir, JobUsers::Isolated(isolated.clone()));
    assert_eq!(restarted.release_leftovers("r", &[]).await.unwrap(), 1);
    assert!(processes_of(uid).is_empty());
    assert!(!work_root.path().join("jobs/left-1").try_exists().unwrap());
    assert_eq!(
        std::fs::read_dir(work_root.path().join("jobs/.uids")).unwrap().count(),
        0
    );
}
