//! A throw-away Postgres cluster in a temp dir, on a free loopback port, that can be restarted
//! (the chaos test restarts it once under load).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kiln_core::testing::free_port;

/// A Postgres server the harness started; stopped (immediate mode) on drop.
pub struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
    as_postgres: bool,
}

fn server_bin() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("Postgres server binaries under /usr/lib/postgresql: run scripts/setup.sh")
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").try_exists().unwrap_or(false))
        .collect();
    found.sort();
    found
        .pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin: run scripts/setup.sh")
}

impl Postgres {
    /// initdb and start, in `dir` (created; as the `postgres` user when running as root).
    pub fn start(dir: &Path) -> Postgres {
        std::fs::create_dir_all(dir).expect("postgres dir");
        // Postgres refuses to run as root; the Debian package made a `postgres` user.
        let as_postgres = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
        };
        if as_postgres {
            let status = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir)
                .status()
                .expect("chown");
            assert!(status.success(), "chown of {} failed", dir.display());
        }
        let postgres = Postgres {
            bin: server_bin(),
            dir: dir.to_path_buf(),
            port: free_port(),
            as_postgres,
        };
        postgres.run(
            "initdb",
            &["-D", &postgres.data(), "-A", "trust", "-U", "postgres", "--no-sync"],
        );
        postgres.pg_ctl_start();
        postgres
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn run(&self, program: &str, args: &[&str]) {
        let program = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        let output = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
        assert!(
            output.status.success(),
            "{} {args:?} failed: {}",
            program.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn pg_ctl_start(&self) {
        let options = format!(
            "-k {} -p {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=400",
            self.dir.display(),
            self.port
        );
        let log = self.dir.join("postgres.log").display().to_string();
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-l", &log, "-w", "-o", &options, "start"],
        );
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops it at once (as a crash would: `-m immediate`) and starts it again.
    pub fn restart(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "-w", "stop"]);
        self.pg_ctl_start();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let program = self.bin.join("pg_ctl");
        let data = self.data();
        let args = ["-D", data.as_str(), "-m", "immediate", "stop"];
        let _ = if self.as_postgres {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&program)
                .args(args)
                .output()
        } else {
            Command::new(&program).args(args).output()
        };
    }
}
