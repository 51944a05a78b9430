//! A service's scaling bounds and targets, and how its latest revision is tried, checked and
//! filled in from what `ServeService` is given.

use kiln_core::serving::{DEFAULT_COLD_WAIT_MS, DEFAULT_SCALE_DOWN_DELAY_MS, DEFAULT_TARGET_IN_FLIGHT, Scaling};
use kiln_proto::v1 as pb;

use super::MAX_REPLICAS;
use crate::record::Rollout;
use crate::{Error, Result};

/// The longest a request may wait for a worker of a service scaled to zero.
pub const MAX_COLD_WAIT_MS: u64 = 600_000;

/// A definition's or scale request's scaling, defaults filled in: `replicas` fixed when it
/// gives no `scaling`.
pub fn check_scaling(replicas: u32, scaling: Option<&pb::Scaling>) -> Result<Scaling> {
    let Some(scaling) = scaling else {
        return match replicas {
            0 => Ok(Scaling::fixed(1)),
            1..=MAX_REPLICAS => Ok(Scaling::fixed(replicas)),
            _ => Err(Error::InvalidArgument(format!(
                "replicas is {replicas}; give 1 to {MAX_REPLICAS} workers per member"
            ))),
        };
    };
    let min = scaling.min_replicas;
    let max = if scaling.max_replicas == 0 {
        min
    } else {
        scaling.max_replicas
    };
    let mut problems = Vec::new();
    if max > MAX_REPLICAS {
        problems.push(format!(
            "max-replicas is {max}; give at most {MAX_REPLICAS} workers per member"
        ));
    }
    if max == 0 {
        problems.push(
            "max-replicas is 0; give at least 1 (min-replicas 0 with max-replicas 1 or more scales to zero)".into(),
        );
    }
    if min > max {
        problems.push(format!("min-replicas ({min}) is above max-replicas ({max})"));
    }
    if !(scaling.target_in_flight.is_finite() && scaling.target_in_flight >= 0.0) {
        problems.push(format!(
            "target-in-flight is {}; give a positive number of requests per worker",
            scaling.target_in_flight
        ));
    }
    if scaling.cold_wait_ms > MAX_COLD_WAIT_MS {
        problems.push(format!(
            "cold-wait-ms is {}; give at most {MAX_COLD_WAIT_MS} (10 minutes)",
            scaling.cold_wait_ms
        ));
    }
    if !problems.is_empty() {
        return Err(Error::InvalidArgument(format!("scaling: {}", problems.join("; "))));
    }
    Ok(Scaling {
        min_replicas: min,
        max_replicas: max,
        target_in_flight: if scaling.target_in_flight == 0.0 {
            DEFAULT_TARGET_IN_FLIGHT
        } else {
            scaling.target_in_flight
        },
        target_latency_ms: scaling.target_latency_ms,
        scale_down_delay_ms: if scaling.scale_down_delay_ms == 0 {
            DEFAULT_SCALE_DOWN_DELAY_MS
        } else {
            scaling.scale_down_delay_ms
        },
        cold_wait_ms: match (scaling.cold_wait_ms, min) {
            (0, 0) => DEFAULT_COLD_WAIT_MS,
            (wait, _) => wait,
        },
    })
}

pub fn rollout_of(traffic: u32, shadow: bool) -> Result<Rollout> {
    match traffic {
        0 => Ok(Rollout { traffic: 100, shadow }),
        1..=100 => Ok(Rollout { traffic, shadow }),
        _ => Err(Error::InvalidArgument(format!(
            "traffic is {traffic}; give the percent of requests the new revision answers, 1 to 100"
        ))),
    }
}

pub fn scaling_to_proto(scaling: &Scaling) -> pb::Scaling {
    pb::Scaling {
        min_replicas: scaling.min_replicas,
        max_replicas: scaling.max_replicas,
        target_in_flight: scaling.target_in_flight,
        target_latency_ms: scaling.target_latency_ms,
        scale_down_delay_ms: scaling.scale_down_delay_ms,
        cold_wait_ms: scaling.cold_wait_ms,
    }
}
