//! Where a gang's nodes meet: the address of its rank-0 runner (`advertise-host` in its
//! capacity report) and a port of the gang range on it that no other active gang whose rank 0
//! is on that host uses, derived from the job's id and attempt (a retried attempt gets another).

use std::collections::{BTreeMap, BTreeSet};

use kiln_core::JobState;
use kiln_core::capacity;
use kiln_core::store::{JobRecord, Store};
use kiln_core::streams::Nats;

use crate::error::Result;

/// The ports gangs' rank 0 listen on for their rendezvous (`MASTER_PORT`).
pub const GANG_PORTS: std::ops::Range<u16> = 29400..29900;

/// The rendezvous of the gangs placed in one pass, so two of them never share a port.
#[derive(Default)]
pub struct Rendezvous {
    /// Runner id → its advertised address; read at the first gang of the pass.
    addresses: Option<BTreeMap<String, String>>,
    /// `host:port` of active gangs and of those placed in this pass.
    taken: Option<BTreeSet<String>>,
}

impl Rendezvous {
    /// `host:port` for the gang `job` whose rank 0 goes to `runner`.
    pub async fn master(&mut self, store: &Store, nats: &Nats, job: &JobRecord, runner: &str) -> Result<String> {
        if self.addresses.is_none() {
            let reports = capacity::runners(nats).await?;
            self.addresses = Some(reports.into_iter().map(|r| (r.runner_id, r.address)).collect());
        }
        if self.taken.is_none() {
            let active = store.jobs_in_states(&JobState::ACTIVE).await?;
            self.taken = Some(
                active
                    .into_iter()
                    .filter(|job| !job.gang_master.is_empty())
                    .map(|job| job.gang_master)
                    .collect(),
            );
        }
        let host = self
            .addresses
            .as_ref()
            .and_then(|addresses| addresses.get(runner))
            .filter(|address| !address.is_empty())
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".into());
        let taken = self.taken.as_mut().expect("read above");
        let span = u64::from(GANG_PORTS.end - GANG_PORTS.start);
        let start = first_port(&job.id, job.attempt) % span;
        let master = (0..span)
            .map(|offset| {
                let port = GANG_PORTS.start + u16::try_from((start + offset) % span).unwrap_or(0);
                format!("{host}:{port}")
            })
            .find(|candidate| !taken.contains(candidate))
            .unwrap_or_else(|| format!("{host}:{}", GANG_PORTS.start));
        taken.insert(master.clone());
        Ok(master)
    }
}

/// Where a gang's search for a free port starts: FNV-1a of its id and attempt.
fn first_port(job_id: &str, attempt: i32) -> u64 {
    format!("{job_id}/{attempt}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_of_a_gang_start_their_search_at_different_ports() {
        let span = u64::from(GANG_PORTS.end - GANG_PORTS.start);
        let first = first_port("job", 1) % span;
        let second = first_port("job", 2) % span;
        assert_ne!(first, second);
    }
}
