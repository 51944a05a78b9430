//! The autoscaler: how many workers each member of a service has, between its scaling bounds
//! ([`Scaling`]), from what its workers' relays report ([`LoadReport`]) and from requests that
//! found no worker ([`subjects::serve_demand`]).
//!
//! - Up at once: `ceil(in flight / target-in-flight)` workers, summed over the member's fresh
//!   reports; at least one while requests are answered or waiting; one more than are in
//!   rotation while their mean time per request is above `target-latency-ms` (only once every
//!   wanted worker is in rotation, so a worker still loading is not counted twice).
//! - Down only after the load has wanted fewer for `scale-down-delay-ms` (no flapping); a
//!   member with `min-replicas` 0 goes to zero after that long without a request.
//!
//! Every predictor listens; only the controller (the lease holder) asks. A new holder starts
//! from the workers that are live, so a hand-over neither adds nor cuts any.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kiln_core::serving::{LoadReport, Scaling};
use kiln_core::subjects;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Shared;

/// A report older than this no longer counts (its relay is gone, or drained).
pub const REPORT_STALE: Duration = Duration::from_secs(3);

/// (service key ([`kiln_core::serving::service_key`]), revision, member).
type Key = (String, u64, String);

/// A member's load, summed over its fresh reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemberLoad {
    pub in_flight: f64,
    pub answered: u64,
    /// The answered requests' mean time, in milliseconds.
    pub mean_ms: f64,
    /// Workers whose relay is in rotation.
    pub in_rotation: u32,
}

/// The workers the load asks for now, within the bounds (before the scale-down delay).
pub fn decide(load: &MemberLoad, demanded: bool, scaling: &Scaling) -> u32 {
    let (min, max) = (scaling.min_replicas, scaling.max_replicas.max(scaling.min_replicas));
    if min == max {
        return min;
    }
    let per_worker = if scaling.target_in_flight > 0.0 {
        scaling.target_in_flight
    } else {
        kiln_core::serving::DEFAULT_TARGET_IN_FLIGHT
    };
    let mut wanted = (load.in_flight / per_worker).ceil().min(f64::from(max)) as u32;
    if load.answered > 0 || load.in_flight > 0.0 || demanded {
        wanted = wanted.max(1);
    }
    if scaling.target_latency_ms > 0 && load.answered > 0 && load.mean_ms > scaling.target_latency_ms as f64 {
        wanted = wanted.max(load.in_rotation + 1);
    }
    wanted.clamp(min, max)
}

#[derive(Debug)]
struct Target {
    replicas: u32,
    /// Since when the load has wanted fewer workers.
    low_since: Option<Instant>,
}

#[derive(Default)]
struct State {
    reports: HashMap<Key, HashMap<String, (Instant, LoadReport)>>,
    demand: HashMap<String, Instant>,
    targets: HashMap<Key, Target>,
}

/// What the controller scales on.
#[derive(Default)]
pub struct Autoscaler {
    state: Mutex<State>,
}

impl Autoscaler {
    pub fn report(&self, report: LoadReport) {
        let key = (report.service_key(), report.revision, report.member.clone());
        let mut state = self.state.lock().expect("autoscaler lock");
        state
            .reports
            .entry(key)
            .or_default()
            .insert(report.job_id.clone(), (Instant::now(), report));
    }

    /// A request for `service` found no worker.
    pub fn demand(&self, service: &str) {
        self.state
            .lock()
            .expect("autoscaler lock")
            .demand
            .insert(service.to_string(), Instant::now());
    }

    /// A member's load over its fresh reports (stale ones are forgotten). Only relays in
    /// rotation count: one out of it is draining (its worker stopped or preempted: what it
    /// still answers must not bring a worker back) or has its worker ejected or loading.
    pub fn load(&self, service: &str, revision: u64, member: &str) -> MemberLoad {
        let mut state = self.state.lock().expect("autoscaler lock");
        let key = (service.to_string(), revision, member.to_string());
        let Some(reports) = state.reports.get_mut(&key) else {
            return MemberLoad::default();
        };
        reports.retain(|_, (at, _)| at.elapsed() < REPORT_STALE);
        let mut load = MemberLoad::default();
        let mut answered_ms = 0.0;
        for (_, report) in reports.values().filter(|(_, report)| report.in_rotation) {
            load.in_flight += report.in_flight;
            load.answered += report.answered;
            answered_ms += report.mean_ms * report.answered as f64;
            load.in_rotation += 1;
        }
        if load.answered > 0 {
            load.mean_ms = answered_ms / load.answered as f64;
        }
        load
    }

    /// The workers `member` of `revision` of `service` should have now: its load's wish
    /// ([`decide`]), at least `floor`, cut only once the wish has stayed lower for the
    /// scale-down delay. `live` is where a member the autoscaler has not seen yet starts.
    pub fn wanted(&self, service: &str, revision: u64, member: &str, scaling: &Scaling, live: u32, floor: u32) -> u32 {
        let load = self.load(service, revision, member);
        let delay = Duration::from_millis(scaling.scale_down_delay_ms);
        let mut state = self.state.lock().expect("autoscaler lock");
        let demanded = state.demand.get(service).is_some_and(|at| at.elapsed() < delay);
        let max = scaling.max_replicas.max(scaling.min_replicas).max(floor);
        let wish = decide(&load, demanded, scaling).max(floor).min(max);
        let key = (service.to_string(), revision, member.to_string());
        let target = state.targets.entry(key).or_insert_with(|| Target {
            replicas: live.clamp(scaling.min_replicas.max(floor), max),
            low_since: None,
        });
        target.replicas = target.replicas.clamp(scaling.min_replicas.max(floor), max);
        if wish >= target.replicas {
            target.replicas = wish;
            target.low_since = None;
        } else {
            let since = *target.low_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= delay {
                tracing::info!(
                    service,
                    member,
                    revision,
                    from = target.replicas,
                    to = wish,
                    "scaling a member down"
                );
                target.replicas = wish;
                target.low_since = None;
            }
        }
        target.replicas
    }

    /// Forgets the members of services not in `keep` (stopped, or revisions gone).
    pub fn retain(&self, keep: &[(String, u64)]) {
        let mut state = self.state.lock().expect("autoscaler lock");
        let kept = |key: &Key| {
            keep.iter()
                .any(|(service, revision)| *service == key.0 && *revision == key.1)
        };
        state.targets.retain(|key, _| kept(key));
        state.reports.retain(|key, _| kept(key));
    }
}

/// Feeds every load report and demand into the autoscaler until `shutdown`; a demand wakes
/// the controller at once.
pub async fn listen(shared: Arc<Shared>, shutdown: CancellationToken) {
    let client = &shared.nats.client;
    let (mut loads, mut demands) = loop {
        match tokio::try_join!(
            client.subscribe(subjects::SERVE_LOAD_ALL),
            client.subscribe(subjects::SERVE_DEMAND_ALL)
        ) {
            Ok(subscriptions) => break subscriptions,
            Err(error) => tracing::warn!(error = %error, "cannot subscribe to the workers' load; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(message) = loads.next() => match serde_json::from_slice::<LoadReport>(&message.payload) {
                Ok(report) => {
                    if let Some(directory) = &shared.directory {
                        directory.report(&report);
                    }
                    shared.autoscaler.report(report);
                }
                Err(error) => tracing::debug!(error = %error, "a load report does not parse"),
            },
            Some(message) = demands.next() => {
                // `kiln.serving.demand.<project>.<service>`.
                let mut tokens = message.subject.as_str().rsplit('.');
                let (service, project) = (tokens.next().unwrap_or_default(), tokens.next().unwrap_or_default());
                shared.autoscaler.demand(&kiln_core::serving::service_key(project, service));
                shared.wake.notify_one();
            }
            else => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scaling(min: u32, max: u32) -> Scaling {
        Scaling {
            min_replicas: min,
            max_replicas: max,
            target_in_flight: 2.0,
            target_latency_ms: 0,
            scale_down_delay_ms: 60_000,
            cold_wait_ms: 0,
        }
    }

    fn load(in_flight: f64, answered: u64) -> MemberLoad {
        MemberLoad {
            in_flight,
            answered,
            mean_ms: 5.0,
            in_rotation: 1,
        }
    }

    #[test]
    fn fixed_replicas_ignore_the_load() {
        assert_eq!(decide(&load(40.0, 100), true, &scaling(3, 3)), 3);
        assert_eq!(decide(&MemberLoad::default(), false, &scaling(2, 2)), 2);
    }

    #[test]
    fn in_flight_requests_set_the_workers_within_the_bounds() {
        let bounds = scaling(1, 8);
        assert_eq!(decide(&load(0.0, 0), false, &bounds), 1);
        assert_eq!(decide(&load(2.0, 10), false, &bounds), 1);
        assert_eq!(decide(&load(2.1, 10), false, &bounds), 2);
        assert_eq!(decide(&load(7.0, 10), false, &bounds), 4);
        assert_eq!(decide(&load(1000.0, 10), false, &bounds), 8);
    }

    #[test]
    fn a_member_scales_to_zero_only_without_requests_or_demand() {
        let bounds = scaling(0, 4);
        assert_eq!(decide(&MemberLoad::default(), false, &bounds), 0);
        assert_eq!(decide(&MemberLoad::default(), true, &bounds), 1);
        assert_eq!(decide(&load(0.0, 1), false, &bounds), 1);
        assert_eq!(decide(&load(0.1, 0), false, &bounds), 1);
    }

    #[test]
    fn slow_answers_add_one_worker_beyond_those_in_rotation() {
        let mut bounds = scaling(1, 4);
        bounds.target_latency_ms = 4;
        let slow = MemberLoad {
            in_flight: 1.0,
            answered: 50,
            mean_ms: 9.0,
            in_rotation: 2,
        };
        assert_eq!(decide(&slow, false, &bounds), 3);
        bounds.target_latency_ms = 10;
        assert_eq!(decide(&slow, false, &bounds), 1);
    }

    fn report(job: &str, in_flight: f64) -> LoadReport {
        LoadReport {
            job_id: job.into(),
            project: "p".into(),
            service: "s".into(),
            revision: 1,
            member: "m".into(),
            in_flight,
            answered: 10,
            mean_ms: 2.0,
            in_rotation: true,
            direct_url: String::new(),
            direct_token: String::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn up_at_once_down_after_the_delay() {
        let autoscaler = Autoscaler::default();
        let mut bounds = scaling(0, 6);
        bounds.scale_down_delay_ms = 10_000;
        // Each worker's latest report counts once.
        autoscaler.report(report("a", 3.0));
        autoscaler.report(report("a", 4.0));
        autoscaler.report(report("b", 4.0));
        assert_eq!(autoscaler.load("p.s", 1, "m").in_flight, 8.0);
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 2, 0), 4);
        // The load drops: kept through the delay, cut after it.
        tokio::time::advance(Duration::from_secs(2)).await;
        autoscaler.report(report("a", 1.0));
        autoscaler.report(report("b", 0.5));
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 4, 0), 4);
        tokio::time::advance(Duration::from_millis(9_000)).await;
        autoscaler.report(report("a", 1.0));
        autoscaler.report(report("b", 0.5));
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 4, 0), 4);
        tokio::time::advance(Duration::from_millis(1_100)).await;
        autoscaler.report(report("a", 1.0));
        autoscaler.report(report("b", 0.5));
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 4, 0), 1);
        // Reports stop (no request for a while): down to zero after another delay.
        tokio::time::advance(REPORT_STALE).await;
        assert_eq!(autoscaler.load("p.s", 1, "m"), MemberLoad::default());
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 1, 0), 1);
        tokio::time::advance(Duration::from_millis(10_000)).await;
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 1, 0), 0);
        // A request that finds no worker brings one back at once, and a floor holds.
        autoscaler.demand("p.s");
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 0, 0), 1);
        assert_eq!(autoscaler.wanted("p.s", 2, "m", &bounds, 0, 2), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_draining_relay_does_not_bring_its_worker_back() {
        let autoscaler = Autoscaler::default();
        let mut bounds = scaling(0, 2);
        bounds.scale_down_delay_ms = 1_000;
        // No load: the one live worker is cut after the delay.
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 1, 0), 1);
        tokio::time::advance(Duration::from_millis(1_100)).await;
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 1, 0), 0);
        // The cut worker's relay answers what it held while it drains, out of rotation.
        let mut draining = report("a", 1.0);
        draining.in_rotation = false;
        autoscaler.report(draining);
        assert_eq!(autoscaler.load("p.s", 1, "m"), MemberLoad::default());
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 1, 0), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_controller_starts_from_the_live_workers() {
        let autoscaler = Autoscaler::default();
        let bounds = scaling(1, 6);
        // No reports yet (just took over): the three live workers are kept, not cut to one.
        assert_eq!(autoscaler.wanted("p.s", 1, "m", &bounds, 3, 0), 3);
        // Live beyond the bounds is brought within them.
        let other = Autoscaler::default();
        assert_eq!(other.wanted("p.s", 1, "m", &bounds, 9, 0), 6);
    }
}
