//! Runners and item-batch added to the stack: their configurations, started in this process.

use super::*;

/// Isolated process jobs stage datasets and code in their runner's part of the shared work root
/// (`/var/lib/kiln-jobs/.runner-<hash of the work dir>`), outside the stack's temporary
/// directory: every stack's work dir is new, so without this each test left its datasets (a
/// gibibyte for tests/datasets.rs) on the disk for good. The stack's own work dir's part goes,
/// and those of the runners it spawned with work dirs of their own (tests/gang.rs).
impl Drop for Stack {
    fn drop(&mut self) {
        let spawned = std::mem::take(&mut *self.runner_roots.lock().expect("runner roots"));
        for root in self.runner_config("").shared_root().into_iter().chain(spawned) {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

impl Stack {
    /// A runner configuration for this stack: pool `local`, 2 cores, 2 s grace period.
    pub fn runner_config(&self, runner_id: &str) -> kiln_runner::Config {
        kiln_runner::Config {
            grpc: ephemeral(),
            database: self.database.clone(),
            nats: self.nats.service_config(Service::Runner),
            objects: self.objects.clone(),
            secrets: secrets_config(self.dir.path()),
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
            // The tests' jobs reach servers of the test process (item-batch started later, S3,
            // fakes) on ports no runner config names: their network is left open here. The
            // firewall of isolated process jobs is proven by tests/process_isolation.rs, and
            // with the endpoints of `kiln up` by the SDK's and the UI's suites.
            process: kiln_runner::provider::process::config::ProcessConfig {
                firewall: false,
                ..Default::default()
            },
            // As `kiln up`: the predictors of the stack reach the relays on this machine.
            relay: kiln_runner::relay::RelaySettings {
                direct_addr: "127.0.0.1:0".into(),
                ..Default::default()
            },
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
            nats: self.nats.service_config(Service::ItemBatch),
            objects: self.objects.clone(),
            agent_path: agent_binary(),
            scale_interval_ms: 200,
            idle_stop_ms: 2_000,
            retry_backoff_ms: 50,
            ..Default::default()
        }
    }

    /// Starts api, log-ingest, the scheduler, `runner-1` and item-batch with its test config.
    pub async fn start_with_item_batch() -> Stack {
        let mut stack = Stack::start().await;
        stack.start_item_batch(stack.item_batch_config()).await;
        stack
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

    /// A client of the stack's item-batch as the owner of `token`.
    pub async fn batches_as(&self, token: &str) -> BatchServiceClient<Authed> {
        let addr = self.batches_addr.expect("item-batch is started");
        BatchServiceClient::with_interceptor(Self::channel(addr).await, BearerInterceptor::new(token))
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

    /// Notes `config`'s part of the shared work root for the stack's drop to remove.
    fn remember_root(&self, config: &kiln_runner::Config) {
        if let Some(root) = config.shared_root() {
            self.runner_roots.lock().expect("runner roots").push(root);
        }
    }

    pub async fn spawn_runner(&self, config: kiln_runner::Config) -> ServiceHandle {
        self.remember_root(&config);
        let runner = kiln_runner::Runner::bind(config).await.expect("runner binds");
        ServiceHandle::spawn(|token| runner.serve(token))
    }

    /// Starts a runner on the `sim` provider with its metrics in `metrics`, and the handle on
    /// its simulated cloud.
    pub async fn spawn_sim_runner(
        &self,
        config: kiln_runner::Config,
        metrics: &kiln_core::metrics::Metrics,
    ) -> (ServiceHandle, kiln_runner::provider::sim::SimCloud) {
        self.remember_root(&config);
        let runner = kiln_runner::Runner::bind(config)
            .await
            .expect("runner binds")
            .with_metrics(metrics);
        let cloud = runner.sim_cloud().expect("a runner on the sim provider");
        (ServiceHandle::spawn(|token| runner.serve(token)), cloud)
    }

    /// Starts a runner whose lease renewals the returned handle pauses and resumes.
    pub async fn spawn_runner_pausable(&self, config: kiln_runner::Config) -> (ServiceHandle, kiln_runner::LeasePause) {
        self.remember_root(&config);
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
        self.remember_root(&config);
        let runner = kiln_runner::Runner::bind_with_sampler(config, Some(sampler))
            .await
            .expect("runner binds");
        ServiceHandle::spawn(|token| runner.serve(token))
    }
}
