//! kiln-e2e: starts the services' libraries in-process, on port 0, against a real `nats-server`
//! (one per test) and a SQLite file in a temp dir, and hands out authenticated clients.
//! [`Stack::start_on_cluster`] runs them on a three-node NATS cluster with three replicas.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::time::Duration;

use kiln_core::auth::BearerInterceptor;
use kiln_core::config::{DatabaseConfig, GrpcConfig, NatsConfig, ObjectStoreConfig};
use kiln_core::store::Store;
use kiln_core::testing::{NatsCluster, NatsServer, sqlite_config};
use kiln_proto::v1 as pb;
use kiln_proto::v1::artifact_service_client::ArtifactServiceClient;
use kiln_proto::v1::batch_service_client::BatchServiceClient;
use kiln_proto::v1::dataset_service_client::DatasetServiceClient;
use kiln_proto::v1::job_service_client::JobServiceClient;
use kiln_proto::v1::log_service_client::LogServiceClient;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub mod sim;

pub type Authed = InterceptedService<Channel, BearerInterceptor>;

/// How long a test waits for something that should happen in well under a second.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A service task that can be stopped gracefully or crashed.
pub struct ServiceHandle {
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl ServiceHandle {
    fn spawn<F, E>(serve: impl FnOnce(CancellationToken) -> F) -> ServiceHandle
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
/// the URLs of all its nodes.
pub struct StackNats {
    /// The server's URL, or every node's, comma-separated.
    pub url: String,
    config: NatsConfig,
    _server: Option<NatsServer>,
    pub cluster: Option<NatsCluster>,
}

impl StackNats {
    /// One nats-server of its own.
    fn server() -> StackNats {
        let server = NatsServer::start();
        StackNats {
            url: server.url.clone(),
            config: server.config(),
            _server: Some(server),
            cluster: None,
        }
    }

    pub fn config(&self) -> NatsConfig {
        self.config.clone()
    }

    /// The cluster of a stack started with [`Stack::start_on_cluster`].
    pub fn cluster(&mut self) -> &mut NatsCluster {
        self.cluster.as_mut().expect("the stack runs on a NatsCluster")
    }

    /// A plain client of these servers (for reading streams back).
    pub async fn client(&self) -> async_nats::Client {
        let servers: Vec<&str> = self.url.split(',').collect();
        async_nats::connect(servers).await.expect("connect to NATS")
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
    pub token: String,
    pub api: Option<ServiceHandle>,
    pub scheduler: Option<ServiceHandle>,
    pub runner: Option<ServiceHandle>,
    pub logs: Option<ServiceHandle>,
    pub batches: Option<ServiceHandle>,
    pub batches_addr: Option<SocketAddr>,
    /// The registry the stack's own api and scheduler count into.
    pub metrics: kiln_core::metrics::Metrics,
}

/// The workspace's kiln-agent (built with the workspace: `cargo build --workspace`).
pub fn agent_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    // target/<profile>/deps/<test> → target/<profile>/kiln-agent
    let agent = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("kiln-agent"))
        .expect("a target directory");
    assert!(
        agent.try_exists().unwrap_or(false),
        "{} does not exist: build the workspace first (cargo build --workspace)",
        agent.display()
    );
    agent
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
    GrpcConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
    }
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
        let cluster = NatsCluster::start().await;
        let mut stack = Stack::start_services(
            StackNats {
                url: cluster.url.clone(),
                config: cluster.config(),
                _server: None,
                cluster: Some(cluster),
            },
            None,
        )
        .await;
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
        let logs_service = kiln_log_ingest::LogIngest::bind(kiln_log_ingest::Config {
            grpc: ephemeral(),
            database: database.clone(),
            nats: nats.config(),
            sqlite: kiln_log_ingest::config::SqliteConfig {
                logs_path: dir.path().join("logs.db"),
                metrics_path: dir.path().join("metrics.db"),
            },
            ..Default::default()
        })
        .await
        .expect("log-ingest binds");
        let logs_addr = logs_service.local_addr();
        let logs = ServiceHandle::spawn(|token| logs_service.serve(token));
        let scheduler = kiln_scheduler::Scheduler::bind(scheduler_config(&nats, &database, "scheduler-1"))
            .await
            .expect("scheduler binds")
            .with_metrics(&metrics);
        let scheduler = ServiceHandle::spawn(|token| scheduler.serve(token));
        Stack {
            nats,
            dir,
            database,
            objects,
            store,
            api_addr,
            logs_addr,
            token,
            api: Some(api),
            scheduler: Some(scheduler),
            runner: None,
            logs: Some(logs),
            batches: None,
            batches_addr: None,
            metrics,
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

    fn api_config(&self, listen: SocketAddr) -> kiln_api::Config {
        api_config(&self.nats, &self.database, &self.objects, self.dir.path(), listen)
    }

    /// A runner configuration for this stack: pool `local`, 2 cores, 2 s grace period.
    pub fn runner_config(&self, runner_id: &str) -> kiln_runner::Config {
        kiln_runner::Config {
            grpc: ephemeral(),
            database: self.database.clone(),
            nats: self.nats.config(),
            objects: self.objects.clone(),
            runner_id: runner_id.into(),
            pool: "local".into(),
            cpu_millis: 2000,
            memory_bytes: 8 << 30,
            work_dir: self.dir.path().join("work"),
            stop_grace_period_ms: 2000,
            api_url: format!("http://{}", self.api_addr),
            logs_url: format!("http://{}", self.logs_addr),
            report_interval_ms: 200,
            metrics_interval_ms: 200,
            provider: kiln_runner::ProviderKind::Process,
            ..Default::default()
        }
    }

    /// A runner configuration on the test Docker Engine (`KILN_TEST_DOCKER_HOST`).
    pub fn docker_runner_config(&self, runner_id: &str) -> kiln_runner::Config {
        kiln_runner::Config {
            provider: kiln_runner::ProviderKind::Docker,
            docker: kiln_runner::provider::docker::DockerConfig {
                host: docker_host(),
                network: "none".into(),
                ..Default::default()
            },
            ..self.runner_config(runner_id)
        }
    }

    /// Starts api, log-ingest, the scheduler and a docker runner ([`Stack::docker_runner_id`]).
    pub async fn start_docker() -> Stack {
        let mut stack = Stack::start_without_runner().await;
        stack.runner = Some(
            stack
                .spawn_runner(stack.docker_runner_config(&stack.docker_runner_id()))
                .await,
        );
        stack
    }

    /// The id of this stack's docker runner, unique on the engine that tests share.
    pub fn docker_runner_id(&self) -> String {
        let unique = self.dir.path().file_name().unwrap().to_string_lossy().replace('.', "");
        format!("docker-{unique}")
    }

    /// An item-batch configuration for this stack: process workers run the workspace's
    /// kiln-agent; short backoffs and idle times keep tests quick.
    pub fn item_batch_config(&self) -> kiln_item_batch::Config {
        kiln_item_batch::Config {
            grpc: ephemeral(),
            database: self.database.clone(),
            nats: self.nats.config(),
            objects: self.objects.clone(),
            agent_path: agent_binary(),
            scale_interval_ms: 200,
            idle_stop_ms: 2_000,
            retry_backoff_ms: 50,
            ..Default::default()
        }
    }

    /// Starts item-batch (again, after a crash: on the same port, so agents find it).
    pub async fn start_item_batch(&mut self, mut config: kiln_item_batch::Config) {
        if let Some(addr) = self.batches_addr {
            config.grpc.listen = addr;
        }
        let service = kiln_item_batch::ItemBatch::bind(config)
            .await
            .expect("item-batch binds");
        self.batches_addr = Some(service.local_addr());
        self.batches = Some(ServiceHandle::spawn(|token| service.serve(token)));
    }

    pub async fn batches_client(&self) -> BatchServiceClient<Authed> {
        self.batches_client_at(self.batches_addr.expect("item-batch is started"))
            .await
    }

    /// A client of the item-batch replica at `addr`.
    pub async fn batches_client_at(&self, addr: SocketAddr) -> BatchServiceClient<Authed> {
        BatchServiceClient::with_interceptor(Self::channel(addr).await, BearerInterceptor::new(&self.token))
            .max_encoding_message_size(16 << 20)
    }

    /// Starts one more item-batch replica, beside the stack's own; the caller holds it.
    pub async fn spawn_item_batch(&self, config: kiln_item_batch::Config) -> (ServiceHandle, SocketAddr) {
        let service = kiln_item_batch::ItemBatch::bind(config)
            .await
            .expect("item-batch binds");
        let addr = service.local_addr();
        (ServiceHandle::spawn(|token| service.serve(token)), addr)
    }

    pub async fn spawn_runner(&self, config: kiln_runner::Config) -> ServiceHandle {
        let runner = kiln_runner::Runner::bind(config).await.expect("runner binds");
        ServiceHandle::spawn(|token| runner.serve(token))
    }

    /// Starts a runner whose lease renewals the returned handle pauses and resumes.
    pub async fn spawn_runner_pausable(&self, config: kiln_runner::Config) -> (ServiceHandle, kiln_runner::LeasePause) {
        let runner = kiln_runner::Runner::bind(config).await.expect("runner binds");
        let pause = runner.lease_pause();
        (ServiceHandle::spawn(|token| runner.serve(token)), pause)
    }

    /// Starts a runner whose GPU utilisation comes from `sampler`.
    pub async fn spawn_runner_with_sampler(
        &self,
        config: kiln_runner::Config,
        sampler: std::sync::Arc<dyn kiln_runner::gpu::GpuSampler>,
    ) -> ServiceHandle {
        let runner = kiln_runner::Runner::bind_with_sampler(config, Some(sampler))
            .await
            .expect("runner binds");
        ServiceHandle::spawn(|token| runner.serve(token))
    }

    async fn channel(addr: SocketAddr) -> Channel {
        Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn jobs(&self) -> JobServiceClient<Authed> {
        self.jobs_as(&self.token).await
    }

    pub async fn jobs_as(&self, token: &str) -> JobServiceClient<Authed> {
        JobServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(token))
    }

    pub async fn artifacts(&self) -> ArtifactServiceClient<Authed> {
        ArtifactServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(&self.token))
    }

    pub async fn datasets(&self) -> DatasetServiceClient<Authed> {
        self.datasets_as(&self.token).await
    }

    pub async fn datasets_as(&self, token: &str) -> DatasetServiceClient<Authed> {
        DatasetServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(token))
    }

    pub async fn logs_client(&self) -> LogServiceClient<Authed> {
        self.logs_as(&self.token).await
    }

    pub async fn logs_as(&self, token: &str) -> LogServiceClient<Authed> {
        LogServiceClient::with_interceptor(Self::channel(self.logs_addr).await, BearerInterceptor::new(token))
    }

    /// Submits a job without code.
    pub async fn submit(&self, command: &[&str]) -> pb::Job {
        self.submit_spec(spec(command)).await
    }

    pub async fn submit_spec(&self, spec: pb::JobSpec) -> pb::Job {
        let response = self
            .jobs()
            .await
            .submit_job(pb::SubmitJobRequest {
                spec: Some(spec),
                ..Default::default()
            })
            .await;
        response.expect("submit").into_inner().job.expect("job")
    }

    pub async fn get(&self, job_id: &str) -> pb::Job {
        self.jobs()
            .await
            .get_job(pb::GetJobRequest { job_id: job_id.into() })
            .await
            .expect("get")
            .into_inner()
    }

    /// Stops a job and waits until it is STOPPED.
    pub async fn stop_job(&self, job_id: &str) -> pb::Job {
        self.jobs()
            .await
            .stop_job(pb::StopJobRequest { job_id: job_id.into() })
            .await
            .expect("stop");
        self.wait_for_state(job_id, pb::JobState::Stopped).await
    }

    /// Waits until the job satisfies `done`, panicking with the job after [`PATIENCE`].
    pub async fn wait_for(&self, job_id: &str, what: &str, done: impl Fn(&pb::Job) -> bool) -> pb::Job {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let job = self.get(job_id).await;
            if done(&job) {
                return job;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {job:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_for_state(&self, job_id: &str, state: pb::JobState) -> pb::Job {
        self.wait_for(job_id, state.as_str_name(), |job| job.state == state as i32)
            .await
    }

    /// Reads all of a job's log lines (following until the job ends when `follow`).
    pub async fn log_lines(&self, job_id: &str, follow: bool) -> Vec<pb::LogLine> {
        use futures::StreamExt;
        let request = pb::GetLogsRequest {
            job_id: job_id.into(),
            follow,
        };
        let mut stream = self
            .logs_client()
            .await
            .get_logs(request)
            .await
            .expect("get logs")
            .into_inner();
        let mut lines = Vec::new();
        while let Some(line) = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("log stream stalled")
        {
            lines.push(line.expect("log line"));
        }
        lines
    }
}

fn api_config(
    nats: &StackNats,
    database: &DatabaseConfig,
    objects: &ObjectStoreConfig,
    dir: &std::path::Path,
    listen: SocketAddr,
) -> kiln_api::Config {
    kiln_api::Config {
        grpc: GrpcConfig { listen },
        database: database.clone(),
        nats: nats.config(),
        objects: objects.clone(),
        bootstrap_token_file: dir.join("admin.token"),
        reconcile_interval_ms: 200,
        ..Default::default()
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

/// A spec for a small job without code.
pub fn spec(command: &[&str]) -> pb::JobSpec {
    pb::JobSpec {
        command: command.iter().map(|s| s.to_string()).collect(),
        resources: Some(pb::Resources {
            cpu_millis: 500,
            memory_bytes: 64 << 20,
        }),
        ..Default::default()
    }
}

/// Builds a tar.gz code bundle from (path, content) pairs and returns it with its sha256.
pub fn bundle(files: &[(&str, &str)]) -> (Vec<u8>, String) {
    use sha2::Digest;
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for (path, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, path, content.as_bytes())
            .expect("append");
    }
    let bytes = builder.into_inner().expect("tar").finish().expect("gzip");
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    (bytes, digest)
}

/// Uploads a bundle through `ArtifactService`.
pub async fn upload(
    client: &mut ArtifactServiceClient<Authed>,
    bytes: &[u8],
    digest: &str,
) -> Result<pb::UploadArtifactResponse, tonic::Status> {
    use pb::upload_artifact_request::Part;
    let mut messages = vec![pb::UploadArtifactRequest {
        part: Some(Part::Header(pb::ArtifactHeader {
            digest: digest.into(),
            size: bytes.len() as u64,
        })),
    }];
    messages.extend(bytes.chunks(1000).map(|c| pb::UploadArtifactRequest {
        part: Some(Part::Chunk(c.to_vec())),
    }));
    client
        .upload_artifact(futures::stream::iter(messages))
        .await
        .map(|r| r.into_inner())
}

/// Tells whether a process with this pid exists (zombies count as gone).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// The pid in an instance id `pid:<n>`.
pub fn pid_of(job: &pb::Job) -> i32 {
    job.instance_id
        .strip_prefix("pid:")
        .and_then(|p| p.parse().ok())
        .expect("a process instance id")
}

/// The Docker Engine of the tests; scripts/test.sh starts one when none runs.
pub fn docker_host() -> String {
    std::env::var("KILN_TEST_DOCKER_HOST")
        .expect("KILN_TEST_DOCKER_HOST is not set: run the tests through scripts/test.sh, which starts dockerd")
}

/// The image the docker tests run (busybox, built locally by scripts/test-image.sh).
pub fn test_image() -> String {
    std::env::var("KILN_TEST_IMAGE")
        .expect("KILN_TEST_IMAGE is not set: run the tests through scripts/test.sh, which builds it")
}

/// A client of the test Docker Engine, for checking what kiln left on it.
pub async fn docker() -> bollard::Docker {
    let host = docker_host();
    let path = host.strip_prefix("unix://").expect("a unix socket");
    bollard::Docker::connect_with_socket(path, 60, bollard::API_DEFAULT_VERSION)
        .expect("connect to the engine")
        .negotiate_version()
        .await
        .expect("negotiate")
}

/// Containers and volumes on the engine labelled with `label=value`.
pub async fn labelled(docker: &bollard::Docker, label: &str, value: &str) -> (Vec<String>, Vec<String>) {
    use std::collections::HashMap;
    let filters = HashMap::from([("label", vec![format!("{label}={value}")])]);
    let containers = docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list containers")
        .into_iter()
        .filter_map(|c| c.id)
        .collect();
    let volumes = docker
        .list_volumes(Some(
            bollard::query_parameters::ListVolumesOptionsBuilder::new()
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list volumes")
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect();
    (containers, volumes)
}

/// Reads a job's synced output file.
pub async fn output(stack: &Stack, job_id: &str, path: &str) -> Result<String, tonic::Status> {
    use futures::StreamExt;
    let request = pb::GetOutputRequest {
        job_id: job_id.into(),
        path: path.into(),
    };
    let mut chunks = stack.artifacts().await.get_output(request).await?.into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = chunks.next().await {
        data.extend(chunk?.data);
    }
    Ok(String::from_utf8_lossy(&data).into_owned())
}

/// The files a job's synced outputs hold, through `ListOutputs`, sorted by path.
pub async fn output_files(stack: &Stack, job_id: &str) -> Vec<pb::OutputFile> {
    let request = pb::ListOutputsRequest {
        job_id: job_id.into(),
        prefix: String::new(),
    };
    let response = stack.artifacts().await.list_outputs(request).await;
    response.expect("list outputs").into_inner().files
}

/// Every message stored so far on `subject` of `stream`, in order. Read again after an error
/// (on a cluster, a new consumer may have no leader for a moment).
pub async fn stored_messages(stack: &Stack, stream: &str, subject: String) -> Vec<bytes::Bytes> {
    let js = async_nats::jetstream::new(stack.nats.client().await);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match read_stored(&js, stream, &subject).await {
            Ok(payloads) => return payloads,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("cannot read {subject} from {stream}: {error}"),
        }
    }
}

async fn read_stored(
    js: &async_nats::jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<Vec<bytes::Bytes>, Box<dyn std::error::Error + Send + Sync>> {
    use async_nats::jetstream::consumer::pull;
    use futures::StreamExt;
    let stream = js.get_stream(stream).await?;
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: subject.to_string(),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer
        .fetch()
        .max_messages(10_000)
        .expires(Duration::from_millis(500))
        .messages()
        .await?;
    let mut payloads = Vec::new();
    while let Some(message) = messages.next().await {
        payloads.push(message?.payload.clone());
    }
    Ok(payloads)
}

/// The metric batches published for a job so far (read back from `KILN_METRICS`).
pub async fn metric_batches(stack: &Stack, job_id: &str) -> Vec<pb::MetricBatch> {
    use prost::Message;
    stored_messages(
        stack,
        kiln_core::subjects::STREAM_METRICS,
        kiln_core::subjects::metrics(job_id),
    )
    .await
    .iter()
    .map(|payload| pb::MetricBatch::decode(payload.as_ref()).expect("a metric batch"))
    .collect()
}

/// Preempts a running job as a higher priority would (ACTION_PREEMPT to its runner): SIGTERM,
/// the grace period, outputs synced, queued again with `resume_from` set.
pub async fn preempt(stack: &Stack, job_id: &str) {
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.expect("nats");
    let job = stack.store.job(job_id).await.expect("job record");
    kiln_core::events::preempt_job(&nats, &job, "a-test")
        .await
        .expect("preempt");
}

/// Waits until a job has logged a line starting with `prefix`.
pub async fn wait_for_line(stack: &Stack, job_id: &str, prefix: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let lines = stack.log_lines(job_id, false).await;
        if lines.iter().any(|l| l.text.starts_with(prefix)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no line {prefix:?} in {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A job script that checkpoints `step-42` into its outputs when it is stopped, and, as a
/// resumed attempt, prints `resumed <attempt> <checkpoint> <KILN_RESUME_FROM>` and ends.
pub const CHECKPOINTING_SCRIPT: &str = r#"
if [ -n "$KILN_RESUME_FROM" ]; then
  echo "resumed $KILN_ATTEMPT $(cat "$KILN_RESUME_FROM/ckpt/step.txt") $KILN_RESUME_FROM"
  exit 0
fi
trap 'mkdir -p "$KILN_OUTPUTS/ckpt"; echo step-42 > "$KILN_OUTPUTS/ckpt/step.txt"; exit 0' TERM
echo ready
sleep 60 &
wait
"#;

/// Runs [`CHECKPOINTING_SCRIPT`] as `job_spec` (its command replaced), preempts its first
/// attempt once ready, and checks that the second succeeds, finds the checkpoint and syncs it
/// again. Returns the job and the second attempt's `resumed …` line, for the caller to check
/// where `KILN_RESUME_FROM` pointed.
pub async fn preempted_and_resumed(stack: &Stack, mut job_spec: pb::JobSpec) -> (pb::Job, String) {
    job_spec.command = ["sh", "-c", CHECKPOINTING_SCRIPT].map(String::from).to_vec();
    let job = stack.submit_spec(job_spec).await;
    wait_for_line(stack, &job.id, "ready").await;
    preempt(stack, &job.id).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!((done.attempt, done.preemptions), (2, 1), "{done:?}");
    let lines = stack.log_lines(&job.id, true).await;
    let resumed: Vec<&str> = lines.iter().filter_map(|l| l.text.strip_prefix("resumed ")).collect();
    let [resumed] = resumed[..] else {
        panic!("one resumed line in {lines:?}");
    };
    assert_eq!(output(stack, &job.id, "ckpt/step.txt").await.unwrap(), "step-42\n");
    let resumed = resumed.to_string();
    (done, resumed)
}

/// The state changes published for a job (all but QUEUED), in order.
pub async fn job_events(stack: &Stack, job_id: &str) -> Vec<pb::JobEvent> {
    use prost::Message;
    stored_messages(
        stack,
        kiln_core::subjects::STREAM_JOBS,
        kiln_core::subjects::job_event(job_id),
    )
    .await
    .iter()
    .map(|payload| pb::JobEvent::decode(payload.as_ref()).expect("a job event"))
    .collect()
}

/// A scheduler configuration for a stack.
pub fn scheduler_config(nats: &StackNats, database: &DatabaseConfig, name: &str) -> kiln_scheduler::Config {
    kiln_scheduler::Config {
        grpc: ephemeral(),
        database: database.clone(),
        nats: nats.config(),
        pass_interval_ms: 100,
        instance_name: name.to_string(),
        lease_ttl_ms: 1_500,
        ..Default::default()
    }
}

/// Starts a scheduler (it leads once it holds the lease).
pub async fn spawn_scheduler(config: kiln_scheduler::Config) -> ServiceHandle {
    let scheduler = kiln_scheduler::Scheduler::bind(config).await.expect("scheduler binds");
    ServiceHandle::spawn(|token| scheduler.serve(token))
}

/// Checks that a batch's counters add up to its total.
pub fn assert_adds_up(c: &pb::BatchCounts) {
    assert_eq!(
        c.pending + c.running + c.succeeded + c.failed + c.dead,
        c.total,
        "{c:?}"
    );
}

/// A batch run to its end: its last state, and the most workers seen live at a poll.
pub struct BatchRun {
    pub done: pb::Batch,
    pub most_workers: u32,
}

/// Polls a batch every 500 ms until it is DONE, checking at every poll that its counters add
/// up. Past `deadline` it gives the last state back as the error, for the caller's report.
pub async fn run_batch_to_done(
    client: &mut BatchServiceClient<Authed>,
    batch_id: &str,
    deadline: tokio::time::Instant,
) -> Result<BatchRun, pb::Batch> {
    let mut most_workers = 0;
    loop {
        let now = client
            .get_batch(pb::BatchRef {
                batch_id: batch_id.to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        most_workers = most_workers.max(now.workers);
        assert_adds_up(&now.counts.unwrap());
        if now.state == pb::BatchState::Done as i32 {
            return Ok(BatchRun {
                done: now,
                most_workers,
            });
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(now);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
