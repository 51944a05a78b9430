//! What EC2's error codes mean to kiln: a [`CloudError`] for the call, or an [`Unavailable`]
//! reason for one offering (docs/provisioner.md, section 8).

use std::time::Duration;

use crate::{CapacityType, CloudError, Unavailable};

/// The codes that say an offering (or, for quotas, a bucket of them) cannot be had now.
pub(crate) fn is_capacity(code: &str) -> bool {
    matches!(
        code,
        "InsufficientInstanceCapacity"
            | "InsufficientCapacity"
            | "UnfulfillableCapacity"
            | "Unsupported"
            | "SpotMaxPriceTooLow"
            | "VcpuLimitExceeded"
            | "MaxSpotInstanceCountExceeded"
            | "InstanceLimitExceeded"
            | "InsufficientFreeAddressesInSubnet"
    )
}

/// The reason a capacity code gives for an offering of `instance_type` in `subnet`.
pub(crate) fn unavailable(
    code: &str,
    instance_type: &str,
    capacity: CapacityType,
    subnet: Option<&str>,
) -> Option<Unavailable> {
    let bucket = quota_bucket(instance_type);
    Some(match code {
        "InsufficientInstanceCapacity" | "InsufficientCapacity" | "UnfulfillableCapacity" => Unavailable::NoCapacity,
        "Unsupported" => Unavailable::NotOffered,
        "SpotMaxPriceTooLow" => Unavailable::SpotPriceTooHigh,
        "VcpuLimitExceeded" => Unavailable::Quota {
            name: format!("{capacity} vCPU ({bucket} family)"),
        },
        "MaxSpotInstanceCountExceeded" => Unavailable::Quota {
            name: format!("spot vCPU ({bucket} family)"),
        },
        "InstanceLimitExceeded" => Unavailable::Quota {
            name: format!("{capacity} instance count"),
        },
        "InsufficientFreeAddressesInSubnet" => Unavailable::SubnetFull {
            subnet: subnet.unwrap_or_default().to_owned(),
        },
        _ => return None,
    })
}

/// The vCPU quota bucket an instance type counts against, as AWS's Service Quotas name them:
/// `standard` (A, C, D, H, I, M, R, T, Z), `G and VT`, `P`, `X`, `F`, `Inf`, `DL`, `Trn`,
/// `high memory` (U), `HPC`. A quota error marks every offering of the bucket and capacity type.
pub fn quota_bucket(instance_type: &str) -> &'static str {
    let family = instance_type
        .split('.')
        .next()
        .unwrap_or(instance_type)
        .to_ascii_lowercase();
    let letters: String = family.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
    match letters.as_str() {
        "g" | "vt" => "G and VT",
        "p" => "P",
        "x" => "X",
        "f" => "F",
        "inf" => "Inf",
        "dl" => "DL",
        "trn" => "Trn",
        "u" => "high memory",
        "hpc" => "HPC",
        _ => "standard",
    }
}

/// The error of a call AWS answered with `status` and error `code`.
pub(crate) fn cloud_error(status: u16, code: &str, message: &str, retry_after: Option<Duration>) -> CloudError {
    let text = format!("{code}: {message}");
    match code {
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled" => {
            CloudError::Throttled { retry_after }
        }
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "OptInRequired"
        | "Blocked"
        | "ExpiredToken"
        | "RequestExpired"
        | "PendingVerification" => CloudError::Unauthorized(text),
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => CloudError::Unavailable(text),
        "MissingParameter"
        | "IdempotentParameterMismatch"
        | "InvalidSubnetID.NotFound"
        | "InvalidInstanceType"
        | "InvalidAMIID.NotFound"
        | "InvalidAction" => CloudError::Invalid(text),
        _ if code.starts_with("InvalidParameter") || code.starts_with("InvalidLaunchTemplate") => {
            CloudError::Invalid(text)
        }
        _ if code.ends_with(".NotFound") => CloudError::NotFound(text),
        _ => status_error(status, &text, retry_after),
    }
}

/// The error of an answer with `status` and no error code kiln knows (or no body at all).
pub(crate) fn status_error(status: u16, text: &str, retry_after: Option<Duration>) -> CloudError {
    match status {
        429 | 503 => CloudError::Throttled { retry_after },
        401 | 403 => CloudError::Unauthorized(format!("http {status}: {text}")),
        500..=599 => CloudError::Unavailable(format!("http {status}: {text}")),
        _ => CloudError::Invalid(format!("http {status}: {text}")),
    }
}

/// The instance ids an `InvalidInstanceID.NotFound`/`.Malformed` message names:
/// "The instance ID 'i-1' does not exist", "The instance IDs 'i-1, i-2' do not exist".
pub(crate) fn ids_in_message(message: &str) -> Vec<String> {
    let Some((_, rest)) = message.split_once('\'') else {
        return Vec::new();
    };
    let Some((quoted, _)) = rest.split_once('\'') else {
        return Vec::new();
    };
    quoted
        .split(',')
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_codes_become_reasons() {
        let spot = CapacityType::Spot;
        let od = CapacityType::OnDemand;
        assert_eq!(
            unavailable("InsufficientInstanceCapacity", "c5.large", spot, None),
            Some(Unavailable::NoCapacity)
        );
        assert_eq!(
            unavailable("UnfulfillableCapacity", "c5.large", spot, None),
            Some(Unavailable::NoCapacity)
        );
        assert_eq!(
            unavailable("Unsupported", "c5.large", od, None),
            Some(Unavailable::NotOffered)
        );
        assert_eq!(
            unavailable("SpotMaxPriceTooLow", "c5.large", spot, None),
            Some(Unavailable::SpotPriceTooHigh)
        );
        assert_eq!(
            unavailable("VcpuLimitExceeded", "m6i.large", od, None),
            Some(Unavailable::Quota {
                name: "on-demand vCPU (standard family)".into()
            })
        );
        assert_eq!(
            unavailable("MaxSpotInstanceCountExceeded", "g5.xlarge", spot, None),
            Some(Unavailable::Quota {
                name: "spot vCPU (G and VT family)".into()
            })
        );
        assert_eq!(
            unavailable("InsufficientFreeAddressesInSubnet", "c5.large", od, Some("subnet-1")),
            Some(Unavailable::SubnetFull {
                subnet: "subnet-1".into()
            })
        );
        assert_eq!(unavailable("InvalidParameterValue", "c5.large", od, None), None);
    }

    #[test]
    fn buckets_follow_the_family_letters() {
        for (instance_type, bucket) in [
            ("c6i.large", "standard"),
            ("t3.micro", "standard"),
            ("g4dn.xlarge", "G and VT"),
            ("vt1.3xlarge", "G and VT"),
            ("p3.2xlarge", "P"),
            ("inf2.xlarge", "Inf"),
            ("trn1.2xlarge", "Trn"),
            ("x2idn.16xlarge", "X"),
            ("u-6tb1.metal", "high memory"),
        ] {
            assert_eq!(quota_bucket(instance_type), bucket, "{instance_type}");
        }
    }

    #[test]
    fn codes_and_statuses_become_errors() {
        assert!(matches!(
            cloud_error(503, "RequestLimitExceeded", "", None),
            CloudError::Throttled { .. }
        ));
        assert!(matches!(
            cloud_error(401, "AuthFailure", "", None),
            CloudError::Unauthorized(_)
        ));
        assert!(matches!(
            cloud_error(403, "UnauthorizedOperation", "", None),
            CloudError::Unauthorized(_)
        ));
        assert!(matches!(
            cloud_error(400, "InvalidParameterValue", "", None),
            CloudError::Invalid(_)
        ));
        assert!(matches!(
            cloud_error(400, "InvalidLaunchTemplateName.NotFoundException", "", None),
            CloudError::Invalid(_)
        ));
        assert!(matches!(
            cloud_error(400, "InvalidSubnetID.NotFound", "", None),
            CloudError::Invalid(_)
        ));
        assert!(matches!(
            cloud_error(400, "InvalidInstanceID.NotFound", "", None),
            CloudError::NotFound(_)
        ));
        assert!(matches!(
            cloud_error(500, "InternalError", "", None),
            CloudError::Unavailable(_)
        ));
        assert!(matches!(
            cloud_error(502, "Whatever", "", None),
            CloudError::Unavailable(_)
        ));
        assert!(matches!(status_error(429, "", None), CloudError::Throttled { .. }));
        assert!(matches!(status_error(503, "", None), CloudError::Throttled { .. }));
        assert!(matches!(status_error(403, "", None), CloudError::Unauthorized(_)));
    }

    #[test]
    fn reads_ids_from_not_found_messages() {
        assert_eq!(ids_in_message("The instance ID 'i-1' does not exist"), vec!["i-1"]);
        assert_eq!(
            ids_in_message("The instance IDs 'i-1, i-2' do not exist"),
            vec!["i-1", "i-2"]
        );
        assert!(ids_in_message("no quotes here").is_empty());
    }
}
