//! Configuration parts shared by the services, and the one loader they all use.
//!
//! Layers, later ones winning: `Default` → TOML file (`--config` or `KILN_CONFIG`) → environment
//! `KILN_<SVC>__SECTION__KEY` → command-line flags. The loader takes the environment as a map so
//! tests never touch the process environment.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Value};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

mod nats;

pub use nats::NatsConfig;

/// ConfigError says why a configuration cannot be used; it lists every problem found.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration: {0}")]
    Load(String),
    #[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
}

/// Secret holds a value that must never be printed: `Debug` shows it masked.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// Returns the secret value itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str("\"***\"")
        }
    }
}

/// DatabaseUrl is a database URL whose password is masked when printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn new(url: impl Into<String>) -> Self {
        DatabaseUrl(url.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_sqlite(&self) -> bool {
        self.0.starts_with("sqlite:")
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // postgres://user:password@host/db → postgres://user:***@host/db
        match (self.0.find("://"), self.0.rfind('@')) {
            (Some(scheme_end), Some(at)) if at > scheme_end => {
                let credentials = &self.0[scheme_end + 3..at];
                match credentials.find(':') {
                    Some(colon) => write!(
                        f,
                        "{:?}",
                        format!(
                            "{}{}:***{}",
                            &self.0[..scheme_end + 3],
                            &credentials[..colon],
                            &self.0[at..]
                        )
                    ),
                    None => write!(f, "{:?}", self.0),
                }
            }
            _ => write!(f, "{:?}", self.0),
        }
    }
}

/// DatabaseConfig points at the metadata database (SQLite file or Postgres).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DatabaseConfig {
    pub url: DatabaseUrl,
    pub max_connections: u32,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: DatabaseUrl::new("sqlite://./data/kiln.db?mode=rwc"),
            max_connections: 8,
        }
    }
}

impl DatabaseConfig {
    pub fn validate(&self, problems: &mut Vec<String>) {
        let url = self.url.expose();
        if !(url.starts_with("sqlite:") || url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            problems.push(format!(
                "database.url {:?} must start with sqlite:, postgres:// or postgresql://",
                self.url
            ));
        }
        if self.max_connections == 0 {
            problems.push("database.max-connections must be at least 1".into());
        }
    }
}

/// ObjectStoreConfig says where blobs (code bundles, outputs, datasets) live: a local directory
/// or an S3 bucket. Empty S3 settings fall back to the usual `AWS_*` variables
/// (`ObjectStoreConfig::apply_env`); `validate` and `open` are in [`crate::objects`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ObjectStoreConfig {
    /// `file:///abs/path` or a plain path (a local directory), or `s3://bucket[/prefix]`.
    pub url: String,
    /// The S3 endpoint of an S3-compatible server (`http://127.0.0.1:7070`); empty for AWS's.
    pub endpoint: String,
    /// The S3 region; empty for `AWS_REGION`, else `us-east-1`.
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: Secret,
    /// Allows an `http://` endpoint (no TLS).
    pub allow_http: bool,
}

impl Default for ObjectStoreConfig {
    fn default() -> Self {
        ObjectStoreConfig::local("./data/objects")
    }
}

/// GrpcConfig says where a service listens, and with which TLS (`[grpc.tls]`, off by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct GrpcConfig {
    pub listen: std::net::SocketAddr,
    #[serde(default)]
    pub tls: crate::tls::ServerTlsConfig,
}

impl GrpcConfig {
    pub fn local(port: u16) -> Self {
        GrpcConfig::at(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Listens on `listen`, in plain text.
    pub fn at(listen: std::net::SocketAddr) -> Self {
        GrpcConfig {
            listen,
            tls: crate::tls::ServerTlsConfig::default(),
        }
    }

    pub fn validate(&self, problems: &mut Vec<String>) {
        self.tls.validate("grpc.tls", problems);
    }
}

/// Loads a service's configuration from its layers.
///
/// `service` is the env prefix part (`api` → `KILN_API__…`); `overrides` are command-line flags,
/// a struct whose `None` fields are skipped when serialized.
pub fn load<T>(
    service: &str,
    file: Option<&Path>,
    env: &HashMap<String, String>,
    overrides: &impl Serialize,
) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Default,
{
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    let file = file
        .map(Path::to_path_buf)
        .or_else(|| env.get("KILN_CONFIG").map(PathBuf::from));
    if let Some(path) = file {
        if !path.try_exists().unwrap_or(false) {
            return Err(ConfigError::Load(format!(
                "config file {} does not exist",
                path.display()
            )));
        }
        figment = figment.merge(Toml::file(path));
    }
    let prefix = format!("KILN_{}__", service.to_uppercase().replace('-', "_"));
    figment = figment
        .merge(Serialized::defaults(env_dict(&prefix, env)))
        .merge(Serialized::defaults(overrides));
    figment.extract().map_err(|error| {
        let messages: Vec<String> = error.into_iter().map(|e| e.to_string()).collect();
        ConfigError::Load(messages.join("; "))
    })
}

/// Turns `KILN_API__GRPC__LISTEN=…` into `{grpc: {listen: …}}`: sections split on `__`, names
/// lowercased with `_` read as `-` (the kebab-case of the file).
fn env_dict(prefix: &str, env: &HashMap<String, String>) -> Dict {
    let mut root = Dict::new();
    let sorted: BTreeMap<_, _> = env.iter().collect();
    for (key, raw) in sorted {
        let Some(path) = key.strip_prefix(prefix) else {
            continue;
        };
        let parts: Vec<String> = path
            .split("__")
            .map(|part| part.to_lowercase().replace('_', "-"))
            .collect();
        let value: Value = raw.parse().unwrap_or_else(|_| Value::from(raw.clone()));
        insert_path(&mut root, &parts, value);
    }
    root
}

fn insert_path(dict: &mut Dict, parts: &[String], value: Value) {
    match parts {
        [] => {}
        [last] => {
            dict.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = dict.entry(first.clone()).or_insert_with(|| Value::from(Dict::new()));
            if let Value::Dict(_, inner) = entry {
                insert_path(inner, rest, value);
            }
        }
    }
}

/// Returns the process environment as a map, for binaries to hand to [`load`].
pub fn process_env() -> HashMap<String, String> {
    std::env::vars().collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
    struct Sample {
        nats: NatsConfig,
        database: DatabaseConfig,
        grace_period_secs: u64,
    }

    #[derive(Serialize, Default)]
    #[serde(rename_all = "kebab-case")]
    struct Flags {
        #[serde(skip_serializing_if = "Option::is_none")]
        grace_period_secs: Option<u64>,
    }

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn layers_apply_in_order() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "grace-period-secs = 5\n[nats]\nurl = \"nats://file:1\"").unwrap();
        let env = env(&[
            ("KILN_SAMPLE__NATS__URL", "nats://env:2"),
            ("KILN_SAMPLE__DATABASE__MAX_CONNECTIONS", "3"),
            ("KILN_OTHER__NATS__URL", "nats://other:3"),
        ]);
        let flags = Flags {
            grace_period_secs: Some(9),
        };
        let config: Sample = load("sample", Some(file.path()), &env, &flags).unwrap();
        assert_eq!(config.nats.url, "nats://env:2");
        assert_eq!(config.database.max_connections, 3);
        assert_eq!(config.grace_period_secs, 9);

        let config: Sample = load("sample", Some(file.path()), &HashMap::new(), &Flags::default()).unwrap();
        assert_eq!(config.nats.url, "nats://file:1");
        assert_eq!(config.grace_period_secs, 5);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "[nats]\nurll = \"nats://typo:1\"").unwrap();
        let error = load::<Sample>("sample", Some(file.path()), &HashMap::new(), &Flags::default()).unwrap_err();
        assert!(error.to_string().contains("urll"), "{error}");
    }

    #[test]
    fn secrets_are_masked() {
        let url = DatabaseUrl::new("postgres://kiln:hunter2@db:5432/kiln");
        let shown = format!("{url:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("kiln:***@db"), "{shown}");
        assert_eq!(format!("{:?}", Secret::new("abc")), "\"***\"");
    }
}
