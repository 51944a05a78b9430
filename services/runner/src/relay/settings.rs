//! What a relay is told: its settings (`[relay]` of the runner's configuration) and the member
//! its worker serves.

use std::net::SocketAddr;

use kiln_core::serving::{ENV_MEMBER, ENV_PORT, ENV_REVISION, ENV_SERVICE};
use serde::{Deserialize, Serialize};

/// How a relay treats its worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct RelaySettings {
    /// Requests the worker is given at once; the rest wait in the relay, where an expired one
    /// can still be dropped.
    pub concurrency: usize,
    /// Deadlines missed in a row that take the worker out of rotation.
    pub eject_after: u32,
    /// How often a worker out of rotation (or still loading) is probed, in milliseconds.
    pub probe_interval_ms: u64,
    /// How long a drain waits for in-flight requests, in milliseconds.
    pub drain_grace_ms: u64,
    /// How often the worker's load is reported to the controller, in milliseconds.
    pub report_interval_ms: u64,
    /// Where the direct channel listens (`IP:PORT`; port 0 picks one); empty: none, the
    /// predictors reach the relay through NATS only. Set it only where the predictors can reach
    /// this address (`kiln up` sets `127.0.0.1:0`; deploy/compose `0.0.0.0:0` with
    /// `direct-advertise-host`).
    pub direct_addr: String,
    /// The host the predictors reach the direct channel at; empty: its listening IP.
    pub direct_advertise_host: String,
}

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            concurrency: 2,
            eject_after: 3,
            probe_interval_ms: 200,
            drain_grace_ms: 10_000,
            report_interval_ms: 1_000,
            direct_addr: String::new(),
            direct_advertise_host: String::new(),
        }
    }
}

/// The member a relay's worker serves.
#[derive(Debug, Clone)]
pub struct Member {
    /// The service's project: its worker's job's (service names are unique per project).
    pub project: String,
    pub service: String,
    pub revision: u64,
    pub member: String,
    /// The worker's REST API (`127.0.0.1:KILN_SERVE_PORT`).
    pub worker: SocketAddr,
    /// The worker's job, named in its load reports.
    pub job_id: String,
}

impl Member {
    /// The member an inference worker's job environment names (a worker of a service of
    /// `project`, its job's project), with the port the runner gave it; `None` for other jobs.
    pub fn of_env(env: &std::collections::BTreeMap<String, String>, project: &str) -> Option<Member> {
        Some(Member {
            project: project.to_string(),
            service: env.get(ENV_SERVICE)?.clone(),
            revision: env.get(ENV_REVISION)?.parse().ok()?,
            member: env.get(ENV_MEMBER)?.clone(),
            worker: SocketAddr::from(([127, 0, 0, 1], env.get(ENV_PORT)?.parse().ok()?)),
            job_id: env.get("KILN_JOB_ID").cloned().unwrap_or_default(),
        })
    }
}
