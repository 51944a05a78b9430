//! A TLS-only topology: every gRPC listener requires a client certificate of the topology's
//! CA, and NATS requires TLS, a client certificate and an NKey user. The CLI, the Python SDK
//! (outside and inside a job) and batch agents work through it; plain text, no certificate and
//! a certificate of another CA are refused.

use std::process::{Command, Output};

use kiln_core::testing::TestCa;
use kiln_topology::{Options, Topology, binaries_dir};

fn kiln(topology: &Topology, env: &[(&str, String)], args: &[&str]) -> Output {
    Command::new(binaries_dir().join("kiln"))
        .args(args)
        .env("KILN_HOME", topology.dir.join("cli-home"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run kiln")
}

fn ok(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_the_sdk_and_agents_work_on_a_tls_only_topology() {
    let mut topology = Topology::start(Options {
        tls: true,
        ..Options::from_env()
    })
    .await;
    let env = topology.client_env();
    assert!(env[0].1.starts_with("https://"), "{env:?}");

    // The CLI, and a job that logs through the SDK with what its runner handed it.
    let python = std::env::var("KILN_TEST_PYTHON")
        .expect("KILN_TEST_PYTHON is not set: run the tests through scripts/test.sh, which makes the SDK's venv");
    let script = "import kiln\nkiln.init()\nfor s in range(20):\n    kiln.log({'tls/x': s}, step=s)\nkiln.finish()\nprint('logged')";
    let job = ok(
        kiln(
            &topology,
            &env,
            &["run", "-f", "--no-code", "--pool", "local", "--", &python, "-c", script],
        ),
        "kiln run -f",
    );
    assert_eq!(job, "logged\n");

    // The SDK outside a job.
    let outside = Command::new(&python)
        .args([
            "-c",
            "import kiln\nrun = kiln.init(name='outside')\nkiln.log({'tls/y': 1.0}, step=0)\nkiln.finish()\nprint('ok')",
        ])
        .env("KILN_HOME", topology.dir.join("cli-home"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("python");
    assert_eq!(ok(outside, "the SDK"), "ok\n");

    // A batch: the agents reach both item-batch replicas over TLS with the runners' certificate.
    let batch = ok(
        kiln(
            &topology,
            &env,
            &[
                "batch",
                "create",
                "--cpu",
                "0.1",
                "--mem",
                "64M",
                "--max-workers",
                "2",
                "--pool",
                "local",
                "--",
                "true",
                "{item}",
            ],
        ),
        "kiln batch create",
    )
    .trim()
    .to_string();
    let items = topology.dir.join("items.txt");
    std::fs::write(&items, (0..20).map(|n| format!("mem://{n}\n")).collect::<String>()).unwrap();
    ok(
        kiln(
            &topology,
            &env,
            &["batch", "add", &batch, "--from", items.to_str().unwrap()],
        ),
        "kiln batch add",
    );
    ok(kiln(&topology, &env, &["batch", "seal", &batch]), "kiln batch seal");
    let status = ok(
        kiln(&topology, &env, &["batch", "status", &batch, "--watch"]),
        "kiln batch status --watch",
    );
    assert!(status.contains("20 succeeded"), "{status}");

    // Refused: plain text, no client certificate, a certificate of another CA.
    let mut plain = env.clone();
    plain[0].1 = plain[0].1.replace("https://", "http://");
    assert!(
        !kiln(&topology, &plain, &["ps"]).status.success(),
        "plain text is refused"
    );
    let anonymous: Vec<_> = env
        .iter()
        .filter(|(k, _)| !k.starts_with("KILN_CLIENT_"))
        .cloned()
        .collect();
    assert!(
        !kiln(&topology, &anonymous, &["ps"]).status.success(),
        "a client without a certificate is refused"
    );
    let other = TestCa::new(&topology.dir, "other");
    let foreign = other.client_cert("foreign");
    let mut stranger = anonymous.clone();
    stranger.push(("KILN_CLIENT_CERT", foreign.cert_file.display().to_string()));
    stranger.push(("KILN_CLIENT_KEY", foreign.key_file.display().to_string()));
    assert!(
        !kiln(&topology, &stranger, &["ps"]).status.success(),
        "a certificate of another CA is refused"
    );
    ok(kiln(&topology, &env, &["ps"]), "kiln ps after the refusals");
    topology.stop();
}
