//! One log-ingest per NATS account while a store is embedded: two, each with its own SQLite
//! files, would each take part of the intakes' messages and split a job's lines and points.
//!
//! A log-ingest with a SQLite store takes the `log-ingest` lease in `kiln_leases` at bind, renews
//! it while it serves and gives it up at shutdown. Its holder name is the host and the store
//! files, so a log-ingest restarted on the same files (after a crash, which leaves the lease
//! behind) takes its own lease back at once; any other is refused at start until the lease is
//! released or has gone [`TTL`] without renewal.

use std::path::Path;
use std::time::Duration;

use kiln_core::lease::Lease;
use kiln_core::streams::Nats;
use kiln_core::subjects::LEASE_LOG_INGEST;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, StoreKind};
use crate::error::{Error, Result};

/// How long the lease lasts without renewal (renewed every third of it).
pub const TTL: Duration = Duration::from_secs(10);

/// The held lease of the one log-ingest with embedded stores.
pub struct SoleLease {
    lease: Lease,
    nats: Nats,
}

/// This log-ingest's name in the lease: the host and its SQLite files.
pub fn holder_name(config: &Config) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    let file = |path: &Path| {
        std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string()
    };
    let mut files = Vec::new();
    if config.log_store == StoreKind::Sqlite {
        files.push(file(&config.sqlite.logs_path));
    }
    if config.metric_store == StoreKind::Sqlite {
        files.push(file(&config.sqlite.metrics_path));
    }
    format!("{host}:{}", files.join(","))
}

impl SoleLease {
    /// Takes the lease when either store is SQLite (`None` when both are shared); fails when
    /// another log-ingest holds it.
    pub async fn take(nats: &Nats, config: &Config) -> Result<Option<SoleLease>> {
        if !config.uses_sqlite() {
            return Ok(None);
        }
        let mut lease = Lease::new(nats, LEASE_LOG_INGEST, &holder_name(config), TTL).await?;
        if lease.tick().await? {
            return Ok(Some(SoleLease {
                lease,
                nats: nats.clone(),
            }));
        }
        Err(Error::AnotherLogIngest {
            holder: current_holder(nats).await,
        })
    }

    /// Renews the lease until `shutdown`, then hands it back for [`SoleLease::release`]. If
    /// another log-ingest took it (this one could not renew it within [`TTL`]), cancels
    /// `shutdown` and fails: two must not serve.
    pub async fn hold(mut self, shutdown: CancellationToken) -> Result<SoleLease> {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(TTL / 3) => {}
            }
            match self.lease.tick().await {
                Ok(true) => {}
                Ok(false) => {
                    let holder = current_holder(&self.nats).await;
                    tracing::error!(holder, "another log-ingest took the log-ingest lease; stopping");
                    shutdown.cancel();
                    return Err(Error::AnotherLogIngest { holder });
                }
                Err(error) => tracing::warn!(error = %error, "cannot renew the log-ingest lease; retrying"),
            }
        }
        Ok(self)
    }

    /// Gives the lease up (once the intakes have stopped), so another log-ingest may start.
    pub async fn release(mut self) {
        if let Err(error) = self.lease.release().await {
            tracing::warn!(error = %error, "cannot give the log-ingest lease up; it expires on its own");
        }
    }
}

async fn current_holder(nats: &Nats) -> String {
    match Lease::current(nats, LEASE_LOG_INGEST).await {
        Ok(Some(current)) => current.holder,
        _ => "unknown".into(),
    }
}
