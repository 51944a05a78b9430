//! What the CLI tests share: `kiln up` as a child process on a temp KILN_HOME, and the
//! `kiln` commands run against it. Each test binary uses only some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub mod http;

pub const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// A `kiln up` running on a temp KILN_HOME, on free ports.
pub struct Up {
    pub child: Child,
    pub home: tempfile::TempDir,
    pub project: tempfile::TempDir,
    pub flags: Vec<String>,
    /// The `kiln` that runs `up`: [`KILN`], or a lone link to it ([`Up::start_alone`]).
    binary: PathBuf,
    _lone: Option<tempfile::TempDir>,
}

impl Up {
    /// Starts `kiln up` with the `process` provider.
    pub fn start() -> Up {
        Up::start_with(&["--provider", "process"])
    }

    /// Starts `kiln up` with the `docker` provider on the test engine.
    pub fn start_docker() -> Up {
        let host = std::env::var("KILN_TEST_DOCKER_HOST")
            .expect("KILN_TEST_DOCKER_HOST is not set: run the tests through scripts/test.sh, which starts dockerd");
        Up::start_with(&["--provider", "docker", "--docker-host", &host])
    }

    pub fn start_with(flags: &[&str]) -> Up {
        Up::start_from(PathBuf::from(KILN), None, flags)
    }

    /// Starts `kiln up` (process provider) from a `kiln` alone in its directory, as the first
    /// command's build leaves it (`target/quick` holds no kiln-agent), with the agent behind a
    /// directory of mode 0700, as setup's tools are in a root's home (`/root` is 0700).
    pub fn start_alone() -> Up {
        use std::os::unix::fs::PermissionsExt;
        let lone = tempfile::tempdir().unwrap();
        // Hard links where the temp dir shares the build's filesystem, else copies.
        let place = |from: &Path, to: &Path| {
            std::fs::hard_link(from, to)
                .or_else(|_| std::fs::copy(from, to).map(drop))
                .unwrap()
        };
        let binary = lone.path().join("kiln");
        place(Path::new(KILN), &binary);
        let built = Path::new(KILN).with_file_name("kiln-agent");
        assert!(
            built.try_exists().unwrap(),
            "{} is missing: build the workspace",
            built.display()
        );
        let private = lone.path().join("home");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let agent = private.join("kiln-agent");
        place(&built, &agent);
        let flags = ["--provider", "process", "--agent-binary", agent.to_str().unwrap()];
        Up::start_from(binary, Some(lone), &flags)
    }

    fn start_from(binary: PathBuf, lone: Option<tempfile::TempDir>, flags: &[&str]) -> Up {
        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        std::fs::write(project.path().join("train.py"), "print('training')\n").unwrap();
        let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
        let child = spawn_up(&binary, home.path(), &flags);
        let up = Up {
            child,
            home,
            project,
            flags,
            binary,
            _lone: lone,
        };
        up.wait_until_up();
        up
    }

    /// Starts `kiln up` again on the same home, after [`Up::interrupt`].
    pub fn restart(&mut self) {
        std::fs::remove_file(self.home.path().join("credentials.toml")).unwrap();
        self.child = spawn_up(&self.binary, self.home.path(), &self.flags);
        self.wait_until_up();
    }

    pub fn wait_until_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.home.path().join("credentials.toml").try_exists().unwrap() {
            assert!(Instant::now() < deadline, "kiln up did not start:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `kiln up`'s log, then its nats-server's.
    pub fn log(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.home.path().join(name)).unwrap_or_default();
        format!("{}\n--- nats.log ---\n{}", read("up.log"), read("nats.log"))
    }

    /// Runs `kiln ARGS` in the project directory.
    pub fn kiln(&self, args: &[&str]) -> Output {
        self.kiln_env(args, &[])
    }

    pub fn kiln_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(KILN)
            .args(args)
            .current_dir(self.project.path())
            .env("KILN_HOME", self.home.path())
            .env_remove("KILN_ADDR")
            .env_remove("KILN_TOKEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    pub fn status_json(&self, job_id: &str) -> serde_json::Value {
        let output = self.kiln(&["status", job_id, "-o", "json"]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    }

    pub fn wait_for_state(&self, job_id: &str, state: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.status_json(job_id);
            if status["state"] == state {
                return status;
            }
            assert!(Instant::now() < deadline, "job never reached {state}: {status}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The value of the `LABEL: value` line `kiln up` printed once up. It prints them after it
    /// writes its credentials (what [`Up::wait_until_up`] waits for), so they are waited for too.
    fn printed(&self, label: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|l| l.trim_start().starts_with(label)) {
                return line.split_whitespace().nth(1).unwrap().to_string();
            }
            assert!(Instant::now() < deadline, "no {label} line in:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The `/metrics` URL `kiln up` printed.
    pub fn metrics_url(&self) -> String {
        self.printed("metrics:")
    }

    /// The web UI's URL `kiln up` printed (`http://127.0.0.1:PORT`, no trailing slash).
    pub fn ui_url(&self) -> String {
        self.printed("ui:").trim_end_matches('/').to_string()
    }

    /// The admin token `kiln up` wrote.
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.home.path().join("admin.token"))
            .unwrap()
            .trim()
            .to_string()
    }

    pub fn nats_url(&self) -> String {
        let log = self.log();
        let line = log
            .lines()
            .find(|l| l.trim_start().starts_with("nats:"))
            .expect("nats line");
        line.split_whitespace().nth(1).unwrap().to_string()
    }

    pub fn interrupt(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "kiln up did not stop:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.interrupt();
        }
    }
}

pub fn spawn_up(kiln: &Path, home: &Path, flags: &[String]) -> Child {
    let log = std::fs::File::create(home.join("up.log")).unwrap();
    // Free loopback ports, a short grace period: each unless `flags` says otherwise.
    let defaults = [
        ("--api-addr", "127.0.0.1:0"),
        ("--logs-addr", "127.0.0.1:0"),
        ("--batch-addr", "127.0.0.1:0"),
        ("--advisor-addr", "127.0.0.1:0"),
        ("--predictor-addr", "127.0.0.1:0"),
        ("--predictor-http-addr", "127.0.0.1:0"),
        ("--metrics-addr", "127.0.0.1:0"),
        ("--http-addr", "127.0.0.1:0"),
        ("--grace-period", "2"),
    ];
    let mut command = Command::new(kiln);
    command.arg("up");
    for (flag, value) in defaults {
        if !flags.iter().any(|given| given == flag) {
            command.args([flag, value]);
        }
    }
    command
        .args(flags)
        .env("KILN_HOME", home)
        .env_remove("KILN_ADDR")
        .env_remove("KILN_TOKEN")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// The last line of a command's stdout (where commands put the id or token they made).
pub fn last_line(output: &Output) -> String {
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn artifacts(home: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(home.join("objects/artifacts/sha256")) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}
