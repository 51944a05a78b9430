//! The discrete-event simulation: submits, finishes and spot preemptions in time order, a
//! `policy::plan` pass after news at each pass boundary, and the figures of the report.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use kiln_scheduler::policy::{self, Input, Market, PreemptionRate, Resources, Wait, jain_index, water_fill};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Args;
use crate::workload::{HOUR_MS, JobSpec, MINUTE_MS, TYPES, pending_job, pools, running_job};

/// Priority preemptions: a token bucket of this size, refilled at this rate per hour. Fair-share
/// preemptions have a bucket of the same size of their own, refilled at `--fair-share-preemptions-per-hour`.
const PREEMPTION_TOKENS: f64 = 5.0;
const PREEMPTION_TOKENS_PER_HOUR: f64 = 20.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Submit(usize),
    /// Job, run number (a stale run's events are ignored).
    Finish(usize, u32),
    SpotPreempt(usize, u32),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Place {
    Unsubmitted,
    Pending(usize),
    Running {
        slot: usize,
        pool: usize,
        market: Market,
        started_ms: i64,
    },
    Done,
}

pub(crate) struct SimJob {
    spec: JobSpec,
    pub(crate) place: Place,
    remaining_ms: i64,
    run: u32,
    preemptions: u32,
    first_start_ms: Option<i64>,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) passes: usize,
    /// CPU-milliseconds allocated, and offered, on pools with work waiting for them.
    pub(crate) allocated_cpu_ms: f64,
    pub(crate) offered_cpu_ms: f64,
    pub(crate) jain_sum: f64,
    pub(crate) entitlement_jain_sum: f64,
    pub(crate) jain_passes: usize,
    pub(crate) waits_ms: Vec<i64>,
    pub(crate) spot_preemptions: usize,
    pub(crate) priority_preemptions: usize,
    pub(crate) fair_share_preemptions: usize,
    /// Work thrown away by preemptions (the time since the victim's last checkpoint), in
    /// instance-hours: a job's dominant share of an instance of its pool times the hours.
    pub(crate) spot_lost_hours: f64,
    pub(crate) priority_lost_hours: f64,
    pub(crate) fair_share_lost_hours: f64,
    /// Every run's instance-hours, lost work included.
    pub(crate) run_hours: f64,
    pub(crate) spot_segments: usize,
    pub(crate) segments: usize,
    pub(crate) cost: f64,
    pub(crate) on_demand_cost: f64,
    pub(crate) pass_time: Duration,
    /// Per user, integrated over the time they have pending jobs.
    pub(crate) backlog: Vec<Backlog>,
    /// The same per hour of simulated time (index = hour), per user.
    pub(crate) hourly_backlog: Vec<Vec<Backlog>>,
}

/// A user's dominant share and DRF share integrated over the time they had pending jobs.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Backlog {
    /// ∫ dominant share dt and ∫ DRF share dt, in share × milliseconds.
    pub(crate) share_ms: f64,
    pub(crate) fair_ms: f64,
    /// How long the user had pending jobs, in milliseconds.
    pub(crate) time_ms: f64,
}

impl Backlog {
    /// x = ∫ dominant share dt / ∫ DRF share dt (1 if the user was owed nothing, as per pass).
    fn ratio(&self) -> f64 {
        if self.fair_ms > 0.0 {
            self.share_ms / self.fair_ms
        } else {
            1.0
        }
    }
}

/// Jain's index of the users' time-integrated x, over the users backlogged at least `min_ms`;
/// with how many they are, or `None` if fewer than two.
pub(crate) fn integrated_jain(backlogs: &[Backlog], min_ms: f64) -> Option<(f64, usize)> {
    let ratios: Vec<f64> = backlogs
        .iter()
        .filter(|backlog| backlog.time_ms >= min_ms)
        .map(Backlog::ratio)
        .collect();
    (ratios.len() >= 2).then(|| (jain_index(&ratios), ratios.len()))
}

pub(crate) struct Sim<'a> {
    args: &'a Args,
    pub(crate) input: Input,
    pub(crate) jobs: Vec<SimJob>,
    /// Job numbers aligned with `input.pending` and `input.running`.
    pending_ids: Vec<usize>,
    running_ids: Vec<usize>,
    events: BinaryHeap<Reverse<(i64, u64, Event)>>,
    sequence: u64,
    pub(crate) clock_ms: i64,
    rng: StdRng,
    total: Resources,
    rates: Vec<PreemptionRate>,
    allocated: Vec<Resources>,
    spot_jobs: Vec<i64>,
    /// Pools some job waits for capacity on, as of the last pass.
    waited_for: Vec<bool>,
    user_held: Vec<Resources>,
    user_pending: Vec<usize>,
    user_queued: Vec<Resources>,
    project_weights: Vec<f64>,
    tokens: f64,
    tokens_at_ms: i64,
    fair_share_tokens: f64,
    pub(crate) stats: Stats,
}

impl<'a> Sim<'a> {
    pub(crate) fn new(args: &'a Args, specs: Vec<JobSpec>) -> Sim<'a> {
        let mut input = Input {
            pools: pools(args.instances),
            ..Input::default()
        };
        input.settings.preempting_priorities.insert(1);
        input.settings.reservations = !args.no_reservations;
        input.settings.fair_share_preemption = args.fair_share_preemption;
        input.settings.yield_within_project = !args.no_yield_within_project;
        input.settings.order = args.order.order();
        // One project weighs double, so the study covers weights.
        input.weights.projects.insert("p00".into(), 2.0);
        let project_weights = (0..args.projects)
            .map(|project| input.weights.project(&format!("p{project:02}")))
            .collect();
        let total = input
            .pools
            .iter()
            .fold(Resources::ZERO, |sum, pool| sum + pool.capacity);
        let pool_count = input.pools.len();
        let mut sim = Sim {
            args,
            input,
            jobs: Vec::with_capacity(specs.len()),
            pending_ids: Vec::new(),
            running_ids: Vec::new(),
            events: BinaryHeap::new(),
            sequence: 0,
            clock_ms: 0,
            rng: StdRng::seed_from_u64(args.seed.wrapping_add(1)),
            total,
            rates: vec![PreemptionRate::default(); pool_count],
            allocated: vec![Resources::ZERO; pool_count],
            spot_jobs: vec![0; pool_count],
            waited_for: vec![false; pool_count],
            user_held: vec![Resources::ZERO; args.users],
            user_pending: vec![0; args.users],
            user_queued: vec![Resources::ZERO; args.users],
            project_weights,
            tokens: PREEMPTION_TOKENS,
            tokens_at_ms: 0,
            fair_share_tokens: PREEMPTION_TOKENS,
            stats: Stats {
                backlog: vec![Backlog::default(); args.users],
                ..Stats::default()
            },
        };
        for (number, spec) in specs.into_iter().enumerate() {
            sim.schedule(spec.submitted_at_ms, Event::Submit(number));
            sim.jobs.push(SimJob {
                remaining_ms: spec.runtime_ms,
                spec,
                place: Place::Unsubmitted,
                run: 0,
                preemptions: 0,
                first_start_ms: None,
            });
        }
        sim
    }

    fn schedule(&mut self, at_ms: i64, event: Event) {
        self.sequence += 1;
        self.events.push(Reverse((at_ms, self.sequence, event)));
    }

    /// Runs until every job is done: events in time order, and a pass at the next pass
    /// boundary after anything happened (events at the boundary itself come first).
    pub(crate) fn run(&mut self) {
        let interval_ms = self.args.pass_interval_secs.max(1) * 1000;
        let mut dirty_since: Option<i64> = None;
        loop {
            let next_event = self.events.peek().map(|Reverse((at, _, _))| *at);
            let pass_at = dirty_since.map(|since| (since + interval_ms - 1) / interval_ms * interval_ms);
            match (next_event, pass_at) {
                (None, None) => break,
                (next, Some(pass_at)) if next.is_none_or(|at| pass_at < at) => {
                    self.advance(pass_at);
                    self.pass();
                    dirty_since = None;
                }
                _ => {
                    let Reverse((at, _, event)) = self.events.pop().expect("an event is due");
                    self.advance(at);
                    self.handle(event);
                    dirty_since.get_or_insert(at);
                }
            }
        }
    }

    /// Moves the clock, integrating utilisation, spot exposure and backlogged users' shares over
    /// the elapsed time.
    fn advance(&mut self, to_ms: i64) {
        let elapsed_ms = to_ms - self.clock_ms;
        if elapsed_ms > 0 {
            self.integrate_backlog(self.clock_ms, to_ms);
            for (pool, waited) in self.waited_for.iter().enumerate() {
                if *waited {
                    self.stats.allocated_cpu_ms += self.allocated[pool].cpu_millis as f64 * elapsed_ms as f64;
                    self.stats.offered_cpu_ms += self.input.pools[pool].capacity.cpu_millis as f64 * elapsed_ms as f64;
                }
                let hours = self.spot_jobs[pool] as f64 * elapsed_ms as f64 / HOUR_MS;
                self.rates[pool].observe_exposure(hours, to_ms);
            }
        }
        self.clock_ms = to_ms;
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Submit(number) => self.push_pending(number),
            Event::Finish(number, run) if self.is_running(number, run) => {
                let (pool, _) = self.end_run(number);
                let job = &self.jobs[number];
                self.stats.on_demand_cost += self.input.pools[pool]
                    .cost_per_hour(&job.spec.resources, Market::OnDemand)
                    * job.spec.runtime_ms as f64
                    / HOUR_MS;
                self.jobs[number].place = Place::Done;
            }
            Event::SpotPreempt(number, run) if self.is_running(number, run) => {
                let (pool, ran_ms) = self.end_run(number);
                self.stats.spot_lost_hours += self.lost_instance_hours(number, pool, ran_ms);
                self.rates[pool].observe_preemption(self.clock_ms);
                self.stats.spot_preemptions += 1;
                self.jobs[number].preemptions += 1;
                self.requeue(number, ran_ms);
            }
            Event::Finish(..) | Event::SpotPreempt(..) => {}
        }
    }

    fn is_running(&self, number: usize, run: u32) -> bool {
        let job = &self.jobs[number];
        job.run == run && matches!(job.place, Place::Running { .. })
    }

    fn pass(&mut self) {
        let now_ms = self.clock_ms;
        for (pool, rate) in self.input.pools.iter_mut().zip(&self.rates) {
            pool.preemptions_per_hour = rate.rate_per_hour(now_ms);
        }
        let hours = (now_ms - self.tokens_at_ms) as f64 / HOUR_MS;
        self.tokens = (self.tokens + hours * PREEMPTION_TOKENS_PER_HOUR).min(PREEMPTION_TOKENS);
        self.fair_share_tokens =
            (self.fair_share_tokens + hours * self.args.fair_share_preemptions_per_hour).min(PREEMPTION_TOKENS);
        self.tokens_at_ms = now_ms;
        self.input.settings.preemption_budget = self.tokens.floor() as usize;
        self.input.settings.fair_share_preemption_budget = self.fair_share_tokens.floor() as usize;

        let started = Instant::now();
        let plan = policy::plan(&self.input);
        self.stats.pass_time += started.elapsed();
        self.stats.passes += 1;

        self.waited_for.iter_mut().for_each(|waited| *waited = false);
        for wait in &plan.waits {
            let names: Vec<&str> = match &wait.reason {
                Wait::NoCapacity { pools, .. } => pools.iter().map(|(name, _)| name.as_str()).collect(),
                Wait::Provisioning { pools } => pools.iter().map(String::as_str).collect(),
                Wait::Reserved { pool, .. } | Wait::WaitingForPreemption { pool, .. } => vec![pool.as_str()],
                Wait::Quota { .. } | Wait::NoPoolFits { .. } | Wait::Gang { .. } => Vec::new(),
            };
            for name in names {
                if let Some(pool) = self.input.pools.iter().position(|pool| pool.name == name) {
                    self.waited_for[pool] = true;
                }
            }
        }
        let mut placements = plan.placements;
        // Highest index first, so each swap_remove leaves the lower indices in place.
        placements.sort_unstable_by_key(|placement| Reverse(placement.job));
        for placement in placements {
            let pool = self
                .input
                .pools
                .iter()
                .position(|pool| pool.name == placement.pool)
                .expect("a placement names a pool of the input");
            self.start(self.pending_ids[placement.job], pool, placement.market);
        }
        // A victim of either kind stops at once, loses the work since its last checkpoint and
        // is queued again with its submit time.
        for preemption in &plan.preemptions {
            let number: usize = preemption.victim[1..].parse().expect("job ids are j<number>");
            let (pool, ran_ms) = self.end_run(number);
            let lost_hours = self.lost_instance_hours(number, pool, ran_ms);
            if preemption.fair_share {
                self.stats.fair_share_preemptions += 1;
                self.stats.fair_share_lost_hours += lost_hours;
                self.fair_share_tokens -= 1.0;
            } else {
                self.stats.priority_preemptions += 1;
                self.stats.priority_lost_hours += lost_hours;
                self.tokens -= 1.0;
            }
            self.requeue(number, ran_ms);
        }
        self.measure_fairness();
    }

    /// Jain's index of x = dominant share / fair share over the users with pending jobs, with
    /// the fair shares of `drf_shares`. Also the same index against a demand-blind entitlement
    /// (project weight over the backlogged projects' weights, split evenly between the
    /// project's backlogged users), for reference.
    fn measure_fairness(&mut self) {
        let users = self.args.users;
        let projects = self.args.projects;
        let backlogged: Vec<usize> = (0..users).filter(|&user| self.user_pending[user] > 0).collect();
        if backlogged.len() < 2 {
            return;
        }
        let (shares, fair) = self.drf_shares();
        let mut backlogged_in_project = vec![0usize; projects];
        for &user in &backlogged {
            backlogged_in_project[user % projects] += 1;
        }
        let weight_sum: f64 = (0..projects)
            .filter(|&project| backlogged_in_project[project] > 0)
            .map(|project| self.project_weights[project])
            .sum();
        let ratio = |share: f64, fair: f64| if fair > 0.0 { share / fair } else { 1.0 };
        let mut against_drf = Vec::with_capacity(backlogged.len());
        let mut against_entitlement = Vec::with_capacity(backlogged.len());
        for &user in &backlogged {
            let project = user % projects;
            let entitlement = self.project_weights[project] / weight_sum / backlogged_in_project[project] as f64;
            against_drf.push(ratio(shares[user], fair[user]));
            against_entitlement.push(ratio(shares[user], entitlement));
        }
        self.stats.jain_sum += jain_index(&against_drf);
        self.stats.entitlement_jain_sum += jain_index(&against_entitlement);
        self.stats.jain_passes += 1;
    }

    /// Each user's dominant share of the cluster now, and their DRF share of what all users hold
    /// now (in dominant-share units): weighted max-min between projects, then evenly between a
    /// project's users, none above its demand (what it holds plus what it has queued).
    fn drf_shares(&self) -> (Vec<f64>, Vec<f64>) {
        let users = self.args.users;
        let projects = self.args.projects;
        let shares: Vec<f64> = (0..users)
            .map(|user| self.user_held[user].dominant_share(&self.total))
            .collect();
        let demands: Vec<f64> = (0..users)
            .map(|user| (self.user_held[user] + self.user_queued[user]).dominant_share(&self.total))
            .collect();
        let project_claims: Vec<(f64, f64)> = (0..projects)
            .map(|project| {
                let demand = (project..users).step_by(projects).map(|user| demands[user]).sum();
                (self.project_weights[project], demand)
            })
            .collect();
        let project_fair = water_fill(shares.iter().sum(), &project_claims);
        let mut fair = vec![0.0; users];
        for (project, &project_share) in project_fair.iter().enumerate() {
            let members: Vec<usize> = (project..users).step_by(projects).collect();
            let claims: Vec<(f64, f64)> = members.iter().map(|&user| (1.0, demands[user])).collect();
            for (user, share) in members.iter().zip(water_fill(project_share, &claims)) {
                fair[*user] = share;
            }
        }
        (shares, fair)
    }

    /// Adds each backlogged user's dominant share and DRF share, constant since the last event
    /// or pass, times the time from `from_ms` to `to_ms`, to their totals and their hours'.
    fn integrate_backlog(&mut self, from_ms: i64, to_ms: i64) {
        if self.user_pending.iter().all(|&pending| pending == 0) {
            return;
        }
        let (shares, fair) = self.drf_shares();
        let users = self.args.users;
        let hour_ms = HOUR_MS as i64;
        let mut start_ms = from_ms;
        while start_ms < to_ms {
            let hour = (start_ms / hour_ms) as usize;
            let end_ms = to_ms.min((hour as i64 + 1) * hour_ms);
            let elapsed_ms = (end_ms - start_ms) as f64;
            if self.stats.hourly_backlog.len() <= hour {
                self.stats
                    .hourly_backlog
                    .resize_with(hour + 1, || vec![Backlog::default(); users]);
            }
            for user in (0..users).filter(|&user| self.user_pending[user] > 0) {
                for backlog in [
                    &mut self.stats.backlog[user],
                    &mut self.stats.hourly_backlog[hour][user],
                ] {
                    backlog.share_ms += shares[user] * elapsed_ms;
                    backlog.fair_ms += fair[user] * elapsed_ms;
                    backlog.time_ms += elapsed_ms;
                }
            }
            start_ms = end_ms;
        }
    }

    fn push_pending(&mut self, number: usize) {
        let job = &mut self.jobs[number];
        job.place = Place::Pending(self.input.pending.len());
        self.input.pending.push(pending_job(number, &job.spec, job.preemptions));
        self.pending_ids.push(number);
        self.user_pending[job.spec.user] += 1;
        self.user_queued[job.spec.user] += job.spec.resources;
    }

    fn start(&mut self, number: usize, pool: usize, market: Market) {
        let Place::Pending(slot) = self.jobs[number].place else {
            unreachable!("only pending jobs start")
        };
        let pending = self.input.pending.swap_remove(slot);
        self.pending_ids.swap_remove(slot);
        if let Some(&moved) = self.pending_ids.get(slot) {
            self.jobs[moved].place = Place::Pending(slot);
        }
        let now_ms = self.clock_ms;
        let running = running_job(&pending, &self.input.pools[pool].name, market, now_ms);
        let job = &mut self.jobs[number];
        job.run += 1;
        job.place = Place::Running {
            slot: self.input.running.len(),
            pool,
            market,
            started_ms: now_ms,
        };
        if job.first_start_ms.is_none() {
            job.first_start_ms = Some(now_ms);
            self.stats.waits_ms.push(now_ms - job.spec.submitted_at_ms);
        }
        let (user, resources, run, remaining_ms) = (job.spec.user, job.spec.resources, job.run, job.remaining_ms);
        self.input.running.push(running);
        self.running_ids.push(number);
        self.user_pending[user] -= 1;
        self.user_queued[user] -= resources;
        self.user_held[user] += resources;
        self.allocated[pool] += resources;
        self.stats.segments += 1;
        if market == Market::Spot {
            self.spot_jobs[pool] += 1;
            self.stats.spot_segments += 1;
            let rate = TYPES[pool].preemptions_per_hour;
            let preempted_after_ms = (-(1.0 - self.rng.random::<f64>()).ln() / rate * HOUR_MS) as i64;
            if preempted_after_ms < remaining_ms {
                self.schedule(now_ms + preempted_after_ms, Event::SpotPreempt(number, run));
                return;
            }
        }
        self.schedule(now_ms + remaining_ms, Event::Finish(number, run));
    }

    /// Takes a running job off its pool and bills the run; returns its pool and how long it ran.
    fn end_run(&mut self, number: usize) -> (usize, i64) {
        let Place::Running {
            slot,
            pool,
            market,
            started_ms,
        } = self.jobs[number].place
        else {
            unreachable!("only running jobs end")
        };
        self.input.running.swap_remove(slot);
        self.running_ids.swap_remove(slot);
        if let Some(&moved) = self.running_ids.get(slot)
            && let Place::Running { slot: moved_slot, .. } = &mut self.jobs[moved].place
        {
            *moved_slot = slot;
        }
        let resources = self.jobs[number].spec.resources;
        let ran_ms = self.clock_ms - started_ms;
        self.user_held[self.jobs[number].spec.user] -= resources;
        self.allocated[pool] -= resources;
        if market == Market::Spot {
            self.spot_jobs[pool] -= 1;
        }
        let pool_spec = &self.input.pools[pool];
        self.stats.cost += pool_spec.cost_per_hour(&resources, market) * ran_ms as f64 / HOUR_MS;
        self.stats.run_hours += resources.dominant_share(&pool_spec.instance) * ran_ms as f64 / HOUR_MS;
        (pool, ran_ms)
    }

    /// The work a run stopped after `ran_ms` throws away (the time since its last checkpoint),
    /// in instance-hours.
    fn lost_instance_hours(&self, number: usize, pool: usize, ran_ms: i64) -> f64 {
        let checkpoint_ms = self.args.checkpoint_minutes.max(1) * MINUTE_MS;
        let instance = &self.input.pools[pool].instance;
        self.jobs[number].spec.resources.dominant_share(instance) * (ran_ms % checkpoint_ms) as f64 / HOUR_MS
    }

    /// Queues a stopped job again, with its submit time, minus the work its checkpoints saved.
    fn requeue(&mut self, number: usize, ran_ms: i64) {
        let checkpoint_ms = self.args.checkpoint_minutes.max(1) * MINUTE_MS;
        let saved_ms = ran_ms / checkpoint_ms * checkpoint_ms;
        self.jobs[number].remaining_ms -= saved_ms;
        self.push_pending(number);
    }
}
