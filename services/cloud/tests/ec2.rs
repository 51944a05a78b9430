//! The EC2 client against the real moto, through the real fault proxy (docs/provisioner.md,
//! section 12): every request signed and checked, faults injected per test.

mod support;

use std::time::Duration;

use kiln_cloud::ec2::Ec2Cloud;
use kiln_cloud::{CapacityType, Cloud, CloudError, InstanceId, InstanceState, PriceSource, Requirements, Unavailable};
use serde_json::json;
use support::{Fixture, cloud_env, fast_config, spot_prices};

const SPOT: CapacityType = CapacityType::Spot;
const ON_DEMAND: CapacityType = CapacityType::OnDemand;

#[tokio::test]
async fn create_launches_on_the_first_of_two_candidates() {
    let fx = Fixture::start("first").await;
    let mut intent = fx.intent(SPOT, 1, &[("c5.large", "us-east-1a"), ("m5.large", "us-east-1b")]);
    // Its job asked for disk: the template's root device at the size the planner chose.
    intent.root_volume = Some(kiln_cloud::RootVolume {
        device: "/dev/xvda".into(),
        size_gib: 300,
    });
    let launched = fx.cloud.create(&intent).await.expect("create");
    assert!(launched.failures.is_empty(), "{:?}", launched.failures);
    assert_eq!(launched.instances.len(), 1);
    let instance = &launched.instances[0];
    assert_eq!(instance.key, intent.candidates[0].key);
    assert_eq!(instance.intent, Some(intent.id));
    // moto keeps no fleet's block devices: what reached EC2 is read from the proxy.
    let sent = fx.proxy.fleet_params().await;
    for index in 1..=2 {
        let device = format!("LaunchTemplateConfigs.1.Overrides.{index}.BlockDeviceMapping.1");
        let param = |name: &str| sent[0].get(&format!("{device}.{name}")).and_then(|v| v.as_str());
        assert_eq!(param("DeviceName"), Some("/dev/xvda"), "{device}");
        assert_eq!(param("Ebs.VolumeSize"), Some("300"), "{device}");
        assert_eq!(param("Ebs.DeleteOnTermination"), Some("true"), "{device}");
    }

    let got = fx.cloud.get(&instance.id).await.expect("get").expect("moto knows it");
    assert_eq!(got.key, intent.candidates[0].key, "type, zone and spot read back");
    assert_eq!(got.intent, Some(intent.id), "the intent tag read back");
    assert_eq!(got.pool.as_deref(), Some("cpu"));
    assert!(got.state.is_live());
    assert!(got.private_ip.is_some());
    assert_eq!(
        fx.cloud
            .get(&InstanceId("i-0123456789abcdef0".into()))
            .await
            .expect("get"),
        None
    );
    fx.finish().await;
}

#[tokio::test]
async fn no_capacity_on_the_first_override_lands_on_the_second() {
    let fx = Fixture::start("ice").await;
    fx.proxy
        .fault(json!({"action": "CreateFleet", "instance_type": "c5.large", "error": "InsufficientInstanceCapacity"}))
        .await;
    let intent = fx.intent(SPOT, 2, &[("c5.large", "us-east-1a"), ("m5.large", "us-east-1b")]);
    let launched = fx.cloud.create(&intent).await.expect("create");
    assert_eq!(launched.instances.len(), 2);
    assert!(launched.instances.iter().all(|i| i.key == intent.candidates[1].key));
    assert_eq!(launched.failures.len(), 1);
    assert_eq!(launched.failures[0].key, intent.candidates[0].key);
    assert_eq!(launched.failures[0].reason, Unavailable::NoCapacity);
    assert!(
        launched.failures[0]
            .message
            .starts_with("InsufficientInstanceCapacity: ")
    );
    fx.finish().await;
}

#[tokio::test]
async fn a_gang_lands_whole_in_the_one_zone_that_holds_it_in_its_placement_group() {
    let fx = Fixture::start("gang").await;
    // us-east-1a has room for two: a gang of three goes whole to us-east-1b.
    fx.proxy
        .fault(json!({"action": "CreateFleet", "zone": "us-east-1a", "capacity": 2}))
        .await;
    let mut gang = fx.intent(ON_DEMAND, 3, &[("c5.large", "us-east-1a"), ("c5.large", "us-east-1b")]);
    gang.min_count = 3;
    gang.single_zone = true;
    gang.placement_group = Some("kiln-test-gangs".into());
    let launched = fx.cloud.create(&gang).await.expect("create");
    assert_eq!(launched.instances.len(), 3, "{launched:?}");
    assert!(
        launched.instances.iter().all(|i| i.key.zone == "us-east-1b"),
        "{launched:?}"
    );
    // moto keeps no placement groups: what reached EC2 is read from the proxy.
    let sent = fx.proxy.fleet_params().await;
    assert_eq!(sent.len(), 1);
    for override_index in 1..=2 {
        let key = format!("LaunchTemplateConfigs.1.Overrides.{override_index}.Placement.GroupName");
        assert_eq!(
            sent[0].get(&key).and_then(|v| v.as_str()),
            Some("kiln-test-gangs"),
            "{key}"
        );
    }
    assert_eq!(
        sent[0]
            .get("OnDemandOptions.MinTargetCapacity")
            .and_then(|v| v.as_str()),
        Some("3")
    );

    // No zone holds a gang of five: nothing is launched, not a part of it.
    let mut bigger = fx.intent(ON_DEMAND, 5, &[("c5.large", "us-east-1a")]);
    bigger.min_count = 5;
    bigger.single_zone = true;
    let launched = fx.cloud.create(&bigger).await.expect("create");
    assert!(launched.instances.is_empty(), "{launched:?}");
    assert_eq!(launched.failures[0].reason, Unavailable::NoCapacity);
    fx.finish().await;
}

#[tokio::test]
async fn quota_errors_per_override_and_for_the_whole_call_are_quota_failures() {
    let fx = Fixture::start("quota").await;
    let quota = Unavailable::Quota {
        name: "on-demand vCPU (standard family)".into(),
    };
    // Per override (in the answer's errorSet).
    fx.proxy
        .fault(json!({"action": "CreateFleet", "error": "VcpuLimitExceeded", "times": 2}))
        .await;
    let intent = fx.intent(ON_DEMAND, 1, &[("c5.large", "us-east-1a"), ("m5.large", "us-east-1b")]);
    let launched = fx.cloud.create(&intent).await.expect("an answer, not an error");
    assert!(launched.instances.is_empty());
    let reasons: Vec<&Unavailable> = launched.failures.iter().map(|f| &f.reason).collect();
    assert_eq!(reasons, [&quota, &quota]);

    // For the whole call (an error document, HTTP 400): every candidate fails, nothing retried.
    fx.proxy
        .fault(json!({"action": "CreateFleet", "error": "VcpuLimitExceeded", "whole": true, "times": 1}))
        .await;
    let again = fx.intent(ON_DEMAND, 1, &[("c5.large", "us-east-1a"), ("m5.large", "us-east-1b")]);
    let launched = fx.cloud.create(&again).await.expect("an answer, not an error");
    assert!(launched.instances.is_empty());
    assert_eq!(launched.failures.len(), 2);
    assert!(launched.failures.iter().all(|f| f.reason == quota));
    assert_eq!(fx.proxy.calls("CreateFleet").await, 2, "one call each, no retry");
    fx.finish().await;
}

#[tokio::test]
async fn a_dropped_answer_is_ambiguous_and_the_intent_is_found_by_tag() {
    let fx = Fixture::start("drop").await;
    fx.proxy
        .fault(json!({"action": "CreateFleet", "drop": true, "times": 1}))
        .await;
    let intent = fx.intent(SPOT, 1, &[("c5.large", "us-east-1a")]);
    let error = fx.cloud.create(&intent).await.expect_err("no answer");
    assert!(matches!(error, CloudError::Ambiguous(_)), "{error:?}");
    assert_eq!(
        fx.proxy.calls("CreateFleet").await,
        1,
        "an ambiguous launch is never resent"
    );

    let found = fx.cloud.list(&fx.selector(Some(intent.id))).await.expect("list");
    assert_eq!(found.len(), 1, "the launch happened");
    assert_eq!(found[0].intent, Some(intent.id));

    // The same ClientToken again: the same instance, nothing new.
    let replayed = fx.cloud.create(&intent).await.expect("create again");
    assert_eq!(replayed.instances.len(), 1);
    assert_eq!(replayed.instances[0].id, found[0].id);
    assert_eq!(fx.proxy.outcomes("CreateFleet").await, ["dropped", "replayed"]);
    assert_eq!(
        fx.cloud.list(&fx.selector(Some(intent.id))).await.expect("list").len(),
        1
    );
    fx.finish().await;
}

#[tokio::test]
async fn a_call_that_times_out_after_sending_is_ambiguous() {
    let fx = Fixture::with_config("timeout", |config| kiln_cloud::ec2::Ec2Config {
        request_timeout_ms: 1_000,
        ..config
    })
    .await;
    fx.proxy
        .fault(json!({"action": "CreateFleet", "delay_ms": 2500, "times": 1}))
        .await;
    let intent = fx.intent(SPOT, 1, &[("c5.large", "us-east-1a")]);
    let error = fx.cloud.create(&intent).await.expect_err("timed out");
    assert!(matches!(error, CloudError::Ambiguous(_)), "{error:?}");
    let mut found = Vec::new();
    for _ in 0..50 {
        found = fx.cloud.list(&fx.selector(Some(intent.id))).await.expect("list");
        if !found.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        found.len(),
        1,
        "the proxy carried the launch out after the client gave up"
    );
    fx.finish().await;
}

#[tokio::test]
async fn list_pages_through_every_tagged_instance() {
    let fx = Fixture::with_config("pages", |config| kiln_cloud::ec2::Ec2Config { page_size: 5, ..config }).await;
    let intent = fx.intent(SPOT, 7, &[("c5.large", "us-east-1a")]);
    let launched = fx.cloud.create(&intent).await.expect("create");
    assert_eq!(launched.instances.len(), 7);
    let other = fx.intent(SPOT, 1, &[("m5.large", "us-east-1b")]);
    fx.cloud.create(&other).await.expect("create");

    let before = fx.proxy.calls("DescribeInstances").await;
    let mine = fx.cloud.list(&fx.selector(Some(intent.id))).await.expect("list");
    assert_eq!(mine.len(), 7);
    assert!(
        fx.proxy.calls("DescribeInstances").await - before >= 2,
        "7 instances at 5 a page"
    );
    let mut ids: Vec<&InstanceId> = mine.iter().map(|i| &i.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 7, "no instance twice across pages");
    assert_eq!(
        fx.cloud.list(&fx.selector(None)).await.expect("list").len(),
        8,
        "the cluster's"
    );
    fx.finish().await;
}

#[tokio::test]
async fn terminate_is_idempotent_and_skips_unknown_ids() {
    let fx = Fixture::start("term").await;
    let intent = fx.intent(ON_DEMAND, 2, &[("c5.large", "us-east-1a")]);
    let launched = fx.cloud.create(&intent).await.expect("create");
    let mut ids: Vec<InstanceId> = launched.instances.iter().map(|i| i.id.clone()).collect();
    ids.push(InstanceId("i-0000000000000dead".into()));
    fx.cloud.terminate(&ids).await.expect("terminate with an unknown id");
    fx.cloud.terminate(&ids).await.expect("terminate again");
    fx.cloud
        .terminate(&[InstanceId("i-00000000000000bad".into())])
        .await
        .expect("only unknown");
    let ended = fx.cloud.get(&ids[0]).await.expect("get").expect("still described");
    assert_eq!(ended.state, InstanceState::Terminated);
    assert_eq!(ended.key.capacity, ON_DEMAND);
    assert!(
        fx.cloud
            .list(&fx.selector(Some(intent.id)))
            .await
            .expect("list")
            .is_empty(),
        "none live"
    );
    fx.finish().await;
}

#[tokio::test]
async fn throttled_twice_then_answered_takes_three_calls() {
    let fx = Fixture::start("throttle").await;
    fx.proxy
        .fault(json!({"action": "CreateFleet", "error": "RequestLimitExceeded", "times": 2}))
        .await;
    let intent = fx.intent(SPOT, 1, &[("c5.large", "us-east-1a")]);
    let launched = fx
        .cloud
        .create(&intent)
        .await
        .expect("create after two throttled calls");
    assert_eq!(launched.instances.len(), 1);
    assert_eq!(fx.proxy.calls("CreateFleet").await, 3);

    // A bare 503 (no error document) is retried too; three in a row end the call.
    fx.proxy
        .fault(json!({"action": "DescribeInstances", "status": 503, "times": 3}))
        .await;
    let error = fx.cloud.list(&fx.selector(None)).await.expect_err("three 503s");
    assert!(matches!(error, CloudError::Throttled { .. }), "{error:?}");
    assert_eq!(fx.cloud.list(&fx.selector(None)).await.expect("list").len(), 1);
    fx.finish().await;
}

#[tokio::test]
async fn spot_prices_come_from_the_price_history() {
    let fx = Fixture::start("spot").await;
    fx.proxy
        .prices(spot_prices(&[
            ("c5.large", "us-east-1a", 0.031),
            ("c5.large", "us-east-1b", 0.029),
            ("m5.large", "us-east-1a", 0.041),
            ("m5.large", "us-east-1b", 0.043),
        ]))
        .await;
    let pool = fx.pool(
        &["us-east-1a", "us-east-1b"],
        &["c5.large", "m5.large"],
        &[SPOT, ON_DEMAND],
    );
    let offerings = fx.cloud.offerings(&pool).await.expect("offerings");
    let price = |t: &str, z: &str, c: CapacityType| {
        offerings
            .iter()
            .find(|o| o.key.instance_type == t && o.key.zone == z && o.key.capacity == c)
            .unwrap_or_else(|| panic!("an offering {c} {t} {z} in {offerings:#?}"))
    };
    assert_eq!(offerings.len(), 8);
    assert_eq!(price("c5.large", "us-east-1b", SPOT).price_per_hour, 0.029);
    assert_eq!(price("m5.large", "us-east-1a", SPOT).price_per_hour, 0.041);
    assert!(
        matches!(price("m5.large", "us-east-1a", SPOT).price_source, PriceSource::SpotHistory { at_ms } if at_ms > 0)
    );
    let on_demand = price("c5.large", "us-east-1a", ON_DEMAND);
    assert_eq!(on_demand.price_per_hour, 0.085, "the shipped table");
    assert!(matches!(on_demand.price_source, PriceSource::Table { .. }));
    assert_eq!(on_demand.subnet.as_deref(), Some(fx.subnets["us-east-1a"].as_str()));
    assert_eq!(on_demand.shape.cpu_millis, 2000);

    // Cached for five minutes: a second look calls nothing.
    let calls = fx.proxy.calls("DescribeSpotPriceHistory").await;
    fx.cloud.offerings(&pool).await.expect("offerings");
    assert_eq!(fx.proxy.calls("DescribeSpotPriceHistory").await, calls);
    assert_eq!(fx.proxy.calls("DescribeInstanceTypes").await, 1);
    fx.finish().await;
}

#[tokio::test]
async fn offerings_intersect_types_zone_offerings_and_subnets() {
    let fx = Fixture::start("offer").await;
    // moto, as AWS: c5.large is not offered in us-east-1e, m4.large is.
    let mut pool = fx.pool(&["us-east-1a", "us-east-1e"], &["c5.large", "m4.large"], &[ON_DEMAND]);
    pool.on_demand_prices.insert("m4.large".into(), 0.1);
    let offerings = fx.cloud.offerings(&pool).await.expect("offerings");
    let mut found: Vec<(String, String)> = offerings
        .iter()
        .map(|o| (o.key.instance_type.clone(), o.key.zone.clone()))
        .collect();
    found.sort();
    let expected = [
        ("c5.large", "us-east-1a"),
        ("m4.large", "us-east-1a"),
        ("m4.large", "us-east-1e"),
    ];
    assert_eq!(found, expected.map(|(t, z)| (t.to_owned(), z.to_owned())));
    let m4 = offerings
        .iter()
        .find(|o| o.key.instance_type == "m4.large")
        .expect("m4.large");
    assert_eq!(m4.price_source, PriceSource::Configured, "the pool's own price");

    // Requirements over the whole catalogue: 2 vCPUs of the c5 and m5 families.
    let mut by_requirements = fx.pool(&["us-east-1a"], &[], &[ON_DEMAND]);
    by_requirements.requirements = Some(Requirements {
        vcpu: Some([2, 2]),
        families: vec!["c5".into(), "m5".into()],
        ..Requirements::default()
    });
    let offerings = fx.cloud.offerings(&by_requirements).await.expect("offerings");
    let types: Vec<&str> = offerings.iter().map(|o| o.key.instance_type.as_str()).collect();
    assert_eq!(types, ["c5.large", "m5.large"]);

    let mut unknown_subnet = fx.pool(&["us-east-1a"], &["c5.large"], &[ON_DEMAND]);
    unknown_subnet.subnets = vec!["subnet-0000000000000000f".into()];
    let error = fx.cloud.offerings(&unknown_subnet).await.expect_err("no such subnet");
    assert!(matches!(error, CloudError::Invalid(_)), "{error:?}");
    fx.finish().await;
}

#[tokio::test]
async fn a_wrong_secret_is_unauthorized() {
    let fx = Fixture::start("auth").await;
    let wrong = Ec2Cloud::with_static_credentials(
        fast_config(&fx.env, &fx.proxy.url),
        &fx.env.access_key_id,
        &format!("wrong{}", fx.env.secret_access_key),
        None,
    )
    .expect("a client");
    let error = wrong.list(&fx.selector(None)).await.expect_err("refused");
    assert!(matches!(error, CloudError::Unauthorized(_)), "{error:?}");
    let intent = fx.intent(SPOT, 1, &[("c5.large", "us-east-1a")]);
    let error = wrong.create(&intent).await.expect_err("refused");
    assert!(matches!(error, CloudError::Unauthorized(_)), "{error:?}");
    // The control: the right secret through the same proxy is accepted.
    assert!(fx.cloud.list(&fx.selector(None)).await.expect("list").is_empty());
    fx.finish().await;
}

#[tokio::test]
async fn a_closed_port_is_unavailable() {
    let env = cloud_env();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("an address").port()
    };
    let cloud = Ec2Cloud::with_static_credentials(
        fast_config(&env, &format!("http://127.0.0.1:{port}")),
        &env.access_key_id,
        &env.secret_access_key,
        None,
    )
    .expect("a client");
    let selector = kiln_cloud::TagSelector {
        cluster: "nobody".into(),
        ..Default::default()
    };
    let error = cloud.list(&selector).await.expect_err("nothing listens");
    assert!(matches!(error, CloudError::Unavailable(_)), "{error:?}");
}
