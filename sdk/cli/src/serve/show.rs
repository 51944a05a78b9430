//! How `kiln serve ls` and `kiln serve status` show a service: its table cells, the status
//! page and its JSON.

use anyhow::Result;
use kiln_proto::v1 as pb;
use serde_json::json;
use tabled::settings::Style;

use crate::format::{out, state_name};

pub(super) fn revision_text(service: &pb::Service) -> String {
    if service.latest_revision > service.revision {
        format!("{} → {}", service.revision, service.latest_revision)
    } else {
        service.revision.to_string()
    }
}

pub(super) fn models_text(service: &pb::Service) -> String {
    service
        .members
        .iter()
        .filter(|member| member.revision == service.revision)
        .map(|member| member.model_version.clone())
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn workers_running(service: &pb::Service) -> String {
    let (running, wanted) = service
        .members
        .iter()
        .filter(|member| member.revision == service.revision)
        .fold((0, 0), |(running, wanted), member| {
            let up = member
                .workers
                .iter()
                .filter(|worker| worker.state == pb::JobState::Running as i32)
                .count();
            (running + up, wanted + member.wanted as usize)
        });
    format!("{running}/{wanted}")
}

pub(super) fn print_status(service: &pb::Service) -> Result<()> {
    out!("service   {} ({})", service.name, service.state);
    out!("project   {}", service.project);
    out!("url       {}/v2/models/{}/infer", service.url, service.name);
    out!("revision  {}", revision_text(service));
    if let Some(definition) = &service.definition {
        out!(
            "ensemble  {}, deadline {} ms, quorum {}",
            definition.ensemble,
            definition.deadline_ms,
            definition.quorum
        );
    }
    if let Some(scaling) = &service.scaling {
        if scaling.max_replicas > scaling.min_replicas {
            out!(
                "workers   {} to {} per member, autoscaled ({} in flight per worker{}, down after {} ms{})",
                scaling.min_replicas,
                scaling.max_replicas,
                scaling.target_in_flight,
                if scaling.target_latency_ms > 0 {
                    format!(", {} ms a request", scaling.target_latency_ms)
                } else {
                    String::new()
                },
                scaling.scale_down_delay_ms,
                if scaling.cold_wait_ms > 0 {
                    format!(", a request waits up to {} ms for a worker", scaling.cold_wait_ms)
                } else {
                    String::new()
                }
            );
        } else {
            out!("workers   {} per member", scaling.min_replicas);
        }
    }
    if service.latest_revision > service.revision {
        if service.shadow {
            out!("trying    revision {} in shadow", service.latest_revision);
        } else if service.traffic < 100 {
            out!(
                "trying    revision {} with {}% of requests",
                service.latest_revision,
                service.traffic
            );
        }
    }
    if !service.reason.is_empty() {
        out!("reason    {}", service.reason);
    }
    if !service.paused_reason.is_empty() {
        out!("paused    its workers stopped; create it again to serve it (its owner may no longer run jobs)");
    }
    out!("requests  {}", traffic_text(service.recent.as_ref()));
    let mut table = tabled::builder::Builder::default();
    table.push_record(["REVISION", "MEMBER", "MODEL", "WEIGHT", "WORKER", "STATE"]);
    for member in &service.members {
        if member.workers.is_empty() {
            table.push_record([
                member.revision.to_string(),
                member.member.clone(),
                member.model_version.clone(),
                member.weight.to_string(),
                String::new(),
                "(none yet)".into(),
            ]);
        }
        for worker in &member.workers {
            table.push_record([
                member.revision.to_string(),
                member.member.clone(),
                member.model_version.clone(),
                member.weight.to_string(),
                worker.job_id.clone(),
                state_name(worker.state),
            ]);
        }
    }
    out!("{}", table.build().with(Style::blank()));
    Ok(())
}

/// The last five minutes of requests: rate, latency percentiles, partial and failed shares.
fn traffic_text(recent: Option<&pb::ServiceTraffic>) -> String {
    let Some(recent) = recent.filter(|recent| recent.requests > 0 && recent.window_seconds > 0.0) else {
        return "none in the last 5 minutes".into();
    };
    let share = |n: u64| n as f64 / recent.requests as f64 * 100.0;
    format!(
        "{:.2}/s over the last {:.0} s; p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms; {:.1}% partial, {:.1}% failed",
        recent.requests as f64 / recent.window_seconds,
        recent.window_seconds,
        recent.p50_ms,
        recent.p95_ms,
        recent.p99_ms,
        share(recent.partial),
        share(recent.failed + recent.invalid)
    )
}

pub(super) fn service_json(service: &pb::Service) -> serde_json::Value {
    json!({
        "name": service.name,
        "project": service.project,
        "owner": service.owner,
        "state": service.state,
        "reason": service.reason,
        "paused_reason": service.paused_reason,
        "url": service.url,
        "revision": service.revision,
        "latest_revision": service.latest_revision,
        "ensemble": service.definition.as_ref().map(|definition| definition.ensemble.clone()),
        "deadline_ms": service.definition.as_ref().map(|definition| definition.deadline_ms),
        "quorum": service.definition.as_ref().map(|definition| definition.quorum),
        "traffic": service.traffic,
        "shadow": service.shadow,
        "scaling": service.scaling.as_ref().map(|scaling| json!({
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "target_in_flight": scaling.target_in_flight,
            "target_latency_ms": scaling.target_latency_ms,
            "scale_down_delay_ms": scaling.scale_down_delay_ms,
            "cold_wait_ms": scaling.cold_wait_ms,
        })),
        "members": service.members.iter().map(|member| json!({
            "member": member.member,
            "model_version": member.model_version,
            "weight": member.weight,
            "revision": member.revision,
            "wanted": member.wanted,
            "workers": member.workers.iter().map(|worker| json!({
                "job_id": worker.job_id,
                "state": state_name(worker.state),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "recent": service.recent.as_ref().map(|recent| json!({
            "window_seconds": recent.window_seconds,
            "requests": recent.requests,
            "answered": recent.answered,
            "partial": recent.partial,
            "invalid": recent.invalid,
            "failed": recent.failed,
            "p50_ms": recent.p50_ms,
            "p95_ms": recent.p95_ms,
            "p99_ms": recent.p99_ms,
        })),
        "created_at_ms": service.created_at_ms,
        "updated_at_ms": service.updated_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_reads_as_rate_latency_and_shares() {
        let recent = pb::ServiceTraffic {
            window_seconds: 300.0,
            requests: 600,
            answered: 570,
            partial: 24,
            invalid: 3,
            failed: 3,
            p50_ms: 4.31,
            p95_ms: 38.0,
            p99_ms: 120.5,
        };
        assert_eq!(
            traffic_text(Some(&recent)),
            "2.00/s over the last 300 s; p50 4.3 ms, p95 38.0 ms, p99 120.5 ms; 4.0% partial, 1.0% failed"
        );
        assert_eq!(traffic_text(None), "none in the last 5 minutes");
        assert_eq!(
            traffic_text(Some(&pb::ServiceTraffic::default())),
            "none in the last 5 minutes"
        );
    }
}
