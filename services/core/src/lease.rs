//! Leases: leader election in the `kiln_leases` bucket, and runner liveness in `kiln_runners`
//! (see [`crate::runners`]).
//!
//! The entry under a lease's name holds its holder and when it expires. A candidate takes an
//! absent or expired lease, and the holder renews it, each with a compare-and-set on the
//! entry's revision: of two candidates racing, one write wins. The holder counts itself leader
//! only until `ttl` after it *sent* its last successful write, so it stops before anyone may
//! take over (clocks of the hosts are assumed to agree within a fraction of the TTL). What a
//! leader does must still be safe if, in a partition, two believe they lead: the scheduler's
//! transitions are compare-and-set on the job's version, so a job is placed once whatever happens.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::ids::now_ms;
use crate::streams::{Nats, NatsError};
use crate::subjects::BUCKET_LEASES;

/// The value of a lease entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHolder {
    pub holder: String,
    pub expires_at_ms: i64,
    /// What the holder tells those who act when it is gone (a runner's pool and `on-lost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl LeaseHolder {
    /// Tells whether the lease still runs at `now_ms`.
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.expires_at_ms >= now_ms
    }
}

/// One candidate for a named lease.
pub struct Lease {
    kv: kv::Store,
    name: String,
    holder: String,
    ttl: Duration,
    data: Option<serde_json::Value>,
    held_until: Option<Instant>,
}

fn other(error: impl std::fmt::Display) -> NatsError {
    NatsError::Other(error.to_string())
}

impl Lease {
    /// `ttl` must stay under the bucket's max age (30 s), which removes abandoned entries.
    pub async fn new(nats: &Nats, name: &str, holder: &str, ttl: Duration) -> Result<Lease, NatsError> {
        Lease::in_bucket(nats, BUCKET_LEASES, name, holder, ttl, None).await
    }

    /// A lease in `bucket` whose entry carries `data` besides its holder and expiry.
    pub async fn in_bucket(
        nats: &Nats,
        bucket: &str,
        name: &str,
        holder: &str,
        ttl: Duration,
        data: Option<serde_json::Value>,
    ) -> Result<Lease, NatsError> {
        let kv = nats.jetstream.get_key_value(bucket).await.map_err(other)?;
        Ok(Lease {
            kv,
            name: name.to_string(),
            holder: holder.to_string(),
            ttl,
            data,
            held_until: None,
        })
    }

    /// Until when this candidate leads (none: it does not).
    pub fn held_until(&self) -> Option<Instant> {
        self.held_until.filter(|until| Instant::now() < *until)
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether this candidate leads now.
    pub fn is_held(&self) -> bool {
        self.held_until.is_some_and(|until| Instant::now() < until)
    }

    /// Takes the lease if it is free or expired, or renews it if held; returns whether this
    /// candidate leads. Call it every `ttl / 3`. A tick that takes longer than that is given
    /// up (an error), so the caller's loop goes on and its leadership lapses on time.
    pub async fn tick(&mut self) -> Result<bool, NatsError> {
        let patience = self.ttl / 3;
        match tokio::time::timeout(patience, self.try_tick()).await {
            Ok(ticked) => ticked,
            Err(_) => {
                self.held_until = self.held_until.filter(|until| Instant::now() < *until);
                Err(other(format!(
                    "the lease {} was not written within {} ms",
                    self.name,
                    patience.as_millis()
                )))
            }
        }
    }

    async fn try_tick(&mut self) -> Result<bool, NatsError> {
        let sent = Instant::now();
        let value = serde_json::to_vec(&LeaseHolder {
            holder: self.holder.clone(),
            expires_at_ms: now_ms() + i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX),
            data: self.data.clone(),
        })
        .map_err(other)?;
        let written = match self.kv.entry(&self.name).await.map_err(other)? {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let current: Option<LeaseHolder> = serde_json::from_slice(&entry.value).ok();
                let ours = current.as_ref().is_some_and(|c| c.holder == self.holder);
                let expired = current.as_ref().is_none_or(|c| c.expires_at_ms < now_ms());
                if !ours && !expired {
                    self.held_until = None;
                    return Ok(false);
                }
                self.kv.update(&self.name, value.into(), entry.revision).await.is_ok()
            }
            // Deleted or purged: a write on that revision, so a racing create cannot also win.
            Some(entry) => self.kv.update(&self.name, value.into(), entry.revision).await.is_ok(),
            None => self.kv.create(&self.name, value.into()).await.is_ok(),
        };
        self.held_until = written.then_some(sent + self.ttl);
        Ok(written)
    }

    /// Gives the lease up (at shutdown) so a standby need not wait for it to expire.
    pub async fn release(&mut self) -> Result<(), NatsError> {
        if !self.is_held() {
            return Ok(());
        }
        self.held_until = None;
        if let Some(entry) = self.kv.entry(&self.name).await.map_err(other)?
            && serde_json::from_slice::<LeaseHolder>(&entry.value).is_ok_and(|c| c.holder == self.holder)
        {
            // Best effort: if someone took it since, the revision check leaves theirs alone.
            let expired = serde_json::to_vec(&LeaseHolder {
                holder: self.holder.clone(),
                expires_at_ms: 0,
                data: self.data.clone(),
            })
            .map_err(other)?;
            let _ = self.kv.update(&self.name, expired.into(), entry.revision).await;
        }
        Ok(())
    }

    /// Who holds a lease now, if anyone.
    pub async fn current(nats: &Nats, name: &str) -> Result<Option<LeaseHolder>, NatsError> {
        let kv = nats.jetstream.get_key_value(BUCKET_LEASES).await.map_err(other)?;
        let Some(entry) = kv.entry(name).await.map_err(other)? else {
            return Ok(None);
        };
        let holder = serde_json::from_slice::<LeaseHolder>(&entry.value).ok();
        Ok(holder.filter(|h| entry.operation == kv::Operation::Put && h.is_live(now_ms())))
    }

    /// Every lease entry of `bucket` by name, expired ones included (a deleted or unreadable
    /// entry is left out).
    pub async fn all(nats: &Nats, bucket: &str) -> Result<HashMap<String, LeaseHolder>, NatsError> {
        let kv = nats.jetstream.get_key_value(bucket).await.map_err(other)?;
        let mut keys = kv.keys().await.map_err(other)?;
        let mut leases = HashMap::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(other)?;
            let Some(entry) = kv.entry(&key).await.map_err(other)? else {
                continue;
            };
            if entry.operation != kv::Operation::Put {
                continue;
            }
            match serde_json::from_slice::<LeaseHolder>(&entry.value) {
                Ok(holder) => {
                    leases.insert(key, holder);
                }
                Err(_) => tracing::warn!(bucket, key, "ignoring a malformed lease"),
            }
        }
        Ok(leases)
    }
}
