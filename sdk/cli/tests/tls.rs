//! A TLS-only `kiln up`: every listener serves TLS and requires a client certificate of its CA.
//! The CLI, a job and a batch's agents work through it; plain text, a client without a
//! certificate and one with a certificate of another CA are refused.

use std::path::Path;

use crate::common;

use common::{Up, text};
use kiln_core::testing::{CertFiles, TestCa};

/// `kiln up` serving a certificate of `ca`, requiring client certificates of `ca`, and
/// handing jobs `ca` and a client certificate of their own.
fn start_tls(ca: &TestCa) -> Up {
    let server = ca.server_cert("server");
    let job = ca.client_cert("job");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let flags = [
        "--provider".to_string(),
        "process".into(),
        "--tls-cert".into(),
        path(&server.cert_file),
        "--tls-key".into(),
        path(&server.key_file),
        "--tls-ca".into(),
        path(&ca.ca_file),
        "--tls-client-ca".into(),
        path(&ca.ca_file),
        "--job-client-cert".into(),
        path(&job.cert_file),
        "--job-client-key".into(),
        path(&job.key_file),
    ];
    Up::start_with(&flags.iter().map(String::as_str).collect::<Vec<_>>())
}

fn client_env(files: &CertFiles) -> [(&'static str, &str); 2] {
    [
        ("KILN_CLIENT_CERT", files.cert_file.to_str().unwrap()),
        ("KILN_CLIENT_KEY", files.key_file.to_str().unwrap()),
    ]
}

#[test]
fn the_cli_a_job_and_a_batch_work_through_tls_and_others_are_refused() {
    let certs = tempfile::tempdir().unwrap();
    let ca = TestCa::new(certs.path(), "kiln");
    let up = start_tls(&ca);
    let credentials = std::fs::read_to_string(up.home.path().join("credentials.toml")).unwrap();
    assert!(credentials.contains("api = \"https://127.0.0.1:"), "{credentials}");
    assert!(credentials.contains("ca-file = "), "{credentials}");
    let cli = ca.client_cert("cli");
    let env = client_env(&cli);

    let listed = up.kiln_env(&["ps"], &env);
    assert!(listed.status.success(), "{}\n{}", text(&listed.stderr), up.log());

    // A job gets the CA and a client certificate for the https:// addresses it is given.
    let run = up.kiln_env(
        &[
            "run",
            "-f",
            "--",
            "sh",
            "-c",
            "case $KILN_API in https://*) ;; *) exit 7;; esac; [ -n \"$KILN_CA_PEM\" ] && [ -n \"$KILN_CLIENT_KEY_PEM\" ] && echo tls",
        ],
        &env,
    );
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "tls\n");

    // A batch: its agents reach item-batch over TLS with the runner's client certificate.
    let created = up.kiln_env(
        &[
            "batch",
            "create",
            "--cpu",
            "0.1",
            "--mem",
            "64M",
            "--max-workers",
            "2",
            "--",
            "true",
            "{item}",
        ],
        &env,
    );
    assert!(created.status.success(), "{}", text(&created.stderr));
    let batch = text(&created.stdout).trim().to_string();
    let items = up.project.path().join("items.txt");
    std::fs::write(&items, (0..10).map(|n| format!("mem://{n}\n")).collect::<String>()).unwrap();
    let added = up.kiln_env(&["batch", "add", &batch, "--from", items.to_str().unwrap()], &env);
    assert!(added.status.success(), "{}", text(&added.stderr));
    assert!(up.kiln_env(&["batch", "seal", &batch], &env).status.success());
    let watched = up.kiln_env(&["batch", "status", &batch, "--watch"], &env);
    let status = text(&watched.stdout);
    assert!(
        watched.status.success() && status.contains("10 succeeded"),
        "{status}\n{}\n{}",
        text(&watched.stderr),
        up.log()
    );

    // No client certificate: refused.
    let refused = up.kiln(&["ps"]);
    assert!(!refused.status.success(), "a client without a certificate is refused");

    // A certificate of another CA: refused.
    let other = TestCa::new(certs.path(), "other");
    let foreign = other.client_cert("foreign");
    let refused = up.kiln_env(&["ps"], &client_env(&foreign));
    assert!(!refused.status.success(), "a certificate of another CA is refused");

    // Plain text to the same port: refused.
    let api = credentials
        .lines()
        .find_map(|line| line.strip_prefix("api = \"https://"))
        .unwrap()
        .trim_end_matches('"')
        .to_string();
    let token = std::fs::read_to_string(up.home.path().join("admin.token")).unwrap();
    let plain_url = format!("http://{api}");
    let mut plain_env = env.to_vec();
    plain_env.extend([("KILN_ADDR", plain_url.as_str()), ("KILN_TOKEN", token.trim())]);
    let refused = up.kiln_env(&["ps"], &plain_env);
    assert!(!refused.status.success(), "a plain-text client is refused");

    // A client that does not trust kiln's CA does not connect either.
    let distrust = up.kiln_env(&["--ca-file", other.ca_file.to_str().unwrap(), "ps"], &env);
    assert!(!distrust.status.success(), "the server's certificate is checked");
}

#[test]
fn kiln_up_refuses_plain_text_beyond_loopback() {
    let home = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(common::KILN)
        .args(["up", "--provider", "process", "--api-addr", "0.0.0.0:0"])
        .env("KILN_HOME", home.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("--api-addr 0.0.0.0:0") && stderr.contains("--tls-cert") && stderr.contains("--insecure"),
        "{stderr}"
    );
}
