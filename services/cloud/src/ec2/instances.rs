//! `get`, `list` and `terminate`: `DescribeInstances` by id or by kiln's tags (paginated), and
//! `TerminateInstances` in batches, unknown ids counting as terminated.

use std::net::IpAddr;
use std::time::UNIX_EPOCH;

use tracing::debug;

use super::client::{CallError, QueryClient, Resend};
use super::codes;
use super::params::Params;
use super::xml::{self, DescribeInstancesResponse, Instance};
use crate::timefmt;
use crate::{
    CapacityType, CloudError, CloudInstance, InstanceId, InstanceState, IntentId, OfferingKey, TAG_CLUSTER, TAG_INTENT,
    TAG_POOL, TagSelector,
};

/// The most ids one `TerminateInstances` takes.
const TERMINATE_BATCH: usize = 1000;
const NOT_FOUND: &str = "InvalidInstanceID.NotFound";
const MALFORMED: &str = "InvalidInstanceID.Malformed";

pub(crate) async fn get(client: &QueryClient, id: &InstanceId) -> Result<Option<CloudInstance>, CloudError> {
    let mut params = Params::new("DescribeInstances");
    params.set("InstanceId.1", &id.0);
    match client.call(&params, Resend::Safe).await {
        Ok(body) => {
            let answer: DescribeInstancesResponse = xml::parse("DescribeInstances", &body)?;
            Ok(instances(answer).find(|i| i.id == *id))
        }
        Err(error) if matches!(error.code(), Some(NOT_FOUND | MALFORMED)) => Ok(None),
        Err(error) => Err(error.into_cloud()),
    }
}

pub(crate) async fn list(
    client: &QueryClient,
    selector: &TagSelector,
    page_size: u32,
) -> Result<Vec<CloudInstance>, CloudError> {
    let mut found = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = Params::new("DescribeInstances");
        params.filter(&format!("tag:{TAG_CLUSTER}"), [selector.cluster.as_str()]);
        if let Some(pool) = &selector.pool {
            params.filter(&format!("tag:{TAG_POOL}"), [pool.as_str()]);
        }
        if let Some(intent) = &selector.intent {
            params.filter(&format!("tag:{TAG_INTENT}"), [intent.to_string()]);
        }
        if selector.live_only {
            params.filter("instance-state-name", ["pending", "running", "stopping", "stopped"]);
        }
        params.set("MaxResults", page_size.clamp(5, 1000).to_string());
        if let Some(token) = &token {
            params.set("NextToken", token);
        }
        let body = client.call(&params, Resend::Safe).await?;
        let answer: DescribeInstancesResponse = xml::parse("DescribeInstances", &body)?;
        token = xml::next_token(answer.next_token.clone());
        found.extend(instances(answer));
        if token.is_none() {
            break;
        }
    }
    if selector.live_only {
        found.retain(|i| i.state.is_live());
    }
    Ok(found)
}

pub(crate) async fn terminate(client: &QueryClient, ids: &[InstanceId]) -> Result<(), CloudError> {
    for batch in ids.chunks(TERMINATE_BATCH) {
        let mut left: Vec<String> = batch.iter().map(|id| id.0.clone()).collect();
        left.sort();
        left.dedup();
        while !left.is_empty() {
            let mut params = Params::new("TerminateInstances");
            params.list("InstanceId", left.iter().map(String::as_str));
            match client.call(&params, Resend::Safe).await {
                Ok(_) => break,
                Err(error @ CallError::Api { .. }) if matches!(error.code(), Some(NOT_FOUND | MALFORMED)) => {
                    let CallError::Api { message, .. } = &error else {
                        unreachable!("matched above")
                    };
                    let unknown = codes::ids_in_message(message);
                    debug!(
                        count = unknown.len(),
                        "terminate: unknown instance ids count as terminated"
                    );
                    let before = left.len();
                    left.retain(|id| !unknown.contains(id));
                    if left.len() == before {
                        // The message named none of them: one at a time, each unknown one skipped.
                        if left.len() == 1 {
                            break;
                        }
                        for id in std::mem::take(&mut left) {
                            Box::pin(terminate(client, &[InstanceId(id)])).await?;
                        }
                    }
                }
                Err(error) => return Err(error.into_cloud()),
            }
        }
    }
    Ok(())
}

fn instances(answer: DescribeInstancesResponse) -> impl Iterator<Item = CloudInstance> {
    answer
        .reservation_set
        .items
        .into_iter()
        .flat_map(|reservation| reservation.instances_set.items)
        .map(cloud_instance)
}

/// An instance as kiln sees it: its offering, state, and the intent and pool read from its tags.
pub(crate) fn cloud_instance(instance: Instance) -> CloudInstance {
    let tag = |key: &str| {
        instance
            .tag_set
            .items
            .iter()
            .find(|t| t.key == key)
            .map(|t| t.value.clone())
    };
    let capacity = match instance.instance_lifecycle.as_deref() {
        Some("spot") => CapacityType::Spot,
        _ => CapacityType::OnDemand,
    };
    CloudInstance {
        intent: tag(TAG_INTENT).and_then(|v| IntentId::parse(&v)),
        pool: tag(TAG_POOL),
        key: OfferingKey {
            instance_type: instance.instance_type,
            zone: instance.placement.availability_zone,
            capacity,
        },
        state: state(&instance.instance_state.name),
        launched_at: instance
            .launch_time
            .as_deref()
            .and_then(timefmt::parse_utc)
            .unwrap_or(UNIX_EPOCH),
        private_ip: instance
            .private_ip_address
            .as_deref()
            .and_then(|ip| ip.parse::<IpAddr>().ok()),
        id: InstanceId(instance.instance_id),
    }
}

/// EC2's six states onto kiln's four: `shutting-down` is on its way to `terminated` (and out of
/// a live listing), `stopped` is kept with `stopping` (it still holds its volumes).
fn state(name: &str) -> InstanceState {
    match name {
        "pending" => InstanceState::Pending,
        "running" => InstanceState::Running,
        "stopping" | "stopped" => InstanceState::Stopping,
        _ => InstanceState::Terminated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOTO_DESCRIBE: &str = include_str!("fixtures/moto_describe_instances.xml");
    const AWS_DESCRIBE: &str = include_str!("fixtures/aws_describe_instances.xml");

    #[test]
    fn reads_moto_instances_with_their_tags() {
        let answer: DescribeInstancesResponse = xml::parse("DescribeInstances", MOTO_DESCRIBE).expect("parses");
        let found: Vec<CloudInstance> = instances(answer).collect();
        assert_eq!(found.len(), 2);
        let first = &found[0];
        assert_eq!(first.id.0, "i-1c49858e403468ec8");
        assert_eq!(first.key.instance_type, "m5.large");
        assert_eq!(first.key.zone, "us-east-1a");
        assert_eq!(first.key.capacity, CapacityType::Spot);
        assert_eq!(first.state, InstanceState::Running);
        assert_eq!(first.private_ip, Some("172.31.0.4".parse().expect("an ip")));
        assert_eq!(first.intent, IntentId::parse("0192a5c4-7d3e-7a51-9c1b-2f64e8a9d0b3"));
        assert_eq!(first.pool.as_deref(), Some("cpu"));
        assert!(first.launched_at > UNIX_EPOCH);
    }

    #[test]
    fn reads_aws_instances_and_their_token() {
        let answer: DescribeInstancesResponse = xml::parse("DescribeInstances", AWS_DESCRIBE).expect("parses");
        assert_eq!(
            xml::next_token(answer.next_token.clone()).as_deref(),
            Some("eyJ2IjoiMiJ9")
        );
        let found: Vec<CloudInstance> = instances(answer).collect();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].key.capacity, CapacityType::OnDemand);
        assert_eq!(found[0].state, InstanceState::Pending);
        assert_eq!(found[1].state, InstanceState::Terminated);
        assert_eq!(found[1].private_ip, None);
        assert_eq!(
            found[0].intent, None,
            "a tag that is not an intent id is not read as one"
        );
    }

    #[test]
    fn maps_every_ec2_state() {
        assert_eq!(state("pending"), InstanceState::Pending);
        assert_eq!(state("running"), InstanceState::Running);
        assert_eq!(state("stopping"), InstanceState::Stopping);
        assert_eq!(state("stopped"), InstanceState::Stopping);
        assert_eq!(state("shutting-down"), InstanceState::Terminated);
        assert_eq!(state("terminated"), InstanceState::Terminated);
    }
}
