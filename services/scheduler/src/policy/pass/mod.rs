//! One scheduling pass: the order, running quotas, placement, backfill with reservations, and
//! priority and fair-share preemption.
//!
//! The order is a lazy merge, not a sort of everything: pending jobs are grouped by priority,
//! then into one queue per (project, user) sorted by submit time. Within a priority, a set keyed
//! by weighted dominant share yields the project with the smallest share, a set per project the
//! user with the smallest share (ties: the older head job), and that user's queue its oldest
//! job. Only a placement changes shares, so each step costs a few `O(log n)` set operations.
//! Queues that yield to a waiting project-mate are merged again after the rest, once. With
//! [`Order::FairShareRatio`], one set keyed by held share over fair share orders every user
//! of the priority instead (see `ratio`).
//!
//! This module walks the queues; `setup` builds a pass from the input, `holders` keeps who
//! holds what, `limits` checks running quotas, and `room` finds capacity: pools, reservations
//! and victims.

use std::collections::{BTreeSet, HashSet};

use super::explain::{Ahead, JobWait, Wait};
use super::model::{Input, Market, Order, Quota, Resources};

mod holders;
mod limits;
mod ratio;
mod room;
mod setup;

use holders::{Holder, Member, Share};
use limits::ScopeUsage;
pub use ratio::water_fill;
use room::{SHARE_EPSILON, eligible_pools};

/// A job to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Its index in [`Input::pending`].
    pub job: usize,
    pub pool: String,
    /// The runner it goes to; empty for a pool's implicit runner (a pool no runner is listed
    /// for, as studies describe pools).
    pub runner: String,
    pub market: Market,
    /// For a gang job: the runner of each node by rank (`runner` is rank 0's); empty for one
    /// node.
    pub nodes: Vec<String>,
}

/// A running job to stop so that a higher-priority job, or one below its fair share, can start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub victim: String,
    pub for_job: String,
    /// Ordered for fair share (the settings' `fair_share_preemption`), not for priority.
    pub fair_share: bool,
}

/// What a pass decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// In the order of the pass.
    pub placements: Vec<Placement>,
    /// Never more than the settings' `preemption_budget`.
    pub preemptions: Vec<Preemption>,
    /// Every pending job not placed, in the order of the pass.
    pub waits: Vec<JobWait>,
}

impl Plan {
    /// Why the pending job at index `job` waits; `None` when the pass placed it.
    pub fn wait_of(&self, job: usize) -> Option<&JobWait> {
        self.waits.iter().find(|wait| wait.job == job)
    }
}

/// Decides which pending jobs start now, on which pool and market, which running jobs to
/// preempt, and why every other job waits.
///
/// In order: higher priority first; within a priority, weighted dominant-resource fair share,
/// counting what running jobs hold and what this pass placed: by the settings' `order`, users
/// across projects by held share over fair share, or projects and then users inside them (a
/// project's users above a project-mate waiting for capacity go after the other projects'
/// jobs); then submit time. A job over a running quota, or that no pool could
/// ever hold, waits without holding up others. A job that cannot fit for lack of capacity may
/// preempt lower priorities (when its priority may), or else (with fair-share preemption on)
/// jobs of projects or users above its share, or else gets a reservation on its best pool
/// (one per pool): that pool's free room up to its request is held, and later jobs backfill
/// only into what is left.
pub fn plan(input: &Input) -> Plan {
    Pass::new(input).run()
}

/// One runner in a pass: jobs are placed on, hold room on and preempt on one runner.
#[derive(Debug)]
struct RunnerState {
    /// Empty for a pool's implicit runner.
    id: String,
    /// Its pool's index in [`Input::pools`].
    pool: usize,
    capacity: Resources,
    /// The largest job it can hold.
    instance: Resources,
    /// Capacity less what running jobs, this pass's placements and holds take.
    free: Resources,
    /// Held for reservations and preemptions of this pass.
    hold: Resources,
    /// The job (pending index) this runner's reservation is for.
    reserved_for: Option<usize>,
    /// Running jobs on it in the order victims are tried: stopping first, then lowest
    /// priority, then youngest.
    victims: Vec<usize>,
}

/// A (project, user) queue of one priority, oldest first.
struct Queue<'o> {
    member: usize,
    jobs: &'o [usize],
    next: usize,
    /// Jobs of this queue already walked that compete for capacity.
    competing: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Placed,
    /// Waits for capacity: counts as ahead of later jobs.
    Competing,
    /// Waits on a quota or for a bigger pool: holds nobody up.
    Skipped,
}

struct Pass<'a> {
    input: &'a Input,
    /// The cluster: the sum of the pools' capacities, against which shares are taken.
    total: Resources,
    /// Pool-major, then by id.
    runners: Vec<RunnerState>,
    /// Per pool, its runners' indices in `runners`.
    runners_of_pool: Vec<Vec<usize>>,
    projects: Vec<Holder>,
    members: Vec<Member>,
    member_of_job: Vec<usize>,
    member_of_running: Vec<usize>,
    /// Per member, what its running and pending jobs ask together: its demand for the
    /// fair-share-ratio order (placements move jobs from one to the other, so it stays put).
    member_demands: Vec<Resources>,
    /// What this pass's preemptions will move, per project and per member: minus the victims
    /// (and jobs already stopping), plus the jobs waiting for them. Only fair-share checks read it.
    project_moves: Vec<Resources>,
    member_moves: Vec<Resources>,
    /// (member, request) whose fair-share victim search found nothing in this pass: their
    /// like jobs do not search again.
    fair_share_failed: HashSet<(usize, Resources)>,
    global_usage: ScopeUsage,
    project_usage: Vec<ScopeUsage>,
    user_usage: Vec<ScopeUsage>,
    global_quotas: Vec<&'a Quota>,
    project_quotas: Vec<Vec<&'a Quota>>,
    user_quotas: Vec<Vec<&'a Quota>>,
    /// Running jobs already chosen as victims (or counted as stopping) in this pass.
    victim_taken: Vec<bool>,
    /// Priority preemptions this pass may still order.
    budget_left: usize,
    /// Fair-share preemptions this pass may still order: a budget of their own, so fair share
    /// never spends priority preemption's.
    fair_share_budget_left: usize,
    /// Stopping running jobs no preempting job has counted yet: with none and no budget left,
    /// the victim search is skipped.
    stopping_left: usize,
    plan: Plan,
}

// === impl Pass ===

impl<'a> Pass<'a> {
    fn run(mut self) -> Plan {
        let input = self.input;
        let mut order: Vec<usize> = (0..input.pending.len()).collect();
        order.sort_unstable_by(|&a, &b| {
            let (job_a, job_b) = (&input.pending[a], &input.pending[b]);
            job_b
                .priority
                .cmp(&job_a.priority)
                .then(self.member_of_job[a].cmp(&self.member_of_job[b]))
                .then(job_a.submitted_at_ms.cmp(&job_b.submitted_at_ms))
                .then_with(|| job_a.id.cmp(&job_b.id))
                .then(a.cmp(&b))
        });
        let mut higher_priority = 0;
        for tier in order.chunk_by(|&a, &b| input.pending[a].priority == input.pending[b].priority) {
            let queues: Vec<Queue<'_>> = tier
                .chunk_by(|&a, &b| self.member_of_job[a] == self.member_of_job[b])
                .map(|jobs| Queue {
                    member: self.member_of_job[jobs[0]],
                    jobs,
                    next: 0,
                    competing: 0,
                })
                .collect();
            higher_priority += self.walk(queues, higher_priority);
        }
        self.plan
    }

    /// Walks one priority in fair-share order; returns how many of its jobs compete for capacity.
    ///
    /// With `yield_within_project`, once a user's job waits for capacity, the users of the same
    /// project with a larger share than that user's yield: their jobs are walked only after every
    /// other project's, in a second merge, so they backfill what is left rather than taking the
    /// room other projects could use. A project's share mixes pools: without this, members
    /// holding (say) GPUs keep the project's share up by taking back each GPU that frees, and a
    /// member who needs CPUs never gets a turn. Yielding lets the project's share fall until the
    /// waiting member's job is first in the whole order.
    fn walk(&mut self, mut queues: Vec<Queue<'_>>, higher_priority: usize) -> usize {
        let mut competing = 0;
        if self.input.settings.order == Order::FairShareRatio {
            self.merge_by_ratio(&mut queues, higher_priority, &mut competing);
            return competing;
        }
        let all: Vec<usize> = (0..queues.len()).collect();
        let yielding = self.input.settings.yield_within_project;
        let yielded = self.merge(&mut queues, &all, higher_priority, &mut competing, yielding);
        let rest = self.merge(&mut queues, &yielded, higher_priority, &mut competing, false);
        debug_assert!(rest.is_empty(), "the second merge yields nothing");
        competing
    }

    /// Walks the queues at `indices` in fair-share order, considering each job; with `yielding`,
    /// returns (not walked further) the queues of users who yield to a project-mate waiting for
    /// capacity.
    fn merge(
        &mut self,
        queues: &mut [Queue<'_>],
        indices: &[usize],
        higher_priority: usize,
        competing: &mut usize,
        yielding: bool,
    ) -> Vec<usize> {
        let mut users: Vec<BTreeSet<(Share, i64, usize)>> = vec![BTreeSet::new(); self.projects.len()];
        for &index in indices {
            let queue = &queues[index];
            users[self.members[queue.member].project].insert(self.user_key(queue, index));
        }
        let mut projects: BTreeSet<(Share, usize)> = users
            .iter()
            .enumerate()
            .filter(|(_, set)| !set.is_empty())
            .map(|(project, _)| (self.projects[project].share(&self.total), project))
            .collect();
        // Per project, the first member whose job waited for capacity, with its share then.
        let mut waiting_member: Vec<Option<(usize, Share)>> = vec![None; self.projects.len()];
        let mut yielded = Vec::new();
        while let Some(&project_key) = projects.first() {
            let project = project_key.1;
            let (share, _, index) = users[project]
                .pop_first()
                .expect("a project in the order has a user with jobs");
            let member = queues[index].member;
            let yields = yielding
                && waiting_member[project].is_some_and(|(waiting, waiting_share)| {
                    waiting != member && share.0 > waiting_share.0 + SHARE_EPSILON
                });
            let mut placed = false;
            if yields {
                yielded.push(index);
            } else {
                let step = self.consider_head(&mut queues[index], higher_priority, competing);
                if step == Step::Competing {
                    waiting_member[project].get_or_insert((member, share));
                }
                placed = step == Step::Placed;
                let queue = &queues[index];
                if queue.next < queue.jobs.len() {
                    users[project].insert(self.user_key(&queues[index], index));
                }
            }
            if placed || users[project].is_empty() {
                projects.remove(&project_key);
                if !users[project].is_empty() {
                    projects.insert((self.projects[project].share(&self.total), project));
                }
            }
        }
        yielded
    }

    /// Considers the head job of `queue` and moves past it; a job that competes for capacity
    /// counts as ahead of later ones.
    fn consider_head(&mut self, queue: &mut Queue<'_>, higher_priority: usize, competing: &mut usize) -> Step {
        let job = queue.jobs[queue.next];
        queue.next += 1;
        let ahead = Ahead {
            higher_priority,
            fair_share: *competing - queue.competing,
            same_user: queue.competing,
            order: self.input.settings.order,
        };
        let step = self.consider(job, ahead);
        if step != Step::Skipped {
            *competing += 1;
            queue.competing += 1;
        }
        step
    }

    fn user_key(&self, queue: &Queue<'_>, index: usize) -> (Share, i64, usize) {
        let head = &self.input.pending[queue.jobs[queue.next]];
        (
            self.members[queue.member].holder.share(&self.total),
            head.submitted_at_ms,
            index,
        )
    }

    fn consider(&mut self, job_index: usize, ahead: Ahead) -> Step {
        let input = self.input;
        let job = &input.pending[job_index];
        let member = self.member_of_job[job_index];
        let pools = eligible_pools(&input.pools, job);
        let eligible = self.eligible_runners(job, &pools);
        // A pool that holds the job with no runner that does can launch one (the pools of
        // runners alone hold only what their largest runner holds).
        if eligible.is_empty() && !pools.is_empty() {
            if let Some(reason) = self.quota_wait(job, member) {
                self.wait(job_index, ahead, reason);
                return Step::Skipped;
            }
            let pools = pools.iter().map(|&pool| input.pools[pool].name.clone()).collect();
            self.wait(job_index, ahead, Wait::Provisioning { pools });
            return Step::Competing;
        }
        if eligible.is_empty() {
            let reason = Wait::NoPoolFits {
                asked: job.resources,
                market: job.market,
                pool: job.pool.clone(),
            };
            self.wait(job_index, ahead, reason);
            return Step::Skipped;
        }
        if let Some(reason) = self.quota_wait(job, member) {
            self.wait(job_index, ahead, reason);
            return Step::Skipped;
        }
        if job.nodes > 1 {
            let pools = pools.iter().map(|&pool| input.pools[pool].name.clone()).collect();
            return self.consider_gang(job_index, member, &eligible, pools, ahead);
        }
        if let Some((runner, market)) = self.best_fit(job, &eligible) {
            self.place(job_index, member, runner, market);
            return Step::Placed;
        }
        if let Some(reason) = self.preempt(job_index, &eligible) {
            self.wait(job_index, ahead, reason);
            return Step::Competing;
        }
        let reason = self.capacity_wait(job_index, &eligible);
        self.wait(job_index, ahead, reason);
        Step::Competing
    }

    /// Counts `resources` (negative for a victim) as moving to the member and its project once
    /// this pass's preemptions are done.
    fn moves(&mut self, member: usize, resources: Resources) {
        let project = self.members[member].project;
        self.member_moves[member] += resources;
        self.project_moves[project] += resources;
    }

    fn wait(&mut self, job: usize, ahead: Ahead, reason: Wait) {
        self.plan.waits.push(JobWait { job, ahead, reason });
    }

    /// Counts `resources` as held by the member, its project, its user and the cluster.
    fn take(&mut self, member: usize, resources: Resources) {
        let Member { project, user, .. } = self.members[member];
        self.members[member].holder.held += resources;
        self.projects[project].held += resources;
        self.global_usage.add(resources);
        self.project_usage[project].add(resources);
        self.user_usage[user].add(resources);
    }

    fn place(&mut self, job_index: usize, member: usize, runner: usize, market: Market) {
        let resources = self.input.pending[job_index].resources;
        self.runners[runner].free -= resources;
        self.take(member, resources);
        let state = &self.runners[runner];
        self.plan.placements.push(Placement {
            job: job_index,
            pool: self.input.pools[state.pool].name.clone(),
            runner: state.id.clone(),
            market,
            nodes: Vec::new(),
        });
    }

    /// A gang: every node on a runner whose free room holds it (several on one runner when its
    /// room holds several), all in this pass or none. One that cannot start whole preempts
    /// nothing and waits, competing (backfill goes on behind it).
    fn consider_gang(
        &mut self,
        job_index: usize,
        member: usize,
        eligible: &[usize],
        pools: Vec<String>,
        ahead: Ahead,
    ) -> Step {
        let job = &self.input.pending[job_index];
        let nodes = job.nodes;
        let mut taken: Vec<(usize, Market)> = Vec::new();
        while taken.len() < nodes as usize {
            let Some((runner, market)) = self.best_fit(job, eligible) else {
                break;
            };
            self.runners[runner].free -= job.resources;
            taken.push((runner, market));
        }
        if taken.len() < nodes as usize {
            for (runner, _) in &taken {
                self.runners[*runner].free += job.resources;
            }
            let reason = Wait::Gang {
                nodes,
                fit: u32::try_from(taken.len()).unwrap_or(0),
                pools,
            };
            self.wait(job_index, ahead, reason);
            return Step::Competing;
        }
        let resources = job.resources;
        for _ in 0..nodes {
            self.take(member, resources);
        }
        let (first, market) = taken[0];
        let state = &self.runners[first];
        self.plan.placements.push(Placement {
            job: job_index,
            pool: self.input.pools[state.pool].name.clone(),
            runner: state.id.clone(),
            market,
            nodes: taken
                .iter()
                .map(|(runner, _)| self.runners[*runner].id.clone())
                .collect(),
        });
        Step::Placed
    }
}
