//! Room for a job: the pool and market it starts on, the victims a higher priority preempts,
//! and the reservations that hold room for a job that cannot fit yet.

use super::{Pass, Preemption};
use crate::policy::explain::Wait;
use crate::policy::market::choose_market;
use crate::policy::model::{Market, MarketPolicy, PendingJob, Pool, Resources};

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

    /// Names victims on one pool (fewest new ones, then the lowest priority) within the budget,
    /// holds that pool's room for the job, and tells it to wait for them.
    pub(super) fn preempt_for(&mut self, job_index: usize, eligible: &[usize]) -> Option<Wait> {
        let input = self.input;
        let job = &input.pending[job_index];
        let mut best: Option<((usize, i32, usize), Vec<usize>)> = None;
        for &pool in eligible {
            let Some(victims) = self.victims_on(pool, job) else {
                continue;
            };
            let new_victims = victims.iter().filter(|&&index| !input.running[index].stopping);
            let count = new_victims.clone().count();
            if count > self.budget_left {
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
        self.budget_left -= count;
        for &index in &victims {
            self.victim_taken[index] = true;
            let victim = &input.running[index];
            if victim.stopping {
                self.stopping_left -= 1;
            } else {
                self.plan.preemptions.push(Preemption {
                    victim: victim.id.clone(),
                    for_job: job.id.clone(),
                });
            }
        }
        self.hold(pool, job_index);
        Some(Wait::WaitingForPreemption {
            pool: input.pools[pool].name.clone(),
            victims: victims.iter().map(|&index| input.running[index].id.clone()).collect(),
        })
    }

    /// Running jobs on `pool` whose stop would let the job fit: stopping ones first, then
    /// lower-priority preemptible ones, lowest priority and youngest first; pruned to a minimal set.
    fn victims_on(&self, pool: usize, job: &PendingJob) -> Option<Vec<usize>> {
        let state = &self.pools[pool];
        let running = &self.input.running;
        let mut room = state.free;
        let mut chosen = Vec::new();
        for &index in &state.victims {
            if job.resources.fits_in(&room) {
                break;
            }
            let victim = &running[index];
            let allowed = victim.stopping || (victim.preemptible && victim.priority < job.priority);
            if self.victim_taken[index] || !allowed {
                continue;
            }
            let lacking = (job.resources - room).clamp_negative();
            if victim.resources.min(&lacking) == Resources::ZERO {
                continue;
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
    let serves = |pool: &Pool| pool.holds(&job.resources) && (job.market != MarketPolicy::Spot || pool.spot_available);
    let avoid_gpu_pools = job.resources.gpus == 0 && pools.iter().any(|pool| pool.capacity.gpus == 0 && serves(pool));
    (0..pools.len())
        .filter(|&index| serves(&pools[index]) && !(avoid_gpu_pools && pools[index].capacity.gpus > 0))
        .collect()
}
