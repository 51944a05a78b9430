//! [`Aemm`]: one `amazon-ec2-metadata-mock` (AEMM 1.13.0, `KILN_TEST_AEMM`) per simulated
//! instance, serving IMDSv2 only on its own loopback port, killed on drop.
//!
//! It starts with no notice (both trigger times far ahead: AEMM's rebalance delay defaults to
//! 0). A test triggers a rebalance recommendation or an interruption notice at a moment of its
//! choosing with [`Aemm::trigger`], which restarts it on the same port with that trigger time
//! set to now (editing its config file does not reach the spot handler; docs/provisioner.md
//! section 12). Tokens live in its memory: a restart refuses the tokens of before (401).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary of the tests (`KILN_TEST_AEMM`, written by `scripts/cloud-servers.sh`).
pub fn aemm_binary() -> String {
    std::env::var("KILN_TEST_AEMM").expect(
        "KILN_TEST_AEMM is not set: run the tests through scripts/test.sh (scripts/cloud-servers.sh points it at ~/.kiln/tools/bin/ec2-metadata-mock, installed by scripts/setup.sh)",
    )
}

/// What the mocked instance is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AemmInstance {
    pub instance_id: String,
    pub instance_type: String,
    pub zone: String,
    pub region: String,
    /// `spot` or `on-demand`.
    pub life_cycle: String,
}

impl AemmInstance {
    /// A spot `c5.large` in `us-east-1b` with a fresh id.
    pub fn spot() -> AemmInstance {
        AemmInstance {
            instance_id: format!("i-{:017x}", rand::random::<u64>() >> 4),
            instance_type: "c5.large".into(),
            zone: "us-east-1b".into(),
            region: "us-east-1".into(),
            life_cycle: "spot".into(),
        }
    }
}

/// Which notice a restart makes appear at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AemmNotice {
    /// `events/recommendations/rebalance`.
    Rebalance,
    /// `spot/instance-action` (`terminate`, two minutes ahead).
    Interruption,
}

/// One running AEMM.
pub struct Aemm {
    /// `http://127.0.0.1:<port>`: what `[imds] endpoint` takes.
    pub endpoint: String,
    pub instance: AemmInstance,
    /// The instance role's access key id, secret and session token it serves (AEMM's own fixed
    /// ones when `None`).
    role: Option<(String, String, String)>,
    port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

/// The trigger time of a notice not wanted.
const NEVER: &str = "2099-01-01T00:00:00Z";

impl Aemm {
    /// Starts an AEMM for `instance` on a free port, with no notice; waits until it answers.
    pub fn start(instance: AemmInstance) -> Aemm {
        Aemm::start_with_role(instance, None)
    }

    /// As [`Aemm::start`], its instance role's credentials (`iam/security-credentials/`) the
    /// access key id, secret and session token of `role` (a role moto's user assumed, so that
    /// moto takes their signatures), valid for a day.
    pub fn start_with_role(instance: AemmInstance, role: Option<(String, String, String)>) -> Aemm {
        let dir = tempfile::tempdir().expect("temp dir");
        for _ in 0..5 {
            let port = super::free_port();
            if let Some(child) = spawn(dir.path(), port, &instance, role.as_ref(), NEVER, NEVER) {
                return Aemm {
                    endpoint: format!("http://127.0.0.1:{port}"),
                    instance,
                    role,
                    port,
                    child,
                    dir,
                };
            }
        }
        panic!(
            "ec2-metadata-mock did not start five times (ports taken?): run {} by hand",
            aemm_binary()
        );
    }

    /// Restarts it on the same port with `notice` triggered now (and what was triggered before
    /// still triggered: `notices` lists all of them).
    pub fn trigger(&mut self, notices: &[AemmNotice]) {
        self.stop();
        let now = utc_now();
        let when = |notice| if notices.contains(&notice) { now.as_str() } else { NEVER };
        let (interruption, rebalance) = (when(AemmNotice::Interruption), when(AemmNotice::Rebalance));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // The port is free again at once, unless another test took it meanwhile.
            let role = self.role.as_ref();
            if let Some(child) = spawn(
                self.dir.path(),
                self.port,
                &self.instance,
                role,
                interruption,
                rebalance,
            ) {
                self.child = child;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ec2-metadata-mock did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Restarts it on the same port with no notice (as a metadata service that came back).
    pub fn restart(&mut self) {
        self.trigger(&[]);
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Aemm {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts AEMM's `spot` command on `port`; `None` when it exited (its port was taken).
fn spawn(
    dir: &std::path::Path,
    port: u16,
    instance: &AemmInstance,
    role: Option<&(String, String, String)>,
    interruption: &str,
    rebalance: &str,
) -> Option<Child> {
    let mut config = serde_json::json!({
        "imdsv2": true,
        "server": {"hostname": "127.0.0.1", "port": port.to_string()},
        "mock-trigger-time": interruption,
        "rebalance-trigger-time": rebalance,
        "metadata": {"values": {
            "instance-id": instance.instance_id,
            "instance-type": instance.instance_type,
            "placement-availability-zone": instance.zone,
            "placement-region": instance.region,
            "instance-life-cycle": instance.life_cycle,
        }},
        "dynamic": {"values": {"instance-identity-document": {
            "instanceId": instance.instance_id,
            "instanceType": instance.instance_type,
            "availabilityZone": instance.zone,
            "region": instance.region,
        }}},
    });
    if let Some((key_id, secret, token)) = role {
        let now_secs = crate::ids::now_ms().div_euclid(1000);
        config["metadata"]["values"]["iam-security-credentials"] = serde_json::json!({
            "Code": "Success",
            "LastUpdated": utc_at(now_secs),
            "Type": "AWS-HMAC",
            "AccessKeyId": key_id,
            "SecretAccessKey": secret,
            "Token": token,
            "Expiration": utc_at(now_secs + 86_400),
        });
    }
    let path = dir.join("aemm.json");
    std::fs::write(&path, config.to_string()).expect("write the AEMM config");
    let log = std::fs::File::create(dir.join(format!("aemm-{port}.log"))).expect("AEMM log");
    let mut child = Command::new(aemm_binary())
        .arg("spot")
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("AEMM log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", aemm_binary()));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if child.try_wait().ok().flatten().is_some() {
            return None;
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            // One that could not bind exits at once; one that did keeps running.
            std::thread::sleep(Duration::from_millis(100));
            if child.try_wait().ok().flatten().is_some() {
                return None;
            }
            return Some(child);
        }
        assert!(
            Instant::now() < deadline,
            "ec2-metadata-mock did not answer on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    utc_at(crate::ids::now_ms().div_euclid(1000))
}

/// `secs` after the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_at(secs: i64) -> String {
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // The civil date of a day number (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_reads_as_the_date_command_writes_it() {
        let ours = super::utc_now();
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
            .output()
            .expect("date");
        let theirs = String::from_utf8_lossy(&date.stdout).trim().to_string();
        // The same minute (a second may tick between the two).
        assert_eq!(ours[..16], theirs[..16], "{ours} vs {theirs}");
    }
}
