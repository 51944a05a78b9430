//! `kiln up`'s nats-server admits only the services' NKey users: every service runs with its
//! own seed (a job runs end to end), the seeds are private and kept across restarts, and a job
//! that speaks NATS without credentials is refused — while the same probe gets through to a
//! server without authorization (the control).

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::{Up, text};
use kiln_core::nats_auth::Service;
use kiln_core::testing::{NatsProbe, NatsServer, nats_probe_script};

fn port(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn a_job_cannot_speak_nats_to_kiln_up_and_each_service_has_its_own_user() {
    let mut up = Up::start();
    let home = up.home.path().canonicalize().unwrap();
    let users = home.join("nats-users");
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&users), 0o700);
    let seeds: Vec<String> = Service::ALL
        .iter()
        .map(|service| {
            let path = users.join(service.seed_file_name());
            assert_eq!(mode(&path), 0o600, "{}", path.display());
            std::fs::read_to_string(path).unwrap()
        })
        .collect();
    let config = std::fs::read_to_string(home.join("nats-server.conf")).unwrap();
    assert_eq!(config.matches("nkey:").count(), Service::ALL.len(), "{config}");
    assert!(!config.contains("no_auth_user"), "{config}");

    // The hostile job: it shares kiln up's loopback and tries to stop a job over NATS. As root
    // its firewall (process.firewall) does not let it connect; not root, NATS refuses it.
    let script = nats_probe_script("127.0.0.1", port(&up.nats_url()), "kiln.control.any-job", "stop");
    let output = up.kiln(&["run", "-f", "--", "bash", "-c", &script]);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    let probe = NatsProbe::from_output(&text(&output.stdout));
    let refused =
        |probe: &Option<NatsProbe>| matches!(probe, Some(NatsProbe::Refused(why)) if why.contains("Authorization"));
    assert!(
        refused(&probe) || probe == Some(NatsProbe::Unreachable),
        "{probe:?}: {}",
        text(&output.stdout)
    );
    // Whatever connects without a service's seed is refused (a process of this host, here).
    let output = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    let probe = NatsProbe::from_output(&text(&output.stdout));
    assert!(refused(&probe), "{probe:?}: {}", text(&output.stdout));

    // The seeds are kept: a restart reuses them (the services still connect, a job still runs).
    up.interrupt();
    up.restart();
    for (service, seed) in Service::ALL.iter().zip(&seeds) {
        let again = std::fs::read_to_string(users.join(service.seed_file_name())).unwrap();
        assert_eq!(&again, seed, "{service}'s seed changed");
    }
    let output = up.kiln(&["run", "-f", "--", "sh", "-c", "echo after restart"]);
    assert_eq!(text(&output.stdout), "after restart\n", "{}", text(&output.stderr));

    // Control: the same probe against a nats-server without authorization publishes.
    let open = NatsServer::start();
    let script = nats_probe_script("127.0.0.1", port(&open.url), "kiln.control.any-job", "stop");
    let output = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        NatsProbe::from_output(&text(&output.stdout)),
        Some(NatsProbe::Published)
    );
}
