//! Inference services for tests: Python workers through the SDK's adapter (`kiln.serve`), their
//! relays and a predictor in this process, and a small REST client.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kiln_core::serving::ServiceSpec;
use kiln_core::subjects::BUCKET_SERVICES;
use kiln_runner::relay::{Member, Relay, RelayMetrics, RelaySettings};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{PATIENCE, ServiceHandle, Stack};

/// The SDK's venv Python (scripts/test.sh makes it).
pub fn python() -> String {
    std::env::var("KILN_TEST_PYTHON")
        .expect("KILN_TEST_PYTHON is not set: run the tests through scripts/test.sh, which makes the SDK's venv")
}

/// A worker process: `script` run by the SDK's Python with `KILN_SERVE_PORT` set.
pub struct Worker {
    pub port: u16,
    child: Child,
}

impl Worker {
    /// Starts `script` (Python calling `kiln.serve`) in `dir` with `env`.
    pub fn spawn(dir: &Path, name: &str, script: &str, env: &[(&str, &str)]) -> Worker {
        let path = dir.join(format!("{name}.py"));
        std::fs::write(&path, script).expect("write the worker's script");
        let port = kiln_core::testing::free_port();
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("worker log");
        let child = Command::new(python())
            .arg(&path)
            .env("KILN_SERVE_PORT", port.to_string())
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the worker");
        let mut worker = Worker { port, child };
        worker.wait_listening(&dir.join(format!("{name}.log")));
        worker
    }

    /// Waits until the worker accepts connections; panics with its log if it exited.
    fn wait_listening(&mut self, log: &Path) {
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::net::TcpStream::connect(self.addr()).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the worker exited ({status}): {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            assert!(std::time::Instant::now() < deadline, "the worker never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Another process may hold the port (it was free a moment ago): this one must be alive.
        std::thread::sleep(Duration::from_millis(50));
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "the worker exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn signal(&self, signal: Signal) {
        self.try_signal(signal).expect("signal the worker");
    }

    /// SIGSTOPs the worker and waits until every thread of it has stopped (the signal is
    /// delivered asynchronously: a thread may finish a request first).
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
        let tasks = format!("/proc/{}/task", self.child.id());
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let stopped = std::fs::read_dir(&tasks).expect("the worker's threads").all(|task| {
                let stat = std::fs::read_to_string(task.expect("a thread").path().join("stat")).unwrap_or_default();
                // The state follows the command's closing parenthesis.
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
            });
            if stopped {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the worker never stopped");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn try_signal(&self, signal: Signal) -> nix::Result<()> {
        kill(Pid::from_raw(i32::try_from(self.child.id()).expect("a pid")), signal)
    }

    /// SIGKILLs the worker and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.try_signal(Signal::SIGCONT);
        self.kill();
    }
}

/// A worker multiplying its input `x` by `FACTOR`, answering `y`.
pub const SCALE_WORKER: &str = r#"
import os
import kiln

factor = float(os.environ["FACTOR"])

def predict(model, inputs):
    return {"y": inputs["x"] * factor}

kiln.serve(predict)
"#;

/// Starts a relay for `worker` as member `member` of revision `revision` of `service` (of
/// project `default`).
pub async fn spawn_relay(
    stack: &Stack,
    service: &str,
    revision: u64,
    member: &str,
    worker: SocketAddr,
    metrics: &RelayMetrics,
) -> ServiceHandle {
    spawn_relay_in(stack, "default", service, revision, member, worker, metrics).await
}

/// [`spawn_relay`] for a service of `project`.
pub async fn spawn_relay_in(
    stack: &Stack,
    project: &str,
    service: &str,
    revision: u64,
    member: &str,
    worker: SocketAddr,
    metrics: &RelayMetrics,
) -> ServiceHandle {
    let relay = Relay::new(
        stack.nats.client().await,
        Member {
            project: project.into(),
            service: service.into(),
            revision,
            member: member.into(),
            worker,
            job_id: String::new(),
        },
        RelaySettings {
            probe_interval_ms: 50,
            direct_addr: "127.0.0.1:0".into(),
            ..Default::default()
        },
        metrics.clone(),
    );
    ServiceHandle::spawn(|token| relay.run(token))
}

/// A predictor on this stack, and its REST API's base URL.
pub async fn spawn_predictor(stack: &Stack) -> (ServiceHandle, String) {
    let (handle, url, _) = spawn_predictor_with_api(stack).await;
    (handle, url)
}

/// A predictor on this stack: its REST API's base URL and where its `ServeService` listens.
pub async fn spawn_predictor_with_api(stack: &Stack) -> (ServiceHandle, String, SocketAddr) {
    spawn_predictor_configured(stack, |_| {}).await
}

/// [`spawn_predictor_with_api`] with its configuration changed by `tweak` first.
pub async fn spawn_predictor_configured(
    stack: &Stack,
    tweak: impl FnOnce(&mut kiln_predictor::Config),
) -> (ServiceHandle, String, SocketAddr) {
    let mut config = kiln_predictor::Config {
        grpc: kiln_core::config::GrpcConfig::at(SocketAddr::from(([127, 0, 0, 1], 0))),
        http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        database: stack.database.clone(),
        nats: stack.nats.service_config(kiln_core::nats_auth::Service::Predictor),
        max_body_bytes: 64 * 1024,
        control_interval_ms: 200,
        ..Default::default()
    };
    tweak(&mut config);
    let predictor = kiln_predictor::Predictor::bind(config)
        .await
        .expect("the predictor binds");
    let url = predictor.http_url().to_string();
    let api = predictor.grpc_addr();
    (ServiceHandle::spawn(|token| predictor.serve(token)), url, api)
}

/// A `ServeService` client of the predictor at `addr`.
/// A `ServeService` client with a token.
pub type ServeClient = kiln_proto::v1::serve_service_client::ServeServiceClient<crate::Authed>;

pub async fn serve_client(addr: SocketAddr, token: &str) -> ServeClient {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect to the predictor");
    kiln_proto::v1::serve_service_client::ServeServiceClient::with_interceptor(
        channel,
        kiln_core::auth::BearerInterceptor::new(token),
    )
}

/// A service's definition as these tests' relays serve it: revision 1 of project `default`,
/// `members` (each `(name, weight)`, model `NAME:1`) combined by `ensemble`, quorum 1, no declared
/// tensors.
pub fn service_spec(
    name: &str,
    members: &[(&str, f64)],
    ensemble: kiln_core::serving::Ensemble,
    deadline_ms: u64,
) -> ServiceSpec {
    ServiceSpec {
        name: name.into(),
        project: "default".into(),
        revision: 1,
        members: members
            .iter()
            .map(|(member, weight)| kiln_core::serving::Member {
                name: (*member).into(),
                model: format!("{member}:1"),
                weight: *weight,
            })
            .collect(),
        ensemble,
        deadline_ms,
        quorum: 1,
        inputs: Vec::new(),
        outputs: Vec::new(),
        cold_wait_ms: 0,
        split: None,
    }
}

/// Service `scale` on this stack with one member, `double` (a worker answering y = 2x), and
/// its relay counting into `relays`: the worker and the relay's handle, to keep alive.
pub async fn serve_double(stack: &Stack, relays: &RelayMetrics) -> (Worker, ServiceHandle) {
    let worker = Worker::spawn(stack.dir.path(), "double", SCALE_WORKER, &[("FACTOR", "2")]);
    let relay = spawn_relay(stack, "scale", 1, "double", worker.addr(), relays).await;
    let spec = service_spec("scale", &[("double", 1.0)], kiln_core::serving::Ensemble::Mean, 5_000);
    put_service(stack, &spec).await;
    (worker, relay)
}

/// Writes `spec` as the service's live definition (under its `PROJECT.NAME` key).
pub async fn put_service(stack: &Stack, spec: &ServiceSpec) {
    let jetstream = async_nats::jetstream::new(stack.nats.client().await);
    let bucket = jetstream
        .get_key_value(BUCKET_SERVICES)
        .await
        .expect("the services bucket");
    bucket
        .put(spec.key(), serde_json::to_vec(spec).expect("json").into())
        .await
        .expect("put the service");
}

/// A REST client of a predictor.
#[derive(Clone)]
pub struct Rest {
    pub base: String,
    pub token: String,
    client: reqwest::Client,
}

/// A REST answer: status, headers, body.
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: bytes::Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&self.body)))
    }

    /// The `error` of an error body.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().expect("an error message").to_string()
    }
}

impl Rest {
    pub fn new(base: &str, token: &str) -> Rest {
        Rest {
            base: base.into(),
            token: token.into(),
            client: reqwest::Client::builder().no_proxy().build().expect("a client"),
        }
    }

    pub async fn post(&self, path: &str, headers: &[(&str, String)], body: Vec<u8>) -> Reply {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(PATIENCE)
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        Reply::of(request.send().await.expect("the predictor answers")).await
    }

    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> Reply {
        self.post(
            path,
            &[("content-type", "application/json".into())],
            body.to_string().into_bytes(),
        )
        .await
    }

    pub async fn get(&self, path: &str) -> Reply {
        let request = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(PATIENCE);
        Reply::of(request.send().await.expect("the predictor answers")).await
    }

    /// Posts `body` to `path` until the answer's status is `status` (a worker joining its
    /// rotation), returning that answer.
    pub async fn post_until(&self, path: &str, body: &serde_json::Value, status: u16) -> Reply {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let reply = self.post_json(path, body).await;
            if reply.status == status {
                return reply;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path} still answers {}: {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Reply {
    async fn of(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("the body");
        Reply { status, headers, body }
    }
}

/// An Open Inference Protocol gRPC client (`inference.GRPCInferenceService`) of the predictor
/// at `addr`, sending `token`.
pub async fn inference_client(
    addr: SocketAddr,
    token: &str,
) -> kiln_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient<crate::Authed> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect to the predictor");
    kiln_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient::with_interceptor(
        channel,
        kiln_core::auth::BearerInterceptor::new(token),
    )
}

/// Runs `script` (written to `dir/name.py`) with the SDK's Python and `env`, and returns its
/// stdout; panics with its stdout and stderr unless it exits 0 within `limit`.
pub async fn run_python(dir: &Path, name: &str, script: &str, env: &[(&str, &str)], limit: Duration) -> String {
    run_python_with(&python(), dir, name, script, env, limit).await
}

/// [`run_python`] with another interpreter (a venv of its own).
pub async fn run_python_with(
    python: &str,
    dir: &Path,
    name: &str,
    script: &str,
    env: &[(&str, &str)],
    limit: Duration,
) -> String {
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, script).expect("write the script");
    let mut command = tokio::process::Command::new(python);
    command
        .arg(&path)
        .current_dir(dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(limit, command.output())
        .await
        .unwrap_or_else(|_| panic!("{name}.py ran longer than {limit:?}"))
        .expect("run the script");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{name}.py failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}
