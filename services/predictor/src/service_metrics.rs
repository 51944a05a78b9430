//! The predictor's Prometheus metrics (`kiln_predictor_*`), per service (labelled with its
//! project and name: names are unique per project) and per member.
//!
//! A request counts once under its outcome (`answered`, `partial`, `invalid`, `deadline`,
//! `unavailable`, `failed`); each member's part of it once under the member's (`answered`,
//! `late`, `unavailable`, `refused`, `failed`); a shadow revision's copies under theirs
//! (`agreed`, `differed`, `missed`, `unmatched`). Ejections are the relays' (`kiln_runner_serve_*`):
//! a worker is taken out of rotation by its own relay.

use kiln_core::metrics::{HistogramFamily, Metrics, RegistryExt, seconds_histogram};
use kiln_core::serving::ServiceSpec;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    project: String,
    service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    project: String,
    service: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabels {
    project: String,
    service: String,
    member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberOutcomeLabels {
    project: String,
    service: String,
    member: String,
    outcome: &'static str,
}

/// The handles of the predictor's metrics.
#[derive(Clone, Debug)]
pub struct PredictorMetrics {
    requests: Family<OutcomeLabels, Counter>,
    request_seconds: HistogramFamily<ServiceLabels>,
    member_requests: Family<MemberOutcomeLabels, Counter>,
    member_seconds: HistogramFamily<MemberLabels>,
    shadow_requests: Family<OutcomeLabels, Counter>,
    shadow_seconds: HistogramFamily<ServiceLabels>,
    cold_starts: Family<ServiceLabels, Counter>,
}

impl Default for PredictorMetrics {
    fn default() -> Self {
        PredictorMetrics {
            requests: Family::default(),
            request_seconds: HistogramFamily::new_with_constructor(seconds_histogram as fn() -> Histogram),
            member_requests: Family::default(),
            member_seconds: HistogramFamily::new_with_constructor(seconds_histogram as fn() -> Histogram),
            shadow_requests: Family::default(),
            shadow_seconds: HistogramFamily::new_with_constructor(seconds_histogram as fn() -> Histogram),
            cold_starts: Family::default(),
        }
    }
}

impl PredictorMetrics {
    pub fn register(&self, metrics: &Metrics) {
        metrics.register("predictor", |registry| {
            kiln_core::metrics::register_build_info(registry);
            registry.add(
                "requests",
                "Inference requests, by service (project and name) and outcome (answered, partial, invalid, deadline, unavailable, failed)",
                self.requests.clone(),
            );
            registry.add_with_unit(
                "request_duration",
                "Time from a request's arrival to its answer, by service",
                Unit::Seconds,
                self.request_seconds.clone(),
            );
            registry.add(
                "member_requests",
                "Members' parts of requests, by service, member and outcome (answered, late, unavailable, refused, failed)",
                self.member_requests.clone(),
            );
            registry.add_with_unit(
                "member_duration",
                "Time from a request's fan-out to a member's answer, by service and member",
                Unit::Seconds,
                self.member_seconds.clone(),
            );
            registry.add(
                "shadow_requests",
                "Copies of requests sent to a service's revision in shadow, by service and outcome (agreed, differed: its answer and the returned one do not match, missed: it gave none, unmatched: the returned answer failed)",
                self.shadow_requests.clone(),
            );
            registry.add_with_unit(
                "shadow_duration",
                "Time from a request's arrival to its shadow revision's answer, by service",
                Unit::Seconds,
                self.shadow_seconds.clone(),
            );
            registry.add(
                "cold_starts",
                "Requests that found no worker and waited for one (a service scaled to zero, or starting), by service",
                self.cold_starts.clone(),
            );
        });
    }

    pub(crate) fn request(&self, spec: &ServiceSpec, outcome: &'static str, seconds: f64) {
        self.requests.get_or_create(&outcome_labels(spec, outcome)).inc();
        self.request_seconds
            .get_or_create(&service_labels(spec))
            .observe(seconds);
    }

    pub(crate) fn shadow(&self, spec: &ServiceSpec, outcome: &'static str, seconds: f64) {
        self.shadow_requests.get_or_create(&outcome_labels(spec, outcome)).inc();
        self.shadow_seconds
            .get_or_create(&service_labels(spec))
            .observe(seconds);
    }

    pub(crate) fn cold_start(&self, spec: &ServiceSpec) {
        self.cold_starts.get_or_create(&service_labels(spec)).inc();
    }

    pub(crate) fn member(&self, spec: &ServiceSpec, member: &str, outcome: &'static str, seconds: Option<f64>) {
        let labels = MemberLabels {
            project: spec.project.clone(),
            service: spec.name.clone(),
            member: member.into(),
        };
        self.member_requests
            .get_or_create(&MemberOutcomeLabels {
                project: labels.project.clone(),
                service: labels.service.clone(),
                member: labels.member.clone(),
                outcome,
            })
            .inc();
        if let Some(seconds) = seconds {
            self.member_seconds.get_or_create(&labels).observe(seconds);
        }
    }
}

fn service_labels(spec: &ServiceSpec) -> ServiceLabels {
    ServiceLabels {
        project: spec.project.clone(),
        service: spec.name.clone(),
    }
}

fn outcome_labels(spec: &ServiceSpec, outcome: &'static str) -> OutcomeLabels {
    OutcomeLabels {
        project: spec.project.clone(),
        service: spec.name.clone(),
        outcome,
    }
}
