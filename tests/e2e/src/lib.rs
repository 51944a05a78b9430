//! kiln-e2e: starts the services' libraries in-process, on port 0, against a real `nats-server`
//! (one per test) and a SQLite file in a temp dir, and hands out authenticated clients.
//! [`Stack::start_on_cluster`] runs them on a three-node NATS cluster with three replicas.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::time::Duration;

use kiln_core::auth::BearerInterceptor;
use kiln_core::config::{DatabaseConfig, GrpcConfig, NatsConfig, ObjectStoreConfig};
use kiln_core::nats_auth::Service;
use kiln_core::store::Store;
use kiln_core::testing::{NatsCluster, NatsServer, SecureNatsServer, sqlite_config};
use kiln_proto::v1 as pb;
use kiln_proto::v1::artifact_service_client::ArtifactServiceClient;
use kiln_proto::v1::batch_service_client::BatchServiceClient;
use kiln_proto::v1::dataset_service_client::DatasetServiceClient;
use kiln_proto::v1::job_service_client::JobServiceClient;
use kiln_proto::v1::log_service_client::LogServiceClient;
use kiln_proto::v1::model_service_client::ModelServiceClient;
use kiln_proto::v1::secret_service_client::SecretServiceClient;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

mod batches;
pub mod boot_bridge;
mod clients;
mod configs;
mod docker;
pub mod ec2;
mod jobs;
pub mod references;
pub mod registry;
pub mod rpc;
pub mod serve_world;
mod services;
pub mod serving;
pub mod sim;
pub mod sim_fleet;
mod streams;
pub mod sweeps;
mod tenancy;
pub mod two_projects;

pub use batches::*;
use configs::{api_config, logs_config};
pub use configs::{scheduler_config, secrets_config, spawn_scheduler};
pub use docker::*;
pub use jobs::*;
pub use streams::*;

pub type Authed = InterceptedService<Channel, BearerInterceptor>;

/// How long a test waits for something that should happen in well under a second.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A service task that can be stopped gracefully or crashed.
pub struct ServiceHandle {
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl ServiceHandle {
    pub fn spawn<F, E>(serve: impl FnOnce(CancellationToken) -> F) -> ServiceHandle
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let shutdown = CancellationToken::new();
        let future = serve(shutdown.clone());
        let task = tokio::spawn(async move {
            if let Err(error) = future.await {
                panic!("service failed: {error}");
            }
        });
        ServiceHandle { shutdown, task }
    }

    /// Drops the service mid-flight, as a crash would: its tasks are aborted at their next
    /// await point and nothing runs its shutdown path.
    pub async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Shuts the service down gracefully and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("service task");
    }
}

/// The NATS of a stack: one server, or a cluster (`cluster` set) the services reach through
/// the URLs of all its nodes. Every server admits only NKey users: each service connects with
/// its own seed and the permissions of `kiln_core::nats_auth` (so the whole suite shows the
/// permission table is enough), the tests with a harness seed that has every subject.
pub struct StackNats {
    /// The server's URL, or every node's, comma-separated.
    pub url: String,
    config: NatsConfig,
    _server: Option<NatsServer>,
    pub cluster: Option<NatsCluster>,
    /// The server of [`Stack::start_on_secure_nats`] (TLS with client certificates, an NKey).
    pub secure: Option<SecureNatsServer>,
}

impl StackNats {
    /// The JetStream store of the stack's own server (none on a cluster).
    pub fn store_dir(&self) -> Option<&std::path::Path> {
        self._server.as_ref().map(NatsServer::store_dir)
    }

    /// One nats-server of its own.
    fn server() -> StackNats {
        let server = NatsServer::start_authorized();
        StackNats {
            url: server.url.clone(),
            config: server.config(),
            _server: Some(server),
            cluster: None,
            secure: None,
        }
    }

    /// The test harness's configuration (every subject): for tests that read streams back.
    pub fn config(&self) -> NatsConfig {
        self.config.clone()
    }

    /// The configuration of `service`, with its own seed.
    pub fn service_config(&self, service: Service) -> NatsConfig {
        if let Some(server) = &self._server {
            return server.service_config(service);
        }
        if let Some(cluster) = &self.cluster {
            return cluster.service_config(service);
        }
        if let Some(secure) = &self.secure {
            return secure.service_config(service);
        }
        self.config()
    }

    /// The cluster of a stack started with [`Stack::start_on_cluster`].
    pub fn cluster(&mut self) -> &mut NatsCluster {
        self.cluster.as_mut().expect("the stack runs on a NatsCluster")
    }

    /// A plain client of these servers (for reading streams back).
    pub async fn client(&self) -> async_nats::Client {
        let servers: Vec<&str> = self.url.split(',').collect();
        let options = match &self.config.nkey_seed_file {
            Some(path) => {
                let seed = std::fs::read_to_string(path).expect("the harness seed");
                async_nats::ConnectOptions::with_nkey(seed.trim().to_string())
            }
            None => async_nats::ConnectOptions::new(),
        };
        options.connect(servers).await.expect("connect to NATS")
    }
}

/// The kiln services in this process (item-batch when started with [`Stack::start_item_batch`]).
pub struct Stack {
    pub nats: StackNats,
    pub dir: tempfile::TempDir,
    pub database: DatabaseConfig,
    pub objects: ObjectStoreConfig,
    pub store: Store,
    pub api_addr: SocketAddr,
    pub logs_addr: SocketAddr,
    pub scheduler_addr: SocketAddr,
    pub token: String,
    pub api: Option<ServiceHandle>,
    pub scheduler: Option<ServiceHandle>,
    pub runner: Option<ServiceHandle>,
    pub logs: Option<ServiceHandle>,
    pub batches: Option<ServiceHandle>,
    pub batches_addr: Option<SocketAddr>,
    pub advisor: Option<ServiceHandle>,
    pub advisor_addr: Option<SocketAddr>,
    /// The registry the stack's own api and scheduler count into.
    pub metrics: kiln_core::metrics::Metrics,
    /// The parts of the shared work root of the runners the stack spawned, removed when it is
    /// dropped (runners of other work dirs than the stack's own have parts of their own).
    runner_roots: std::sync::Mutex<Vec<std::path::PathBuf>>,
}

/// The workspace's kiln-agent (built with the workspace: `cargo build --workspace`).
pub fn agent_binary() -> std::path::PathBuf {
    workspace_binary("kiln-agent")
}

/// A binary of the workspace beside the test's own build (`cargo build --workspace` makes
/// them): for tests that run a service in a process of its own, to SIGKILL it or to measure it.
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let binary = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join(name))
        .expect("a target directory");
    assert!(
        binary.try_exists().unwrap_or(false),
        "{} does not exist: build the workspace first (cargo build --workspace)",
        binary.display()
    );
    binary
}

/// The static kiln-agent that batch workers' containers run (scripts/build-agent.sh builds it;
/// scripts/setup.sh runs that).
pub fn static_agent_binary() -> std::path::PathBuf {
    let profile_dir = agent_binary()
        .parent()
        .map(std::path::Path::to_path_buf)
        .expect("a profile dir");
    let profile = profile_dir.file_name().expect("a profile name").to_owned();
    let target = profile_dir.parent().expect("the target dir");
    let agent = target.join("x86_64-unknown-linux-gnu").join(profile).join("kiln-agent");
    assert!(
        agent.try_exists().unwrap_or(false),
        "{} does not exist: build it with scripts/build-agent.sh",
        agent.display()
    );
    agent
}

fn ephemeral() -> GrpcConfig {
    GrpcConfig::at(SocketAddr::from(([127, 0, 0, 1], 0)))
}

impl Stack {
    /// Starts api, log-ingest, scheduler and one runner (`runner-1`, pool `local`).
    pub async fn start() -> Stack {
        let mut stack = Stack::start_without_runner().await;
        stack.runner = Some(stack.spawn_runner(stack.runner_config("runner-1")).await);
        stack
    }

    /// Starts api, log-ingest, scheduler and one runner (`runner-1`, pool `local`), keeping
    /// blobs in `objects` (an S3 bucket: `kiln_core::testing::s3_objects_config`).
    pub async fn start_with_objects(objects: ObjectStoreConfig) -> Stack {
        let mut stack = Stack::start_services(StackNats::server(), Some(objects)).await;
        stack.runner = Some(stack.spawn_runner(stack.runner_config("runner-1")).await);
        stack
    }

    /// Starts api, log-ingest and the scheduler.
    pub async fn start_without_runner() -> Stack {
        Stack::start_services(StackNats::server(), None).await
    }

    /// Starts api, log-ingest, the scheduler and `runner-1` on a three-node NATS cluster, with
    /// `nats.replicas = 3` and every node's URL in `nats.url`.
    pub async fn start_on_cluster() -> Stack {
        let cluster = NatsCluster::start_authorized().await;
        let mut stack = Stack::start_services(
            StackNats {
                url: cluster.url.clone(),
                config: cluster.config(),
                _server: None,
                cluster: Some(cluster),
                secure: None,
            },
            None,
        )
        .await;
        stack.runner = Some(stack.spawn_runner(stack.runner_config("runner-1")).await);
        stack
    }

    /// Starts api, log-ingest, the scheduler and `runner-1` on a nats-server that requires TLS
    /// with a client certificate and an NKey user per service (`kiln_core::testing::SecureNatsServer`).
    pub async fn start_on_secure_nats() -> Stack {
        let secure = SecureNatsServer::start();
        let nats = StackNats {
            url: secure.server.url.clone(),
            config: secure.config(),
            _server: None,
            cluster: None,
            secure: Some(secure),
        };
        let mut stack = Stack::start_services(nats, None).await;
        stack.runner = Some(stack.spawn_runner(stack.runner_config("runner-1")).await);
        stack
    }

    /// Starts api, log-ingest and the scheduler on `nats`, with blobs in `objects`, else in
    /// `objects/` of the stack's temp dir.
    async fn start_services(nats: StackNats, objects: Option<ObjectStoreConfig>) -> Stack {
        // Service logs only when asked for (KILN_LOG=info cargo test …): they are not captured.
        if std::env::var_os("KILN_LOG").is_some() {
            kiln_core::telemetry::init(false);
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let database = sqlite_config(dir.path());
        let objects = objects.unwrap_or_else(|| ObjectStoreConfig::local(dir.path().join("objects")));
        let metrics = kiln_core::metrics::Metrics::default();
        let (api, api_addr) = start_api(&nats, &database, &objects, dir.path(), &metrics).await;
        let token = std::fs::read_to_string(dir.path().join("admin.token"))
            .expect("admin token")
            .trim()
            .to_string();
        let store = Store::connect(&database).await.expect("store");
        let logs_service = kiln_log_ingest::LogIngest::bind(logs_config(&nats, &database, dir.path(), ephemeral()))
            .await
            .expect("log-ingest binds");
        let logs_addr = logs_service.local_addr();
        let logs = ServiceHandle::spawn(|token| logs_service.serve(token));
        let scheduler = kiln_scheduler::Scheduler::bind(scheduler_config(&nats, &database, "scheduler-1"))
            .await
            .expect("scheduler binds")
            .with_metrics(&metrics);
        let scheduler_addr = scheduler.local_addr();
        let scheduler = ServiceHandle::spawn(|token| scheduler.serve(token));
        Stack {
            nats,
            dir,
            database,
            objects,
            store,
            api_addr,
            logs_addr,
            scheduler_addr,
            token,
            api: Some(api),
            scheduler: Some(scheduler),
            runner: None,
            logs: Some(logs),
            batches: None,
            batches_addr: None,
            advisor: None,
            advisor_addr: None,
            metrics,
            runner_roots: std::sync::Mutex::default(),
        }
    }

    /// A scheduler configuration for this stack (a pass at least every 100 ms, a 1.5 s lease).
    pub fn scheduler_config(&self, name: &str) -> kiln_scheduler::Config {
        scheduler_config(&self.nats, &self.database, name)
    }

    /// The directory of this stack's object store (the default, local one).
    pub fn objects_dir(&self) -> std::path::PathBuf {
        self.objects
            .local_dir()
            .expect("this stack's object store is a local directory")
    }

    /// Restarts the api (after a crash of it).
    pub async fn restart_api(&mut self) {
        let config = self.api_config(SocketAddr::from(([127, 0, 0, 1], self.api_addr.port())));
        let api = kiln_api::Api::bind(config).await.expect("api binds again");
        self.api = Some(ServiceHandle::spawn(|token| api.serve(token)));
    }

    /// Restarts log-ingest on its address (after a stop or crash of it).
    pub async fn restart_logs(&mut self) {
        let listen = GrpcConfig::at(SocketAddr::from(([127, 0, 0, 1], self.logs_addr.port())));
        let config = logs_config(&self.nats, &self.database, self.dir.path(), listen);
        let logs = kiln_log_ingest::LogIngest::bind(config)
            .await
            .expect("log-ingest binds again");
        self.logs = Some(ServiceHandle::spawn(|token| logs.serve(token)));
    }

    fn api_config(&self, listen: SocketAddr) -> kiln_api::Config {
        api_config(&self.nats, &self.database, &self.objects, self.dir.path(), listen)
    }

    async fn channel(addr: SocketAddr) -> Channel {
        Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }
}

async fn start_api(
    nats: &StackNats,
    database: &DatabaseConfig,
    objects: &ObjectStoreConfig,
    dir: &std::path::Path,
    metrics: &kiln_core::metrics::Metrics,
) -> (ServiceHandle, SocketAddr) {
    let config = api_config(nats, database, objects, dir, ephemeral().listen);
    let api = kiln_api::Api::bind(config)
        .await
        .expect("api binds")
        .with_metrics(metrics);
    let addr = api.local_addr();
    (ServiceHandle::spawn(|token| api.serve(token)), addr)
}
