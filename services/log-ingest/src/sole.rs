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

/// Tries at start to take the lease when its write does not go through.
const TAKE_ATTEMPTS: usize = 10;

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
        // A write that did not go through (NATS busy) is tried again; another holder is final.
        for _ in 0..TAKE_ATTEMPTS {
            if lease.tick().await? {
                return Ok(Some(SoleLease {
                    lease,
                    nats: nats.clone(),
                }));
            }
            if let Ok(Some(current)) = Lease::current(nats, LEASE_LOG_INGEST).await
                && current.holder != lease.holder()
            {
                return Err(Error::AnotherLogIngest { holder: current.holder });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
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
                // A renewal can also fail because its write did not go through (a NATS node
                // died, a stream is electing a leader): only another holder stops this one.
                Ok(false) => match Lease::current(&self.nats, LEASE_LOG_INGEST).await {
                    Ok(Some(current)) if current.holder != self.lease.holder() => {
                        tracing::error!(holder = %current.holder, "another log-ingest took the log-ingest lease; stopping");
                        shutdown.cancel();
                        return Err(Error::AnotherLogIngest { holder: current.holder });
                    }
                    _ => tracing::warn!("cannot renew the log-ingest lease now; retrying"),
                },
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
