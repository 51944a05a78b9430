//! Room for a job: the runner (of a pool) and market it starts on, the victims a higher priority or a job
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

/// At most this many runners are listed in a wait for capacity (those it lacks least on).
const LISTED_RUNNERS: usize = 8;

/// Weighted shares closer than this count as equal.
pub(super) const SHARE_EPSILON: f64 = 1e-9;

impl Pass<'_> {
    /// The runners of `pools` that could hold the job when empty, pool by pool.
    pub(super) fn eligible_runners(&self, job: &PendingJob, pools: &[usize]) -> Vec<usize> {
        pools
            .iter()
            .flat_map(|&pool| self.runners_of_pool[pool].iter().copied())
            .filter(|&runner| {
                let state = &self.runners[runner];
                job.resources.fits_in(&state.capacity) && job.resources.fits_in(&state.instance)
            })
            .collect()
    }

    /// How `runner` reads in a reason: its pool for a pool's implicit runner, else
    /// `<id> (<pool>)`.
    pub(super) fn runner_label(&self, runner: usize) -> String {
        let state = &self.runners[runner];
        let pool = &self.input.pools[state.pool].name;
        if state.id.is_empty() {
            pool.clone()
        } else {
            format!("{} ({pool})", state.id)
        }
    }

    /// The runner whose free room holds the job now at the lowest cost per hour, with its
    /// market: across pools the cheapest (the first eligible pool on a tie), inside a pool the
    /// tightest fit (the least dominant share of the runner left free, then the first runner),
    /// so large runners stay free for large jobs.
    pub(super) fn best_fit(&self, job: &PendingJob, eligible: &[usize]) -> Option<(usize, Market)> {
        let settings = &self.input.settings;
        let mut best: Option<(f64, usize, f64, usize, Market)> = None;
        for &runner in eligible {
            let state = &self.runners[runner];
            if !job.resources.fits_in(&state.free) {
                continue;
            }
            let pool = &self.input.pools[state.pool];
            let Some(market) = choose_market(job.market, pool, job.preemptions, job.expected_runtime_secs, settings)
            else {
                continue;
            };
            let cost = pool.cost_per_hour(&job.resources, market);
            let left = (state.free - job.resources).dominant_share(&state.capacity);
            let better = best.is_none_or(|(best_cost, best_pool, best_left, _, _)| {
                cost < best_cost || (cost == best_cost && state.pool == best_pool && left < best_left)
            });
            if better {
                best = Some((cost, state.pool, left, runner, market));
            }
        }
        best.map(|(_, _, _, runner, market)| (runner, market))
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

    /// Names victims on one runner (fewest new ones, then the lowest priority) within the
    /// budget, holds that runner's room for the job, and tells it to wait for them. Victims
    /// spread over several runners would free room no one runner has.
    fn preempt_for(&mut self, job_index: usize, eligible: &[usize], cause: Cause) -> Option<Wait> {
        let input = self.input;
        let job = &input.pending[job_index];
        let mut best: Option<((usize, i32, usize), Vec<usize>)> = None;
        for &runner in eligible {
            let Some(victims) = self.victims_on(runner, job_index, cause) else {
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
            let key = (count, highest, runner);
            if best.as_ref().is_none_or(|(best_key, _)| key < *best_key) {
                best = Some((key, victims));
            }
        }
        let ((count, _, runner), victims) = best?;
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
        self.hold(runner, job_index);
        Some(Wait::WaitingForPreemption {
            pool: self.runner_label(runner),
            victims: victims.iter().map(|&index| input.running[index].id.clone()).collect(),
        })
    }

    /// Running jobs on `runner` whose stop would let the job fit: stopping ones first, then for
    /// priority lower-priority preemptible ones, lowest priority and youngest first, or for
    /// fair share the candidates of [`Pass::fair_share_order`] while each owner stays at or
    /// above the job's share; pruned to a minimal set.
    fn victims_on(&self, runner: usize, job_index: usize, cause: Cause) -> Option<Vec<usize>> {
        let state = &self.runners[runner];
        let running = &self.input.running;
        let job = &self.input.pending[job_index];
        let fair_share_order;
        let order: &[usize] = match cause {
            Cause::Priority => &state.victims,
            Cause::FairShare => {
                fair_share_order = self.fair_share_order(runner, job_index);
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

    /// The fair-share candidates on `runner`, after its stopping jobs: other users' preemptible
    /// jobs of the same or lower priority whose owner would stay at or above the job's share
    /// after losing that one; in the runner's victim order (the lowest priority, then the
    /// youngest), so a victim throws away the least work. Taking from the owner furthest ahead
    /// first instead lost 54% more work in the study for the same fairness (README, Performance).
    fn fair_share_order(&self, runner: usize, job_index: usize) -> Vec<usize> {
        let state = &self.runners[runner];
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

    /// Why a job that fits no runner's free room now waits: room held for a job ahead of it,
    /// or no room, with the runners it lacks least on and the one reserved for it, if any.
    pub(super) fn capacity_wait(&mut self, job_index: usize, eligible: &[usize]) -> Wait {
        let input = self.input;
        let job = &input.pending[job_index];
        for &runner in eligible {
            let state = &self.runners[runner];
            if let Some(holder) = state.reserved_for
                && job.resources.fits_in(&(state.free + state.hold))
            {
                return Wait::Reserved {
                    pool: self.runner_label(runner),
                    for_job: input.pending[holder].id.clone(),
                };
            }
        }
        let mut listed = eligible.to_vec();
        if listed.len() > LISTED_RUNNERS {
            listed.sort_by(|&a, &b| self.shortfall(job_index, a).total_cmp(&self.shortfall(job_index, b)));
            listed.truncate(LISTED_RUNNERS);
            listed.sort_unstable();
        }
        let pools = listed
            .iter()
            .map(|&runner| (self.runner_label(runner), self.runners[runner].free.clamp_negative()))
            .collect();
        let reserved_on = if input.settings.reservations {
            self.reserve(job_index, eligible)
        } else {
            None
        };
        Wait::NoCapacity { pools, reserved_on }
    }

    /// What the job lacks on `runner`, as a dominant share of the runner.
    fn shortfall(&self, job_index: usize, runner: usize) -> f64 {
        let state = &self.runners[runner];
        (self.input.pending[job_index].resources - state.free)
            .clamp_negative()
            .dominant_share(&state.capacity)
    }

    /// Reserves the unreserved runner where the job lacks least, if any; returns its label.
    fn reserve(&mut self, job_index: usize, eligible: &[usize]) -> Option<String> {
        let best = eligible
            .iter()
            .copied()
            .filter(|&runner| self.runners[runner].reserved_for.is_none())
            .min_by(|&a, &b| {
                self.shortfall(job_index, a)
                    .total_cmp(&self.shortfall(job_index, b))
                    .then(a.cmp(&b))
            })?;
        self.hold(best, job_index);
        Some(self.runner_label(best))
    }

    /// Holds the runner's free room, up to what the job asks, for the job.
    fn hold(&mut self, runner: usize, job_index: usize) {
        let asked = self.input.pending[job_index].resources;
        let state = &mut self.runners[runner];
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
