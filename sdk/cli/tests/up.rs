//! `kiln up` as a new user meets it: the tools setup installed are found whatever KILN_HOME
//! is, and a `kiln up` killed with SIGKILL leaves no nats-server writing to its store.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{KILN, Up, text};

/// The nats-server the tests use (scripts/test.sh exports it).
fn nats_server() -> PathBuf {
    PathBuf::from(
        std::env::var("KILN_TEST_NATS_SERVER")
            .expect("KILN_TEST_NATS_SERVER is not set: run the tests through scripts/test.sh"),
    )
}

/// Whether process `pid` runs with `store` in its command line (a reaped process or a zombie
/// does not).
fn serves(pid: u32, store: &Path) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| {
            cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == store.as_os_str().as_encoded_bytes())
        })
        .unwrap_or(false)
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `kiln up` on `home` with only `path` as PATH and `user_home` as HOME, stopped at once by
/// SIGINT once up; returns its exit status, stdout and stderr.
fn up_with(home: &Path, user_home: &Path, path: &str) -> (bool, String) {
    let mut child = Command::new(KILN)
        .args([
            "up",
            "--provider",
            "process",
            "--api-addr",
            "127.0.0.1:0",
            "--logs-addr",
            "127.0.0.1:0",
            "--batch-addr",
            "127.0.0.1:0",
            "--advisor-addr",
            "127.0.0.1:0",
            "--predictor-addr",
            "127.0.0.1:0",
            "--predictor-http-addr",
            "127.0.0.1:0",
        ])
        .env_clear()
        .env("KILN_HOME", home)
        .env("HOME", user_home)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if home.join("credentials.toml").try_exists().unwrap() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
            break;
        }
        assert!(Instant::now() < deadline, "kiln up neither started nor failed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let up = home.join("credentials.toml").try_exists().unwrap();
    (up, format!("{}{}", text(&output.stdout), text(&output.stderr)))
}

#[test]
fn the_tools_setup_installed_are_found_whatever_kiln_home_is() {
    let user_home = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    // No nats-server anywhere: the error names every place looked.
    let (up, said) = up_with(home.path(), user_home.path(), "/usr/bin:/bin");
    assert!(!up, "{said}");
    for place in ["$KILN_HOME/tools/bin", ".kiln/tools/bin", "PATH", "scripts/setup.sh"] {
        assert!(said.contains(place), "{place} not named in: {said}");
    }
    // What setup installs into ~/.kiln/tools/bin is found with another KILN_HOME; so is the
    // static kiln-agent for batch workers.
    let tools = user_home.path().join(".kiln/tools/bin");
    std::fs::create_dir_all(&tools).unwrap();
    std::os::unix::fs::symlink(nats_server(), tools.join("nats-server")).unwrap();
    let (up, said) = up_with(home.path(), user_home.path(), "/usr/bin:/bin");
    assert!(up, "{said}");
    assert!(said.contains("kiln-agent not found"), "a missing agent is said: {said}");
    std::fs::remove_file(home.path().join("credentials.toml")).unwrap();
    std::fs::write(tools.join("kiln-agent"), "").unwrap();
    let (up, said) = up_with(home.path(), user_home.path(), "/usr/bin:/bin");
    assert!(up && !said.contains("kiln-agent not found"), "{said}");
}

#[test]
fn a_killed_up_leaves_no_nats_server_and_the_next_one_stops_a_stale_one() {
    let mut up = Up::start();
    let home = up.home.path().canonicalize().unwrap();
    let store = home.join("nats");
    let pid_file = home.join("nats.pid");
    let nats_pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert!(serves(nats_pid, &store), "the pid file names the child nats-server");
    let nats = up.nats_url();
    let port: u16 = nats.rsplit(':').next().unwrap().parse().unwrap();

    // SIGKILL: no cleanup runs in kiln up; the parent-death signal ends its child.
    up.child.kill().unwrap();
    up.child.wait().unwrap();
    wait_until("the child nats-server outlived kiln up", || !serves(nats_pid, &store));
    // An exiting process loses its command line (its memory) before its sockets: wait for both.
    wait_until("the child nats-server's port still accepts connections", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
    });

    // A server that outlived its parent anyway (setpriv missing, or killed in the instant
    // before the signal was set): one of our own on the same store, named in the pid file.
    let mut stale = Command::new(nats_server())
        .args(["-js", "-a", "127.0.0.1", "-p", "-1", "-sd"])
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::fs::write(&pid_file, format!("{}\n", stale.id())).unwrap();
    up.restart();
    let stopped = stale.try_wait().unwrap();
    assert!(stopped.is_some(), "the stale nats-server still runs:\n{}", up.log());
    assert!(
        up.log().contains(&format!("stopping nats-server pid {}", stale.id())),
        "{}",
        up.log()
    );
    let new_pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert_ne!(new_pid, stale.id());
    assert!(serves(new_pid, &store));
    let listed = up.kiln(&["ps"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));

    // A pid file naming a process of something else is left alone.
    let mut other = Command::new("sleep").arg("30").spawn().unwrap();
    up.interrupt();
    assert!(!pid_file.try_exists().unwrap(), "a clean stop removes the pid file");
    std::fs::write(&pid_file, format!("{}\n", other.id())).unwrap();
    up.restart();
    assert!(other.try_wait().unwrap().is_none(), "an unrelated process was stopped");
    other.kill().unwrap();
    other.wait().unwrap();
}
