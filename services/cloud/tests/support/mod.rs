//! The EC2 tests' harness: moto from `scripts/cloud-servers.sh` (its env file sourced), one fault
//! proxy per test in front of it, and an [`Ec2Cloud`] with its own `kiln-cluster` tag and
//! launch template. A missing env fails the test with what to run; nothing is skipped.

use std::collections::BTreeMap;

use kiln_cloud::ec2::{Ec2Cloud, Ec2Config};
pub use kiln_cloud::testing::{CloudEnv, FaultProxy, IMAGE, cloud_env, fast_config, spot_prices};
use kiln_cloud::{
    CapacityType, Cloud, InstanceId, IntentId, LaunchIntent, Offering, OfferingKey, PoolSpec, PriceSource, Shape,
    TagSelector, TemplateRef,
};

/// One test's cloud: its proxy, client, cluster tag, launch template and the region's subnets.
pub struct Fixture {
    pub env: CloudEnv,
    pub proxy: FaultProxy,
    pub cloud: Ec2Cloud,
    pub cluster: String,
    pub template: String,
    /// zone → the default subnet moto made there.
    pub subnets: BTreeMap<String, String>,
}

impl Fixture {
    pub async fn start(name: &str) -> Fixture {
        Fixture::with_config(name, |config| config).await
    }

    pub async fn with_config(name: &str, tweak: impl FnOnce(Ec2Config) -> Ec2Config) -> Fixture {
        let env = cloud_env();
        let proxy = FaultProxy::start(&env).await;
        let config = tweak(fast_config(&env, &proxy.url));
        let cloud = Ec2Cloud::with_static_credentials(config, &env.access_key_id, &env.secret_access_key, None)
            .expect("an ec2 client");
        let unique = &uuid::Uuid::now_v7().simple().to_string()[20..];
        let template = format!("kiln-test-{name}-{unique}");
        cloud
            .create_launch_template(&template, IMAGE)
            .await
            .expect("a launch template");
        let subnets = cloud
            .subnets()
            .await
            .expect("the region's subnets")
            .into_iter()
            .map(|(subnet, zone)| (zone, subnet))
            .collect();
        Fixture {
            env,
            proxy,
            cloud,
            cluster: template.clone(),
            template,
            subnets,
        }
    }

    pub fn candidate(&self, instance_type: &str, zone: &str, capacity: CapacityType) -> Offering {
        Offering {
            key: OfferingKey {
                instance_type: instance_type.into(),
                zone: zone.into(),
                capacity,
            },
            shape: Shape::default(),
            price_per_hour: 0.1,
            price_source: PriceSource::Configured,
            subnet: Some(
                self.subnets
                    .get(zone)
                    .unwrap_or_else(|| panic!("a subnet in {zone}"))
                    .clone(),
            ),
        }
    }

    pub fn intent(&self, capacity: CapacityType, count: u32, candidates: &[(&str, &str)]) -> LaunchIntent {
        LaunchIntent {
            id: IntentId::new(),
            cluster: self.cluster.clone(),
            pool: "cpu".into(),
            capacity,
            count,
            min_count: 0,
            single_zone: false,
            placement_group: None,
            candidates: candidates.iter().map(|(t, z)| self.candidate(t, z, capacity)).collect(),
            template: TemplateRef {
                name: self.template.clone(),
                version: None,
            },
            labels: BTreeMap::from([("kiln-test".to_owned(), "ec2".to_owned())]),
            root_volume: None,
        }
    }

    pub fn selector(&self, intent: Option<IntentId>) -> TagSelector {
        TagSelector {
            cluster: self.cluster.clone(),
            pool: None,
            intent,
            live_only: true,
        }
    }

    pub fn pool(&self, zones: &[&str], instance_types: &[&str], capacity_types: &[CapacityType]) -> PoolSpec {
        PoolSpec {
            name: "cpu".into(),
            cloud: "ec2".into(),
            region: self.env.region.clone(),
            subnets: zones.iter().map(|z| self.subnets[*z].clone()).collect(),
            zones: Vec::new(),
            instance_types: instance_types.iter().map(|t| (*t).to_owned()).collect(),
            requirements: None,
            capacity_types: capacity_types.to_vec(),
            launch_template: self.template.clone(),
            launch_template_version: None,
            max_instances: 20,
            idle_timeout_secs: 300,
            boot_timeout_secs: 600,
            labels: BTreeMap::new(),
            on_demand_prices: BTreeMap::new(),
            placement_group: None,
            disk: Default::default(),
        }
    }

    /// Terminates what the test launched (moto is shared by every test of the run).
    pub async fn finish(self) {
        let mut selector = self.selector(None);
        selector.live_only = false;
        let ids: Vec<InstanceId> = self
            .cloud
            .list(&selector)
            .await
            .expect("list for cleanup")
            .into_iter()
            .map(|i| i.id)
            .collect();
        self.cloud.terminate(&ids).await.expect("terminate for cleanup");
    }
}
