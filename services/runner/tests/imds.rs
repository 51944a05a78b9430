//! The runner's instance metadata source against a real amazon-ec2-metadata-mock (AEMM 1.13.0,
//! `KILN_TEST_AEMM`): its identity over IMDSv2, a new token when the service forgets the old
//! one, and the spot notices as they appear.

use std::time::Duration;

use kiln_core::testing::{Aemm, AemmInstance, AemmNotice};
use kiln_runner::metadata::MetadataSource;
use kiln_runner::metadata::imds::Imds;

/// A client that keeps no connection (the service restarts under it).
fn http() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap()
}

async fn status_of(request: reqwest::RequestBuilder) -> u16 {
    request.send().await.expect("AEMM answers").status().as_u16()
}

#[tokio::test]
async fn the_identity_is_read_over_imdsv2_and_a_read_without_a_token_is_refused() {
    let aemm = Aemm::start(AemmInstance::spot());
    let imds = Imds::new(&aemm.endpoint, Duration::from_secs(60)).unwrap();
    let identity = imds.identity().await.expect("the identity reads");
    assert_eq!(identity.instance_id, aemm.instance.instance_id);
    assert_eq!(
        (
            identity.instance_type.as_str(),
            identity.zone.as_str(),
            identity.region.as_str()
        ),
        ("c5.large", "us-east-1b", "us-east-1")
    );
    assert!(identity.is_spot(), "{identity:?}");
    // Control: the service answers only with a token (IMDSv2); a plain GET is refused.
    let http = http();
    let url = format!("{}/latest/meta-data/instance-id", aemm.endpoint);
    assert_eq!(status_of(http.get(&url)).await, 401);
    let notices = imds.notices().await.expect("the notices read");
    assert_eq!(notices, Default::default(), "no notice yet");

    // An on-demand instance reads as such.
    let on_demand = Aemm::start(AemmInstance {
        life_cycle: "on-demand".into(),
        ..AemmInstance::spot()
    });
    let imds = Imds::new(&on_demand.endpoint, Duration::from_secs(60)).unwrap();
    let identity = imds.identity().await.unwrap();
    assert_eq!(identity.market, "on-demand");
}

#[tokio::test]
async fn a_token_the_service_forgot_is_replaced_and_one_near_its_end_is_renewed() {
    let mut aemm = Aemm::start(AemmInstance::spot());
    let imds = Imds::new(&aemm.endpoint, Duration::from_secs(60)).unwrap();
    let before = imds.identity().await.unwrap();
    let http = http();
    let old_token = http
        .put(format!("{}/latest/api/token", aemm.endpoint))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "60")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    aemm.restart();
    // Control: the restarted service refuses a token of before (401)...
    let url = format!("{}/latest/meta-data/instance-id", aemm.endpoint);
    let refused = http.get(&url).header("X-aws-ec2-metadata-token", &old_token);
    assert_eq!(status_of(refused).await, 401);
    // ... and the source, holding one too, takes a new one and reads on.
    assert_eq!(imds.identity().await.expect("read with a new token"), before);

    // A 1 s token is renewed before it ends: reads go on across several of its lives.
    let short = Imds::new(&aemm.endpoint, Duration::from_secs(1)).unwrap();
    for _ in 0..4 {
        assert_eq!(short.identity().await.expect("read").instance_id, before.instance_id);
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
}

#[tokio::test]
async fn the_notices_appear_when_the_cloud_gives_them() {
    let mut aemm = Aemm::start(AemmInstance::spot());
    let imds = Imds::new(&aemm.endpoint, Duration::from_secs(60)).unwrap();
    assert_eq!(imds.notices().await.unwrap(), Default::default());
    let asked = kiln_core::ids::now_ms();
    aemm.trigger(&[AemmNotice::Rebalance]);
    let notices = imds.notices().await.unwrap();
    let rebalance_at_ms = notices.rebalance_at_ms.expect("a rebalance recommendation");
    assert!((rebalance_at_ms - asked).abs() < 5_000, "{rebalance_at_ms} vs {asked}");
    assert_eq!(notices.interruption, None);

    aemm.trigger(&[AemmNotice::Rebalance, AemmNotice::Interruption]);
    let notices = imds.notices().await.unwrap();
    assert!(notices.rebalance_at_ms.is_some());
    let interruption = notices.interruption.expect("an interruption notice");
    assert_eq!(interruption.action, "terminate");
    // Two minutes ahead.
    let ahead = interruption.at_ms - kiln_core::ids::now_ms();
    assert!((100_000..=125_000).contains(&ahead), "{ahead} ms ahead");
}
