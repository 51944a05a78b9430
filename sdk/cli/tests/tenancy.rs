//! Users, tokens and projects from the command line, against `kiln up`: what a script does
//! to onboard someone, and what that person can then do.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::common;

use common::{KILN, Up, last_line, text};

fn ok(output: std::process::Output) -> String {
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
}

#[test]
fn an_admin_onboards_a_user_who_then_works_in_their_project_only() {
    let up = Up::start();
    let ada = last_line(&up.kiln(&["user", "create", "ada"]));
    assert!(ada.starts_with("kiln_"), "the token alone on the last line: {ada}");
    ok(up.kiln(&["project", "create", "vision"]));
    ok(up.kiln(&["project", "add-member", "vision", "ada", "--role", "member"]));
    let members = ok(up.kiln(&["project", "members", "vision", "-o", "json"]));
    assert!(members.contains("\"ada\"") && members.contains("member"), "{members}");

    let as_ada = |args: &[&str]| up.kiln_env(args, &[("KILN_TOKEN", ada.as_str())]);
    let me = ok(as_ada(&["whoami", "-o", "json"]));
    assert!(me.contains("\"ada\"") && me.contains("vision"), "{me}");
    // Not a member of `default`: the project does not exist for her.
    let refused = as_ada(&["run", "--no-code", "--", "true"]);
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("not found"), "{}", text(&refused.stderr));
    let job = last_line(&as_ada(&["run", "--no-code", "--project", "vision", "--", "true"]));
    assert!(ok(as_ada(&["ps", "--all", "--project", "vision"])).contains(&job));
    // Admin-only commands say so.
    let denied = as_ada(&["user", "create", "mallory"]);
    assert!(text(&denied.stderr).contains("admin"), "{}", text(&denied.stderr));

    // Her own tokens: a narrowed, expiring one that can read but not submit, then revoked.
    let viewer = last_line(&as_ada(&[
        "token",
        "create",
        "--name",
        "ci",
        "--expires",
        "30d",
        "--project",
        "vision",
        "--role",
        "viewer",
    ]));
    let as_viewer = |args: &[&str]| up.kiln_env(args, &[("KILN_TOKEN", viewer.as_str())]);
    assert!(ok(as_viewer(&["status", &job])).contains(&job));
    let refused = as_viewer(&["run", "--no-code", "--project", "vision", "--", "true"]);
    assert!(
        text(&refused.stderr).contains("member role"),
        "{}",
        text(&refused.stderr)
    );
    let tokens = ok(as_ada(&["token", "ls", "-o", "json"]));
    assert!(tokens.contains("\"ci\"") && tokens.contains("viewer"), "{tokens}");
    ok(as_ada(&["token", "revoke", "ci"]));
    let revoked = as_viewer(&["whoami"]);
    assert!(!revoked.status.success());
    assert!(text(&revoked.stderr).contains("revoked"), "{}", text(&revoked.stderr));

    // `kiln login` stores a token read from stdin, mode 0600, and the CLI then uses it.
    let home = tempfile::tempdir().unwrap();
    let addr = ok(up.kiln(&["whoami", "-o", "json"]));
    assert!(addr.contains("admin"));
    let credentials = std::fs::read_to_string(up.home.path().join("credentials.toml")).unwrap();
    let api = credentials
        .lines()
        .find_map(|line| line.strip_prefix("api = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let mut login = Command::new(KILN)
        .args(["login", "--addr", &api])
        .env("KILN_HOME", home.path())
        .env_remove("KILN_TOKEN")
        .env_remove("KILN_ADDR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(login.stdin.take().unwrap(), "{ada}").unwrap();
    let logged_in = login.wait_with_output().unwrap();
    assert!(ok(logged_in).contains("as ada"));
    let path = home.path().join("credentials.toml");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let me = Command::new(KILN)
        .args(["whoami"])
        .env("KILN_HOME", home.path())
        .env_remove("KILN_TOKEN")
        .env_remove("KILN_ADDR")
        .output()
        .unwrap();
    assert!(ok(me).contains("ada"));
    // One address is stored; item-batch's (another port under `kiln up`) comes from the api's
    // DiscoveryService at each use: answered by the api's own address, `batch ls` would fail.
    let stored = std::fs::read_to_string(&path).unwrap();
    assert!(stored.contains("batches = \"\""), "{stored}");
    let batches = Command::new(KILN)
        .args(["batch", "ls"])
        .env("KILN_HOME", home.path())
        .env_remove("KILN_TOKEN")
        .env_remove("KILN_ADDR")
        .output()
        .unwrap();
    ok(batches);
    // KILN_ADDR and KILN_TOKEN alone, without a credentials file, do as well.
    let bare = tempfile::tempdir().unwrap();
    let only_two = Command::new(KILN)
        .args(["batch", "ls"])
        .env("KILN_HOME", bare.path())
        .env("KILN_ADDR", &api)
        .env("KILN_TOKEN", &ada)
        .output()
        .unwrap();
    ok(only_two);
    // `kiln doctor` checks each service it found: all fine here; item-batch's address pointed
    // at the api is told in its line (the api answers there), and the exit code is 1.
    let doctor = |extra: &[(&str, &str)]| {
        Command::new(KILN)
            .args(["doctor"])
            .env("KILN_HOME", bare.path())
            .env("KILN_ADDR", &api)
            .env("KILN_TOKEN", &ada)
            .envs(extra.iter().copied())
            .output()
            .unwrap()
    };
    let healthy = ok(doctor(&[]));
    assert_eq!(healthy.matches("ok: ").count(), 6, "{healthy}");
    let misrouted = doctor(&[("KILN_BATCH_ADDR", api.as_str())]);
    assert_eq!(misrouted.status.code(), Some(1));
    let lines = text(&misrouted.stdout);
    assert!(lines.contains("\"api\" answers there, not item-batch"), "{lines}");
    // Two api replicas in KILN_ADDR, the first one down: commands use the second, and
    // `kiln doctor` gives each replica its line (exit 1: one is unreachable).
    let replicas = format!("http://127.0.0.1:9,{api}");
    let two = |args: &[&str]| {
        Command::new(KILN)
            .args(args)
            .env("KILN_HOME", bare.path())
            .env("KILN_ADDR", &replicas)
            .env("KILN_TOKEN", &ada)
            .output()
            .unwrap()
    };
    ok(two(&["batch", "ls"]));
    let checked = two(&["doctor"]);
    assert_eq!(checked.status.code(), Some(1));
    let lines = text(&checked.stdout);
    let api_lines: Vec<&str> = lines.lines().filter(|line| line.starts_with("api ")).collect();
    assert_eq!(api_lines.len(), 2, "{lines}");
    assert!(
        api_lines[0].contains("127.0.0.1:9") && api_lines[0].contains("unreachable"),
        "{lines}"
    );
    assert!(api_lines[1].contains("ok: api"), "{lines}");

    // Disabled: every command of hers is refused.
    ok(up.kiln(&["user", "disable", "ada"]));
    assert!(!as_ada(&["whoami"]).status.success());
    let users = ok(up.kiln(&["user", "ls", "-o", "json"]));
    assert!(users.contains("\"disabled\": true"), "{users}");
}
