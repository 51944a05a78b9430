//! The relays' metrics (`kiln_runner_serve_*`), shared by every relay of a runner.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::Member;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct MemberLabels {
    project: String,
    service: String,
    member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    project: String,
    service: String,
    member: String,
    /// How the request came: `direct` or `nats`.
    channel: &'static str,
    outcome: &'static str,
}

/// The relays' metrics (`kiln_runner_serve_*`), shared by every relay of a runner.
#[derive(Clone, Debug, Default)]
pub struct RelayMetrics {
    requests: Family<OutcomeLabels, Counter>,
    pub(super) ejections: Family<MemberLabels, Counter>,
    pub(super) in_rotation: Family<MemberLabels, Gauge>,
}

impl RelayMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        use kiln_core::metrics::RegistryExt;
        registry.add(
            "serve_requests",
            "Inference requests the relays took, by service (project and name), member, channel (direct, nats) and outcome (answered, dropped: expired before the worker took it, late: the worker missed the deadline, failed)",
            self.requests.clone(),
        );
        registry.add(
            "serve_ejections",
            "Times a worker was taken out of rotation for missing deadlines in a row",
            self.ejections.clone(),
        );
        registry.add(
            "serve_in_rotation",
            "Workers in rotation (their relay in the member's queue group)",
            self.in_rotation.clone(),
        );
    }

    /// How often the worker of `member` of `service` of `project` was taken out of rotation.
    pub fn ejections(&self, project: &str, service: &str, member: &str) -> u64 {
        self.ejections
            .get_or_create(&MemberLabels {
                project: project.into(),
                service: service.into(),
                member: member.into(),
            })
            .get()
    }

    /// How many requests for `member` of `service` of `project` came by `channel` and ended in
    /// `outcome`.
    pub fn requests(
        &self,
        project: &str,
        service: &str,
        member: &str,
        channel: &'static str,
        outcome: &'static str,
    ) -> u64 {
        self.requests
            .get_or_create(&OutcomeLabels {
                project: project.into(),
                service: service.into(),
                member: member.into(),
                channel,
                outcome,
            })
            .get()
    }

    pub(super) fn count(&self, member: &Member, channel: &'static str, outcome: &'static str) {
        self.requests
            .get_or_create(&OutcomeLabels {
                project: member.project.clone(),
                service: member.service.clone(),
                member: member.member.clone(),
                channel,
                outcome,
            })
            .inc();
    }

    pub(super) fn labels(member: &Member) -> MemberLabels {
        MemberLabels {
            project: member.project.clone(),
            service: member.service.clone(),
            member: member.member.clone(),
        }
    }
}
