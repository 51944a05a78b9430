//! Finding and talking to a kiln endpoint: credentials from `KILN_HOME/credentials.toml`
//! (written by `kiln up`), overridden by `KILN_ADDR`, `KILN_LOGS_ADDR`, `KILN_BATCH_ADDR` and
//! `KILN_TOKEN`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kiln_core::auth::BearerInterceptor;
use kiln_proto::v1::artifact_service_client::ArtifactServiceClient;
use kiln_proto::v1::batch_service_client::BatchServiceClient;
use kiln_proto::v1::dataset_service_client::DatasetServiceClient;
use kiln_proto::v1::job_service_client::JobServiceClient;
use kiln_proto::v1::log_service_client::LogServiceClient;
use kiln_proto::v1::node_service_client::NodeServiceClient;
use kiln_proto::v1::project_service_client::ProjectServiceClient;
use kiln_proto::v1::quota_service_client::QuotaServiceClient;
use kiln_proto::v1::secret_service_client::SecretServiceClient;
use kiln_proto::v1::user_service_client::UserServiceClient;
use serde::{Deserialize, Serialize};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// The file `kiln up` writes for clients.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credentials {
    pub api: String,
    pub logs: String,
    /// item-batch (BatchService); files written before batches existed have none.
    #[serde(default)]
    pub batches: String,
    pub token: String,
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

/// Writes the credentials with mode 0600.
pub fn write_credentials(home: &Path, credentials: &Credentials) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = credentials_path(home);
    let text = toml::to_string(credentials)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// Resolves the endpoint and token from the environment and the credentials file.
pub fn resolve() -> Result<Credentials> {
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
    let logs = env("KILN_LOGS_ADDR")
        .or_else(|| file.as_ref().map(|f| f.logs.clone()))
        .unwrap_or_else(|| api.clone());
    let batches = env("KILN_BATCH_ADDR")
        .or_else(|| file.as_ref().map(|f| f.batches.clone()).filter(|b| !b.is_empty()))
        .unwrap_or_else(|| api.clone());
    Ok(normalized(&Credentials {
        api,
        logs,
        batches,
        token,
    }))
}

/// The credentials with every address as a URL (`host:port` reads as `http://host:port`).
pub fn normalized(credentials: &Credentials) -> Credentials {
    Credentials {
        api: normalize(&credentials.api),
        logs: normalize(&credentials.logs),
        batches: normalize(&credentials.batches),
        token: credentials.token.clone(),
    }
}

fn normalize(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

type Authed = InterceptedService<Channel, BearerInterceptor>;

/// Clients of every service, authenticated.
pub struct Clients {
    pub jobs: JobServiceClient<Authed>,
    pub artifacts: ArtifactServiceClient<Authed>,
    pub datasets: DatasetServiceClient<Authed>,
    pub logs: LogServiceClient<Authed>,
    pub batches: BatchServiceClient<Authed>,
    pub quotas: QuotaServiceClient<Authed>,
    pub users: UserServiceClient<Authed>,
    pub projects: ProjectServiceClient<Authed>,
    /// The api's `NodeService` (who the token is).
    pub node: NodeServiceClient<Authed>,
    pub secrets: SecretServiceClient<Authed>,
}

async fn channel(addr: &str) -> Result<Channel> {
    Endpoint::from_shared(addr.to_string())
        .with_context(|| format!("invalid address {addr:?}"))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("cannot reach kiln at {addr}; is `kiln up` running?"))
}

pub async fn connect(credentials: &Credentials) -> Result<Clients> {
    let api = channel(&credentials.api).await?;
    let logs = if credentials.logs == credentials.api {
        api.clone()
    } else {
        channel(&credentials.logs).await?
    };
    let batches = if credentials.batches == credentials.api {
        api.clone()
    } else {
        channel(&credentials.batches).await?
    };
    let auth = BearerInterceptor::new(&credentials.token);
    Ok(Clients {
        batches: BatchServiceClient::with_interceptor(batches, auth.clone()).max_encoding_message_size(16 << 20),
        jobs: JobServiceClient::with_interceptor(api.clone(), auth.clone()),
        quotas: QuotaServiceClient::with_interceptor(api.clone(), auth.clone()),
        users: UserServiceClient::with_interceptor(api.clone(), auth.clone()),
        projects: ProjectServiceClient::with_interceptor(api.clone(), auth.clone()),
        node: NodeServiceClient::with_interceptor(api.clone(), auth.clone()),
        secrets: SecretServiceClient::with_interceptor(api.clone(), auth.clone()),
        datasets: DatasetServiceClient::with_interceptor(api.clone(), auth.clone()),
        artifacts: ArtifactServiceClient::with_interceptor(api, auth.clone())
            .max_decoding_message_size(8 << 20)
            .max_encoding_message_size(8 << 20),
        logs: LogServiceClient::with_interceptor(logs, auth),
    })
}
