//! Finding and talking to a kiln endpoint: credentials from `KILN_HOME/credentials.toml`
//! (written by `kiln up` and `kiln login`), overridden by `KILN_ADDR`, `KILN_LOGS_ADDR`,
//! `KILN_BATCH_ADDR`, `KILN_ADVISOR_ADDR`, `KILN_PREDICTOR_ADDR`, `KILN_UI_ADDR` and `KILN_TOKEN`;
//! what neither names comes from the api's `DiscoveryService`. `https://` addresses trust `--ca-file` (`KILN_CA_FILE`, the file's `ca-file`),
//! else the system roots, and present `--client-cert`/`--client-key` (`KILN_CLIENT_CERT`,
//! `KILN_CLIENT_KEY`, `cert-file`/`key-file`) to servers that require a client certificate.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use kiln_core::auth::BearerInterceptor;
use kiln_core::tls::ClientTlsConfig;
use kiln_proto::v1 as pb;
use kiln_proto::v1::artifact_service_client::ArtifactServiceClient;
use kiln_proto::v1::batch_log_service_client::BatchLogServiceClient;
use kiln_proto::v1::batch_service_client::BatchServiceClient;
use kiln_proto::v1::dataset_service_client::DatasetServiceClient;
use kiln_proto::v1::discovery_service_client::DiscoveryServiceClient;
use kiln_proto::v1::job_service_client::JobServiceClient;
use kiln_proto::v1::log_service_client::LogServiceClient;
use kiln_proto::v1::model_service_client::ModelServiceClient;
use kiln_proto::v1::node_service_client::NodeServiceClient;
use kiln_proto::v1::project_service_client::ProjectServiceClient;
use kiln_proto::v1::quota_service_client::QuotaServiceClient;
use kiln_proto::v1::secret_service_client::SecretServiceClient;
use kiln_proto::v1::serve_service_client::ServeServiceClient;
use kiln_proto::v1::sweep_service_client::SweepServiceClient;
use kiln_proto::v1::user_service_client::UserServiceClient;
use serde::{Deserialize, Serialize};
use tonic::service::interceptor::InterceptedService;

mod replicas;

pub(crate) use replicas::channel;
use replicas::lazy_channel;
pub use replicas::{Replicas, replica_urls, while_unavailable};

/// The file `kiln up` writes for clients.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credentials {
    pub api: String,
    pub logs: String,
    /// item-batch (BatchService); files written before batches existed have none.
    #[serde(default)]
    pub batches: String,
    /// The advisor (SweepService); files written before sweeps existed have none.
    #[serde(default)]
    pub advisor: String,
    /// The predictor (ServeService); files written before services existed have none.
    #[serde(default)]
    pub predictor: String,
    /// The web UI and its HTTP API; files written before it existed have none.
    #[serde(default)]
    pub ui: String,
    pub token: String,
    /// The CA of `https://` addresses (the system roots when unset).
    #[serde(default, rename = "ca-file", skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate and key, for servers that require one.
    #[serde(default, rename = "cert-file", skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    #[serde(default, rename = "key-file", skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

/// How the client commands connect to `https://` addresses.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsFlags {
    /// PEM CA certificates that kiln's certificate is checked against (default: KILN_CA_FILE,
    /// the credentials file's ca-file, else the system roots).
    #[arg(long, global = true, value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for servers that require one (default: KILN_CLIENT_CERT).
    #[arg(long, global = true, value_name = "PATH", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM key of --client-cert (default: KILN_CLIENT_KEY).
    #[arg(long, global = true, value_name = "PATH", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

impl From<TlsFlags> for ClientTlsConfig {
    fn from(flags: TlsFlags) -> Self {
        ClientTlsConfig {
            ca_file: flags.ca_file,
            cert_file: flags.client_cert,
            key_file: flags.client_key,
        }
    }
}

/// The TLS flags of the command line (`--ca-file`, `--client-cert`, `--client-key`), set once
/// by `main` before any command runs; they win over the environment and the file.
static TLS_FLAGS: OnceLock<ClientTlsConfig> = OnceLock::new();

pub fn set_tls_flags(flags: ClientTlsConfig) {
    let _ = TLS_FLAGS.set(flags);
}

/// The TLS settings of the command line and the environment alone (what `kiln login` stores):
/// the CA file, the client certificate and its key.
pub fn tls_paths() -> (Option<PathBuf>, Option<PathBuf>, Option<PathBuf>) {
    let flags = TLS_FLAGS.get().cloned().unwrap_or_default();
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    (
        flags.ca_file.or_else(|| env("KILN_CA_FILE")),
        flags.cert_file.or_else(|| env("KILN_CLIENT_CERT")),
        flags.key_file.or_else(|| env("KILN_CLIENT_KEY")),
    )
}

/// Returns `KILN_HOME`, by default `~/.kiln`.
pub fn kiln_home() -> PathBuf {
    match std::env::var_os("KILN_HOME") {
        Some(home) => PathBuf::from(home),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."))
            .join(".kiln"),
    }
}

pub fn credentials_path(home: &Path) -> PathBuf {
    home.join("credentials.toml")
}

/// Writes the credentials with mode 0600, atomically: a reader (a `kiln` command, or a test
/// waiting for `kiln up`) sees the old file or the whole new one, never an empty or half one.
pub fn write_credentials(home: &Path, credentials: &Credentials) -> Result<()> {
    use std::io::Write;
    let path = credentials_path(home);
    let text = toml::to_string(credentials)?;
    // A temp file is created 0600, in the same directory so that the rename is atomic.
    let mut file = tempfile::NamedTempFile::new_in(home).with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    file.persist(&path)
        .map_err(|error| error.error)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Resolves the endpoint and token from the environment and the credentials file, and asks the
/// api where the other services are when neither says (`DiscoveryService`): `KILN_ADDR` and
/// `KILN_TOKEN` are enough.
pub async fn resolve() -> Result<Credentials> {
    discover(&configured()?).await
}

/// The endpoint and token from the environment and the credentials file; a service neither
/// names is empty. The file's addresses count only with the file's api (with `KILN_ADDR` naming
/// another, they are another deployment's).
fn configured() -> Result<Credentials> {
    let home = kiln_home();
    let path = credentials_path(&home);
    let file: Option<Credentials> = match std::fs::read_to_string(&path) {
        Ok(text) => Some(toml::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))?),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
    };
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let api = env("KILN_ADDR").or_else(|| file.as_ref().map(|f| f.api.clone()));
    let token = env("KILN_TOKEN").or_else(|| file.as_ref().map(|f| f.token.clone()));
    let (Some(api), Some(token)) = (api, token) else {
        bail!(
            "no kiln endpoint: start one with `kiln up`, or set KILN_ADDR and KILN_TOKEN (looked for {})",
            path.display()
        );
    };
    let same = file.as_ref().filter(|f| normalize(&f.api) == normalize(&api));
    let address = |var: &str, of: fn(&Credentials) -> &String| {
        env(var)
            .or_else(|| same.map(of).filter(|a| !a.is_empty()).cloned())
            .unwrap_or_default()
    };
    let flags = TLS_FLAGS.get().cloned().unwrap_or_default();
    let path_setting = |flag: Option<PathBuf>, var: &str, from_file: fn(&Credentials) -> Option<PathBuf>| {
        flag.or_else(|| env(var).map(PathBuf::from))
            .or_else(|| file.as_ref().and_then(from_file))
    };
    Ok(Credentials {
        logs: address("KILN_LOGS_ADDR", |f| &f.logs),
        batches: address("KILN_BATCH_ADDR", |f| &f.batches),
        advisor: address("KILN_ADVISOR_ADDR", |f| &f.advisor),
        predictor: address("KILN_PREDICTOR_ADDR", |f| &f.predictor),
        ui: address("KILN_UI_ADDR", |f| &f.ui),
        api,
        token,
        ca_file: path_setting(flags.ca_file, "KILN_CA_FILE", |f| f.ca_file.clone()),
        cert_file: path_setting(flags.cert_file, "KILN_CLIENT_CERT", |f| f.cert_file.clone()),
        key_file: path_setting(flags.key_file, "KILN_CLIENT_KEY", |f| f.key_file.clone()),
    })
}

/// Fills the services `credentials` does not name from the api's `DiscoveryService`; an api
/// without it (an older one) leaves them at the api's own address, as before.
pub async fn discover(credentials: &Credentials) -> Result<Credentials> {
    let mut credentials = credentials.clone();
    credentials.api = normalize(&credentials.api);
    let missing = [
        &credentials.logs,
        &credentials.batches,
        &credentials.advisor,
        &credentials.predictor,
        &credentials.ui,
    ];
    if missing.iter().all(|address| !address.is_empty()) {
        return Ok(normalized(&credentials));
    }
    let api = channel(&credentials.api, &credentials.tls()).await?;
    let mut discovery = DiscoveryServiceClient::with_interceptor(api, BearerInterceptor::new(&credentials.token));
    let found = match discovery.discover(pb::DiscoverRequest {}).await {
        Ok(found) => found.into_inner(),
        Err(status) if status.code() == tonic::Code::Unimplemented => pb::DiscoverResponse::default(),
        Err(status) => bail!("the api at {} answered: {}", credentials.api, status.message()),
    };
    let first_api = replica_urls(&credentials.api).into_iter().next().unwrap_or_default();
    let api_host = host_of(&first_api).to_string();
    let fill = |mine: &mut String, found: &str, fallback: &str| {
        if mine.is_empty() {
            *mine = if found.is_empty() {
                fallback.to_string()
            } else {
                reachable(found, &api_host)
            };
        }
    };
    let api_url = credentials.api.clone();
    fill(&mut credentials.logs, &found.logs, &api_url);
    fill(&mut credentials.batches, &found.batches, &api_url);
    fill(&mut credentials.advisor, &found.advisor, &api_url);
    fill(&mut credentials.predictor, &found.predictor, &api_url);
    fill(&mut credentials.ui, &found.ui, "");
    Ok(normalized(&credentials))
}

/// The `host:port` of a URL (`http://host:port/...`).
pub(crate) fn authority_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

/// The host of a URL (`http://host:port/...`).
fn host_of(url: &str) -> &str {
    let authority = authority_of(url);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A discovered URL as this client reaches it: a loopback host means the api's own host, so a
/// client on another machine uses the api's host name with that port.
fn reachable(found: &str, api_host: &str) -> String {
    if found.contains(',') {
        let each: Vec<String> = found.split(',').map(|one| reachable(one.trim(), api_host)).collect();
        return each.join(",");
    }
    let host = host_of(found);
    if is_loopback(host) && !is_loopback(api_host) {
        found.replacen(host, api_host, 1)
    } else {
        found.to_string()
    }
}

/// The credentials with every address as a URL (`host:port` reads as `http://host:port`).
pub fn normalized(credentials: &Credentials) -> Credentials {
    Credentials {
        api: normalize(&credentials.api),
        logs: normalize(&credentials.logs),
        batches: normalize(&credentials.batches),
        advisor: normalize(&credentials.advisor),
        predictor: normalize(&credentials.predictor),
        ui: if credentials.ui.is_empty() {
            String::new()
        } else {
            normalize(&credentials.ui)
        },
        ..credentials.clone()
    }
}

impl Credentials {
    /// The TLS settings of its `https://` addresses.
    pub fn tls(&self) -> ClientTlsConfig {
        ClientTlsConfig {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        }
    }
}

/// An address as a URL (`host:port` reads as `http://host:port`), each of a list.
fn normalize(addr: &str) -> String {
    if addr.contains(',') {
        return replica_urls(addr).join(",");
    }
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

type Authed = InterceptedService<Replicas, BearerInterceptor>;

/// Clients of every service, authenticated.
pub struct Clients {
    pub jobs: JobServiceClient<Authed>,
    pub artifacts: ArtifactServiceClient<Authed>,
    pub datasets: DatasetServiceClient<Authed>,
    pub logs: LogServiceClient<Authed>,
    /// log-ingest's search of batch items' lines.
    pub batch_logs: BatchLogServiceClient<Authed>,
    pub batches: BatchServiceClient<Authed>,
    pub sweeps: SweepServiceClient<Authed>,
    pub serve: ServeServiceClient<Authed>,
    pub quotas: QuotaServiceClient<Authed>,
    pub users: UserServiceClient<Authed>,
    pub projects: ProjectServiceClient<Authed>,
    /// The api's `NodeService` (who the token is).
    pub node: NodeServiceClient<Authed>,
    pub secrets: SecretServiceClient<Authed>,
    pub models: ModelServiceClient<Authed>,
}

pub async fn connect(credentials: &Credentials) -> Result<Clients> {
    let tls = credentials.tls();
    let api = channel(&credentials.api, &tls).await?;
    let logs = if credentials.logs == credentials.api {
        api.clone()
    } else {
        channel(&credentials.logs, &tls).await?
    };
    let batches = if credentials.batches == credentials.api {
        api.clone()
    } else {
        channel(&credentials.batches, &tls).await?
    };
    // Connected on first use: commands that need no sweeps work while the advisor is down.
    let advisor = if credentials.advisor == credentials.api {
        api.clone()
    } else {
        lazy_channel(&credentials.advisor, &tls)?
    };
    let predictor = if credentials.predictor == credentials.api {
        api.clone()
    } else {
        lazy_channel(&credentials.predictor, &tls)?
    };
    let auth = BearerInterceptor::new(&credentials.token);
    Ok(Clients {
        serve: ServeServiceClient::with_interceptor(predictor, auth.clone()),
        sweeps: SweepServiceClient::with_interceptor(advisor, auth.clone()),
        batches: BatchServiceClient::with_interceptor(batches, auth.clone()).max_encoding_message_size(16 << 20),
        jobs: JobServiceClient::with_interceptor(api.clone(), auth.clone()),
        quotas: QuotaServiceClient::with_interceptor(api.clone(), auth.clone()),
        users: UserServiceClient::with_interceptor(api.clone(), auth.clone()),
        projects: ProjectServiceClient::with_interceptor(api.clone(), auth.clone()),
        node: NodeServiceClient::with_interceptor(api.clone(), auth.clone()),
        secrets: SecretServiceClient::with_interceptor(api.clone(), auth.clone()),
        datasets: DatasetServiceClient::with_interceptor(api.clone(), auth.clone()),
        models: ModelServiceClient::with_interceptor(api.clone(), auth.clone()).max_decoding_message_size(16 << 20),
        artifacts: ArtifactServiceClient::with_interceptor(api, auth.clone())
            .max_decoding_message_size(8 << 20)
            .max_encoding_message_size(8 << 20),
        batch_logs: BatchLogServiceClient::with_interceptor(logs.clone(), auth.clone())
            .max_decoding_message_size(64 << 20),
        logs: LogServiceClient::with_interceptor(logs, auth),
    })
}

#[cfg(test)]
mod discovery_tests {
    use super::*;

    #[test]
    fn a_loopback_answer_means_the_apis_host() {
        assert_eq!(host_of("https://kiln.example.com:7070"), "kiln.example.com");
        assert_eq!(host_of("http://[::1]:7071/x"), "::1");
        assert_eq!(
            reachable("http://127.0.0.1:7071", "kiln.example.com"),
            "http://kiln.example.com:7071"
        );
        assert_eq!(reachable("http://localhost:7075", "10.1.2.3"), "http://10.1.2.3:7075");
        assert_eq!(reachable("http://127.0.0.1:7071", "127.0.0.1"), "http://127.0.0.1:7071");
        assert_eq!(
            reachable("https://logs.example.com", "10.1.2.3"),
            "https://logs.example.com"
        );
        assert_eq!(
            reachable("http://127.0.0.1:7071,http://127.0.0.1:7081", "10.1.2.3"),
            "http://10.1.2.3:7071,http://10.1.2.3:7081"
        );
    }

    #[test]
    fn a_list_of_replicas_is_each_a_url() {
        assert_eq!(
            replica_urls(" 10.0.0.1:7070, https://kiln-2:7070 ,"),
            ["http://10.0.0.1:7070", "https://kiln-2:7070"]
        );
        assert_eq!(normalize("a:1,b:2"), "http://a:1,http://b:2");
    }
}
