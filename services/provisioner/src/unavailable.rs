//! Offerings the provisioner will not try for a while (docs/provisioner.md section 8), as
//! Karpenter's unavailable-offerings cache: a capacity error marks its (capacity type, type,
//! zone) for [`kiln_cloud::UNAVAILABLE_TTL`]; a quota error marks every offering of the pool
//! with that capacity type and quota bucket, so the next cycle does not call again for them.
//! Kept in memory on the leader and mirrored into the pool's status, from which a new leader
//! starts.

use std::collections::HashMap;

use kiln_cloud::{Offering, OfferingFailure, OfferingKey, Unavailable};
use kiln_core::provisioning::UnavailableOffering;

#[derive(Debug, Clone, Default)]
pub struct UnavailableOfferings {
    entries: HashMap<OfferingKey, (Unavailable, i64)>,
}

impl UnavailableOfferings {
    /// Marks what a create call's answer says failed, until `now_ms + ttl_ms`. A quota is not
    /// per zone: every offering in `offerings` of the failed one's capacity type and quota
    /// bucket (its family's bucket on EC2: the type's first letters) is marked with it.
    pub fn mark(&mut self, failures: &[OfferingFailure], offerings: &[Offering], now_ms: i64, ttl_ms: i64) {
        for failure in failures {
            let until = now_ms + ttl_ms;
            if let Unavailable::Quota { .. } = failure.reason {
                let bucket = quota_bucket(&failure.key.instance_type);
                for offering in offerings {
                    if offering.key.capacity == failure.key.capacity
                        && quota_bucket(&offering.key.instance_type) == bucket
                    {
                        self.entries
                            .insert(offering.key.clone(), (failure.reason.clone(), until));
                    }
                }
            }
            self.entries
                .insert(failure.key.clone(), (failure.reason.clone(), until));
        }
    }

    /// Marks one offering (a spot notice on it).
    pub fn mark_one(&mut self, key: OfferingKey, reason: Unavailable, until_ms: i64) {
        self.entries.insert(key, (reason, until_ms));
    }

    /// Forgets what expired.
    pub fn expire(&mut self, now_ms: i64) {
        self.entries.retain(|_, (_, until)| *until > now_ms);
    }

    pub fn is_unavailable(&self, key: &OfferingKey, now_ms: i64) -> bool {
        self.entries.get(key).is_some_and(|(_, until)| *until > now_ms)
    }

    /// The pool's offerings that may be tried now.
    pub fn available(&self, offerings: &[Offering], now_ms: i64) -> Vec<Offering> {
        offerings
            .iter()
            .filter(|offering| !self.is_unavailable(&offering.key, now_ms))
            .cloned()
            .collect()
    }

    /// What is marked among `offerings`, as the pool's status shows it, soonest back first.
    pub fn listed(&self, offerings: &[Offering], now_ms: i64) -> Vec<UnavailableOffering> {
        let mut listed: Vec<UnavailableOffering> = offerings
            .iter()
            .filter_map(|offering| {
                let (reason, until) = self.entries.get(&offering.key)?;
                (*until > now_ms).then(|| UnavailableOffering {
                    offering: offering.key.to_string(),
                    reason: reason.to_string(),
                    until_ms: *until,
                })
            })
            .collect();
        listed.sort_by(|a, b| a.until_ms.cmp(&b.until_ms).then(a.offering.cmp(&b.offering)));
        listed
    }

    /// Short reasons for a held-back job: one line per reason, with the offerings it covers
    /// and how long is left ("no capacity: spot c5.large in z-a, z-b (2 min)").
    pub fn summary(&self, offerings: &[Offering], now_ms: i64) -> Vec<String> {
        let mut by_reason: Vec<(String, Vec<String>, i64)> = Vec::new();
        for entry in self.listed(offerings, now_ms) {
            match by_reason.iter_mut().find(|(reason, _, _)| *reason == entry.reason) {
                Some((_, names, until)) => {
                    names.push(entry.offering);
                    *until = (*until).max(entry.until_ms);
                }
                None => by_reason.push((entry.reason, vec![entry.offering], entry.until_ms)),
            }
        }
        by_reason
            .into_iter()
            .map(|(reason, names, until)| {
                let minutes = ((until - now_ms) as f64 / 60_000.0).ceil().max(1.0);
                let shown = if names.len() > 4 {
                    format!("{} and {} more", names[..4].join(", "), names.len() - 4)
                } else {
                    names.join(", ")
                };
                format!("{reason}: {shown} for {minutes} min")
            })
            .collect()
    }

    /// Restores entries a previous leader listed in the pool's status.
    pub fn restore(
        &mut self,
        offerings: &[Offering],
        listed: &[UnavailableOffering],
        reasons: &[(String, Unavailable)],
    ) {
        for entry in listed {
            let Some(offering) = offerings.iter().find(|o| o.key.to_string() == entry.offering) else {
                continue;
            };
            let reason = reasons
                .iter()
                .find(|(text, _)| *text == entry.reason)
                .map(|(_, reason)| reason.clone())
                .unwrap_or(Unavailable::NoCapacity);
            self.entries.insert(offering.key.clone(), (reason, entry.until_ms));
        }
    }
}

/// EC2's vCPU quotas are per family bucket: standard (A, C, D, H, I, M, R, T, Z), G and VT,
/// P, X, F, Inf, DL, trn. The leading letters of the type's family name it well enough.
fn quota_bucket(instance_type: &str) -> String {
    let family = instance_type.split('.').next().unwrap_or(instance_type);
    let letters: String = family.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
    match letters.as_str() {
        "inf" | "dl" | "trn" | "vt" => letters,
        _ => match letters.chars().next() {
            Some('a' | 'c' | 'd' | 'h' | 'i' | 'm' | 'r' | 't' | 'z') => "standard".into(),
            Some(letter) => letter.to_string(),
            None => String::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use kiln_cloud::{CapacityType, PriceSource, Shape};

    use super::*;

    fn offering(instance_type: &str, zone: &str, capacity: CapacityType) -> Offering {
        Offering {
            key: OfferingKey {
                instance_type: instance_type.into(),
                zone: zone.into(),
                capacity,
            },
            shape: Shape::default(),
            price_per_hour: 1.0,
            price_source: PriceSource::Configured,
            subnet: None,
        }
    }

    #[test]
    fn capacity_errors_mark_one_offering_and_quotas_their_bucket() {
        let offerings = vec![
            offering("c5.large", "a", CapacityType::Spot),
            offering("c5.large", "b", CapacityType::Spot),
            offering("m5.large", "a", CapacityType::OnDemand),
            offering("c5.large", "a", CapacityType::OnDemand),
            offering("g5.xlarge", "a", CapacityType::OnDemand),
        ];
        let mut cache = UnavailableOfferings::default();
        cache.mark(
            &[OfferingFailure {
                key: offerings[0].key.clone(),
                reason: Unavailable::NoCapacity,
                message: "InsufficientInstanceCapacity".into(),
            }],
            &offerings,
            0,
            180_000,
        );
        let left: Vec<String> = cache
            .available(&offerings, 1)
            .iter()
            .map(|o| o.key.to_string())
            .collect();
        assert_eq!(left.len(), 4, "only spot c5.large in a: {left:?}");
        cache.mark(
            &[OfferingFailure {
                key: offerings[2].key.clone(),
                reason: Unavailable::Quota {
                    name: "on-demand vCPU (standard family)".into(),
                },
                message: "VcpuLimitExceeded".into(),
            }],
            &offerings,
            0,
            180_000,
        );
        let left: Vec<String> = cache
            .available(&offerings, 1)
            .iter()
            .map(|o| o.key.to_string())
            .collect();
        assert_eq!(left, ["spot c5.large in b", "on-demand g5.xlarge in a"]);
        assert_eq!(
            cache.summary(&offerings, 60_000),
            [
                "on-demand vCPU (standard family) quota reached: on-demand c5.large in a, on-demand m5.large in a for 2 min",
                "no capacity: spot c5.large in a for 2 min"
            ]
        );
        // After the TTL the cheap offering is tried again.
        assert_eq!(cache.available(&offerings, 180_000).len(), 5);
        cache.expire(180_000);
        assert!(cache.listed(&offerings, 0).is_empty());
    }

    #[test]
    fn quota_buckets_follow_ec2s_families() {
        assert_eq!(quota_bucket("c6i.large"), "standard");
        assert_eq!(quota_bucket("t3.micro"), "standard");
        assert_eq!(quota_bucket("g5.xlarge"), "g");
        assert_eq!(quota_bucket("p4d.24xlarge"), "p");
        assert_eq!(quota_bucket("inf2.xlarge"), "inf");
    }
}
