//! An EC2 world for the end-to-end tests of the provisioner (issue 27): moto from
//! `scripts/cloud-servers.sh` behind a fault proxy of the test's own, a launch template whose
//! user data is terraform's runner config rendered from its template, kiln-provisioner as a real
//! process (so a test can SIGKILL it), and the [`BootBridge`](crate::boot_bridge::BootBridge)
//! that boots a real kiln-runner process, with an AEMM of its own, for every running instance.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use base64::Engine;
use kiln_cloud::ec2::{Ec2Cloud, Ec2Config};
use kiln_cloud::testing::{CloudEnv, FaultProxy, IMAGE, cloud_env, fast_config};
use kiln_cloud::{CapacityType, Cloud, CloudInstance, InstanceId, PoolSpec, TagSelector};
use kiln_core::nats_auth::Service;
use serde_json::{Value, json};

use crate::Stack;

/// The pool the tests launch into.
pub const POOL: &str = "ec2";

/// One test's cloud: moto behind its own fault proxy, its `kiln-cluster` tag and template.
pub struct Ec2World {
    pub env: CloudEnv,
    pub proxy: FaultProxy,
    /// The test's own client (through the proxy), to look at what kiln did.
    pub cloud: Arc<Ec2Cloud>,
    pub cluster: String,
    pub template: String,
    /// zone → the default subnet moto made there.
    pub subnets: BTreeMap<String, String>,
}

/// terraform's runner config template (`deploy/terraform/modules/runner-pool`).
pub fn runner_template_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/terraform/modules/runner-pool/runner.toml.tftpl")
}

/// Renders a terraform template's `${name}` and `${jsonencode(name)}` interpolations from
/// `vars`; anything else it cannot render (a directive, another function) fails loudly, so a
/// template that outgrows this renderer stops the tests instead of booting something else.
pub fn render_template(text: &str, vars: &BTreeMap<&str, Value>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .map(|e| start + e)
            .expect("a closed interpolation");
        let inner = &rest[start + 2..end];
        let (name, json) = match inner.strip_prefix("jsonencode(").and_then(|i| i.strip_suffix(')')) {
            Some(name) => (name, true),
            None => (inner, false),
        };
        let value = vars
            .get(name)
            .unwrap_or_else(|| panic!("the template names ${{{inner}}}, which the test does not render"));
        match (json, value) {
            (false, Value::String(text)) => out.push_str(text),
            (false, other) | (true, other) => out.push_str(&other.to_string()),
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    assert!(
        !out.contains("%{"),
        "the template has a directive the test cannot render"
    );
    out
}

impl Ec2World {
    /// A world for the test `name` on the `stack`: the launch template carries terraform's
    /// runner config rendered for the stack, as user data.
    pub async fn start(name: &str, stack: &Stack) -> Ec2World {
        let env = cloud_env();
        let proxy = FaultProxy::start(&env).await;
        let cloud = Arc::new(
            Ec2Cloud::with_static_credentials(
                fast_config(&env, &proxy.url),
                &env.access_key_id,
                &env.secret_access_key,
                None,
            )
            .expect("an ec2 client"),
        );
        let id = kiln_core::ids::new_id();
        let unique = &id[id.len() - 10..];
        let template = format!("kiln-e2e-{name}-{unique}").to_lowercase();
        let vars = BTreeMap::from([
            ("pool", json!(POOL)),
            ("api_url", json!(format!("http://{}", stack.api_addr))),
            ("logs_url", json!(format!("http://{}", stack.logs_addr))),
            (
                "job_endpoints",
                json!([stack.api_addr.to_string(), stack.logs_addr.to_string()]),
            ),
            ("nats_urls", json!(stack.nats.url)),
            ("nats_replicas", json!(1)),
            ("objects_url", json!(stack.objects.url)),
            ("region", json!(env.region)),
            // No ECR repositories for the pool (tests/e2e/tests/registry.rs tests [ecr]).
            ("ecr_registries", json!([])),
        ]);
        let text = std::fs::read_to_string(runner_template_path()).expect("terraform's runner template");
        let user_data = base64::engine::general_purpose::STANDARD.encode(render_template(&text, &vars));
        cloud
            .create_launch_template_with(&template, IMAGE, Some(&user_data))
            .await
            .expect("a launch template");
        let subnets = cloud
            .subnets()
            .await
            .expect("the region's subnets")
            .into_iter()
            .map(|(subnet, zone)| (zone, subnet))
            .collect();
        Ec2World {
            env,
            proxy,
            cloud,
            cluster: template.clone(),
            template,
            subnets,
        }
    }

    /// The tests' pool: c5 types in two zones, both capacity types.
    pub fn pool(&self) -> PoolSpec {
        PoolSpec {
            name: POOL.into(),
            cloud: "ec2".into(),
            region: self.env.region.clone(),
            subnets: ["us-east-1a", "us-east-1b"]
                .iter()
                .map(|zone| self.subnets[*zone].clone())
                .collect(),
            zones: Vec::new(),
            instance_types: vec!["c5.large".into(), "c5.xlarge".into(), "c5.2xlarge".into()],
            requirements: None,
            capacity_types: vec![CapacityType::Spot, CapacityType::OnDemand],
            launch_template: self.template.clone(),
            launch_template_version: None,
            max_instances: 20,
            idle_timeout_secs: 4,
            boot_timeout_secs: 120,
            labels: BTreeMap::from([("kiln-test".to_owned(), "e2e".to_owned())]),
            on_demand_prices: BTreeMap::new(),
            placement_group: None,
            disk: Default::default(),
        }
    }

    /// Every instance moto has with this world's cluster tag, live or not.
    pub async fn instances(&self) -> Vec<CloudInstance> {
        self.cloud
            .list(&TagSelector {
                cluster: self.cluster.clone(),
                pool: None,
                intent: None,
                live_only: false,
            })
            .await
            .expect("list the world's instances")
    }

    /// Terminates whatever the test left (moto is shared by every test of the run).
    pub async fn finish(self) {
        let ids: Vec<InstanceId> = self.instances().await.into_iter().map(|i| i.id).collect();
        self.cloud.terminate(&ids).await.expect("terminate for cleanup");
    }
}

/// The provisioner's configuration for `world` on `stack`, with the tests' short timings.
pub fn provisioner_config(stack: &Stack, world: &Ec2World, pool: PoolSpec) -> Value {
    json!({
        "cluster": world.cluster,
        "instance-name": "provisioner-e2e",
        "grpc": { "listen": "127.0.0.1:0" },
        "metrics": { "enabled": false },
        "database": { "url": stack.database.url.expose() },
        "nats": stack.nats.service_config(Service::Provisioner),
        "lease-ttl-ms": 1500,
        "batch-idle-ms": 500,
        "batch-max-ms": 2000,
        "cycle-interval-ms": 500,
        "reap-interval-ms": 1000,
        "reap-grace-ms": 8000,
        "consistency-horizon-ms": 4000,
        "cordon-settle-ms": 1000,
        "unavailable-ttl-ms": 180000,
        "ec2-endpoint": world.proxy.url,
        "pools": [pool],
    })
}

/// kiln-provisioner as a process of its own (the workspace's binary), its log in `dir`.
pub struct ProvisionerProcess {
    child: Child,
    pub log: PathBuf,
}

impl ProvisionerProcess {
    /// Starts it with `config` (TOML from JSON), the cloud's keys in its environment as the
    /// AWS credential chain reads them.
    pub fn start(dir: &Path, env: &CloudEnv, config: &Value) -> ProvisionerProcess {
        let path = dir.join("provisioner.toml");
        let toml: toml::Value = serde_json::from_value(without_nulls(config.clone())).expect("the config as TOML");
        std::fs::write(&path, toml::to_string(&toml).expect("TOML")).expect("write provisioner.toml");
        let log = dir.join("provisioner.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("the provisioner's log");
        let child = Command::new(binary("kiln-provisioner"))
            .arg("--config")
            .arg(&path)
            .env("AWS_ACCESS_KEY_ID", &env.access_key_id)
            .env("AWS_SECRET_ACCESS_KEY", &env.secret_access_key)
            .env("AWS_REGION", &env.region)
            .env("KILN_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start kiln-provisioner");
        ProvisionerProcess { child, log }
    }

    /// SIGKILL: a crash at whatever instant it is in.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ProvisionerProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- kiln-provisioner log ---\n{}", self.log_text());
        }
    }
}

/// TOML has no null: an unset option is a missing key.
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// A binary of the workspace beside the test's (`cargo build --workspace --bins` first).
pub fn binary(name: &str) -> PathBuf {
    let agent = crate::agent_binary();
    let path = agent.with_file_name(name);
    assert!(
        path.try_exists().unwrap_or(false),
        "{} does not exist: build the workspace first (cargo build --workspace --bins)",
        path.display()
    );
    path
}

/// The AWS shapes of the tests' types, as an instance of each would report them.
pub fn shape_of(instance_type: &str) -> (i64, i64) {
    const GIB: i64 = 1 << 30;
    match instance_type {
        "c5.large" => (2000, 4 * GIB),
        "c5.xlarge" => (4000, 8 * GIB),
        "c5.2xlarge" => (8000, 16 * GIB),
        other => panic!("the tests' pool has no type {other}"),
    }
}

/// The default Ec2Config of a world (for a client of the test's own).
pub fn config(world: &Ec2World) -> Ec2Config {
    fast_config(&world.env, &world.proxy.url)
}
