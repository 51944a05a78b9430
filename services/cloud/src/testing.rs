//! Test helpers against the real moto (`scripts/cloud-servers.sh`) and the fault proxy in
//! front of it (`scripts/cloud/fault_proxy.py`), for this crate's tests, the provisioner's and
//! the end-to-end ones. A missing env fails the test with what to run; nothing is skipped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::ec2::Ec2Config;

/// An image moto knows.
pub const IMAGE: &str = "ami-12c6146b";

pub struct CloudEnv {
    pub endpoint: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Temporary credentials of a role moto's user assumed (allowed ecr:GetAuthorizationToken):
    /// an instance role's, as a test's AEMM serves them. Key id, secret and session token.
    pub role: (String, String, String),
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
        role: (
            var("KILN_TEST_EC2_ROLE_ACCESS_KEY_ID"),
            var("KILN_TEST_EC2_ROLE_SECRET_ACCESS_KEY"),
            var("KILN_TEST_EC2_ROLE_SESSION_TOKEN"),
        ),
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

    /// Removes every fault rule.
    pub async fn clear_faults(&self) {
        self.control(reqwest::Method::DELETE, "faults", None).await;
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
        self.requests(action)
            .await
            .iter()
            .map(|r| r["outcome"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// The parameters of each `CreateFleet` the proxy carried out, in order.
    pub async fn fleet_params(&self) -> Vec<serde_json::Map<String, Value>> {
        self.requests("CreateFleet")
            .await
            .into_iter()
            .filter_map(|mut r| match r["params"].take() {
                Value::Object(params) => Some(params),
                _ => None,
            })
            .collect()
    }

    async fn requests(&self, action: &str) -> Vec<Value> {
        let requests = self.control(reqwest::Method::GET, "requests", None).await;
        let Value::Array(requests) = requests else {
            panic!("/_proxy/requests is not a list: {requests}")
        };
        requests.into_iter().filter(|r| r["action"] == action).collect()
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

pub fn spot_prices(prices: &[(&str, &str, f64)]) -> Value {
    json!({ "spot": prices.iter().map(|(t, z, p)| json!({"instance_type": t, "zone": z, "price": p})).collect::<Vec<_>>() })
}
