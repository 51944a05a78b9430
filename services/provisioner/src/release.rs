//! Giving machines back (docs/provisioner.md sections 3 and 7). Every release goes through one
//! compare-and-set on the instance's record (`→ terminating`), so the boot timeout, the idle
//! scaler, a lapsed lease and the reaper never race each other into double work, and a
//! terminate is safe to send again.
//!
//! - `booting` → `registered` when a runner on the instance holds a lease; → `terminating`
//!   when none did by the pool's boot timeout.
//! - `registered` → `cordoned` after the pool's idle timeout with no job on its runner;
//!   `cordoned` → `terminating` a settle time later if still no job was placed on it (the
//!   scheduler stops placing on it when it reads the cordon), else back to `registered`.
//! - `registered` → `terminating` when its runner's lease lapsed and its jobs were handed back.
//! - The reaper lists the cluster's tagged instances: one kiln has no record of is adopted if
//!   its intent is known, else terminated after the grace; a record whose instance the cloud no
//!   longer has is closed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use kiln_cloud::{Cloud, InstanceId, PoolSpec, TagSelector};
use kiln_core::store::cloud::{instance_state, intent_state};
use kiln_core::store::{InstanceRecord, Store};

use crate::error::{Result, in_pool};
use crate::launch::record_of;

/// What the provisioner sees of the runners this cycle.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Instance id → the runner on it that holds a live lease.
    pub runner_on: HashMap<String, String>,
    /// Runners with a job placed on them (scheduled, starting, running or stopping).
    pub busy: HashSet<String>,
    /// Instances with a spot interruption notice: the cloud takes them back, so each is released
    /// as soon as its jobs were handed back, without waiting for the idle timeout.
    pub interrupted: HashSet<String>,
}

/// What one release round did, for metrics and logs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Released {
    pub registered: usize,
    pub cordoned: usize,
    pub uncordoned: usize,
    /// Every instance terminated, whatever the reason.
    pub terminated: usize,
    /// Of those, the ones idle past the pool's idle timeout.
    pub terminated_idle: usize,
    pub boot_timeouts: usize,
    pub lapsed: usize,
    pub interrupted: usize,
}

/// Where instances are released: the records, the cloud, this kiln's cluster id.
pub struct Scope<'a> {
    pub store: &'a Store,
    pub cloud: &'a dyn Cloud,
    pub cluster: &'a str,
}

/// Moves each live instance of `pool` along its lifecycle and terminates what is released.
pub async fn release(
    scope: &Scope<'_>,
    pool: &PoolSpec,
    seen: &Seen,
    idle_since: &mut HashMap<String, i64>,
    cordon_settle_ms: i64,
    now_ms: i64,
) -> Result<Released> {
    let Scope { store, cloud, cluster } = *scope;
    let mut done = Released::default();
    let mut to_terminate: Vec<InstanceRecord> = Vec::new();
    let records = store.instances(cluster, &instance_state::LIVE).await?;
    for record in records.into_iter().filter(|r| r.pool == pool.name) {
        let next_version = record.version + 1;
        let terminating = |record: &InstanceRecord, reason: &str| InstanceRecord {
            state: instance_state::TERMINATING.into(),
            version: record.version + 1,
            reason: reason.into(),
            ..record.clone()
        };
        match record.state.as_str() {
            instance_state::BOOTING => {
                if let Some(runner) = seen.runner_on.get(&record.instance_id) {
                    let registered = InstanceRecord {
                        state: instance_state::REGISTERED.into(),
                        version: next_version,
                        runner_id: runner.clone(),
                        registered_at_ms: now_ms,
                        ..record
                    };
                    if store.update_instance(&registered).await? {
                        done.registered += 1;
                    }
                } else if now_ms >= record.boot_deadline_ms {
                    let next = terminating(&record, "boot timeout: no runner registered");
                    if store.update_instance(&next).await? {
                        tracing::warn!(instance = %next.instance_id, pool = %pool.name, "no runner registered by the boot timeout; terminating");
                        done.boot_timeouts += 1;
                        to_terminate.push(next);
                    }
                }
            }
            instance_state::REGISTERED | instance_state::CORDONED => {
                let live = seen.runner_on.get(&record.instance_id) == Some(&record.runner_id);
                let busy = seen.busy.contains(&record.runner_id);
                if !live {
                    if busy {
                        // The scheduler hands its jobs back first (lost runners).
                        continue;
                    }
                    let next = terminating(&record, "runner lease lapsed");
                    if store.update_instance(&next).await? {
                        done.lapsed += 1;
                        to_terminate.push(next);
                    }
                    continue;
                }
                if busy {
                    idle_since.remove(&record.instance_id);
                    if record.state == instance_state::CORDONED {
                        let back = InstanceRecord {
                            state: instance_state::REGISTERED.into(),
                            version: next_version,
                            cordoned_at_ms: 0,
                            ..record
                        };
                        if store.update_instance(&back).await? {
                            done.uncordoned += 1;
                        }
                    }
                    continue;
                }
                if seen.interrupted.contains(&record.instance_id) {
                    // Its runner cordoned itself on the notice and handed its jobs back.
                    let next = terminating(&record, "spot interruption");
                    if store.update_instance(&next).await? {
                        done.interrupted += 1;
                        to_terminate.push(next);
                    }
                    continue;
                }
                if record.state == instance_state::CORDONED {
                    if now_ms - record.cordoned_at_ms >= cordon_settle_ms {
                        let next = terminating(&record, "idle");
                        if store.update_instance(&next).await? {
                            done.terminated_idle += 1;
                            to_terminate.push(next);
                        }
                    }
                    continue;
                }
                let since = *idle_since.entry(record.instance_id.clone()).or_insert(now_ms);
                if now_ms - since >= (pool.idle_timeout_secs as i64) * 1000 {
                    let cordoned = InstanceRecord {
                        state: instance_state::CORDONED.into(),
                        version: next_version,
                        cordoned_at_ms: now_ms,
                        ..record
                    };
                    if store.update_instance(&cordoned).await? {
                        tracing::info!(instance = %cordoned.instance_id, runner = %cordoned.runner_id, pool = %pool.name, "idle past the pool's idle timeout; cordoned");
                        done.cordoned += 1;
                    }
                }
            }
            // Sent before and not confirmed: send again.
            _ => to_terminate.push(record),
        }
    }
    done.terminated = terminate(store, cloud, &pool.name, to_terminate, now_ms).await?;
    Ok(done)
}

/// Terminates `records` (each already `terminating`) in one call and closes them.
async fn terminate(
    store: &Store,
    cloud: &dyn Cloud,
    pool: &str,
    records: Vec<InstanceRecord>,
    now_ms: i64,
) -> Result<usize> {
    if records.is_empty() {
        return Ok(0);
    }
    let ids: Vec<InstanceId> = records.iter().map(|r| InstanceId(r.instance_id.clone())).collect();
    cloud.terminate(&ids).await.map_err(in_pool(pool))?;
    let mut closed = 0;
    for record in records {
        tracing::info!(instance = %record.instance_id, pool, reason = %record.reason, "instance terminated");
        let terminated = InstanceRecord {
            state: instance_state::TERMINATED.into(),
            version: record.version + 1,
            released_at_ms: now_ms,
            ..record
        };
        if store.update_instance(&terminated).await? {
            closed += 1;
        }
    }
    Ok(closed)
}

/// What one reaper round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reaped {
    pub adopted: usize,
    pub reaped: usize,
    pub gone: usize,
}

/// Lists the cluster's tagged instances on `cloud` and makes the records and the cloud agree.
pub async fn reap(
    store: &Store,
    cloud: &Arc<dyn Cloud>,
    cluster: &str,
    pools: &[&PoolSpec],
    grace_ms: i64,
    horizon_ms: i64,
    now_ms: i64,
) -> Result<Reaped> {
    let pool_name = pools.first().map(|p| p.name.as_str()).unwrap_or_default();
    let selector = TagSelector {
        cluster: cluster.into(),
        pool: None,
        intent: None,
        live_only: true,
    };
    let listed = cloud.list(&selector).await.map_err(in_pool(pool_name))?;
    let records = store.instances(cluster, &instance_state::LIVE).await?;
    let known: HashSet<&str> = records.iter().map(|r| r.instance_id.as_str()).collect();
    let mut done = Reaped::default();
    let mut unknown = Vec::new();
    for instance in &listed {
        if known.contains(instance.id.0.as_str()) {
            continue;
        }
        let intent = match &instance.intent {
            Some(id) => store.intent(&id.to_string()).await?,
            None => None,
        };
        let pool = pools.iter().find(|p| Some(&p.name) == instance.pool.as_ref());
        if let (Some(intent), Some(pool)) = (&intent, pool)
            && (intent.state == intent_state::LAUNCHED || intent.state == intent_state::CALLING)
        {
            // Answered late by an eventually consistent listing, or made by a resent call.
            let record = record_of(intent, instance, pool.boot_timeout_secs as i64 * 1000, now_ms);
            done.adopted += store.insert_instances(vec![record]).await? as usize;
            continue;
        }
        let age_ms = instance
            .launched_at
            .duration_since(UNIX_EPOCH)
            .map(|at| now_ms - at.as_millis() as i64)
            .unwrap_or(i64::MAX);
        if age_ms >= grace_ms {
            tracing::warn!(instance = %instance.id, intent = ?instance.intent, "tagged for this cluster but unknown to kiln; reaping");
            unknown.push(instance.id.clone());
        }
    }
    if !unknown.is_empty() {
        cloud.terminate(&unknown).await.map_err(in_pool(pool_name))?;
        done.reaped = unknown.len();
    }
    // Records of instances the cloud no longer lists (reclaimed, terminated outside kiln).
    let listed_ids: HashSet<&str> = listed.iter().map(|i| i.id.0.as_str()).collect();
    for record in records {
        if listed_ids.contains(record.instance_id.as_str())
            || now_ms - record.launched_at_ms < horizon_ms
            || !pools.iter().any(|p| p.name == record.pool)
        {
            continue;
        }
        let gone = InstanceRecord {
            state: instance_state::TERMINATED.into(),
            version: record.version + 1,
            released_at_ms: now_ms,
            reason: if record.reason.is_empty() {
                "gone from the cloud".into()
            } else {
                record.reason.clone()
            },
            ..record
        };
        if store.update_instance(&gone).await? {
            done.gone += 1;
        }
    }
    Ok(done)
}
