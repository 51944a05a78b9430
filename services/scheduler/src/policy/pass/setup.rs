//! Building a pass: members and their demands, pools with their victims in order, what
//! running jobs hold, and the quotas of each scope.

use std::collections::{HashMap, HashSet};

use super::holders::Registry;
use super::limits::ScopeUsage;
use super::{Pass, Plan, RunnerState};
use crate::policy::model::{Input, QuotaScope, Resources};

impl<'a> Pass<'a> {
    pub(super) fn new(input: &'a Input) -> Pass<'a> {
        let mut registry = Registry::default();
        let running_members: Vec<usize> = input
            .running
            .iter()
            .map(|job| registry.member(&job.project, &job.user, &input.weights))
            .collect();
        let member_of_job: Vec<usize> = input
            .pending
            .iter()
            .map(|job| registry.member(&job.project, &job.user, &input.weights))
            .collect();
        let members_count = registry.members.len();
        let Registry {
            project_ids,
            user_ids,
            projects,
            members,
            ..
        } = registry;

        let pool_ids: HashMap<&str, usize> = input
            .pools
            .iter()
            .enumerate()
            .map(|(index, pool)| (pool.name.as_str(), index))
            .collect();
        let state = |id: &str, pool: usize, capacity: Resources, instance: Resources| RunnerState {
            id: id.to_string(),
            pool,
            capacity,
            instance,
            free: capacity,
            hold: Resources::ZERO,
            reserved_for: None,
            victims: Vec::new(),
        };
        let mut listed: Vec<(usize, &str, usize)> = input
            .runners
            .iter()
            .enumerate()
            .filter_map(|(index, runner)| {
                let pool = *pool_ids.get(runner.pool.as_str())?;
                Some((pool, runner.id.as_str(), index))
            })
            .collect();
        listed.sort_unstable();
        listed.dedup_by(|a, b| a.1 == b.1);
        let mut runners: Vec<RunnerState> = Vec::new();
        let mut runners_of_pool: Vec<Vec<usize>> = vec![Vec::new(); input.pools.len()];
        for (pool, id, index) in listed {
            let runner = &input.runners[index];
            runners_of_pool[pool].push(runners.len());
            runners.push(state(id, pool, runner.capacity, runner.instance));
        }
        for (index, pool) in input.pools.iter().enumerate() {
            if runners_of_pool[index].is_empty() {
                runners_of_pool[index].push(runners.len());
                runners.push(state("", index, pool.capacity, pool.instance));
            }
        }
        let runner_ids: HashMap<(usize, String), usize> = runners
            .iter()
            .enumerate()
            .map(|(index, runner)| ((runner.pool, runner.id.clone()), index))
            .collect();
        let total = input
            .pools
            .iter()
            .fold(Resources::ZERO, |total, pool| total + pool.capacity);

        let mut pass = Pass {
            input,
            total,
            runners: Vec::new(),
            runners_of_pool: Vec::new(),
            project_moves: vec![Resources::ZERO; projects.len()],
            member_moves: vec![Resources::ZERO; members.len()],
            fair_share_failed: HashSet::new(),
            project_usage: vec![ScopeUsage::default(); projects.len()],
            user_usage: vec![ScopeUsage::default(); user_ids.len()],
            project_quotas: vec![Vec::new(); projects.len()],
            user_quotas: vec![Vec::new(); user_ids.len()],
            projects,
            members,
            member_of_job,
            member_of_running: running_members,
            member_demands: vec![Resources::ZERO; members_count],
            global_usage: ScopeUsage::default(),
            global_quotas: Vec::new(),
            victim_taken: vec![false; input.running.len()],
            budget_left: input.settings.preemption_budget,
            fair_share_budget_left: input.settings.fair_share_preemption_budget,
            stopping_left: input.running.iter().filter(|job| job.stopping).count(),
            plan: Plan::default(),
        };
        for (index, job) in input.pending.iter().enumerate() {
            pass.member_demands[pass.member_of_job[index]] += job.resources;
        }
        for (index, job) in input.running.iter().enumerate() {
            let member = pass.member_of_running[index];
            pass.member_demands[member] += job.resources;
            pass.take(member, job.resources);
            if job.stopping {
                pass.moves(member, -job.resources);
            }
            // A job on a pool or runner no one reports any more still counts for shares and
            // quotas. One whose runner is unknown (placed before runners were named) counts on
            // the first runner of its pool with room for it.
            let Some(&pool) = pool_ids.get(job.pool.as_str()) else {
                continue;
            };
            let runner = if job.runner.is_empty() {
                let candidates = &runners_of_pool[pool];
                candidates
                    .iter()
                    .copied()
                    .find(|&runner| job.resources.fits_in(&runners[runner].free))
                    .or(candidates.first().copied())
            } else {
                runner_ids.get(&(pool, job.runner.clone())).copied()
            };
            if let Some(runner) = runner {
                runners[runner].free -= job.resources;
                runners[runner].victims.push(index);
            }
        }
        // A cordoned runner takes nothing new: no free room, and no victims to make some.
        let cordoned: HashSet<&str> = input
            .runners
            .iter()
            .filter(|runner| runner.cordoned)
            .map(|runner| runner.id.as_str())
            .collect();
        for runner in runners
            .iter_mut()
            .filter(|runner| cordoned.contains(runner.id.as_str()))
        {
            runner.free = Resources::ZERO;
            runner.victims.clear();
        }
        for runner in &mut runners {
            runner.victims.sort_by_key(|&index| {
                let job = &input.running[index];
                (!job.stopping, job.priority, std::cmp::Reverse(job.started_at_ms))
            });
        }
        pass.runners = runners;
        pass.runners_of_pool = runners_of_pool;
        for quota in &input.quotas {
            match &quota.scope {
                QuotaScope::Global => pass.global_quotas.push(quota),
                QuotaScope::Project(name) => {
                    if let Some(&project) = project_ids.get(name.as_str()) {
                        pass.project_quotas[project].push(quota);
                    }
                }
                QuotaScope::User(name) => {
                    if let Some(&user) = user_ids.get(name.as_str()) {
                        pass.user_quotas[user].push(quota);
                    }
                }
            }
        }
        pass
    }
}
