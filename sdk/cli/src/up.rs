//! `kiln up`: every service in one process on embedded defaults — a child `nats-server` with
//! JetStream, SQLite and a local object-store directory under `KILN_HOME`.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use kiln_core::config::{DatabaseConfig, DatabaseUrl, GrpcConfig, NatsConfig, ObjectStoreConfig};
use kiln_core::metrics::{Metrics, MetricsConfig};
use kiln_core::nats_auth::Service;
use tokio::task::JoinSet;

use crate::client::{self, Credentials};
use crate::nats_child::NatsChild;
use crate::tools::{self, ToolDirs};

mod nats_users;
mod tls;

use nats_users::UpNatsUsers;

/// The nats-server version the scripts install and `kiln up` is tested with.
pub const NATS_SERVER_VERSION: &str = "2.15.1";

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Where kiln keeps its data (default: KILN_HOME, else ~/.kiln).
    #[arg(long)]
    pub home: Option<PathBuf>,
    /// Address of the api.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub api_addr: SocketAddr,
    /// Stop a job whose GPUs stay under 5% busy for this long, in seconds (0: never).
    #[arg(long, default_value_t = 1800)]
    pub idle_gpu_window_secs: u64,
    /// Where `/metrics` of every service is served (Prometheus text format).
    #[arg(long, default_value = "127.0.0.1:9470")]
    pub metrics_addr: SocketAddr,
    /// Address of log-ingest.
    #[arg(long, default_value = "127.0.0.1:7071")]
    pub logs_addr: SocketAddr,
    /// Address of item-batch (BatchService, and the agents of batch workers). Workers in
    /// containers reach it through the Docker bridge's gateway: for batches with --image, listen
    /// on 0.0.0.0:7075, with --tls-cert/--tls-key (or --insecure).
    #[arg(long, default_value = "127.0.0.1:7075")]
    pub batch_addr: SocketAddr,
    /// Address of the advisor (SweepService, and `kiln.should_stop()` of trials).
    #[arg(long, default_value = "127.0.0.1:7076")]
    pub advisor_addr: SocketAddr,
    /// Address of the predictor's gRPC API (ServeService).
    #[arg(long, default_value = "127.0.0.1:7077")]
    pub predictor_addr: SocketAddr,
    /// Address of the predictor's Open Inference Protocol REST API (plain HTTP).
    #[arg(long, default_value = "127.0.0.1:7078")]
    pub predictor_http_addr: SocketAddr,
    /// Address of the web UI and its HTTP API (over HTTPS with --tls-cert).
    #[arg(long, default_value = "127.0.0.1:7079")]
    pub http_addr: SocketAddr,
    /// The built web UI (ui/dist; default: KILN_UI_DIR, else the `ui` directory of the tool
    /// directories, where scripts/setup.sh installs it). Without one the HTTP API is served
    /// alone.
    #[arg(long, env = "KILN_UI_DIR")]
    pub ui_dir: Option<PathBuf>,
    /// The static kiln-agent put into batch workers' containers (scripts/setup.sh builds it
    /// and installs it as kiln-agent in its tools; default: found like nats-server); without
    /// one, batches with an image cannot start workers.
    #[arg(long, env = "KILN_AGENT_BINARY")]
    pub agent_binary: Option<PathBuf>,
    /// Use this NATS server (with JetStream) instead of starting one.
    #[arg(long)]
    pub nats_url: Option<String>,
    /// The nats-server binary to start (default: the first nats-server in KILN_TOOLS/bin,
    /// KILN_HOME/tools/bin, ~/.kiln/tools/bin, then PATH).
    #[arg(long, env = "KILN_NATS_SERVER")]
    pub nats_server: Option<PathBuf>,
    /// Where jobs run: docker when an engine answers (default), else local processes.
    #[arg(long, value_enum, default_value = "auto")]
    pub provider: ProviderArg,
    /// The Docker Engine to use (default: DOCKER_HOST, else the local socket).
    #[arg(long, env = "DOCKER_HOST")]
    pub docker_host: Option<String>,
    /// Lets job containers reach everything the host reaches (the services' ports, the cloud's
    /// instance metadata). By default they run on their own network (`kiln-jobs`) behind an
    /// iptables firewall, which needs root (or CAP_NET_ADMIN) and the iptables program;
    /// without them, jobs with --image are refused. See docs/security/network.md.
    #[arg(long)]
    pub no_job_isolation: bool,
    /// Where metric points are kept: sqlite (under KILN_HOME) or scylla.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub metric_store: StoreArg,
    /// Where log lines are kept: sqlite (under KILN_HOME) or scylla.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub log_store: StoreArg,
    /// ScyllaDB (or Cassandra) contact points for the scylla stores, host:port, comma-separated.
    #[arg(long, default_value = "127.0.0.1:9042")]
    pub scylla_nodes: String,
    /// Time a stopped job gets between SIGTERM and SIGKILL, in seconds.
    #[arg(long, default_value_t = 10)]
    pub grace_period: u64,
    #[command(flatten)]
    pub tls: tls::TlsArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreArg {
    Sqlite,
    Scylla,
}

impl From<StoreArg> for kiln_log_ingest::StoreKind {
    fn from(store: StoreArg) -> Self {
        match store {
            StoreArg::Sqlite => kiln_log_ingest::StoreKind::Sqlite,
            StoreArg::Scylla => kiln_log_ingest::StoreKind::Scylla,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderArg {
    Auto,
    Docker,
    Process,
}

/// Finds a program `kiln up` needs, or says where it looked and how to get it.
fn find(program: &str, flag: Option<&Path>, home: &Path, remedy: &str) -> Result<PathBuf> {
    tools::find_tool(program, flag, &ToolDirs::from_env(home)).map_err(|looked| anyhow::anyhow!("{looked}: {remedy}"))
}

/// The built web UI to serve: `--ui-dir` (or KILN_UI_DIR), else `ui/` of the tool directories.
fn ui_dir(args: &UpArgs, home: &Path) -> Option<PathBuf> {
    if let Some(dir) = &args.ui_dir {
        return Some(dir.clone());
    }
    let found = ToolDirs::from_env(home)
        .roots()
        .into_iter()
        .map(|tools| tools.join("ui"))
        .find(|dir| dir.join("index.html").is_file());
    if found.is_none() {
        eprintln!(
            "kiln: warning: no built web UI found (run scripts/ui.sh build, or pass --ui-dir); serving the HTTP API alone"
        );
    }
    found
}

/// Takes the `KILN_HOME` lock, so two `kiln up` never share a data directory.
fn lock_home(home: &Path) -> Result<File> {
    let path = home.join("kiln.lock");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "another `kiln up` is running with KILN_HOME={} (pid {}); stop it first or use another --home",
                home.display(),
                holder.trim()
            );
        }
        Err(std::fs::TryLockError::Error(error)) => {
            return Err(error).context("cannot lock KILN_HOME");
        }
    }
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    Ok(file)
}

pub async fn up(args: UpArgs) -> Result<ExitCode> {
    kiln_core::telemetry::init(false);
    let home = args.home.clone().unwrap_or_else(client::kiln_home);
    std::fs::create_dir_all(&home).with_context(|| format!("cannot create {}", home.display()))?;
    let home = home.canonicalize()?;
    // Kiln's own: no other user (a process job run as a uid of its own, say) lists or reads it.
    std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .with_context(|| format!("cannot make {} private", home.display()))?;
    args.tls.check_exposure(&[
        ("--api-addr", args.api_addr),
        ("--logs-addr", args.logs_addr),
        ("--batch-addr", args.batch_addr),
        ("--http-addr", args.http_addr),
    ])?;
    let _lock = lock_home(&home)?;

    // With a server of its own, each service gets its own NKey user; with --nats-url, the
    // server's operator decides who may connect (the services connect without a seed).
    let (nats_child, nats_users) = match &args.nats_url {
        Some(_) => (None, None),
        None => {
            let remedy = format!(
                "run scripts/setup.sh (it installs nats-server {NATS_SERVER_VERSION}), or pass --nats-server PATH or --nats-url URL"
            );
            let binary = find("nats-server", args.nats_server.as_deref(), &home, &remedy)?;
            let users = UpNatsUsers::prepare(&home)?;
            (
                Some(NatsChild::start(&binary, &home, &users.server_config).await?),
                Some(users),
            )
        }
    };
    let remedy = "batches with --image cannot start workers; run scripts/build-agent.sh and pass --agent-binary PATH, or rerun scripts/setup.sh (it installs kiln-agent)";
    let args = UpArgs {
        agent_binary: match find("kiln-agent", args.agent_binary.as_deref(), &home, remedy) {
            Ok(agent) => Some(agent),
            Err(error) if args.agent_binary.is_none() => {
                eprintln!("kiln: warning: {error:#}");
                None
            }
            Err(error) => return Err(error.context("--agent-binary")),
        },
        ..args
    };
    let nats_url = args
        .nats_url
        .clone()
        .or_else(|| nats_child.as_ref().map(|n| n.url.clone()))
        .expect("a NATS url");
    let monitor = nats_child.as_ref().map(|n| n.monitor_url.clone());
    let result = serve_all(&args, &home, &nats_url, nats_users.as_ref(), monitor).await;
    if let Some(nats) = nats_child {
        nats.stop().await;
    }
    result?;
    eprintln!("kiln stopped");
    Ok(ExitCode::SUCCESS)
}

/// Serves every service, counting into one registry served at `--metrics-addr` (with the lag
/// of every consumer, and `nats_monitor`'s `/varz` when kiln up started the nats-server).
async fn serve_all(
    args: &UpArgs,
    home: &Path,
    nats_url: &str,
    nats_users: Option<&UpNatsUsers>,
    nats_monitor: Option<String>,
) -> Result<()> {
    let metrics = Metrics::default();
    let database = DatabaseConfig {
        url: DatabaseUrl::new(format!("sqlite://{}?mode=rwc", home.join("kiln.db").display())),
        max_connections: 8,
    };
    let nats = NatsConfig {
        url: nats_url.to_string(),
        replicas: 1,
        ..NatsConfig::default()
    };
    let nats_of = |service: Service| match nats_users {
        Some(users) => users.config(service, &nats),
        None => nats.clone(),
    };
    let objects = ObjectStoreConfig::local(home.join("objects"));
    let server_tls = args.tls.server()?;
    if let Some(warning) = args.tls.warning() {
        eprintln!("kiln: warning: {warning}");
    }
    let grpc = |listen: SocketAddr| GrpcConfig {
        listen,
        tls: server_tls.clone(),
    };
    let scheme = args.tls.scheme();
    let ephemeral = grpc(SocketAddr::from(([127, 0, 0, 1], 0)));
    let token_file = home.join("admin.token");
    // The key project secrets are sealed with: made (0600) on the first start, kept after.
    let key_file = home.join("secrets.key");
    kiln_core::secrets::ensure_key_file(&key_file)?;
    let secrets = kiln_core::secrets::SecretsConfig {
        key_file,
        ..Default::default()
    };

    let api = kiln_api::Api::bind(kiln_api::Config {
        grpc: grpc(args.api_addr),
        database: database.clone(),
        nats: nats_of(Service::Api),
        objects: objects.clone(),
        secrets: secrets.clone(),
        bootstrap_token_file: token_file.clone(),
        http: kiln_api::config::HttpConfig {
            listen: Some(args.http_addr),
            ui_dir: ui_dir(args, home),
            tls: args.tls.jobs(),
            ..Default::default()
        },
        ..Default::default()
    })
    .await?
    .with_metrics(&metrics);
    let http_addr = api.http_addr().expect("kiln up serves the HTTP side");
    // The laptop's owner: a runner that is not root runs the process jobs of this user only.
    let owner = kiln_core::store::Store::connect(&database)
        .await?
        .user_by_name("admin")
        .await?
        .filter(|user| user.is_admin)
        .map(|user| user.id)
        .unwrap_or_default();
    let process = kiln_runner::provider::process::config::ProcessConfig {
        trusted_owner: owner,
        ..Default::default()
    };
    let api_addr = api.local_addr();
    let logs = kiln_log_ingest::LogIngest::bind(kiln_log_ingest::Config {
        grpc: grpc(args.logs_addr),
        database: database.clone(),
        nats: nats_of(Service::LogIngest),
        sqlite: kiln_log_ingest::config::SqliteConfig {
            logs_path: home.join("logs.db"),
            metrics_path: home.join("metrics.db"),
        },
        log_store: args.log_store.into(),
        metric_store: args.metric_store.into(),
        scylla: kiln_log_ingest::scylla_store::ScyllaConfig {
            nodes: args.scylla_nodes.split(',').map(str::to_string).collect(),
            ..Default::default()
        },
        ..Default::default()
    })
    .await?
    .with_metrics(&metrics);
    let logs_addr = logs.local_addr();
    let scheduler = kiln_scheduler::Scheduler::bind(kiln_scheduler::Config {
        grpc: ephemeral.clone(),
        database: database.clone(),
        nats: nats_of(Service::Scheduler),
        ..Default::default()
    })
    .await?
    .with_metrics(&metrics);
    let batches = kiln_item_batch::ItemBatch::bind(kiln_item_batch::Config {
        grpc: grpc(args.batch_addr),
        database: database.clone(),
        nats: nats_of(Service::ItemBatch),
        objects: objects.clone(),
        // The first command's kiln has no kiln-agent beside it: process workers then run the
        // agent found for containers (static, so it runs on the host too).
        agent_path: tools::process_agent(
            args.agent_binary.as_deref(),
            &process.work_root,
            nix::unistd::geteuid().is_root(),
        )
        .context("cannot place kiln-agent where process jobs can run it")?,
        ..Default::default()
    })
    .await?
    .with_metrics(&metrics);
    let batches_addr = batches.local_addr();
    let database_for_predictor = database.clone();
    let nats_for_predictor = nats_of(Service::Predictor);
    let advisor = kiln_advisor::Advisor::bind(kiln_advisor::Config {
        grpc: grpc(args.advisor_addr),
        database: database.clone(),
        nats: nats_of(Service::Advisor),
        objects: objects.clone(),
        ..Default::default()
    })
    .await?
    .with_metrics(&metrics);
    let advisor_addr = advisor.local_addr();
    let predictor = kiln_predictor::Predictor::bind(kiln_predictor::Config {
        grpc: grpc(args.predictor_addr),
        http_listen: args.predictor_http_addr,
        database: database_for_predictor,
        nats: nats_for_predictor,
        ..Default::default()
    })
    .await?
    .with_metrics(&metrics);
    let predictor_addr = predictor.grpc_addr();
    let predictor_http = predictor.http_url().to_string();
    // The provisioner leads with no pool: this machine's runner is the only one. It runs so that
    // its lease, status and metrics read on a laptop as in a deployment.
    let provisioner = kiln_provisioner::service::ProvisionerService::bind_with_clouds(
        kiln_provisioner::Config {
            grpc: ephemeral.clone(),
            database: database.clone(),
            nats: nats_of(Service::Provisioner),
            ..Default::default()
        },
        Default::default(),
    )
    .await?
    .with_metrics(&metrics);
    // The runner last: its jobs' firewall lets them reach the services bound above.
    let runner = kiln_runner::Runner::bind(kiln_runner::Config {
        grpc: ephemeral.clone(),
        database: database.clone(),
        nats: nats_of(Service::Runner),
        objects: objects.clone(),
        secrets,
        work_dir: home.join("work"),
        idle_gpu: kiln_runner::config::IdleGpuConfig {
            window_secs: args.idle_gpu_window_secs,
            sample_interval_ms: (args.idle_gpu_window_secs * 1000 / 6).clamp(1000, 10_000),
            ..Default::default()
        },
        stop_grace_period_ms: args.grace_period * 1000,
        api_url: format!("{scheme}://{api_addr}"),
        logs_url: format!("{scheme}://{logs_addr}"),
        job_tls: args.tls.jobs(),
        agent_binary: args.agent_binary.clone().unwrap_or_default(),
        provider: match args.provider {
            ProviderArg::Auto => kiln_runner::ProviderKind::Auto,
            ProviderArg::Docker => kiln_runner::ProviderKind::Docker,
            ProviderArg::Process => kiln_runner::ProviderKind::Process,
        },
        docker: kiln_runner::provider::docker::DockerConfig {
            host: args
                .docker_host
                .clone()
                .unwrap_or_else(|| kiln_runner::provider::docker::DockerConfig::default().host),
            isolate_jobs: !args.no_job_isolation,
            // Besides the api (gRPC and its HTTP API) and log-ingest: batch workers' agents reach
            // item-batch, trials the advisor (`kiln.should_stop()`), jobs the models served (the
            // predictor).
            job_endpoints: vec![
                http_addr.to_string(),
                batches_addr.to_string(),
                advisor_addr.to_string(),
                predictor_addr.to_string(),
                predictor_http.clone(),
            ],
            ..Default::default()
        },
        process,
        // The predictor runs in this process: the relays' direct channels are on its loopback.
        relay: kiln_runner::relay::RelaySettings {
            direct_addr: "127.0.0.1:0".into(),
            ..Default::default()
        },
        ..Default::default()
    })
    .await?
    .with_metrics(&metrics);
    let engine = args.docker_host.as_deref().unwrap_or("unix:///var/run/docker.sock");
    let provider = match runner.provider_name() {
        "docker+process" => {
            format!("docker (engine at {engine}) for jobs with --image, local processes for the others")
        }
        "docker" => format!("docker (engine at {engine}; jobs need --image)"),
        other => format!("{other} (jobs run as local processes; no Docker engine answered)"),
    };
    let api = api.with_http_upstreams(
        format!("{scheme}://{logs_addr}"),
        format!("{scheme}://{batches_addr}"),
        format!("{scheme}://{advisor_addr}"),
        format!("{scheme}://{predictor_addr}"),
    );

    let shutdown = kiln_core::shutdown::on_signal();
    let metrics_config = MetricsConfig {
        enabled: true,
        listen: args.metrics_addr,
        consumer_lag: true,
        nats_monitor: nats_monitor.into_iter().collect(),
        refresh_ms: 5_000,
    };
    let metrics_addr = kiln_core::metrics::export(&metrics_config, &metrics, api.nats(), &shutdown)
        .await?
        .expect("enabled");
    let token = std::fs::read_to_string(&token_file)
        .with_context(|| format!("cannot read the admin token from {}", token_file.display()))?
        .trim()
        .to_string();
    let credentials = Credentials {
        api: format!("{scheme}://{api_addr}"),
        logs: format!("{scheme}://{logs_addr}"),
        batches: format!("{scheme}://{batches_addr}"),
        advisor: format!("{scheme}://{advisor_addr}"),
        predictor: format!("{scheme}://{predictor_addr}"),
        ui: format!("{scheme}://{http_addr}"),
        token,
        // Absolute: clients read it from wherever they run.
        ca_file: args.tls.tls_ca.as_deref().map(std::path::absolute).transpose()?,
        cert_file: None,
        key_file: None,
    };
    client::write_credentials(home, &credentials)?;
    println!("kiln is up");
    println!("  api:      {}", credentials.api);
    println!("  logs:     {}", credentials.logs);
    println!("  batches:  {}", credentials.batches);
    println!("  advisor:  {}", credentials.advisor);
    println!(
        "  serving:  {} (Open Inference Protocol: {predictor_http})",
        credentials.predictor
    );
    println!("  ui:       {}/", credentials.ui);
    match nats_users {
        Some(_) => println!(
            "  nats:     {nats_url} (one NKey user per service; seeds in {})",
            home.join("nats-users").display()
        ),
        None => println!("  nats:     {nats_url}"),
    }
    println!("  metrics:  http://{metrics_addr}/metrics");
    println!("  data:     {}", home.display());
    println!("  provider: {provider}");
    println!(
        "the CLI reads {}; Ctrl-C stops everything",
        client::credentials_path(home).display()
    );
    std::io::stdout().flush().ok();

    let mut services: JoinSet<(&str, Result<()>)> = JoinSet::new();
    let token = shutdown.clone();
    services.spawn(async move { ("api", api.serve(token).await.map_err(Into::into)) });
    let token = shutdown.clone();
    services.spawn(async move { ("log-ingest", logs.serve(token).await.map_err(Into::into)) });
    let token = shutdown.clone();
    services.spawn(async move { ("scheduler", scheduler.serve(token).await.map_err(Into::into)) });
    let token = shutdown.clone();
    services.spawn(async move { ("runner", runner.serve(token).await.map_err(Into::into)) });
    let token = shutdown.clone();
    services.spawn(async move { ("item-batch", batches.serve(token).await.map_err(Into::into)) });
    let token = shutdown.clone();
    services.spawn(async move { ("advisor", advisor.serve(token).await.map_err(Into::into)) });
    let token = shutdown.clone();
    services.spawn(async move { ("predictor", predictor.serve(token).await.map_err(Into::into)) });
    let token = shutdown.clone();
    services.spawn(async move { ("provisioner", provisioner.serve(token).await.map_err(Into::into)) });
    let mut failure = None;
    while let Some(joined) = services.join_next().await {
        let (service, result) = joined.context("a service panicked")?;
        if let Err(error) = result {
            tracing::error!(service, error = %error, "service failed; stopping everything");
            failure.get_or_insert(anyhow::anyhow!("{service} failed: {error}"));
        }
        // One service ending ends them all.
        shutdown.cancel();
    }
    failure.map_or(Ok(()), Err)
}
