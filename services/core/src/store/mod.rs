//! The metadata store: users, tokens, jobs and artifacts, through sea-orm on SQLite or Postgres.
//!
//! The database is the source of truth for every record's state. `api` writes the user-facing
//! records (users, tokens, new jobs, artifacts); the scheduler and runners change a job only
//! through [`Store::transition`], a compare-and-set on the record's version.

use std::time::Duration;

use kiln_migrations::{Migrator, MigratorTrait};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr, RuntimeErr};

use crate::config::DatabaseConfig;
use crate::error::ErrorKind;

mod artifacts;
mod batches;
pub mod cloud;
pub mod entities;
pub mod gangs;
mod jobs;
pub mod logins;
pub mod models;
mod owners;
mod projects;
mod quotas;
mod runs;
mod secrets;
mod users;

pub use artifacts::{DatasetRef, NewArtifact};
pub use batches::BatchScope;
pub use cloud::{InstanceRecord, IntentRecord};
pub use entities::job::Model as JobRecord;
pub use gangs::{NodeRecord, node_state};
pub use jobs::{Change, EXTERNAL_POOL, JobHold, NewJob, Usage};
pub use models::{ModelKey, ModelRecord, ModelVersionRecord, NewModelVersion, VersionFilter};
pub use owners::{PAUSED, paused_reason};
pub use projects::MemberRecord;
pub use quotas::{QueuedCounts, QuotaRecord};
pub use runs::{JobFilter, RunArtifactFile};
pub use secrets::SecretRecord;
pub use users::TokenGrant;

/// StoreError is a failure of the metadata store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("job {job_id} not found")]
    JobNotFound { job_id: String },
    #[error("job {job_id} changed concurrently: expected version {expected}, now {actual} in state {state}")]
    Conflict {
        job_id: String,
        expected: i64,
        actual: i64,
        state: String,
    },
    #[error("job {job_id} cannot go from {from} to {to}")]
    IllegalTransition { job_id: String, from: String, to: String },
    #[error("the database schema is not current: {pending} migrations pending (start `api`, which applies them)")]
    SchemaNotCurrent { pending: usize },
    /// A controller may no longer make jobs as this owner (disabled, or no longer a member).
    #[error("{reason}")]
    OwnerRevoked { owner_id: String, reason: String },
    /// A step of a web UI login is refused (the message says what to do).
    #[error(transparent)]
    Login(#[from] logins::LoginError),
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    #[error("database error: {0}")]
    Db(#[from] DbErr),
}

impl StoreError {
    /// Whether a write broke a unique constraint (a racing insert of the same key won).
    pub fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Db(error)
            if matches!(error.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(_))))
    }

    /// Whether Postgres ended the statement so that another transaction could go on: it was
    /// chosen to break a deadlock (SQLSTATE 40P01) or could not be serialized (40001). Nothing
    /// of its transaction was kept, and running the whole transaction again is safe.
    pub fn is_transient(&self) -> bool {
        let StoreError::Db(DbErr::Exec(RuntimeErr::SqlxError(error)) | DbErr::Query(RuntimeErr::SqlxError(error))) =
            self
        else {
            return false;
        };
        let code = error.as_database_error().and_then(|error| error.code());
        matches!(code.as_deref(), Some("40P01" | "40001"))
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::JobNotFound { .. } => ErrorKind::NotFound,
            StoreError::Conflict { .. } | StoreError::IllegalTransition { .. } => ErrorKind::FailedPrecondition,
            StoreError::SchemaNotCurrent { .. } => ErrorKind::Unavailable,
            StoreError::OwnerRevoked { .. } => ErrorKind::FailedPrecondition,
            StoreError::Login(error) => error.kind(),
            StoreError::Corrupt(_) => ErrorKind::Internal,
            StoreError::Db(DbErr::ConnectionAcquire(_) | DbErr::Conn(_)) => ErrorKind::Unavailable,
            error if error.is_transient() => ErrorKind::Unavailable,
            error if error.is_unique_violation() => ErrorKind::AlreadyExists,
            StoreError::Db(_) => ErrorKind::Internal,
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Store is a pool of connections to the metadata database.
#[derive(Clone, Debug)]
pub struct Store {
    db: DatabaseConnection,
    /// `kiln_<service>_job_transitions_total{state}`, once [`Store::count_transitions`] ran.
    transitions: Option<
        prometheus_client::metrics::family::Family<TransitionLabels, prometheus_client::metrics::counter::Counter>,
    >,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub(crate) struct TransitionLabels {
    pub(crate) state: &'static str,
}

impl Store {
    /// Counts the job transitions this store makes as `kiln_<service>_job_transitions_total`,
    /// by the state moved to. Each service counts its own: a dashboard sums them.
    pub fn count_transitions(&mut self, metrics: &crate::metrics::Metrics, service: &str) {
        let family = prometheus_client::metrics::family::Family::default();
        metrics.register(service, |registry| {
            use crate::metrics::RegistryExt;
            registry.add(
                "job_transitions",
                "Job state changes this service made, by the state moved to",
                family.clone(),
            )
        });
        self.transitions = Some(family);
    }

    /// Connects to the database; for SQLite it creates the file's directory and turns on WAL so
    /// several services can share the file (with `synchronous = NORMAL`, see below).
    pub async fn connect(config: &DatabaseConfig) -> StoreResult<Store> {
        let url = config.url.expose();
        if config.url.is_sqlite()
            && let Some(path) = sqlite_path(url)
            && let Some(parent) = std::path::Path::new(path).parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)
                .map_err(|e| DbErr::Custom(format!("cannot create {}: {e}", parent.display())))?;
        }
        if config.url.is_sqlite()
            && let Some(path) = sqlite_path(url)
        {
            create_private(std::path::Path::new(path))?;
        }
        let mut options = ConnectOptions::new(url.to_string());
        options
            .max_connections(config.max_connections)
            .connect_timeout(Duration::from_secs(5))
            .acquire_timeout(Duration::from_secs(10))
            .sqlx_logging(false);
        // SQLite in WAL mode with `synchronous = NORMAL` on every connection: a commit is
        // durable against the crash of any process (the WAL is written before it returns) but
        // not synced to the disk until a checkpoint, so a power loss of the machine may take the
        // last commits back (never corrupting the file). That is JetStream's own promise with
        // its default sync interval, and it makes a commit ~0.1 ms instead of an fsync (~2.5 ms
        // on the CI machine's disk). See docs/design-notes.md.
        options.map_sqlx_sqlite_opts(|sqlite| {
            use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
            sqlite
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
        });
        let db = Database::connect(options).await?;
        Ok(Store { db, transitions: None })
    }

    /// Wraps an existing connection.
    pub fn from_connection(db: DatabaseConnection) -> Store {
        Store { db, transitions: None }
    }

    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Applies every pending migration.
    pub async fn migrate(&self) -> StoreResult<()> {
        Migrator::up(&self.db, None).await?;
        Ok(())
    }

    /// Fails unless every migration is applied (services other than `api` start with this).
    pub async fn check_schema(&self) -> StoreResult<()> {
        let pending = Migrator::get_pending_migrations(&self.db).await?.len();
        if pending > 0 {
            return Err(StoreError::SchemaNotCurrent { pending });
        }
        Ok(())
    }

    /// Waits up to `timeout` for the schema to be current.
    pub async fn wait_for_schema(&self, timeout: Duration) -> StoreResult<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.check_schema().await {
                Ok(()) => return Ok(()),
                Err(error) if tokio::time::Instant::now() >= deadline => return Err(error),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

/// Creates a database file kiln's user alone reads (0600) unless it exists: SQLite gives its
/// `-wal` and `-shm` files the database's mode, where it would make all three 0644.
fn create_private(path: &std::path::Path) -> StoreResult<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(DbErr::Custom(format!("cannot create {}: {error}", path.display())).into()),
    }
}

fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next()?;
    (!path.is_empty() && path != ":memory:").then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_new_sqlite_database_and_its_journal_are_kilns_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data/kiln.db");
        let config = DatabaseConfig {
            url: crate::config::DatabaseUrl::new(format!("sqlite://{}?mode=rwc", path.display())),
            max_connections: 2,
        };
        let store = Store::connect(&config).await.unwrap();
        store.migrate().await.unwrap();
        for file in ["kiln.db", "kiln.db-wal", "kiln.db-shm"] {
            let mode = std::fs::metadata(dir.path().join("data").join(file))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{file}");
        }
    }

    #[test]
    fn sqlite_paths_are_found() {
        assert_eq!(sqlite_path("sqlite://./data/kiln.db?mode=rwc"), Some("./data/kiln.db"));
        assert_eq!(sqlite_path("sqlite:///tmp/x.db"), Some("/tmp/x.db"));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
    }
}
