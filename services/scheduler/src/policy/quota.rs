//! The queued-jobs quota, checked by the api at submit (the running quotas are the pass's).

use std::collections::HashMap;

use super::model::{Quota, QuotaScope};

/// A submit refused because a scope is at its queued-jobs quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("queued-jobs quota of {scope} is {limit} ({queued} queued)")]
pub struct QuotaExceeded {
    pub scope: QuotaScope,
    pub limit: i64,
    pub queued: i64,
}

/// Tells whether one more queued job of `user` in `project` stays within every queued-jobs
/// quota that covers it. `queued` counts the QUEUED jobs of each scope (absent = none).
pub fn check_submit(
    quotas: &[Quota],
    queued: &HashMap<QuotaScope, i64>,
    user: &str,
    project: &str,
) -> Result<(), QuotaExceeded> {
    for quota in quotas {
        let Some(limit) = quota.queued_jobs else { continue };
        if !quota.scope.covers(user, project) {
            continue;
        }
        let count = queued.get(&quota.scope).copied().unwrap_or(0);
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
        let mut queued = HashMap::from([(QuotaScope::Global, 150), (QuotaScope::User("alice".into()), 99)]);
        assert_eq!(check_submit(&quotas, &queued, "alice", "vision"), Ok(()));
        queued.insert(QuotaScope::User("alice".into()), 100);
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
        let queued = HashMap::from([(QuotaScope::Project("vision".into()), 5), (QuotaScope::Global, 6)]);
        let refused = check_submit(&quotas, &queued, "bob", "vision").unwrap_err();
        assert_eq!(
            refused.to_string(),
            "queued-jobs quota of project:vision is 5 (5 queued)"
        );
        assert_eq!(check_submit(&quotas, &queued, "bob", "nlp"), Ok(()));
        let full = HashMap::from([(QuotaScope::Global, 7)]);
        let refused = check_submit(&quotas, &full, "bob", "nlp").unwrap_err();
        assert_eq!(refused.to_string(), "queued-jobs quota of global is 7 (7 queued)");
    }
}
