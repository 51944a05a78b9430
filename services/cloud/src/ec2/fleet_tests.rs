use std::collections::BTreeMap;

use super::*;
use crate::ec2::xml;
use crate::{IntentId, PriceSource, RootVolume, Shape, TemplateRef, Unavailable};

fn offering(instance_type: &str, zone: &str, subnet: &str, capacity: CapacityType) -> Offering {
    Offering {
        key: OfferingKey {
            instance_type: instance_type.into(),
            zone: zone.into(),
            capacity,
        },
        shape: Shape::default(),
        price_per_hour: 0.1,
        price_source: PriceSource::Configured,
        subnet: Some(subnet.into()),
    }
}

fn intent(candidates: Vec<Offering>) -> LaunchIntent {
    LaunchIntent {
        id: IntentId::parse("0192a5c4-7d3e-7a51-9c1b-2f64e8a9d0b3").expect("a uuid"),
        cluster: "c1".into(),
        pool: "cpu".into(),
        capacity: CapacityType::Spot,
        count: 2,
        min_count: 0,
        single_zone: false,
        placement_group: None,
        candidates,
        template: TemplateRef {
            name: "kiln-cpu".into(),
            version: None,
        },
        labels: BTreeMap::from([("team".to_owned(), "vision".to_owned())]),
        root_volume: None,
    }
}

fn eu_candidates() -> Vec<Offering> {
    vec![
        offering("c5.large", "eu-west-1a", "subnet-aaaa", CapacityType::Spot),
        offering("m5.large", "eu-west-1b", "subnet-bbbb", CapacityType::Spot),
        offering("g5.xlarge", "eu-west-1b", "subnet-bbbb", CapacityType::Spot),
    ]
}

#[test]
fn params_name_every_override_tag_and_option() {
    let params = params(&intent(eu_candidates())).expect("valid");
    let get = |key: &str| params.get(key).unwrap_or_else(|| panic!("{key} is set"));
    assert_eq!(get("Type"), "instant");
    assert_eq!(get("ClientToken"), "0192a5c4-7d3e-7a51-9c1b-2f64e8a9d0b3");
    assert_eq!(
        get("LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateName"),
        "kiln-cpu"
    );
    assert_eq!(
        get("LaunchTemplateConfigs.1.LaunchTemplateSpecification.Version"),
        "$Default"
    );
    assert_eq!(get("LaunchTemplateConfigs.1.Overrides.2.InstanceType"), "m5.large");
    assert_eq!(get("LaunchTemplateConfigs.1.Overrides.2.SubnetId"), "subnet-bbbb");
    assert_eq!(
        get("LaunchTemplateConfigs.1.Overrides.2.AvailabilityZone"),
        "eu-west-1b"
    );
    assert_eq!(get("LaunchTemplateConfigs.1.Overrides.3.Priority"), "2");
    assert_eq!(get("TargetCapacitySpecification.TotalTargetCapacity"), "2");
    assert_eq!(get("TargetCapacitySpecification.DefaultTargetCapacityType"), "spot");
    assert_eq!(get("SpotOptions.AllocationStrategy"), "price-capacity-optimized");
    assert_eq!(params.get("SpotOptions.MinTargetCapacity"), None);
    for (index, resource) in ["instance", "volume", "fleet"].into_iter().enumerate() {
        let prefix = format!("TagSpecification.{}", index + 1);
        assert_eq!(get(&format!("{prefix}.ResourceType")), resource);
        // BTreeMap order: kiln-cluster, kiln-intent, kiln-pool, team.
        assert_eq!(get(&format!("{prefix}.Tag.1.Key")), "kiln-cluster");
        assert_eq!(
            get(&format!("{prefix}.Tag.2.Value")),
            "0192a5c4-7d3e-7a51-9c1b-2f64e8a9d0b3"
        );
        assert_eq!(get(&format!("{prefix}.Tag.4.Key")), "team");
    }
    assert_eq!(
        params,
        super::params(&intent(eu_candidates())).expect("valid"),
        "deterministic"
    );
}

#[test]
fn a_root_volume_sizes_the_templates_root_device_on_every_override() {
    let plain = params(&intent(eu_candidates())).expect("valid");
    assert!(
        !plain.encode().contains("BlockDeviceMapping"),
        "no disk asked: the template's volume as it is"
    );
    let mut sized = intent(eu_candidates());
    sized.root_volume = Some(RootVolume {
        device: "/dev/xvda".into(),
        size_gib: 212,
    });
    let params = params(&sized).expect("valid");
    for index in 1..=sized.candidates.len() {
        let device = format!("LaunchTemplateConfigs.1.Overrides.{index}.BlockDeviceMapping.1");
        assert_eq!(params.get(&format!("{device}.DeviceName")), Some("/dev/xvda"));
        assert_eq!(params.get(&format!("{device}.Ebs.VolumeSize")), Some("212"));
        assert_eq!(params.get(&format!("{device}.Ebs.DeleteOnTermination")), Some("true"));
        // Type, encryption and key stay the template's (AWS keeps what an override leaves out).
        assert_eq!(params.get(&format!("{device}.Ebs.VolumeType")), None);
        assert_eq!(params.get(&format!("{device}.Ebs.Encrypted")), None);
    }
}

#[test]
fn gangs_ask_for_one_zone_and_a_minimum() {
    let mut gang = intent(eu_candidates());
    gang.capacity = CapacityType::OnDemand;
    for candidate in &mut gang.candidates {
        candidate.key.capacity = CapacityType::OnDemand;
    }
    gang.single_zone = true;
    gang.min_count = 2;
    gang.placement_group = Some("kiln-runner-gpu".into());
    gang.template = TemplateRef {
        name: "lt-0abc".into(),
        version: Some("3".into()),
    };
    let params = params(&gang).expect("valid");
    assert_eq!(params.get("OnDemandOptions.AllocationStrategy"), Some("lowest-price"));
    assert_eq!(params.get("OnDemandOptions.SingleAvailabilityZone"), Some("true"));
    assert_eq!(params.get("OnDemandOptions.MinTargetCapacity"), Some("2"));
    assert_eq!(
        params.get("LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateId"),
        Some("lt-0abc")
    );
    assert_eq!(
        params.get("LaunchTemplateConfigs.1.LaunchTemplateSpecification.Version"),
        Some("3")
    );
    assert!(minimum_sent(&gang));
    for index in 1..=gang.candidates.len() {
        assert_eq!(
            params.get(&format!(
                "LaunchTemplateConfigs.1.Overrides.{index}.Placement.GroupName"
            )),
            Some("kiln-runner-gpu"),
            "override {index}"
        );
    }

    // Across zones and types AWS takes no minimum: the client holds it (see Ec2Cloud::create).
    let mut spread = intent(eu_candidates());
    spread.min_count = 2;
    let params = super::params(&spread).expect("valid");
    assert_eq!(params.get("SpotOptions.MinTargetCapacity"), None);
    assert_eq!(
        params.get("LaunchTemplateConfigs.1.Overrides.1.Placement.GroupName"),
        None
    );
    assert!(!minimum_sent(&spread));

    // A cluster placement group is one zone: an intent across zones naming one is refused.
    spread.placement_group = Some("kiln-runner-gpu".into());
    let refused = super::params(&spread).expect_err("a placement group across zones");
    assert!(refused.to_string().contains("one zone"), "{refused}");
}

#[test]
fn refuses_intents_it_cannot_send() {
    assert!(matches!(params(&intent(Vec::new())), Err(CloudError::Invalid(_))));
    let mut mixed = eu_candidates();
    mixed[1].key.capacity = CapacityType::OnDemand;
    assert!(matches!(params(&intent(mixed)), Err(CloudError::Invalid(_))));
}

#[test]
fn reads_an_aws_answer_into_instances_and_failures() {
    let answer: CreateFleetResponse =
        xml::parse("CreateFleet", include_str!("fixtures/aws_create_fleet.xml")).expect("parses");
    let launched = launched(&intent(eu_candidates()), answer).expect("an answer");
    let ids: Vec<&str> = launched.instances.iter().map(|i| i.id.0.as_str()).collect();
    assert_eq!(ids, ["i-0a1b2c3d4e5f60001", "i-0a1b2c3d4e5f60002"]);
    assert_eq!(launched.instances[0].key, eu_candidates()[1].key);
    assert_eq!(launched.instances[0].state, InstanceState::Pending);
    assert_eq!(launched.instances[0].pool.as_deref(), Some("cpu"));
    assert_eq!(launched.failures.len(), 2);
    assert_eq!(launched.failures[0].key, eu_candidates()[0].key);
    assert_eq!(launched.failures[0].reason, Unavailable::NoCapacity);
    assert!(
        launched.failures[0]
            .message
            .starts_with("InsufficientInstanceCapacity: ")
    );
    assert_eq!(launched.failures[1].key, eu_candidates()[2].key);
    assert_eq!(
        launched.failures[1].reason,
        Unavailable::Quota {
            name: "spot vCPU (G and VT family)".into()
        }
    );
}

#[test]
fn reads_the_fault_proxys_answer() {
    let answer: CreateFleetResponse =
        xml::parse("CreateFleet", include_str!("fixtures/proxy_create_fleet_ice.xml")).expect("parses");
    let candidates = vec![
        offering("c5.large", "us-east-1a", "subnet-46327d1d95c60fe7b", CapacityType::Spot),
        offering("m5.large", "us-east-1a", "subnet-46327d1d95c60fe7b", CapacityType::Spot),
    ];
    let launched = launched(&intent(candidates.clone()), answer).expect("an answer");
    assert_eq!(launched.instances.len(), 2);
    assert!(launched.instances.iter().all(|i| i.key == candidates[1].key));
    assert_eq!(launched.failures.len(), 1);
    assert_eq!(launched.failures[0].key, candidates[0].key);
    assert_eq!(launched.failures[0].reason, Unavailable::NoCapacity);
}

#[test]
fn a_config_error_in_the_error_set_is_the_calls_error() {
    let body = r#"<CreateFleetResponse><fleetId>fleet-1</fleetId><errorSet><item>
        <errorCode>InvalidLaunchTemplateName.NotFoundException</errorCode>
        <errorMessage>The specified launch template, with template name kiln-cpu, does not exist.</errorMessage>
        </item></errorSet><fleetInstanceSet/></CreateFleetResponse>"#;
    let answer: CreateFleetResponse = xml::parse("CreateFleet", body).expect("parses");
    assert!(matches!(
        launched(&intent(eu_candidates()), answer),
        Err(CloudError::Invalid(_))
    ));
}

#[test]
fn a_whole_call_capacity_error_fails_every_candidate() {
    let launched = all_failed(&intent(eu_candidates()), "VcpuLimitExceeded", "limit of 32");
    assert!(launched.instances.is_empty());
    let names: Vec<String> = launched.failures.iter().map(|f| f.reason.to_string()).collect();
    assert_eq!(
        names,
        [
            "spot vCPU (standard family) quota reached",
            "spot vCPU (standard family) quota reached",
            "spot vCPU (G and VT family) quota reached"
        ]
    );
}
