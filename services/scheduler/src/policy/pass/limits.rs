//! Running quotas in a pass: what each scope's running jobs hold, and the first limit a job
//! would exceed.

use super::Pass;
use super::holders::Member;
use crate::policy::explain::Wait;
use crate::policy::model::{PendingJob, Quota, QuotaResource, Resources};

/// What a quota scope's running jobs hold.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ScopeUsage {
    pub(super) resources: Resources,
    pub(super) running_jobs: i64,
}

impl ScopeUsage {
    pub(super) fn add(&mut self, resources: Resources) {
        self.resources += resources;
        self.running_jobs += 1;
    }
}

impl Pass<'_> {
    pub(super) fn quota_wait(&self, job: &PendingJob, member: usize) -> Option<Wait> {
        let Member { project, user, .. } = self.members[member];
        let scopes = [
            (&self.global_quotas, &self.global_usage),
            (&self.project_quotas[project], &self.project_usage[project]),
            (&self.user_quotas[user], &self.user_usage[user]),
        ];
        scopes
            .into_iter()
            .find_map(|(quotas, usage)| quotas.iter().find_map(|quota| over_quota(quota, usage, &job.resources)))
    }
}

/// The first running limit of `quota` that starting `asked` would exceed.
fn over_quota(quota: &Quota, usage: &ScopeUsage, asked: &Resources) -> Option<Wait> {
    let limits = [
        (
            QuotaResource::Cpu,
            quota.cpu_millis,
            usage.resources.cpu_millis,
            asked.cpu_millis,
        ),
        (
            QuotaResource::Memory,
            quota.memory_bytes,
            usage.resources.memory_bytes,
            asked.memory_bytes,
        ),
        (QuotaResource::Gpus, quota.gpus, usage.resources.gpus, asked.gpus),
        (QuotaResource::RunningJobs, quota.running_jobs, usage.running_jobs, 1),
    ];
    limits.into_iter().find_map(|(resource, limit_opt, used, asked)| {
        let limit = limit_opt?;
        (asked > 0 && used + asked > limit).then(|| Wait::Quota {
            scope: quota.scope.clone(),
            resource,
            limit,
            used,
            asked,
        })
    })
}
