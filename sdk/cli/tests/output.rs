//! How the CLI prints: `-o json` on every listing, quiet ends on a closed pipe, and shell
//! completion scripts.

use std::process::{Command, Stdio};

use crate::common;

use common::{KILN, Up, text};

/// Runs `kiln ARGS` with stdout a pipe whose reader is already gone (as `kiln ps | head` once
/// head has exited): the command must end without a panic or an error message.
fn assert_quiet_on_a_closed_pipe(up: Option<&Up>, args: &[&str]) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut command = Command::new(KILN);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped());
    if let Some(up) = up {
        command
            .current_dir(up.project.path())
            .env("KILN_HOME", up.home.path())
            .env_remove("KILN_ADDR")
            .env_remove("KILN_TOKEN");
    }
    let output = command.output().unwrap();
    let stderr = text(&output.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe") && stderr.is_empty(),
        "kiln {args:?} on a closed pipe said: {stderr}"
    );
    assert_eq!(
        output.status.code(),
        Some(141),
        "kiln {args:?}: 128 + SIGPIPE, as a shell shows it"
    );
}

#[test]
fn completion_scripts_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(KILN).args(["completions", shell]).output().unwrap();
        assert!(output.status.success(), "{shell}: {}", text(&output.stderr));
        let script = text(&output.stdout);
        for subcommand in [
            "up",
            "run",
            "ps",
            "batch",
            "dataset",
            "artifacts",
            "quota",
            "completions",
        ] {
            assert!(
                script.contains(subcommand),
                "the {shell} script does not name {subcommand}"
            );
        }
    }
    let fish = text(
        &Command::new(KILN)
            .args(["completions", "fish"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(fish.contains("complete -c kiln"), "{fish}");
    let bad = Command::new(KILN).args(["completions", "tcsh"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("possible values"), "{}", text(&bad.stderr));
    assert_quiet_on_a_closed_pipe(None, &["completions", "bash"]);
}

#[test]
fn every_listing_takes_json_and_ends_quietly_on_a_closed_pipe() {
    let up = Up::start();
    let job = up.kiln(&[
        "run",
        "-f",
        "--no-code",
        "--name",
        "listed",
        "--",
        "sh",
        "-c",
        "echo w > $KILN_OUTPUTS/model.txt",
    ]);
    assert!(job.status.success(), "{}", text(&job.stderr));
    let job_id = up.kiln(&["ps", "--all", "-o", "json"]);
    let jobs: serde_json::Value = serde_json::from_slice(&job_id.stdout).unwrap();
    let job_id = jobs[0]["id"].as_str().unwrap().to_string();
    let created = up.kiln(&["batch", "create", "--name", "listed", "--", "kiln:noop"]);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let batch = text(&created.stdout).trim().to_string();
    let items = up.project.path().join("items.txt");
    std::fs::write(&items, "mem://a\nmem://b\n").unwrap();
    assert!(
        up.kiln(&["batch", "add", &batch, "--from", items.to_str().unwrap()])
            .status
            .success()
    );

    let listings: [&[&str]; 7] = [
        &["ps", "--all"],
        &["batch", "ls", "--all"],
        &["batch", "items", &batch],
        &["dataset", "ls"],
        &["artifacts", "ls", &job_id],
        &["quota", "ls"],
        &["batch", "status", &batch],
    ];
    for listing in listings {
        let mut args = listing.to_vec();
        args.extend(["-o", "json"]);
        let output = up.kiln(&args);
        assert!(output.status.success(), "kiln {args:?}: {}", text(&output.stderr));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|error| panic!("kiln {args:?} printed no JSON ({error}): {}", text(&output.stdout)));
        assert!(json.is_array() || json.is_object(), "kiln {args:?}: {json}");
        assert_quiet_on_a_closed_pipe(Some(&up), listing);
    }
    let batches: serde_json::Value = serde_json::from_slice(&up.kiln(&["batch", "ls", "-o", "json"]).stdout).unwrap();
    assert_eq!(batches[0]["id"], batch.as_str());
    assert_eq!(batches[0]["name"], "listed");
    let listed: serde_json::Value =
        serde_json::from_slice(&up.kiln(&["batch", "items", &batch, "-o", "json"]).stdout).unwrap();
    let keys: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["mem://a", "mem://b"]);
}
