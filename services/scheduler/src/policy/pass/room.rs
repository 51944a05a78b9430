//! Room for a job: the pool and market it starts on, the victims a higher priority or a job
//! below its fair share preempts, and the reservations that hold room for a job that cannot fit
//! yet.

use super::{Pass, Preemption};
use crate::policy::explain::Wait;
use crate::policy::market::choose_market;
use crate::policy::model::{Market, MarketPolicy, PendingJob, Pool, Resources};

/// Why a job may name victims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// Its priority may preempt strictly lower, preemptible ones.
    Priority,
    /// It may preempt preemptible ones of the same or lower priority whose owner stays at or
    /// above its share once the victims stop and it starts.
    FairShare,
}

/// Where a fair-share victim's owner is compared with the waiting job's: the projects, or the
/// users (inside one project, or across projects as well as the projects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Project(usize),
    Member(usize),
}

/// Weighted shares closer than this count as equal.
pub(super) const SHARE_EPSILON: f64 = 1e-9;

impl Pass<'_> {
    /// The pool where the job fits now at the lowest cost per hour, with its market.
    pub(super) fn best_fit(&self, job: &PendingJob, eligible: &[usize]) -> Option<(usize, Market)> {
        let settings = &self.input.settings;
        let mut best: Option<(f64, usize, Market)> = None;
        for &index in eligible {
            if !job.resources.fits_in(&self.pools[index].free) {
                continue;
            }
            let pool = &self.input.pools[index];
            let Some(market) = choose_market(job.market, pool, job.preemptions, job.expected_runtime_secs, settings)
            else {
                continue;
            };
            let cost = pool.cost_per_hour(&job.resources, market);
            if best.is_none_or(|(best_cost, _, _)| cost < best_cost) {
                best = Some((cost, index, market));
            }
        }
        best.map(|(_, index, market)| (index, market))
    }

    /// Victims for a job that cannot fit: for its priority when that may preempt, else (when
    /// the settings allow) for fair share; `None` when neither finds any within the budget.
    pub(super) fn preempt(&mut self, job_index: usize, eligible: &[usize]) -> Option<Wait> {
        let input = self.input;
        let job = &input.pending[job_index];
        if input.settings.preempting_priorities.contains(&job.priority)
            && (self.budget_left > 0 || self.stopping_left > 0)
            && let Some(wait) = self.preempt_for(job_index, eligible, Cause::Priority)
        {
            return Some(wait);
        }
        if !input.settings.fair_share_preemption || (self.fair_share_budget_left == 0 && self.stopping_left == 0) {
            return None;
        }
        let key = (self.member_of_job[job_index], job.resources);
        if self.fair_share_failed.contains(&key) {
            return None;
        }
        let wait = self.preempt_for(job_index, eligible, Cause::FairShare);
        if wait.is_none() {
            self.fair_share_failed.insert(key);
        }
        wait
    }

    /// The preemptions this pass may still order for `cause`.
    fn budget(&self, cause: Cause) -> usize {
        match cause {
            Cause::Priority => self.budget_left,
            Cause::FairShare => self.fair_share_budget_left,
        }
    }

    /// Names victims on one pool (fewest new ones, then the lowest priority) within the budget,
    /// holds that pool's room for the job, and tells it to wait for them.
    fn preempt_for(&mut self, job_index: usize, eligible: &[usize], cause: Cause) -> Option<Wait> {
        let input = self.input;
        let job = &input.pending[job_index];
        let mut best: Option<((usize, i32, usize), Vec<usize>)> = None;
        for &pool in eligible {
            let Some(victims) = self.victims_on(pool, job_index, cause) else {
                continue;
            };
            let new_victims = victims.iter().filter(|&&index| !input.running[index].stopping);
            let count = new_victims.clone().count();
            if count > self.budget(cause) {
                continue;
            }
            let highest = new_victims
                .map(|&index| input.running[index].priority)
                .max()
                .unwrap_or(i32::MIN);
            let key = (count, highest, pool);
            if best.as_ref().is_none_or(|(best_key, _)| key < *best_key) {
                best = Some((key, victims));
            }
        }
        let ((count, _, pool), victims) = best?;
        match cause {
            Cause::Priority => self.budget_left -= count,
            Cause::FairShare => self.fair_share_budget_left -= count,
        }
        for &index in &victims {
            self.victim_taken[index] = true;
            let victim = &input.running[index];
            if victim.stopping {
                self.stopping_left -= 1;
            } else {
                self.plan.preemptions.push(Preemption {
                    victim: victim.id.clone(),
                    for_job: job.id.clone(),
                    fair_share: cause == Cause::FairShare,
                });
                self.moves(self.member_of_running[index], -victim.resources);
            }
        }
        self.moves(self.member_of_job[job_index], job.resources);
        self.hold(pool, job_index);
        Some(Wait::WaitingForPreemption {
            pool: input.pools[pool].name.clone(),
            victims: victims.iter().map(|&index| input.running[index].id.clone()).collect(),
        })
    }

    /// Running jobs on `pool` whose stop would let the job fit: stopping ones first, then for
    /// priority lower-priority preemptible ones, lowest priority and youngest first, or for
    /// fair share the candidates of [`Pass::fair_share_order`] while each owner stays at or
    /// above the job's share; pruned to a minimal set.
    fn victims_on(&self, pool: usize, job_index: usize, cause: Cause) -> Option<Vec<usize>> {
        let state = &self.pools[pool];
        let running = &self.input.running;
        let job = &self.input.pending[job_index];
        let fair_share_order;
        let order: &[usize] = match cause {
            Cause::Priority => &state.victims,
            Cause::FairShare => {
                fair_share_order = self.fair_share_order(pool, job_index);
                &fair_share_order
            }
        };
        let mut room = state.free;
        let mut chosen = Vec::new();
        // What the fair-share victims chosen so far take from each owner.
        let mut lost: Vec<(Level, Resources)> = Vec::new();
        for &index in order {
            if job.resources.fits_in(&room) {
                break;
            }
            let victim = &running[index];
            let allowed = victim.stopping
                || match cause {
                    Cause::Priority => victim.preemptible && victim.priority < job.priority,
                    Cause::FairShare => true,
                };
            if self.victim_taken[index] || !allowed {
                continue;
            }
            let lacking = (job.resources - room).clamp_negative();
            if victim.resources.min(&lacking) == Resources::ZERO {
                continue;
            }
            if cause == Cause::FairShare && !victim.stopping {
                let comparisons = self
                    .levels(job_index, index)
                    .expect("fair-share candidates are other users' jobs");
                let totals = comparisons.map(|(owner, _)| {
                    let position = lost.iter().position(|(level, _)| *level == owner);
                    position.map_or(Resources::ZERO, |position| lost[position].1) + victim.resources
                });
                let inverts = comparisons
                    .iter()
                    .zip(totals)
                    .any(|(&(owner, waiter), total)| self.lead(owner, total, waiter, job.resources) < -SHARE_EPSILON);
                if inverts {
                    continue;
                }
                for ((owner, _), total) in comparisons.into_iter().zip(totals) {
                    match lost.iter().position(|(level, _)| *level == owner) {
                        Some(position) => lost[position].1 = total,
                        None => lost.push((owner, total)),
                    }
                }
            }
            room += victim.resources;
            chosen.push(index);
        }
        if !job.resources.fits_in(&room) {
            return None;
        }
        // Drop the new victims it can do without, so the set is minimal.
        let mut position = 0;
        while position < chosen.len() {
            let victim = &running[chosen[position]];
            let without = room - victim.resources;
            if !victim.stopping && job.resources.fits_in(&without) {
                room = without;
                chosen.remove(position);
            } else {
                position += 1;
            }
        }
        Some(chosen)
    }

    /// The fair-share candidates on `pool`, after its stopping jobs: other users' preemptible
    /// jobs of the same or lower priority whose owner would stay at or above the job's share
    /// after losing that one; in the pool's victim order (the lowest priority, then the
    /// youngest), so a victim throws away the least work. Taking from the owner furthest ahead
    /// first instead lost 54% more work in the study for the same fairness (README, Performance).
    fn fair_share_order(&self, pool: usize, job_index: usize) -> Vec<usize> {
        let state = &self.pools[pool];
        let running = &self.input.running;
        let job = &self.input.pending[job_index];
        let stopping = state
            .victims
            .iter()
            .take_while(|&&index| running[index].stopping)
            .count();
        let mut candidates: Vec<usize> = Vec::new();
        for &index in &state.victims[stopping..] {
            let victim = &running[index];
            if self.victim_taken[index] || !victim.preemptible || victim.priority > job.priority {
                continue;
            }
            let Some(comparisons) = self.levels(job_index, index) else {
                continue;
            };
            if comparisons
                .iter()
                .any(|&(owner, waiter)| self.lead(owner, victim.resources, waiter, job.resources) < -SHARE_EPSILON)
            {
                continue;
            }
            candidates.push(index);
        }
        state.victims[..stopping].iter().copied().chain(candidates).collect()
    }

    /// The comparisons a fair-share victim must pass, as (owner, waiter): between users inside
    /// one project (given twice); across projects, between the projects and also between the two
    /// users, so a job of a user poorer than the waiting one is never taken because its project
    /// is richer. `None` for the job's own user.
    fn levels(&self, job_index: usize, running_index: usize) -> Option<[(Level, Level); 2]> {
        let waiter = self.member_of_job[job_index];
        let owner = self.member_of_running[running_index];
        if owner == waiter {
            return None;
        }
        let (waiter_project, owner_project) = (self.members[waiter].project, self.members[owner].project);
        let users = (Level::Member(owner), Level::Member(waiter));
        Some(if waiter_project == owner_project {
            [users, users]
        } else {
            [(Level::Project(owner_project), Level::Project(waiter_project)), users]
        })
    }

    /// How far `owner`'s weighted share, less `lost`, stays above `waiter`'s plus `asked`, once
    /// this pass's preemptions are done; negative when the order would invert.
    fn lead(&self, owner: Level, lost: Resources, waiter: Level, asked: Resources) -> f64 {
        self.level_share(owner, -lost) - self.level_share(waiter, asked)
    }

    /// A level's weighted dominant share with what this pass's preemptions move, and `change`.
    fn level_share(&self, level: Level, change: Resources) -> f64 {
        let (holder, moves) = match level {
            Level::Project(project) => (&self.projects[project], self.project_moves[project]),
            Level::Member(member) => (&self.members[member].holder, self.member_moves[member]),
        };
        (holder.held + moves + change)
            .clamp_negative()
            .dominant_share(&self.total)
            / holder.weight
    }

    pub(super) fn capacity_wait(&mut self, job_index: usize, eligible: &[usize]) -> Wait {
        let input = self.input;
        let job = &input.pending[job_index];
        for &pool in eligible {
            let state = &self.pools[pool];
            if let Some(holder) = state.reserved_for
                && job.resources.fits_in(&(state.free + state.hold))
            {
                return Wait::Reserved {
                    pool: input.pools[pool].name.clone(),
                    for_job: input.pending[holder].id.clone(),
                };
            }
        }
        let pools = eligible
            .iter()
            .map(|&pool| (input.pools[pool].name.clone(), self.pools[pool].free.clamp_negative()))
            .collect();
        let reserved_on = if input.settings.reservations {
            self.reserve(job_index, eligible)
        } else {
            None
        };
        Wait::NoCapacity { pools, reserved_on }
    }

    /// Reserves the unreserved pool where the job lacks least, if any; returns its name.
    fn reserve(&mut self, job_index: usize, eligible: &[usize]) -> Option<String> {
        let input = self.input;
        let asked = input.pending[job_index].resources;
        let shortfall = |pool: usize| {
            (asked - self.pools[pool].free)
                .clamp_negative()
                .dominant_share(&input.pools[pool].capacity)
        };
        let best = eligible
            .iter()
            .copied()
            .filter(|&pool| self.pools[pool].reserved_for.is_none())
            .min_by(|&a, &b| shortfall(a).total_cmp(&shortfall(b)).then(a.cmp(&b)))?;
        self.hold(best, job_index);
        Some(input.pools[best].name.clone())
    }

    /// Holds the pool's free room, up to what the job asks, for the job.
    fn hold(&mut self, pool: usize, job_index: usize) {
        let asked = self.input.pending[job_index].resources;
        let state = &mut self.pools[pool];
        let held = asked.min(&state.free.clamp_negative());
        state.free -= held;
        state.hold += held;
        state.reserved_for.get_or_insert(job_index);
    }
}

/// The pools that could hold the job when empty and serve its market. A job without GPUs stays
/// off GPU pools when a pool without GPUs could hold it, so GPU pools are kept for GPU work.
pub(super) fn eligible_pools(pools: &[Pool], job: &PendingJob) -> Vec<usize> {
    let serves = |pool: &Pool| {
        (job.pool.is_empty() || pool.name == job.pool)
            && pool.holds(&job.resources)
            && (job.market != MarketPolicy::Spot || pool.spot_available)
    };
    let avoid_gpu_pools = job.resources.gpus == 0 && pools.iter().any(|pool| pool.capacity.gpus == 0 && serves(pool));
    (0..pools.len())
        .filter(|&index| serves(&pools[index]) && !(avoid_gpu_pools && pools[index].capacity.gpus > 0))
        .collect()
}
