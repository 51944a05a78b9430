//! Quotas in the scheduling policy's terms, read from the store, and the queued-jobs check the
//! api makes at submit. The scheduler's pass enforces the running limits (CPU, memory, GPUs,
//! running jobs) with the same [`Quota`]s; one reading, for both services.

use crate::scheduling::QuotaScope;
use crate::store::{QueuedCounts, QuotaRecord, Store, StoreError};

/// Limits of a scope; `None` is unlimited. The running limits (CPU, memory, GPUs, running jobs)
/// count what the scope's jobs hold; `queued_jobs` is checked at submit by [`check_submit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    pub scope: QuotaScope,
    pub cpu_millis: Option<i64>,
    pub memory_bytes: Option<i64>,
    pub gpus: Option<i64>,
    pub running_jobs: Option<i64>,
    pub queued_jobs: Option<i64>,
}

impl Quota {
    /// A quota with no limit set, to fill in.
    pub fn unlimited(scope: QuotaScope) -> Quota {
        Quota {
            scope,
            cpu_millis: None,
            memory_bytes: None,
            gpus: None,
            running_jobs: None,
            queued_jobs: None,
        }
    }
}

/// The quotas of the store's rows; a row whose scope does not parse is skipped with a warning.
pub fn from_records(rows: Vec<QuotaRecord>) -> Vec<Quota> {
    let mut quotas = Vec::new();
    for row in rows {
        let Ok(scope) = QuotaScope::parse(&row.scope) else {
            tracing::warn!(scope = %row.scope, "ignoring a quota with a malformed scope");
            continue;
        };
        quotas.push(Quota {
            scope,
            cpu_millis: row.cpu_millis,
            memory_bytes: row.memory_bytes,
            gpus: row.gpus,
            running_jobs: row.running_jobs,
            queued_jobs: row.queued_jobs,
        });
    }
    quotas
}

/// Every quota in the store.
pub async fn read(store: &Store) -> Result<Vec<Quota>, StoreError> {
    Ok(from_records(store.quotas().await?))
}

/// A submit refused because a scope is at its queued-jobs quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("queued-jobs quota of {scope} is {limit} ({queued} queued)")]
pub struct QuotaExceeded {
    pub scope: QuotaScope,
    pub limit: i64,
    pub queued: i64,
}

/// Tells whether one more queued job of `user` (a name) in `project` stays within every
/// queued-jobs quota that covers it; `queued` counts the QUEUED jobs of the user, of the project
/// and of everyone ([`Store::queued_counts`]).
pub fn check_submit(quotas: &[Quota], queued: &QueuedCounts, user: &str, project: &str) -> Result<(), QuotaExceeded> {
    for quota in quotas {
        let Some(limit) = quota.queued_jobs else { continue };
        if !quota.scope.covers(user, project) {
            continue;
        }
        let count = match quota.scope {
            QuotaScope::Global => queued.global,
            QuotaScope::Project(_) => queued.project,
            QuotaScope::User(_) => queued.user,
        };
        if count + 1 > limit {
            return Err(QuotaExceeded {
                scope: quota.scope.clone(),
                limit,
                queued: count,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued_limit(scope: QuotaScope, limit: i64) -> Quota {
        Quota {
            queued_jobs: Some(limit),
            ..Quota::unlimited(scope)
        }
    }

    #[test]
    fn a_submit_over_the_queued_quota_is_refused_naming_it() {
        let quotas = [
            queued_limit(QuotaScope::Global, 10_000),
            queued_limit(QuotaScope::User("alice".into()), 100),
        ];
        let mut queued = QueuedCounts {
            user: 99,
            project: 0,
            global: 150,
        };
        assert_eq!(check_submit(&quotas, &queued, "alice", "vision"), Ok(()));
        queued.user = 100;
        let refused = check_submit(&quotas, &queued, "alice", "vision").unwrap_err();
        assert_eq!(
            refused.to_string(),
            "queued-jobs quota of user:alice is 100 (100 queued)"
        );
        // Another user is not covered by alice's quota.
        assert_eq!(check_submit(&quotas, &queued, "bob", "vision"), Ok(()));
    }

    #[test]
    fn project_and_global_quotas_cover_everyone_in_them() {
        let quotas = [
            queued_limit(QuotaScope::Project("vision".into()), 5),
            queued_limit(QuotaScope::Global, 7),
        ];
        let queued = QueuedCounts {
            user: 0,
            project: 5,
            global: 6,
        };
        let refused = check_submit(&quotas, &queued, "bob", "vision").unwrap_err();
        assert_eq!(
            refused.to_string(),
            "queued-jobs quota of project:vision is 5 (5 queued)"
        );
        // In another project the counts are that project's (none queued there).
        let elsewhere = QueuedCounts { project: 0, ..queued };
        assert_eq!(check_submit(&quotas, &elsewhere, "bob", "nlp"), Ok(()));
        let full = QueuedCounts { global: 7, ..elsewhere };
        let refused = check_submit(&quotas, &full, "bob", "nlp").unwrap_err();
        assert_eq!(refused.to_string(), "queued-jobs quota of global is 7 (7 queued)");
    }

    #[test]
    fn rows_with_a_malformed_scope_are_skipped() {
        let row = |scope: &str| QuotaRecord {
            scope: scope.into(),
            cpu_millis: None,
            memory_bytes: None,
            gpus: Some(4),
            running_jobs: None,
            queued_jobs: None,
            updated_at_ms: 0,
            weight: Some(2.0),
        };
        let quotas = from_records(vec![row("project:vision"), row("team:x"), row("global")]);
        let scopes: Vec<String> = quotas.iter().map(|quota| quota.scope.to_string()).collect();
        assert_eq!(scopes, ["project:vision", "global"]);
        assert_eq!(quotas[0].gpus, Some(4));
    }
}
