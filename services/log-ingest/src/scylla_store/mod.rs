//! The production stores on ScyllaDB through the `scylla` driver (token-aware routing by
//! default): [`ScyllaMetricStore`] for points and [`ScyllaLogStore`] for lines, sharing one
//! session. [`connect`] applies the CQL schema (`migrations/cql/*.cql`, in order) at start. Tests
//! run both against Apache Cassandra 5, which speaks the same CQL.
//!
//! Writes go in unlogged batches of one partition each: a single-partition batch is one mutation
//! for the node (atomic and isolated), and costs one request instead of one per row. Metric
//! points go in rows of up to 1,024 consecutive steps each ([`chunks`]). Writing a row again
//! overwrites it with the same value, so redelivery never duplicates one.

use std::path::PathBuf;
use std::sync::Arc;

use kiln_core::config::Secret;
use kiln_core::tls::ClientTlsConfig;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub mod chunks;
mod item_lines;
mod logs;
mod metrics;

pub use logs::{LOG_BUCKET_SEQS, ScyllaLogStore};
pub use metrics::{BUCKET_STEPS, ScyllaMetricStore};

/// The CQL schema files, applied in this order; every statement is idempotent.
const SCHEMA: [&str; 3] = [
    include_str!("../../../../migrations/cql/0001_metrics.cql"),
    include_str!("../../../../migrations/cql/0002_logs.cql"),
    include_str!("../../../../migrations/cql/0003_item_lines.cql"),
];

/// Where the ScyllaDB cluster is, and how the tables are made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ScyllaConfig {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    pub keyspace: String,
    pub replication_factor: u32,
    /// Points and lines expire after this many seconds; 0 keeps them.
    pub ttl_secs: u64,
    /// Write requests (batches of one partition) in flight at once, at most.
    pub write_concurrency: usize,
    /// The role log-ingest logs in as (`PasswordAuthenticator`); empty: no authentication.
    pub username: String,
    /// A file holding the role's password (its first line), or
    pub password_file: Option<PathBuf>,
    /// the password itself (`KILN_LOG_INGEST__SCYLLA__PASSWORD`); masked when printed.
    pub password: Secret,
    /// TLS to every node (`client_encryption_options`): the CA that signs the nodes'
    /// certificates, which must name their IP addresses (the driver checks the address it
    /// connects to). Unset: plain CQL.
    pub tls_ca_file: Option<PathBuf>,
    /// The client certificate and key log-ingest presents (`require_client_auth`).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
}

impl Default for ScyllaConfig {
    fn default() -> Self {
        ScyllaConfig {
            nodes: vec!["127.0.0.1:9042".into()],
            keyspace: "kiln".into(),
            replication_factor: 1,
            ttl_secs: 0,
            write_concurrency: 32,
            username: String::new(),
            password_file: None,
            password: Secret::default(),
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

impl ScyllaConfig {
    pub fn validate(&self, problems: &mut Vec<String>) {
        if self.nodes.is_empty() {
            problems.push("scylla.nodes must name at least one node".into());
        }
        let valid_keyspace = !self.keyspace.is_empty()
            && self.keyspace.len() <= 48
            && self.keyspace.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !self.keyspace.starts_with('_');
        if !valid_keyspace {
            problems.push(format!(
                "scylla.keyspace {:?} must be 1 to 48 letters, digits or '_'",
                self.keyspace
            ));
        }
        if self.write_concurrency == 0 {
            problems.push("scylla.write-concurrency must be at least 1".into());
        }
        let (from_file, inline) = (self.password_file.is_some(), !self.password.expose().is_empty());
        if self.username.is_empty() && (from_file || inline) {
            problems.push("scylla.password-file and scylla.password need scylla.username".into());
        }
        // Exactly one source of the password: both or neither is a mistake.
        if !self.username.is_empty() && from_file == inline {
            problems.push("scylla.username needs one of scylla.password-file and scylla.password".into());
        }
        if let Some(tls) = self.tls() {
            if let Err(error) = tls.rustls_config() {
                problems.push(format!("scylla.tls-*: {error}"));
            }
        } else if self.tls_cert_file.is_some() || self.tls_key_file.is_some() {
            problems.push("scylla.tls-cert-file and scylla.tls-key-file need scylla.tls-ca-file".into());
        }
    }

    /// The TLS settings of the connections, when they are TLS.
    fn tls(&self) -> Option<ClientTlsConfig> {
        self.tls_ca_file.as_ref().map(|ca| ClientTlsConfig {
            ca_file: Some(ca.clone()),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
        })
    }

    /// The password: the first line of `password-file`, else `password`.
    fn password(&self) -> Result<String> {
        match &self.password_file {
            Some(path) => std::fs::read_to_string(path)
                .map(|text| text.lines().next().unwrap_or_default().to_string())
                .map_err(|e| Error::LogStore(format!("scylla: cannot read the password file {}: {e}", path.display()))),
            None => Ok(self.password.expose().to_string()),
        }
    }
}

pub(crate) fn cql_error(what: &str) -> impl FnOnce(&dyn std::fmt::Display) -> Error + '_ {
    move |error| Error::LogStore(format!("scylla: cannot {what}: {error}"))
}

/// Connects to the cluster and applies the CQL schema.
pub async fn connect(config: &ScyllaConfig) -> Result<Arc<Session>> {
    let mut builder = SessionBuilder::new().known_nodes(&config.nodes);
    if !config.username.is_empty() {
        builder = builder.user(config.username.clone(), config.password()?);
    }
    if let Some(tls) = config.tls() {
        let context = tls
            .rustls_config()
            .map_err(|e| Error::LogStore(format!("scylla: TLS: {e}")))?;
        builder = builder.tls_context(Some(context));
    }
    let session = builder.build().await.map_err(|e| cql_error("connect")(&e))?;
    for file in SCHEMA {
        for statement in schema_statements(file, config) {
            session
                .query_unpaged(statement, ())
                .await
                .map_err(|e| cql_error("apply the schema")(&e))?;
        }
    }
    Ok(Arc::new(session))
}

/// The statements of a schema file, its placeholders filled in and its comments dropped.
fn schema_statements(file: &str, config: &ScyllaConfig) -> Vec<String> {
    let schema = file
        .replace("${keyspace}", &config.keyspace)
        .replace("${replication}", &config.replication_factor.to_string())
        .replace("${ttl}", &config.ttl_secs.to_string());
    schema
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

pub(crate) async fn prepare(session: &Session, cql: String) -> Result<PreparedStatement> {
    session
        .prepare(cql)
        .await
        .map_err(|e| cql_error("prepare a statement")(&e))
}

/// Writes rows of one partition in one unlogged batch of `insert`, once more if it fails (a
/// timeout or a node going away): the rows are the same, so a second write changes nothing.
pub(crate) async fn write_batch<R>(session: &Session, insert: &PreparedStatement, rows: &[R], what: &str) -> Result<()>
where
    R: scylla::serialize::row::SerializeRow,
{
    let mut batch = Batch::new(BatchType::Unlogged);
    for _ in rows {
        batch.append_statement(insert.clone());
    }
    batch.set_is_idempotent(true);
    let mut last = None;
    for _ in 0..2 {
        match session.batch(&batch, rows).await {
            Ok(_) => return Ok(()),
            Err(error) => last = Some(error),
        }
    }
    Err(cql_error(what)(&last.expect("a failed attempt")))
}

/// Awaits `writes`, at most `limit` at once; the first error ends it.
pub(crate) async fn bounded<F>(writes: Vec<F>, limit: usize) -> Result<()>
where
    F: std::future::Future<Output = Result<()>>,
{
    use futures::StreamExt;
    let mut running = futures::stream::FuturesUnordered::new();
    for write in writes {
        if running.len() >= limit {
            running.next().await.expect("writes are running")?;
        }
        running.push(write);
    }
    while let Some(done) = running.next().await {
        done?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_tls_settings_are_checked_and_the_password_is_masked() {
        let problems_of = |config: ScyllaConfig| {
            let mut problems = Vec::new();
            config.validate(&mut problems);
            problems
        };
        let with = |username: &str, password: &str, file: Option<&str>| ScyllaConfig {
            username: username.into(),
            password: Secret::new(password),
            password_file: file.map(PathBuf::from),
            ..ScyllaConfig::default()
        };
        assert!(problems_of(with("kiln", "hunter2", None)).is_empty());
        assert!(problems_of(with("kiln", "", Some("/run/secrets/scylla"))).is_empty());
        assert_eq!(problems_of(with("kiln", "", None)).len(), 1);
        assert_eq!(problems_of(with("kiln", "x", Some("/f"))).len(), 1);
        assert_eq!(problems_of(with("", "x", None)).len(), 1);
        let shown = format!("{:?}", with("kiln", "hunter2", None));
        assert!(!shown.contains("hunter2") && shown.contains("***"), "{shown}");
        let client_cert_alone = ScyllaConfig {
            tls_cert_file: Some("/c.pem".into()),
            tls_key_file: Some("/c.key".into()),
            ..ScyllaConfig::default()
        };
        assert!(problems_of(client_cert_alone)[0].contains("need scylla.tls-ca-file"));
        let missing_ca = ScyllaConfig {
            tls_ca_file: Some("/nonexistent/ca.pem".into()),
            ..ScyllaConfig::default()
        };
        assert!(problems_of(missing_ca)[0].contains("/nonexistent/ca.pem"));
    }

    #[test]
    fn schema_files_split_into_filled_statements() {
        let config = ScyllaConfig {
            keyspace: "ks".into(),
            ttl_secs: 60,
            ..Default::default()
        };
        let statements: Vec<String> = SCHEMA.iter().flat_map(|f| schema_statements(f, &config)).collect();
        assert!(statements[0].starts_with("CREATE KEYSPACE IF NOT EXISTS ks"));
        assert!(statements.iter().any(|s| s.contains("ks.log_lines")));
        assert!(statements.iter().all(|s| !s.contains("${") && !s.contains("--")));
        assert!(
            statements
                .iter()
                .filter(|s| s.contains("TABLE"))
                .all(|s| s.contains("IF NOT EXISTS"))
        );
    }
}
