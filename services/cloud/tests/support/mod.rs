//! The EC2 tests' harness: moto from `scripts/cloud-servers.sh` (its env file sourced), one fault
//! proxy per test in front of it, and an [`Ec2Cloud`] with its own `kiln-cluster` tag and
//! launch template. A missing env fails the test with what to run; nothing is skipped.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kiln_cloud::ec2::{Ec2Cloud, Ec2Config};
use kiln_cloud::{
    CapacityType, Cloud, InstanceId, IntentId, LaunchIntent, Offering, OfferingKey, PoolSpec, PriceSource, Shape,
    TagSelector, TemplateRef,
};
use serde_json::{Value, json};

/// An image moto knows.
const IMAGE: &str = "ami-12c6146b";

pub struct CloudEnv {
    pub endpoint: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub python: String,
    pub fault_proxy: String,
}

pub fn cloud_env() -> CloudEnv {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is unset: the ec2 tests need moto. Run `mkdir -p /tmp/kiln-cloud && \
                 scripts/cloud-servers.sh start /tmp/kiln-cloud && source /tmp/kiln-cloud/env` \
                 (scripts/test.sh does this), then the tests again"
            )
        })
    };
    CloudEnv {
        endpoint: var("KILN_TEST_EC2_ENDPOINT"),
        region: std::env::var("KILN_TEST_EC2_REGION").unwrap_or_else(|_| "us-east-1".into()),
        access_key_id: var("KILN_TEST_EC2_ACCESS_KEY_ID"),
        secret_access_key: var("KILN_TEST_EC2_SECRET_ACCESS_KEY"),
        python: var("KILN_TEST_CLOUD_PYTHON"),
        fault_proxy: var("KILN_TEST_EC2_FAULT_PROXY"),
    }
}

/// `scripts/cloud/fault_proxy.py` in front of moto, killed on drop; its stderr is printed when
/// the test failed (a client that gives up makes it log broken pipes, which are expected).
pub struct FaultProxy {
    child: Child,
    dir: tempfile::TempDir,
    pub url: String,
    http: reqwest::Client,
}

impl FaultProxy {
    pub async fn start(env: &CloudEnv) -> FaultProxy {
        let dir = tempfile::tempdir().expect("a temp dir");
        let port_file: PathBuf = dir.path().join("port");
        let log = std::fs::File::create(dir.path().join("proxy.log")).expect("create the proxy's log");
        let child = Command::new(&env.python)
            .arg(&env.fault_proxy)
            .arg("--upstream")
            .arg(&env.endpoint)
            .arg("--port-file")
            .arg(&port_file)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} {}: {e}", env.python, env.fault_proxy));
        let mut port = None;
        for _ in 0..200 {
            if port_file.try_exists().expect("stat the port file") {
                port = Some(std::fs::read_to_string(&port_file).expect("read the port file"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let port = port.expect("the fault proxy wrote its port within 5 s");
        FaultProxy {
            child,
            dir,
            url: format!("http://127.0.0.1:{}", port.trim()),
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("a plain http client"),
        }
    }

    async fn control(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}/_proxy/{path}", self.url));
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.expect("the proxy's control api answers");
        assert!(response.status().is_success(), "/_proxy/{path}: {}", response.status());
        serde_json::from_str(&response.text().await.expect("a body")).expect("json")
    }

    /// Adds a fault rule (see fault_proxy.py's docstring).
    pub async fn fault(&self, rule: Value) {
        self.control(reqwest::Method::POST, "faults", Some(rule)).await;
    }

    pub async fn prices(&self, table: Value) {
        self.control(reqwest::Method::PUT, "prices", Some(table)).await;
    }

    /// Calls so far of one action.
    pub async fn calls(&self, action: &str) -> u64 {
        self.control(reqwest::Method::GET, "calls", None).await[action]
            .as_u64()
            .unwrap_or(0)
    }

    /// The outcomes of one action's calls, in order.
    pub async fn outcomes(&self, action: &str) -> Vec<String> {
        let requests = self.control(reqwest::Method::GET, "requests", None).await;
        requests
            .as_array()
            .expect("a list")
            .iter()
            .filter(|r| r["action"] == action)
            .map(|r| r["outcome"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("proxy.log")).unwrap_or_default();
            eprintln!("--- fault proxy {} stderr ---\n{log}", self.url);
        }
    }
}

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

/// Fast timings: retries 10–50 ms apart.
pub fn fast_config(env: &CloudEnv, endpoint: &str) -> Ec2Config {
    Ec2Config {
        region: env.region.clone(),
        endpoint: Some(endpoint.to_owned()),
        retry_base_ms: 10,
        retry_cap_ms: 50,
        request_timeout_ms: 20_000,
        ..Ec2Config::default()
    }
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
            candidates: candidates.iter().map(|(t, z)| self.candidate(t, z, capacity)).collect(),
            template: TemplateRef {
                name: self.template.clone(),
                version: None,
            },
            labels: BTreeMap::from([("kiln-test".to_owned(), "ec2".to_owned())]),
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

pub fn spot_prices(prices: &[(&str, &str, f64)]) -> Value {
    json!({ "spot": prices.iter().map(|(t, z, p)| json!({"instance_type": t, "zone": z, "price": p})).collect::<Vec<_>>() })
}
