//! `create`: one `CreateFleet` of type `instant` per launch intent, and its answer read back into
//! instances and per-offering failures (docs/provisioner.md, section 2).

use std::time::SystemTime;

use super::codes;
use super::params::Params;
use super::xml::{CreateFleetResponse, Overrides};
use crate::{
    CapacityType, CloudError, CloudInstance, InstanceId, InstanceState, LaunchIntent, Launched, Offering,
    OfferingFailure, OfferingKey,
};

/// The most candidates one intent names (docs/provisioner.md, section 2).
pub(crate) const MAX_CANDIDATES: usize = 60;

/// The `CreateFleet` call for an intent: deterministic, so a replay by `ClientToken` carries the
/// same parameters (AWS answers `IdempotentParameterMismatch` otherwise).
pub(crate) fn params(intent: &LaunchIntent) -> Result<Params, CloudError> {
    if intent.candidates.is_empty() {
        return Err(CloudError::Invalid(format!(
            "intent {} names no candidate offering",
            intent.id
        )));
    }
    if intent.candidates.len() > MAX_CANDIDATES {
        return Err(CloudError::Invalid(format!(
            "intent {} names {} candidates, more than {MAX_CANDIDATES}",
            intent.id,
            intent.candidates.len()
        )));
    }
    if let Some(other) = intent.candidates.iter().find(|c| c.key.capacity != intent.capacity) {
        return Err(CloudError::Invalid(format!(
            "intent {} is {} but names the candidate {}",
            intent.id, intent.capacity, other.key
        )));
    }
    intent.check_placement()?;
    let mut params = Params::new("CreateFleet");
    params.set("Type", "instant").set("ClientToken", intent.id.to_string());
    let spec = "LaunchTemplateConfigs.1.LaunchTemplateSpecification";
    if intent.template.name.starts_with("lt-") {
        params.set(format!("{spec}.LaunchTemplateId"), &intent.template.name);
    } else {
        params.set(format!("{spec}.LaunchTemplateName"), &intent.template.name);
    }
    params.set(
        format!("{spec}.Version"),
        intent.template.version.clone().unwrap_or_else(|| "$Default".to_owned()),
    );
    for (index, candidate) in intent.candidates.iter().enumerate() {
        let prefix = format!("LaunchTemplateConfigs.1.Overrides.{}", index + 1);
        params.set(format!("{prefix}.InstanceType"), &candidate.key.instance_type);
        if let Some(subnet) = &candidate.subnet {
            params.set(format!("{prefix}.SubnetId"), subnet);
        }
        params.set(format!("{prefix}.AvailabilityZone"), &candidate.key.zone);
        params.set(format!("{prefix}.Priority"), index.to_string());
        if let Some(group) = &intent.placement_group {
            params.set(format!("{prefix}.Placement.GroupName"), group);
        }
        // The template's root device at this size: its other settings (gp3, encryption, key)
        // stay the template's; deleted with the instance whatever the template says.
        if let Some(volume) = &intent.root_volume {
            let device = format!("{prefix}.BlockDeviceMapping.1");
            params
                .set(format!("{device}.DeviceName"), &volume.device)
                .set(format!("{device}.Ebs.VolumeSize"), volume.size_gib.to_string())
                .set(format!("{device}.Ebs.DeleteOnTermination"), "true");
        }
    }
    params
        .set(
            "TargetCapacitySpecification.TotalTargetCapacity",
            intent.count.to_string(),
        )
        .set(
            "TargetCapacitySpecification.DefaultTargetCapacityType",
            intent.capacity.as_str(),
        );
    let (options, strategy) = match intent.capacity {
        CapacityType::Spot => ("SpotOptions", "price-capacity-optimized"),
        CapacityType::OnDemand => ("OnDemandOptions", "lowest-price"),
    };
    params.set(format!("{options}.AllocationStrategy"), strategy);
    // AWS takes MinTargetCapacity only with SingleAvailabilityZone or SingleInstanceType; with
    // neither, `create` enforces the minimum itself (see `enforce_minimum`).
    if intent.single_zone {
        params.set(format!("{options}.SingleAvailabilityZone"), "true");
    } else if intent.min_count > 0 && single_type(&intent.candidates) {
        params.set(format!("{options}.SingleInstanceType"), "true");
    }
    if intent.min_count > 0 && (intent.single_zone || single_type(&intent.candidates)) {
        params.set(format!("{options}.MinTargetCapacity"), intent.min_count.to_string());
    }
    let tags = intent.tags();
    for (index, resource) in ["instance", "volume", "fleet"].into_iter().enumerate() {
        let prefix = format!("TagSpecification.{}", index + 1);
        params.set(format!("{prefix}.ResourceType"), resource);
        for (tag_index, (key, value)) in tags.iter().enumerate() {
            params.set(format!("{prefix}.Tag.{}.Key", tag_index + 1), key);
            params.set(format!("{prefix}.Tag.{}.Value", tag_index + 1), value);
        }
    }
    Ok(params)
}

fn single_type(candidates: &[Offering]) -> bool {
    candidates
        .windows(2)
        .all(|pair| pair[0].key.instance_type == pair[1].key.instance_type)
}

/// Whether AWS itself holds the intent to `min_count` (all or nothing).
pub(crate) fn minimum_sent(intent: &LaunchIntent) -> bool {
    intent.min_count == 0 || intent.single_zone || single_type(&intent.candidates)
}

/// The instances and failures of a `CreateFleet` answer. An error with a code kiln does not read
/// as an offering's state, in an answer that launched nothing, is the call's error.
pub(crate) fn launched(intent: &LaunchIntent, answer: CreateFleetResponse) -> Result<Launched, CloudError> {
    let now = SystemTime::now();
    let mut launched = Launched::default();
    for group in answer.fleet_instance_set.items {
        let capacity = lifecycle(group.lifecycle.as_deref()).unwrap_or(intent.capacity);
        let overrides = group.launch_template_and_overrides.and_then(|t| t.overrides);
        let key = candidate_for(intent, overrides.as_ref())
            .map(|c| c.key.clone())
            .unwrap_or_else(|| OfferingKey {
                instance_type: overrides
                    .as_ref()
                    .and_then(|o| o.instance_type.clone())
                    .or(group.instance_type.clone())
                    .unwrap_or_default(),
                zone: overrides
                    .as_ref()
                    .and_then(|o| o.availability_zone.clone())
                    .or(group.availability_zone.clone())
                    .unwrap_or_default(),
                capacity,
            });
        for id in group.instance_ids.items {
            launched.instances.push(CloudInstance {
                id: InstanceId(id),
                intent: Some(intent.id),
                pool: Some(intent.pool.clone()),
                key: key.clone(),
                state: InstanceState::Pending,
                launched_at: now,
                private_ip: None,
            });
        }
    }
    let mut unknown = None;
    for error in answer.error_set.items {
        let overrides = error.launch_template_and_overrides.and_then(|t| t.overrides);
        let targets: Vec<&Offering> = match candidate_for(intent, overrides.as_ref()) {
            Some(candidate) => vec![candidate],
            None => intent.candidates.iter().collect(),
        };
        for candidate in targets {
            let reason = codes::unavailable(
                &error.error_code,
                &candidate.key.instance_type,
                intent.capacity,
                candidate.subnet.as_deref(),
            );
            match reason {
                Some(reason) => launched.failures.push(OfferingFailure {
                    key: candidate.key.clone(),
                    reason,
                    message: format!("{}: {}", error.error_code, error.error_message),
                }),
                None => unknown = Some((error.error_code.clone(), error.error_message.clone())),
            }
        }
    }
    if launched.instances.is_empty()
        && launched.failures.is_empty()
        && let Some((code, message)) = unknown
    {
        return Err(codes::cloud_error(400, &code, &message, None));
    }
    Ok(launched)
}

/// Every candidate failed for the same reason: a whole-call answer with a capacity code.
pub(crate) fn all_failed(intent: &LaunchIntent, code: &str, message: &str) -> Launched {
    let failures = intent
        .candidates
        .iter()
        .filter_map(|candidate| {
            codes::unavailable(
                code,
                &candidate.key.instance_type,
                intent.capacity,
                candidate.subnet.as_deref(),
            )
            .map(|reason| OfferingFailure {
                key: candidate.key.clone(),
                reason,
                message: format!("{code}: {message}"),
            })
        })
        .collect();
    Launched {
        instances: Vec::new(),
        failures,
    }
}

fn lifecycle(text: Option<&str>) -> Option<CapacityType> {
    match text? {
        "spot" => Some(CapacityType::Spot),
        "on-demand" => Some(CapacityType::OnDemand),
        _ => None,
    }
}

/// The candidate an answer's `overrides` names: by type and subnet, else type and zone.
fn candidate_for<'a>(intent: &'a LaunchIntent, overrides: Option<&Overrides>) -> Option<&'a Offering> {
    let overrides = overrides?;
    let instance_type = overrides.instance_type.as_deref()?;
    let same_type = |c: &&Offering| c.key.instance_type == instance_type;
    if let Some(subnet) = overrides.subnet_id.as_deref()
        && let Some(found) = intent
            .candidates
            .iter()
            .filter(same_type)
            .find(|c| c.subnet.as_deref() == Some(subnet))
    {
        return Some(found);
    }
    if let Some(zone) = overrides.availability_zone.as_deref() {
        return intent.candidates.iter().filter(same_type).find(|c| c.key.zone == zone);
    }
    None
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
mod tests;
