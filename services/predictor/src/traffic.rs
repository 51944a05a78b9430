//! Each service's recent requests as this predictor answered them: counts by outcome and
//! latency percentiles over the last [`WINDOW`], for `ServeService.GetService` (the web UI's
//! Services page). Prometheus has the same figures over any range (`kiln_predictor_requests`,
//! `kiln_predictor_request_duration`); this window is what a page shows without one.
//!
//! Every predictor keeps its own: behind a load balancer, each counts the requests it took.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kiln_proto::v1 as pb;

/// How far back the figures reach.
pub const WINDOW: Duration = Duration::from_secs(300);
/// Requests kept per service, at most: past it, the oldest go and the window is shorter
/// (`window_seconds` says how long). 50,000 requests are 1.2 MB.
const MAX_SAMPLES: usize = 50_000;

/// How a request ended, as `kiln_predictor_requests` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Answered,
    Partial,
    Invalid,
    Failed,
}

impl Outcome {
    /// The outcome of a `kiln_predictor_requests` label.
    pub fn of_label(label: &str) -> Outcome {
        match label {
            "answered" => Outcome::Answered,
            "partial" => Outcome::Partial,
            "invalid" => Outcome::Invalid,
            _ => Outcome::Failed,
        }
    }
}

/// The recent requests of every service.
#[derive(Debug, Default)]
pub struct Traffic {
    services: Mutex<HashMap<String, VecDeque<Sample>>>,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    outcome: Outcome,
    seconds: f32,
}

impl Traffic {
    /// Counts a request of `service` that ended at `at`, `seconds` after it arrived.
    pub fn record(&self, service: &str, outcome: Outcome, seconds: f64, at: Instant) {
        let mut services = self.services.lock().expect("traffic lock");
        let samples = services.entry(service.to_string()).or_default();
        if samples.len() == MAX_SAMPLES {
            samples.pop_front();
        }
        samples.push_back(Sample {
            at,
            outcome,
            seconds: seconds as f32,
        });
        expire(samples, at);
    }

    /// The figures of `service` at `now`: zeros when it had no request in the window.
    pub fn summary(&self, service: &str, now: Instant) -> pb::ServiceTraffic {
        let mut services = self.services.lock().expect("traffic lock");
        let Some(samples) = services.get_mut(service) else {
            return pb::ServiceTraffic::default();
        };
        expire(samples, now);
        let Some(oldest) = samples.front() else {
            services.remove(service);
            return pb::ServiceTraffic::default();
        };
        // At the cap the oldest kept sample may be younger than the window: say how far back.
        let window = if samples.len() < MAX_SAMPLES {
            WINDOW
        } else {
            now.saturating_duration_since(oldest.at)
        };
        let mut summary = pb::ServiceTraffic {
            window_seconds: window.as_secs_f64(),
            requests: samples.len() as u64,
            ..Default::default()
        };
        for sample in samples.iter() {
            match sample.outcome {
                Outcome::Answered => summary.answered += 1,
                Outcome::Partial => summary.partial += 1,
                Outcome::Invalid => summary.invalid += 1,
                Outcome::Failed => summary.failed += 1,
            }
        }
        let mut seconds: Vec<f32> = samples.iter().map(|sample| sample.seconds).collect();
        seconds.sort_by(f32::total_cmp);
        let quantile = |q: f64| {
            // The nearest rank: the smallest time at least q of the requests took at most.
            let rank = ((q * seconds.len() as f64).ceil() as usize).clamp(1, seconds.len());
            f64::from(seconds[rank - 1]) * 1000.0
        };
        summary.p50_ms = quantile(0.50);
        summary.p95_ms = quantile(0.95);
        summary.p99_ms = quantile(0.99);
        summary
    }

    /// Forgets a stopped service's requests.
    pub fn forget(&self, service: &str) {
        self.services.lock().expect("traffic lock").remove(service);
    }
}

/// Drops the samples older than [`WINDOW`] at `now`.
fn expire(samples: &mut VecDeque<Sample>, now: Instant) {
    while samples
        .front()
        .is_some_and(|sample| now.saturating_duration_since(sample.at) > WINDOW)
    {
        samples.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outcomes_and_reads_percentiles_by_nearest_rank() {
        let traffic = Traffic::default();
        let start = Instant::now();
        // 100 requests taking 1..=100 ms: the last two failed, the 50th invalid, every other
        // tenth partial.
        for i in 1..=100u32 {
            let outcome = match i {
                99 | 100 => Outcome::Failed,
                50 => Outcome::Invalid,
                i if i % 10 == 0 => Outcome::Partial,
                _ => Outcome::Answered,
            };
            traffic.record("scale", outcome, f64::from(i) / 1000.0, start);
        }
        let summary = traffic.summary("scale", start);
        assert_eq!(summary.requests, 100);
        assert_eq!(
            (summary.answered, summary.partial, summary.invalid, summary.failed),
            (89, 8, 1, 2)
        );
        assert!((summary.p50_ms - 50.0).abs() < 1e-3, "{summary:?}");
        assert!((summary.p95_ms - 95.0).abs() < 1e-3, "{summary:?}");
        assert!((summary.p99_ms - 99.0).abs() < 1e-3, "{summary:?}");
        assert_eq!(summary.window_seconds, WINDOW.as_secs_f64());
        assert_eq!(traffic.summary("other", start), pb::ServiceTraffic::default());
    }

    #[test]
    fn requests_older_than_the_window_are_forgotten() {
        let traffic = Traffic::default();
        let start = Instant::now();
        traffic.record("scale", Outcome::Answered, 0.5, start);
        traffic.record("scale", Outcome::Partial, 0.01, start + Duration::from_secs(200));
        let later = start + WINDOW + Duration::from_secs(1);
        let summary = traffic.summary("scale", later);
        assert_eq!((summary.requests, summary.partial), (1, 1));
        assert!((summary.p99_ms - 10.0).abs() < 1e-3, "{summary:?}");
        let summary = traffic.summary("scale", later + Duration::from_secs(200));
        assert_eq!(summary, pb::ServiceTraffic::default());
        traffic.record("scale", Outcome::Answered, 0.5, later);
        traffic.forget("scale");
        assert_eq!(traffic.summary("scale", later).requests, 0);
    }

    #[test]
    fn past_the_samples_kept_the_window_is_the_span_they_cover() {
        let traffic = Traffic::default();
        let start = Instant::now();
        for i in 0..MAX_SAMPLES as u64 + 10 {
            traffic.record("scale", Outcome::Answered, 0.001, start + Duration::from_millis(i));
        }
        let now = start + Duration::from_millis(MAX_SAMPLES as u64 + 10);
        let summary = traffic.summary("scale", now);
        assert_eq!(summary.requests, MAX_SAMPLES as u64);
        // The oldest kept is the 11th, at 10 ms: it covers 50,000 ms.
        assert!((summary.window_seconds - 50.0).abs() < 1e-6, "{summary:?}");
    }
}
