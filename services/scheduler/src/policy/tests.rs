//! Scenario tests of the pass: quotas, fair share, priority, backfill and reservations,
//! priority and fair-share preemption, market and pool choice, and the explanations of waits.

use std::collections::{BTreeSet, HashMap};

use super::*;

const GIB: i64 = 1 << 30;

fn res(cpus: f64, memory_gib: i64, gpus: i64) -> Resources {
    Resources::new((cpus * 1000.0) as i64, memory_gib * GIB, gpus)
}

/// A pool that is one machine, spot at 30% of on-demand, calm.
fn pool(name: &str, capacity: Resources) -> Pool {
    Pool {
        name: name.into(),
        capacity,
        instance: capacity,
        on_demand_per_hour: 1.0,
        spot_per_hour: 0.3,
        spot_available: true,
        preemptions_per_hour: 0.05,
    }
}

fn job(id: &str, user: &str, project: &str, resources: Resources, submitted_at_ms: i64) -> PendingJob {
    PendingJob {
        id: id.into(),
        user: user.into(),
        project: project.into(),
        priority: 0,
        resources,
        submitted_at_ms,
        market: MarketPolicy::Auto,
        preemptions: 0,
        expected_runtime_secs: 0.0,
        pool: String::new(),
        nodes: 1,
    }
}

fn running(id: &str, user: &str, pool: &str, resources: Resources, priority: i32, started_at_ms: i64) -> RunningJob {
    RunningJob {
        id: id.into(),
        user: user.into(),
        project: "p".into(),
        priority,
        resources,
        pool: pool.into(),
        runner: String::new(),
        market: Market::OnDemand,
        started_at_ms,
        preemptible: true,
        stopping: false,
    }
}

fn input(pending: Vec<PendingJob>, running: Vec<RunningJob>, pools: Vec<Pool>) -> Input {
    Input {
        pending,
        running,
        pools,
        ..Input::default()
    }
}

fn placed_ids(input: &Input, plan: &Plan) -> Vec<String> {
    plan.placements
        .iter()
        .map(|placement| input.pending[placement.job].id.clone())
        .collect()
}

fn wait_of<'p>(input: &Input, plan: &'p Plan, id: &str) -> &'p JobWait {
    let index = input
        .pending
        .iter()
        .position(|job| job.id == id)
        .expect("a pending job");
    plan.wait_of(index).unwrap_or_else(|| panic!("{id} was placed"))
}

/// Each user's dominant share of the cluster after the plan: running jobs plus placements.
fn shares_after(input: &Input, plan: &Plan) -> HashMap<String, f64> {
    let total = input
        .pools
        .iter()
        .fold(Resources::ZERO, |sum, pool| sum + pool.capacity);
    let mut held: HashMap<String, Resources> = HashMap::new();
    for job in &input.running {
        *held.entry(job.user.clone()).or_default() += job.resources;
    }
    for placement in &plan.placements {
        let job = &input.pending[placement.job];
        *held.entry(job.user.clone()).or_default() += job.resources;
    }
    held.into_iter()
        .map(|(user, resources)| (user, resources.dominant_share(&total)))
        .collect()
}

const ORDERS: [Order; 2] = [Order::Hierarchical, Order::FairShareRatio];

fn with_order(mut input: Input, order: Order) -> Input {
    input.settings.order = order;
    input
}

fn flood(user: &str, project: &str, count: usize, resources: Resources) -> Vec<PendingJob> {
    (0..count)
        .map(|n| job(&format!("{user}-{n}"), user, project, resources, n as i64))
        .collect()
}

// === quotas ===

#[test]
fn a_user_at_gpu_quota_waits_while_another_users_job_runs() {
    let mut input = input(
        vec![
            job("a-gpu", "alice", "p", res(1.0, 1, 1), 1),
            job("b-gpu", "bob", "p", res(1.0, 1, 1), 2),
            job("a-cpu", "alice", "p", res(1.0, 1, 0), 3),
        ],
        vec![running("a-old", "alice", "gpu", res(1.0, 1, 1), 0, 0)],
        vec![pool("gpu", res(16.0, 64, 4))],
    );
    input.quotas = vec![Quota {
        gpus: Some(1),
        ..Quota::unlimited(QuotaScope::User("alice".into()))
    }];
    let plan = plan(&input);
    // Alice's GPU job waits and holds up nobody, not even her own CPU-only job.
    assert_eq!(placed_ids(&input, &plan), ["b-gpu", "a-cpu"]);
    let wait = wait_of(&input, &plan, "a-gpu");
    assert_eq!(
        wait.reason,
        Wait::Quota {
            scope: QuotaScope::User("alice".into()),
            resource: QuotaResource::Gpus,
            limit: 1,
            used: 1,
            asked: 1,
        }
    );
    assert_eq!(
        wait.to_string(),
        "it waits: the GPU quota of user:alice is 1 GPU, 1 GPU is in use and the job asks 1 GPU"
    );

    // Raising the quota releases it (after bob's, whose user holds less).
    input.quotas[0].gpus = Some(2);
    let plan = super::plan(&input);
    assert_eq!(placed_ids(&input, &plan), ["b-gpu", "a-gpu", "a-cpu"]);
    assert!(plan.waits.is_empty());
}

#[test]
fn running_quotas_count_what_this_pass_placed() {
    let mut pending = flood("carol", "vision", 3, res(1.0, 1, 0));
    pending.extend(flood("dave", "nlp", 4, res(1.0, 1, 0)));
    // Hierarchical: vision and nlp take turns, so carol's third job meets the project quota
    // before the global one is full (by ratio, dave's larger demand would go faster).
    let mut input = with_order(
        input(pending, Vec::new(), vec![pool("p", res(64.0, 256, 0))]),
        Order::Hierarchical,
    );
    input.quotas = vec![
        Quota {
            running_jobs: Some(2),
            ..Quota::unlimited(QuotaScope::Project("vision".into()))
        },
        Quota {
            cpu_millis: Some(5000),
            ..Quota::unlimited(QuotaScope::Global)
        },
    ];
    let plan = plan(&input);
    assert_eq!(plan.placements.len(), 5);
    assert_eq!(
        wait_of(&input, &plan, "carol-2").reason,
        Wait::Quota {
            scope: QuotaScope::Project("vision".into()),
            resource: QuotaResource::RunningJobs,
            limit: 2,
            used: 2,
            asked: 1,
        }
    );
    let global: Vec<&Wait> = plan
        .waits
        .iter()
        .map(|wait| &wait.reason)
        .filter(|reason| {
            matches!(
                reason,
                Wait::Quota {
                    scope: QuotaScope::Global,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(global.len(), 1);
    assert_eq!(
        *global[0],
        Wait::Quota {
            scope: QuotaScope::Global,
            resource: QuotaResource::Cpu,
            limit: 5000,
            used: 5000,
            asked: 1000,
        }
    );
}

// === fair share ===

#[test]
fn equal_weight_users_flooding_get_equal_dominant_shares() {
    // Alice is CPU-heavy, bob memory-heavy, and alice already holds a quarter of the CPUs.
    // Taking turns would end at 0.75 and 0.5; DRF ends near 0.66 each.
    let mut pending = flood("alice", "p", 200, res(1.0, 1, 0));
    pending.extend(flood("bob", "p", 200, res(0.5, 4, 0)));
    let running = vec![running("a-old", "alice", "p", res(16.0, 16, 0), 0, 0)];
    let input = input(pending, running, vec![pool("p", res(64.0, 256, 0))]);
    for order in ORDERS {
        let input = with_order(input.clone(), order);
        let plan = plan(&input);
        let shares = shares_after(&input, &plan);
        let (alice, bob) = (shares["alice"], shares["bob"]);
        assert!(
            alice > 0.6 && bob > 0.6,
            "{order:?}: the cluster fills: alice {alice}, bob {bob}"
        );
        assert!(
            (alice - bob).abs() <= 0.05 * alice.max(bob),
            "{order:?}: alice {alice} and bob {bob} differ by more than 5%"
        );
    }
}

#[test]
fn project_weights_are_honoured() {
    let mut pending = flood("alice", "vision", 50, res(1.0, 1, 0));
    pending.extend(flood("bob", "nlp", 50, res(1.0, 1, 0)));
    let mut input = input(pending, Vec::new(), vec![pool("p", res(30.0, 1000, 0))]);
    input.weights.projects.insert("vision".into(), 2.0);
    for order in ORDERS {
        let input = with_order(input.clone(), order);
        let shares = shares_after(&input, &plan(&input));
        assert_eq!((shares["alice"] * 30.0).round(), 20.0, "{order:?}");
        assert_eq!((shares["bob"] * 30.0).round(), 10.0, "{order:?}");
    }
}

#[test]
fn user_weights_are_honoured_inside_a_project() {
    let mut pending = flood("alice", "p", 50, res(1.0, 1, 0));
    pending.extend(flood("bob", "p", 50, res(1.0, 1, 0)));
    let mut input = input(pending, Vec::new(), vec![pool("p", res(40.0, 1000, 0))]);
    input.weights.users.insert(("p".into(), "alice".into()), 3.0);
    for order in ORDERS {
        let input = with_order(input.clone(), order);
        let shares = shares_after(&input, &plan(&input));
        assert_eq!((shares["alice"] * 40.0).round(), 30.0, "{order:?}");
        assert_eq!((shares["bob"] * 40.0).round(), 10.0, "{order:?}");
    }
}

#[test]
fn projects_share_first_then_users_inside_them() {
    let mut pending = flood("solo", "small", 100, res(1.0, 1, 0));
    for user in ["t1", "t2", "t3"] {
        pending.extend(flood(user, "team", 100, res(1.0, 1, 0)));
    }
    let input = input(pending, Vec::new(), vec![pool("p", res(60.0, 1000, 0))]);
    for order in ORDERS {
        let input = with_order(input.clone(), order);
        let shares = shares_after(&input, &plan(&input));
        assert_eq!((shares["solo"] * 60.0).round(), 30.0, "{order:?}");
        for user in ["t1", "t2", "t3"] {
            assert_eq!((shares[user] * 60.0).round(), 10.0, "{order:?} {user}");
        }
    }
}

/// Project p: alice holds 3 of 10 CPUs, bob nothing; project q: dave holds 2. Bob and dave
/// each queue a 4-CPU job, and only one fits.
fn ratio_input(order: Order) -> Input {
    let mut held = vec![
        running("a-old", "alice", "p", res(3.0, 1, 0), 0, 0),
        running("d-old", "dave", "p", res(2.0, 1, 0), 0, 0),
    ];
    held[1].project = "q".into();
    let pending = vec![
        job("d-1", "dave", "q", res(4.0, 1, 0), 0),
        job("b-1", "bob", "p", res(4.0, 1, 0), 1),
    ];
    with_order(input(pending, held, vec![pool("p", res(10.0, 64, 0))]), order)
}

#[test]
fn the_fair_share_ratio_order_puts_the_user_furthest_below_their_share_first() {
    // Hierarchical: q holds less than p, so dave goes first.
    let input = ratio_input(Order::Hierarchical);
    assert_eq!(placed_ids(&input, &plan(&input)), ["d-1"]);
    // By ratio: bob holds nothing of his fair share (a quarter), dave 2 CPUs of his half, so
    // bob goes first though his project holds more.
    let input = ratio_input(Order::FairShareRatio);
    let plan = plan(&input);
    assert_eq!(placed_ids(&input, &plan), ["b-1"]);
    let wait = wait_of(&input, &plan, "d-1");
    assert_eq!(
        wait.ahead,
        Ahead {
            fair_share: 1,
            order: Order::FairShareRatio,
            ..Ahead::default()
        }
    );
    assert!(
        wait.to_string()
            .ends_with("1 job is ahead of it: 1 of users further below their fair share"),
        "{wait}"
    );
}

#[test]
fn the_fair_share_ratio_order_caps_fair_shares_by_demand() {
    // Carol wants one CPU in all; alice and bob flood. Carol's fair share is her demand, so her
    // job starts, and the rest splits evenly between alice and bob, whose shares grow with
    // each placement (not alternating by submit time: alice starts with 4 CPUs).
    let mut pending = flood("alice", "p", 50, res(1.0, 1, 0));
    pending.extend(flood("bob", "p", 50, res(1.0, 1, 0)));
    pending.push(job("c-1", "carol", "q", res(1.0, 1, 0), 99));
    let held = vec![running("a-old", "alice", "p", res(4.0, 1, 0), 0, 0)];
    let input = with_order(
        input(pending, held, vec![pool("p", res(21.0, 1000, 0))]),
        Order::FairShareRatio,
    );
    let plan = plan(&input);
    assert!(placed_ids(&input, &plan).contains(&"c-1".to_string()));
    let shares = shares_after(&input, &plan);
    assert_eq!((shares["alice"] * 21.0).round(), 10.0);
    assert_eq!((shares["bob"] * 21.0).round(), 10.0);
    assert_eq!((shares["carol"] * 21.0).round(), 1.0);
}

#[test]
fn priority_comes_before_share_and_submit_time() {
    let mut urgent = job("a-urgent", "alice", "p", res(4.0, 1, 0), 50);
    urgent.priority = 10;
    let input = input(
        vec![
            job("b-1", "bob", "p", res(2.0, 1, 0), 1),
            job("b-2", "bob", "p", res(2.0, 1, 0), 2),
            urgent,
        ],
        vec![running("a-old", "alice", "p", res(2.0, 1, 0), 0, 0)],
        vec![pool("p", res(6.0, 64, 0))],
    );
    let plan = plan(&input);
    assert_eq!(placed_ids(&input, &plan), ["a-urgent"]);
    assert_eq!(wait_of(&input, &plan, "b-1").ahead.higher_priority, 1);
}

#[test]
fn a_users_oldest_job_goes_first() {
    let input = input(
        vec![
            job("late", "alice", "p", res(2.0, 1, 0), 30),
            job("early", "alice", "p", res(2.0, 1, 0), 10),
        ],
        Vec::new(),
        vec![pool("p", res(2.0, 64, 0))],
    );
    let plan = plan(&input);
    assert_eq!(placed_ids(&input, &plan), ["early"]);
}

// === backfill and reservations ===

/// A wide job that fits only the big pool, which is 3/4 full; six small ones behind it.
fn backfill_input(reservations: bool) -> Input {
    let mut pending = vec![job("wide", "x", "p", res(8.0, 8, 0), 1)];
    pending.extend((0..6).map(|n| job(&format!("small-{n}"), "y", "p", res(1.0, 1, 0), 2 + n)));
    let mut input = input(
        pending,
        vec![running("z-old", "z", "big", res(12.0, 12, 0), 0, 0)],
        vec![pool("small", res(4.0, 16, 0)), pool("big", res(16.0, 64, 0))],
    );
    input.settings.reservations = reservations;
    input
}

#[test]
fn small_jobs_backfill_around_a_reservation() {
    let input = backfill_input(true);
    let plan = plan(&input);
    assert_eq!(placed_ids(&input, &plan), ["small-0", "small-1", "small-2", "small-3"]);
    assert!(plan.placements.iter().all(|placement| placement.pool == "small"));
    assert_eq!(
        wait_of(&input, &plan, "wide").reason,
        Wait::NoCapacity {
            pools: vec![("big".into(), res(4.0, 52, 0))],
            reserved_on: Some("big".into()),
        }
    );
    assert_eq!(
        wait_of(&input, &plan, "small-4").reason,
        Wait::Reserved {
            pool: "big".into(),
            for_job: "wide".into(),
        }
    );

    // Without the reservation, small jobs take the big pool's room first (it is cheaper per
    // job), and the wide job's room is gone.
    let input = backfill_input(false);
    let plan = super::plan(&input);
    assert_eq!(plan.placements.len(), 6);
    assert_eq!(plan.placements.iter().filter(|p| p.pool == "big").count(), 4);
}

/// Alice keeps ten one-CPU jobs queued, each running 8 ticks, on an 8-CPU pool where one of
/// hers ends every tick; bob's 8-CPU job comes at tick 0. Returns the tick it starts at.
fn big_job_start(reservations: bool) -> Option<u64> {
    const RUNTIME_TICKS: u64 = 8;
    let pools = vec![pool("p", res(8.0, 64, 0))];
    let mut running_jobs: Vec<(RunningJob, u64)> = (0..8)
        .map(|n| {
            let started = n as i64 - 8;
            (
                running(&format!("a-old-{n}"), "alice", "p", res(1.0, 1, 0), 0, started),
                n + 1,
            )
        })
        .collect();
    let mut pending = vec![job("bob-big", "bob", "p", res(8.0, 8, 0), 0)];
    let mut submitted = 0;
    for tick in 0..60u64 {
        running_jobs.retain(|(_, ends_at)| *ends_at > tick);
        while pending.iter().filter(|job| job.user == "alice").count() < 10 {
            pending.push(job(
                &format!("a-{submitted}"),
                "alice",
                "p",
                res(1.0, 1, 0),
                tick as i64,
            ));
            submitted += 1;
        }
        let mut input = input(
            pending.clone(),
            running_jobs.iter().map(|(job, _)| job.clone()).collect(),
            pools.clone(),
        );
        input.settings.reservations = reservations;
        let plan = plan(&input);
        if reservations && tick == 1 {
            let wait = wait_of(&input, &plan, "bob-big");
            assert!(matches!(&wait.reason, Wait::NoCapacity { reserved_on: Some(pool), .. } if pool == "p"));
        }
        let mut placed: Vec<usize> = plan.placements.iter().map(|placement| placement.job).collect();
        placed.sort_unstable_by(|a, b| b.cmp(a));
        for index in placed {
            let started = pending.swap_remove(index);
            if started.id == "bob-big" {
                return Some(tick);
            }
            let as_running = RunningJob {
                id: started.id.clone(),
                user: started.user.clone(),
                project: started.project.clone(),
                priority: 0,
                resources: started.resources,
                pool: "p".into(),
                runner: String::new(),
                market: Market::Spot,
                started_at_ms: tick as i64,
                preemptible: true,
                stopping: false,
            };
            running_jobs.push((as_running, tick + RUNTIME_TICKS));
        }
    }
    None
}

#[test]
fn a_reservation_stops_a_stream_of_small_jobs_starving_a_big_one() {
    // Held room grows by one CPU a tick until all 8 old jobs are gone.
    assert_eq!(big_job_start(true), Some(8));
    // Without it each freed CPU goes to one of alice's jobs, for ever.
    assert_eq!(big_job_start(false), None);
}

/// A CPU pool that bob (project q) fills and a GPU pool of 3 where alice (project p) and bob
/// hold one GPU each. Carol (p) queues a CPU job, alice and dave (q) a GPU job each.
fn yield_input() -> Input {
    let gpu_job = res(4.0, 16, 1);
    let mut held: Vec<RunningJob> = (0..4)
        .map(|n| running(&format!("b-cpu-{n}"), "bob", "cpu", res(1.0, 1, 0), 0, n))
        .collect();
    held.push(running("b-gpu", "bob", "gpu", gpu_job, 0, 0));
    held.push(running("a-gpu", "alice", "gpu", gpu_job, 0, 0));
    for job in &mut held {
        job.project = if job.user == "bob" { "q" } else { "p" }.into();
    }
    let mut gpus = pool("gpu", res(12.0, 48, 3));
    gpus.instance = gpu_job;
    input(
        vec![
            job("c-cpu", "carol", "p", res(1.0, 1, 0), 0),
            job("a-gpu-2", "alice", "p", gpu_job, 1),
            job("d-gpu", "dave", "q", gpu_job, 2),
        ],
        held,
        vec![pool("cpu", res(4.0, 16, 0)), gpus],
    )
}

#[test]
fn project_mates_above_a_waiting_user_yield_to_other_projects() {
    // Project p holds a third of the GPUs, q half the CPUs: p goes first. Carol (p, nothing)
    // waits for CPUs; alice, her project-mate with a GPU, yields, so the free GPU goes to dave
    // (q), and p's share can fall to carol's turn rather than stay up with alice's GPUs.
    let input = with_order(yield_input(), Order::Hierarchical);
    let plan = plan(&input);
    assert_eq!(placed_ids(&input, &plan), ["d-gpu"]);
    assert!(matches!(
        wait_of(&input, &plan, "c-cpu").reason,
        Wait::NoCapacity { .. }
    ));
    assert!(matches!(
        wait_of(&input, &plan, "a-gpu-2").reason,
        Wait::NoCapacity { .. }
    ));

    // Without yielding, alice takes the GPU back.
    let mut without = with_order(yield_input(), Order::Hierarchical);
    without.settings.yield_within_project = false;
    assert_eq!(placed_ids(&without, &super::plan(&without)), ["a-gpu-2"]);

    // Yielding is not idling: with nobody else wanting it, alice gets the GPU after all.
    let mut alone = with_order(yield_input(), Order::Hierarchical);
    alone.pending.retain(|job| job.id != "d-gpu");
    assert_eq!(placed_ids(&alone, &super::plan(&alone)), ["a-gpu-2"]);

    // The fair-share-ratio order gets there without yielding: carol and dave hold nothing of
    // their fair shares and go before alice.
    let by_ratio = with_order(yield_input(), Order::FairShareRatio);
    assert_eq!(placed_ids(&by_ratio, &super::plan(&by_ratio)), ["d-gpu"]);
}

// === priority preemption ===

fn preemption_input(asked_cpus: f64, budget: usize) -> Input {
    let mut urgent = job("urgent", "u", "p", res(asked_cpus, 1, 0), 0);
    urgent.priority = 10;
    let mut locked = running("v-locked", "w", "p", res(2.0, 1, 0), 0, 900);
    locked.preemptible = false;
    let mut input = input(
        vec![urgent],
        vec![
            running("v-old", "w", "p", res(2.0, 1, 0), 0, 100),
            running("v-young", "w", "p", res(2.0, 1, 0), 0, 500),
            running("v-mid", "w", "p", res(2.0, 1, 0), 5, 300),
            running("v-same", "w", "p", res(2.0, 1, 0), 10, 700),
            locked,
        ],
        vec![pool("p", res(10.0, 64, 0))],
    );
    input.settings.preempting_priorities = BTreeSet::from([10]);
    input.settings.preemption_budget = budget;
    input
}

fn victims(plan: &Plan) -> Vec<&str> {
    plan.preemptions
        .iter()
        .map(|preemption| preemption.victim.as_str())
        .collect()
}

#[test]
fn preemption_picks_the_lowest_priority_youngest_victim() {
    let input = preemption_input(2.0, 5);
    let plan = plan(&input);
    assert_eq!(victims(&plan), ["v-young"]);
    assert_eq!(plan.preemptions[0].for_job, "urgent");
    assert_eq!(
        wait_of(&input, &plan, "urgent").reason,
        Wait::WaitingForPreemption {
            pool: "p".into(),
            victims: vec!["v-young".into()],
        }
    );
    // Needing 6 CPUs: both priority-0 jobs, then the priority-5 one; never the same priority,
    // nor a job that is not preemptible.
    let plan = super::plan(&preemption_input(6.0, 5));
    let mut chosen = victims(&plan);
    chosen.sort_unstable();
    assert_eq!(chosen, ["v-mid", "v-old", "v-young"]);
    assert!(plan.placements.is_empty());
    assert!(super::plan(&preemption_input(10.0, 5)).preemptions.is_empty());
}

#[test]
fn preemption_respects_the_budget() {
    // Two victims needed, one allowed: none is taken and the job waits for capacity.
    let input = preemption_input(4.0, 1);
    let plan = plan(&input);
    assert!(plan.preemptions.is_empty());
    assert!(matches!(
        wait_of(&input, &plan, "urgent").reason,
        Wait::NoCapacity { .. }
    ));
    // Two urgent jobs, budget for one victim.
    let mut input = preemption_input(2.0, 1);
    let mut second = input.pending[0].clone();
    second.id = "urgent-2".into();
    second.submitted_at_ms = 1;
    input.pending.push(second);
    let plan = super::plan(&input);
    assert_eq!(victims(&plan), ["v-young"]);
    assert!(matches!(
        wait_of(&input, &plan, "urgent-2").reason,
        Wait::NoCapacity { .. }
    ));
}

#[test]
fn preemption_takes_the_fewest_victims() {
    let mut urgent = job("urgent", "u", "p", res(4.0, 1, 0), 0);
    urgent.priority = 10;
    let mut input = input(
        vec![urgent],
        vec![
            running("tiny-1", "w", "p", res(1.0, 1, 0), 0, 100),
            running("tiny-2", "w", "p", res(1.0, 1, 0), 0, 200),
            running("large", "w", "p", res(4.0, 1, 0), 1, 300),
        ],
        vec![pool("p", res(6.0, 64, 0))],
    );
    input.settings.preempting_priorities = BTreeSet::from([10]);
    input.settings.preemption_budget = 3;
    assert_eq!(victims(&plan(&input)), ["large"]);
}

#[test]
fn a_stopping_victim_is_not_preempted_twice() {
    // No budget left, yet the job still waits for the victim an earlier pass chose.
    let mut input = preemption_input(2.0, 0);
    input.running[1].stopping = true; // v-young, preempted by an earlier pass
    let plan = plan(&input);
    assert!(plan.preemptions.is_empty());
    assert_eq!(
        wait_of(&input, &plan, "urgent").reason,
        Wait::WaitingForPreemption {
            pool: "p".into(),
            victims: vec!["v-young".into()],
        }
    );
}

// === fair-share preemption ===

/// One 12-CPU pool held by alice (6 one-CPU jobs), bob (4) and carol (2), carol's the
/// youngest; dave holds nothing and asks for one CPU. All priority 0, preemptible, in project p.
fn fair_share_input(flag: bool, budget: usize) -> Input {
    let mut held = Vec::new();
    for (user, count, first_start) in [("alice", 6, 0), ("bob", 4, 1000), ("carol", 2, 2000)] {
        for n in 0..count {
            let id = format!("{}-{n}", &user[..1]);
            held.push(running(&id, user, "p", res(1.0, 1, 0), 0, first_start + 100 * n as i64));
        }
    }
    let mut input = input(
        vec![job("d-0", "dave", "p", res(1.0, 1, 0), 0)],
        held,
        vec![pool("p", res(12.0, 64, 0))],
    );
    input.settings.fair_share_preemption = flag;
    input.settings.fair_share_preemption_budget = budget;
    input
}

#[test]
fn without_fair_share_preemption_an_over_share_user_keeps_its_jobs() {
    let input = fair_share_input(false, 5);
    let plan = plan(&input);
    assert!(plan.preemptions.is_empty());
    assert!(matches!(wait_of(&input, &plan, "d-0").reason, Wait::NoCapacity { .. }));
    // On, but with no budget: the same.
    let plan = super::plan(&fair_share_input(true, 0));
    assert!(plan.preemptions.is_empty());
}

#[test]
fn an_under_share_job_preempts_the_youngest_job_it_may() {
    // Carol's youngest job throws away the least work, and she keeps one (level with dave).
    let input = fair_share_input(true, 5);
    let plan = plan(&input);
    assert_eq!(
        plan.preemptions,
        [Preemption {
            victim: "c-1".into(),
            for_job: "d-0".into(),
            fair_share: true,
        }]
    );
    assert_eq!(
        wait_of(&input, &plan, "d-0").reason,
        Wait::WaitingForPreemption {
            pool: "p".into(),
            victims: vec!["c-1".into()],
        }
    );

    // Three of dave's jobs, budget for two victims: the second is bob's youngest (carol, at 1
    // against dave's 2 counting the first, may lose no more), the third waits for capacity.
    let mut input = fair_share_input(true, 2);
    for n in 1..3 {
        input
            .pending
            .push(job(&format!("d-{n}"), "dave", "p", res(1.0, 1, 0), n));
    }
    let plan = super::plan(&input);
    assert_eq!(victims(&plan), ["c-1", "b-3"]);
    assert!(matches!(wait_of(&input, &plan, "d-2").reason, Wait::NoCapacity { .. }));
}

#[test]
fn fair_share_preemption_spares_what_it_must() {
    // With alice's jobs the youngest, alice's youngest goes; when hers are not preemptible,
    // then of a higher priority, carol loses her youngest instead.
    let youngest_alice = || {
        let mut input = fair_share_input(true, 5);
        for job in input.running.iter_mut().filter(|job| job.user == "alice") {
            job.started_at_ms += 10_000;
        }
        input
    };
    assert_eq!(victims(&plan(&youngest_alice())), ["a-5"]);
    for spare in [
        (|job: &mut RunningJob| job.preemptible = false) as fn(&mut RunningJob),
        |job: &mut RunningJob| job.priority = 1,
    ] {
        let mut input = youngest_alice();
        input
            .running
            .iter_mut()
            .filter(|job| job.user == "alice")
            .for_each(spare);
        assert_eq!(victims(&plan(&input)), ["c-1"]);
    }
    // A lower priority may be taken, as the same one is.
    let mut lower = fair_share_input(true, 5);
    lower.running[0].priority = -1; // a-0, the oldest
    assert_eq!(victims(&plan(&lower)), ["a-0"]);

    // No inversion: dave holds 1 of 4 CPUs and asks 1 more; alice (2 jobs) would drop to 1
    // while he rises to 2, bob (1 job) to 0. Nobody is preempted.
    let mut input = input(
        vec![job("d-1", "dave", "p", res(1.0, 1, 0), 0)],
        vec![
            running("a-0", "alice", "p", res(1.0, 1, 0), 0, 0),
            running("a-1", "alice", "p", res(1.0, 1, 0), 0, 1),
            running("b-0", "bob", "p", res(1.0, 1, 0), 0, 2),
            running("d-0", "dave", "p", res(1.0, 1, 0), 0, 3),
        ],
        vec![pool("p", res(4.0, 64, 0))],
    );
    input.settings.fair_share_preemption = true;
    input.settings.fair_share_preemption_budget = 5;
    let plan = plan(&input);
    assert!(plan.preemptions.is_empty());
    assert!(matches!(wait_of(&input, &plan, "d-1").reason, Wait::NoCapacity { .. }));
    // Two victims from one owner are judged together: dave (holding none) asks 2 CPUs; alice,
    // holding 3, could lose one (2 left against his 2) but not two.
    input.pending[0].resources = res(2.0, 1, 0);
    input.running[3].user = "alice".into();
    assert!(super::plan(&input).preemptions.is_empty());
    // One big victim would invert the order too: alice's only job is 2 CPUs of 2.
    input.pending[0].resources = res(1.0, 1, 0);
    input.running = vec![running("a-big", "alice", "p", res(2.0, 1, 0), 0, 0)];
    input.pools = vec![pool("p", res(2.0, 64, 0))];
    assert!(super::plan(&input).preemptions.is_empty());

    // Inside one pass, the victims and the jobs waiting for them already count: alice holds
    // all 4 CPUs, dave queues 3 jobs, the budget allows 5, and only 2 are preempted (2 each).
    let mut input = self::input(
        flood("dave", "p", 3, res(1.0, 1, 0)),
        (0..4)
            .map(|n| running(&format!("a-{n}"), "alice", "p", res(1.0, 1, 0), 0, n))
            .collect(),
        vec![pool("p", res(4.0, 64, 0))],
    );
    input.settings.fair_share_preemption = true;
    input.settings.fair_share_preemption_budget = 5;
    assert_eq!(victims(&super::plan(&input)), ["a-3", "a-2"]);
}

#[test]
fn fair_share_preemption_compares_projects_first() {
    // Alice (project x) holds 6 of 12 CPUs, bob 4 and dave 2 in project y: the projects are
    // level, so dave may not take from alice although she leads him most; bob is above him
    // inside y.
    let mut input = fair_share_input(true, 5);
    input.running.retain(|job| job.user != "carol");
    for n in 0..2 {
        input
            .running
            .push(running(&format!("d-old-{n}"), "dave", "p", res(1.0, 1, 0), 0, n));
    }
    for job in &mut input.running {
        job.project = if job.user == "alice" { "x" } else { "y" }.into();
    }
    input.pending[0].project = "y".into();
    assert_eq!(victims(&plan(&input)), ["b-3"]);
}

#[test]
fn fair_share_preemption_has_a_budget_of_its_own() {
    // Only the priority budget: fair share orders nothing.
    let mut input = fair_share_input(true, 0);
    input.settings.preemption_budget = 5;
    assert!(plan(&input).preemptions.is_empty());

    // One token each: a high-priority job and dave both get a victim; neither spends the other's.
    let mut input = fair_share_input(true, 1);
    input.settings.preemption_budget = 1;
    input.settings.preempting_priorities.insert(1);
    let mut urgent = job("e-0", "erin", "p", res(1.0, 1, 0), 0);
    urgent.priority = 1;
    input.pending.push(urgent);
    let plan = plan(&input);
    let kinds: Vec<(&str, bool)> = plan
        .preemptions
        .iter()
        .map(|preemption| (preemption.for_job.as_str(), preemption.fair_share))
        .collect();
    assert_eq!(kinds, [("e-0", false), ("d-0", true)]);
}

#[test]
fn fair_share_preemption_across_projects_spares_users_poorer_than_the_waiting_one() {
    // A 12-CPU pool: alice, bob, carol and erin hold 2 CPUs each in project x (8), dave 3 and
    // frank 1 in project y (4). Dave asks 1 more: project x would stay ahead of y (7 to 5), but
    // every user of x would drop below dave (1 to 4), so nobody is preempted.
    let mut held = Vec::new();
    for (user, project, count) in [
        ("alice", "x", 2),
        ("bob", "x", 2),
        ("carol", "x", 2),
        ("erin", "x", 2),
        ("dave", "y", 3),
        ("frank", "y", 1),
    ] {
        for n in 0..count {
            let mut job = running(&format!("{user}-{n}"), user, "p", res(1.0, 1, 0), 0, n);
            job.project = project.into();
            held.push(job);
        }
    }
    let mut input = input(
        vec![job("d-new", "dave", "y", res(1.0, 1, 0), 0)],
        held,
        vec![pool("p", res(12.0, 64, 0))],
    );
    input.settings.fair_share_preemption = true;
    input.settings.fair_share_preemption_budget = 5;
    assert!(plan(&input).preemptions.is_empty());

    // When frank holds dave's 3 CPUs instead, dave (0, asking 1) is poorer than each user of x
    // (2, left with 1): one of theirs is taken.
    for job in input.running.iter_mut().filter(|job| job.user == "dave") {
        job.user = "frank".into();
    }
    let plan = plan(&input);
    assert_eq!(plan.preemptions.len(), 1);
    assert!(plan.preemptions[0].fair_share);
}

/// Alice holds the whole `cpus`-CPU pool with one-CPU jobs and has as many queued; bob queues
/// as many. Passes with a budget of two victims; victims are queued again with their submit
/// time, placements start, nothing ends. Returns the preemptions of each pass and the CPUs
/// alice and bob hold at the end.
fn fair_share_passes(cpus: usize, passes: usize) -> (Vec<usize>, usize, usize) {
    let mut running_jobs: Vec<RunningJob> = (0..cpus)
        .map(|n| running(&format!("a-run-{n}"), "alice", "p", res(1.0, 1, 0), 0, n as i64))
        .collect();
    let mut pending = flood("alice", "p", cpus, res(1.0, 1, 0));
    pending.extend(flood("bob", "p", cpus, res(1.0, 1, 0)));
    let mut preemptions = Vec::new();
    for tick in 0..passes {
        let mut input = input(
            pending.clone(),
            running_jobs.clone(),
            vec![pool("p", res(cpus as f64, 64, 0))],
        );
        input.settings.fair_share_preemption = true;
        input.settings.fair_share_preemption_budget = 2;
        let plan = plan(&input);
        assert!(plan.preemptions.iter().all(|preemption| preemption.fair_share));
        preemptions.push(plan.preemptions.len());
        let mut placed: Vec<usize> = plan.placements.iter().map(|placement| placement.job).collect();
        placed.sort_unstable_by(|a, b| b.cmp(a));
        for index in placed {
            let started = pending.swap_remove(index);
            let mut as_running = running(
                &started.id,
                &started.user,
                "p",
                started.resources,
                0,
                1000 + tick as i64,
            );
            as_running.project = started.project.clone();
            running_jobs.push(as_running);
        }
        for preemption in &plan.preemptions {
            let position = running_jobs
                .iter()
                .position(|job| job.id == preemption.victim)
                .expect("a victim runs");
            let victim = running_jobs.swap_remove(position);
            pending.push(job(&victim.id, &victim.user, &victim.project, victim.resources, 0));
        }
    }
    let held = |user: &str| running_jobs.iter().filter(|job| job.user == user).count();
    (preemptions, held("alice"), held("bob"))
}

#[test]
fn fair_share_preemption_converges_and_then_stops() {
    // 12 CPUs: two victims a pass for three passes, then 6 each and no more preemptions.
    let (preemptions, alice, bob) = fair_share_passes(12, 10);
    assert_eq!(preemptions, [2, 2, 2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!((alice, bob), (6, 6));
    // 5 CPUs cannot be split evenly: 3 and 2, and neither takes the odd one back.
    let (preemptions, alice, bob) = fair_share_passes(5, 10);
    assert_eq!(preemptions.iter().sum::<usize>(), 2);
    assert_eq!(preemptions[2..], [0; 8]);
    assert_eq!((alice, bob), (3, 2));
}

// === pools and markets ===

#[test]
fn gpu_pools_are_kept_for_gpu_work() {
    let mut pending = flood("alice", "p", 12, res(1.0, 1, 0));
    pending.extend(flood("bob", "p", 2, res(1.0, 1, 1)));
    let input = input(
        pending,
        Vec::new(),
        vec![pool("cpu", res(8.0, 64, 0)), pool("gpu", res(8.0, 64, 2))],
    );
    let plan = plan(&input);
    let on = |name: &str| plan.placements.iter().filter(|p| p.pool == name).count();
    assert_eq!((on("cpu"), on("gpu")), (8, 2));
    let wait = wait_of(&input, &plan, "alice-11");
    assert!(matches!(&wait.reason, Wait::NoCapacity { pools, .. } if pools.len() == 1 && pools[0].0 == "cpu"));
}

#[test]
fn jobs_go_where_they_cost_least_on_the_market_chosen() {
    let mut risky = pool("risky", res(64.0, 256, 0));
    risky.preemptions_per_hour = 2.0;
    let mut calm = pool("calm", res(64.0, 256, 0));
    calm.on_demand_per_hour = 1.2;
    calm.spot_per_hour = 0.4;
    let mut on_demand = job("on-demand", "a", "p", res(1.0, 1, 0), 1);
    on_demand.market = MarketPolicy::OnDemand;
    let mut spot = job("spot", "a", "p", res(1.0, 1, 0), 2);
    spot.market = MarketPolicy::Spot;
    let mut preempted = job("preempted", "a", "p", res(1.0, 1, 0), 3);
    preempted.preemptions = 3;
    let input = input(
        vec![job("auto", "a", "p", res(1.0, 1, 0), 0), on_demand, spot, preempted],
        Vec::new(),
        vec![risky, calm],
    );
    let plan = plan(&input);
    let chosen: Vec<(String, &str, Market)> = plan
        .placements
        .iter()
        .map(|p| (input.pending[p.job].id.clone(), p.pool.as_str(), p.market))
        .collect();
    assert_eq!(
        chosen,
        [
            // Risky spot restarts with p = 0.86 > 0.5 in an hour: 1.0 on-demand there loses to 0.4 calm spot.
            ("auto".to_string(), "calm", Market::Spot),
            ("on-demand".to_string(), "risky", Market::OnDemand),
            ("spot".to_string(), "risky", Market::Spot),
            ("preempted".to_string(), "risky", Market::OnDemand),
        ]
    );
}

// === explanations ===

#[test]
fn waits_explain_why_and_count_the_jobs_ahead() {
    let mut high = job("high", "carol", "p", res(4.0, 1, 0), 0);
    high.priority = 5;
    let mut spot_only = job("spot-only", "erin", "p", res(1.0, 1, 0), 0);
    spot_only.market = MarketPolicy::Spot;
    let mut input = input(
        vec![
            high,
            job("a-1", "alice", "p", res(1.0, 1, 0), 1),
            job("b-1", "bob", "p", res(1.0, 1, 0), 2),
            job("a-2", "alice", "p", res(1.0, 1, 0), 3),
            job("d-quota", "dave", "p", res(1.0, 1, 0), 0),
            job("huge", "erin", "p", res(64.0, 1, 0), 0),
            spot_only,
        ],
        Vec::new(),
        vec![Pool {
            spot_available: false,
            ..pool("p", res(4.0, 16, 0))
        }],
    );
    input.quotas = vec![Quota {
        running_jobs: Some(0),
        ..Quota::unlimited(QuotaScope::User("dave".into()))
    }];
    let plan = plan(&input);
    assert_eq!(placed_ids(&input, &plan), ["high"]);
    // Quota and never-fitting jobs do not count as ahead of anyone.
    let ahead = |id: &str| wait_of(&input, &plan, id).ahead;
    assert_eq!(
        ahead("a-1"),
        Ahead {
            higher_priority: 1,
            fair_share: 0,
            same_user: 0,
            ..Ahead::default()
        }
    );
    assert_eq!(
        ahead("b-1"),
        Ahead {
            higher_priority: 1,
            fair_share: 1,
            same_user: 0,
            ..Ahead::default()
        }
    );
    assert_eq!(
        ahead("a-2"),
        Ahead {
            higher_priority: 1,
            fair_share: 1,
            same_user: 1,
            ..Ahead::default()
        }
    );
    // a-1's reservation holds 1 GiB of the free memory (all it can hold now), so b-1 sees 14.
    assert_eq!(
        wait_of(&input, &plan, "b-1").to_string(),
        "it waits: no pool that can hold it has room now (free: p 0 CPUs, 14 GiB); \
         2 jobs are ahead of it: 1 of higher priority, 1 of users further below their fair share"
    );
    let hierarchical = with_order(input.clone(), Order::Hierarchical);
    let plan_hierarchical = super::plan(&hierarchical);
    assert_eq!(
        wait_of(&hierarchical, &plan_hierarchical, "b-1").ahead.to_string(),
        "2 jobs are ahead of it: 1 of higher priority, 1 of projects or users with a smaller weighted share"
    );
    assert_eq!(
        wait_of(&input, &plan, "a-1").to_string(),
        "it waits: no pool that can hold it has room now (free: p 0 CPUs, 15 GiB); \
         room on p is held for it as jobs there finish; 1 job is ahead of it: 1 of higher priority"
    );
    assert_eq!(
        wait_of(&input, &plan, "huge").to_string(),
        "it waits: no runner of any pool can hold it even when empty (it asks 64 CPUs, 1 GiB; a job runs on one runner, never across several)"
    );
    assert_eq!(
        wait_of(&input, &plan, "spot-only").to_string(),
        "it waits: no runner of any pool offering spot can hold it even when empty (it asks 1 CPU, 1 GiB; a job runs on one runner, never across several)"
    );
    assert_eq!(
        wait_of(&input, &plan, "d-quota").to_string(),
        "it waits: the running-jobs quota of user:dave is 0 jobs, 0 jobs are in use and the job asks 1 job, \
         more than the quota itself: it cannot start until the quota is raised"
    );
    assert_eq!(plan.waits.len(), input.pending.len() - 1);
}

#[test]
fn jobs_on_pools_nobody_reports_still_count_for_shares() {
    let input = input(
        vec![
            job("a-1", "alice", "p", res(1.0, 1, 0), 0),
            job("b-1", "bob", "p", res(1.0, 1, 0), 1),
        ],
        vec![running("a-gone", "alice", "vanished", res(3.0, 1, 0), 0, 0)],
        vec![pool("p", res(1.0, 64, 0))],
    );
    let plan = plan(&input);
    assert_eq!(placed_ids(&input, &plan), ["b-1"]);
}

#[test]
fn jain_index_is_one_when_equal_and_one_over_n_when_one_has_all() {
    assert!((jain_index(&[0.3, 0.3, 0.3]) - 1.0).abs() < 1e-12);
    assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    assert!((jain_index(&[1.0, 2.0]) - 0.9).abs() < 1e-12);
    assert_eq!(jain_index(&[]), 1.0);
}

// === requested pools ===

#[test]
fn a_job_that_names_a_pool_runs_only_there() {
    let mut cheap = pool("cheap", res(8.0, 32, 0));
    cheap.on_demand_per_hour = 0.1;
    let dear = pool("dear", res(8.0, 32, 0));
    let mut pinned = job("pinned", "alice", "p", res(1.0, 1, 0), 1);
    pinned.pool = "dear".into();
    let free = job("free", "alice", "p", res(1.0, 1, 0), 2);
    let mut nowhere = job("nowhere", "alice", "p", res(1.0, 1, 0), 3);
    nowhere.pool = "absent".into();
    let input = input(vec![pinned, free, nowhere], vec![], vec![cheap, dear]);
    let plan = plan(&input);
    let pool_of = |id: &str| {
        plan.placements
            .iter()
            .find(|placement| input.pending[placement.job].id == id)
            .map(|placement| placement.pool.clone())
    };
    assert_eq!(pool_of("pinned").as_deref(), Some("dear"));
    assert_eq!(pool_of("free").as_deref(), Some("cheap"));
    assert_eq!(pool_of("nowhere"), None);
    let wait = wait_of(&input, &plan, "nowhere").to_string();
    assert!(wait.contains("it asks for pool absent"), "{wait}");
}

// === placement on runners, not on a pool's sum ===

fn runner(id: &str, pool: &str, capacity: Resources) -> Runner {
    Runner {
        id: id.into(),
        pool: pool.into(),
        capacity,
        instance: capacity,
        cordoned: false,
        spot_offering: None,
    }
}

fn on(mut job: RunningJob, runner: &str) -> RunningJob {
    job.runner = runner.into();
    job
}

/// Pool `cpu` made of two runners of 2 CPUs each, as the service reads it: the pool's capacity
/// is their sum, its instance the largest of them.
fn two_runner_input(pending: Vec<PendingJob>, running: Vec<RunningJob>) -> Input {
    let mut pool = pool("cpu", res(4.0, 16, 0));
    pool.instance = res(2.0, 8, 0);
    let mut input = input(pending, running, vec![pool]);
    input.runners = vec![
        runner("r-1", "cpu", res(2.0, 8, 0)),
        runner("r-2", "cpu", res(2.0, 8, 0)),
    ];
    input
}

fn runners_of(plan: &Plan) -> Vec<(usize, &str)> {
    plan.placements
        .iter()
        .map(|placement| (placement.job, placement.runner.as_str()))
        .collect()
}

#[test]
fn two_runners_of_two_cpus_take_two_two_cpu_jobs_one_each_and_not_a_three_cpu_one() {
    let input = two_runner_input(
        vec![
            job("big", "a", "p", res(3.0, 1, 0), 0),
            job("two-a", "b", "p", res(2.0, 1, 0), 1),
            job("two-b", "c", "p", res(2.0, 1, 0), 2),
        ],
        vec![],
    );
    let plan = plan(&input);
    assert_eq!(runners_of(&plan), [(1, "r-1"), (2, "r-2")]);
    let big = wait_of(&input, &plan, "big");
    assert_eq!(
        big.reason,
        Wait::NoPoolFits {
            asked: res(3.0, 1, 0),
            market: MarketPolicy::Auto,
            pool: String::new(),
        }
    );
    assert!(
        big.reason.to_string().contains("a job runs on one runner"),
        "{}",
        big.reason
    );
    // A runner large enough appears: the 3-CPU job is placed on it.
    let mut grown = input.clone();
    grown.pools[0].capacity = res(8.0, 32, 0);
    grown.pools[0].instance = res(4.0, 16, 0);
    grown.runners.push(runner("r-3", "cpu", res(4.0, 16, 0)));
    let plan = super::plan(&grown);
    assert!(runners_of(&plan).contains(&(0, "r-3")), "{:?}", plan.placements);
}

#[test]
fn a_job_that_fits_the_pools_free_sum_but_no_runners_free_room_waits() {
    // One CPU used on each runner: the pool has 2 CPUs free in all, no runner has 2.
    let input = two_runner_input(
        vec![
            job("two", "a", "p", res(2.0, 1, 0), 0),
            job("one", "b", "p", res(1.0, 1, 0), 1),
        ],
        vec![
            on(running("x", "w", "cpu", res(1.0, 1, 0), 0, 0), "r-1"),
            on(running("y", "w", "cpu", res(1.0, 1, 0), 0, 0), "r-2"),
        ],
    );
    let plan = plan(&input);
    let two = wait_of(&input, &plan, "two");
    let Wait::NoCapacity { pools, reserved_on } = &two.reason else {
        panic!("{:?}", two.reason);
    };
    assert_eq!(
        pools,
        &[
            ("r-1 (cpu)".to_string(), res(1.0, 7, 0)),
            ("r-2 (cpu)".to_string(), res(1.0, 7, 0))
        ]
    );
    assert_eq!(reserved_on.as_deref(), Some("r-1 (cpu)"));
    // The 1-CPU job backfills on the runner not reserved.
    assert_eq!(runners_of(&plan), [(1, "r-2")]);
}

#[test]
fn a_job_goes_to_the_tightest_runner_and_counts_on_it() {
    let mut pool = pool("cpu", res(6.0, 24, 0));
    pool.instance = res(4.0, 16, 0);
    let mut input = input(
        vec![
            job("one", "a", "p", res(1.0, 1, 0), 0),
            job("three", "b", "p", res(3.0, 1, 0), 1),
        ],
        vec![],
        vec![pool],
    );
    input.runners = vec![
        runner("big", "cpu", res(4.0, 16, 0)),
        runner("small", "cpu", res(2.0, 8, 0)),
    ];
    let plan = plan(&input);
    // The 1-CPU job leaves the 4-CPU runner whole for the 3-CPU one.
    assert_eq!(runners_of(&plan), [(0, "small"), (1, "big")]);
}

#[test]
fn preemption_frees_room_on_one_runner_not_across_the_pool() {
    // r-1 runs an old 1-CPU job and has 1 CPU idle; r-2 runs two younger 1-CPU jobs. Summed,
    // stopping the youngest ("b", on r-2) would free 2 CPUs in the pool, on no one runner: the
    // urgent 2-CPU job must stop "a" on r-1 instead, the one victim that makes room.
    let mut urgent = job("urgent", "u", "p", res(2.0, 1, 0), 0);
    urgent.priority = 10;
    let mut input = two_runner_input(
        vec![urgent],
        vec![
            on(running("a", "w", "cpu", res(1.0, 1, 0), 0, 100), "r-1"),
            on(running("b", "w", "cpu", res(1.0, 1, 0), 0, 900), "r-2"),
            on(running("c", "w", "cpu", res(1.0, 1, 0), 0, 800), "r-2"),
        ],
    );
    input.settings.preempting_priorities = BTreeSet::from([10]);
    input.settings.preemption_budget = 5;
    let plan = plan(&input);
    assert_eq!(victims(&plan), ["a"]);
    assert_eq!(
        wait_of(&input, &plan, "urgent").reason,
        Wait::WaitingForPreemption {
            pool: "r-1 (cpu)".into(),
            victims: vec!["a".into()],
        }
    );
    // Once "a" is gone, r-1 has room: the job starts there with no victim.
    let mut tight = input.clone();
    tight.running.remove(0);
    tight.settings.preemption_budget = 1;
    let plan = super::plan(&tight);
    assert!(plan.preemptions.is_empty());
    assert_eq!(runners_of(&plan), [(0, "r-1")]);
}

#[test]
fn running_jobs_of_a_runner_gone_do_not_count_on_the_live_ones() {
    let input = two_runner_input(
        vec![
            job("two-a", "a", "p", res(2.0, 1, 0), 0),
            job("two-b", "b", "p", res(2.0, 1, 0), 1),
        ],
        vec![on(running("ghost", "w", "cpu", res(2.0, 1, 0), 0, 0), "r-gone")],
    );
    let plan = plan(&input);
    assert_eq!(runners_of(&plan), [(0, "r-1"), (1, "r-2")]);
}

#[test]
fn a_cordoned_runner_has_no_free_room_and_no_victims() {
    // r-1 is empty but cordoned (its spot instance got a rebalance recommendation): the first
    // 2-CPU job goes to r-2, the second waits, and nothing is placed or reserved room on r-1.
    let mut input = two_runner_input(
        vec![
            job("two-a", "a", "p", res(2.0, 1, 0), 0),
            job("two-b", "b", "p", res(2.0, 1, 0), 1),
        ],
        vec![],
    );
    input.runners[0].cordoned = true;
    let plan = plan(&input);
    assert_eq!(runners_of(&plan), [(0, "r-2")]);
    let waiting = wait_of(&input, &plan, "two-b");
    let Wait::NoCapacity { pools, .. } = &waiting.reason else {
        panic!("{:?}", waiting.reason);
    };
    assert!(
        pools.contains(&("r-1 (cpu)".to_string(), Resources::ZERO)),
        "r-1 shows no free room: {pools:?}"
    );
    // A higher priority does not preempt a job on a cordoned runner to make room there.
    let mut urgent = job("urgent", "u", "p", res(2.0, 1, 0), 0);
    urgent.priority = 10;
    let mut input = two_runner_input(
        vec![urgent],
        vec![
            on(running("a", "w", "cpu", res(2.0, 1, 0), 0, 100), "r-1"),
            on(running("b", "w", "cpu", res(2.0, 1, 0), 0, 900), "r-2"),
        ],
    );
    input.runners[0].cordoned = true;
    input.settings.preempting_priorities = BTreeSet::from([10]);
    input.settings.preemption_budget = 5;
    let plan = super::plan(&input);
    assert_eq!(victims(&plan), ["b"]);
    // Uncordoned, the older "a" is as good a victim: the choice above was the cordon's.
    input.runners[0].cordoned = false;
    let plan = super::plan(&input);
    assert_eq!(plan.preemptions.len(), 1, "{:?}", plan.preemptions);
}

/// Disk (`--disk`) is placed as CPU and memory are: a job goes to the runner whose free disk
/// holds it, and one no runner's disk holds waits saying so.
#[test]
fn a_job_asking_for_disk_goes_to_the_runner_with_the_disk_and_waits_when_none_has_it() {
    const GIB: i64 = 1 << 30;
    let mut input = two_runner_input(
        vec![
            job("disk-10", "a", "p", res(1.0, 1, 0).with_disk(10 * GIB), 0),
            job("disk-90", "b", "p", res(1.0, 1, 0).with_disk(90 * GIB), 1),
        ],
        vec![],
    );
    input.runners[1].capacity = input.runners[1].capacity.with_disk(20 * GIB);
    input.runners[1].instance = input.runners[1].capacity;
    input.pools[0].capacity = input.pools[0].capacity.with_disk(20 * GIB);
    input.pools[0].instance = input.pools[0].instance.with_disk(20 * GIB);
    let plan = plan(&input);
    assert_eq!(runners_of(&plan), [(0, "r-2")]);
    let wait = wait_of(&input, &plan, "disk-90").to_string();
    assert!(wait.contains("90 GiB disk"), "{wait}");
}

/// A gang starts whole: three 1-CPU nodes fit on two 2-CPU runners (two share one); three
/// 2-CPU nodes do not, so none is placed, nothing is preempted for them, and a later small job
/// still starts behind the gang (backfill).
#[test]
fn a_gang_is_placed_whole_or_waits_whole_with_backfill_behind_it() {
    let mut small_gang = job("gang", "a", "p", res(1.0, 1, 0), 0);
    small_gang.nodes = 3;
    let input = two_runner_input(vec![small_gang], vec![]);
    let decided = plan(&input);
    assert_eq!(decided.placements.len(), 1, "{decided:?}");
    let nodes = &decided.placements[0].nodes;
    assert_eq!(nodes.len(), 3, "{decided:?}");
    assert_eq!(nodes[0], decided.placements[0].runner);
    assert_eq!(
        nodes.iter().filter(|runner| *runner == "r-1").count() + nodes.iter().filter(|runner| *runner == "r-2").count(),
        3
    );

    let mut big_gang = job("gang", "a", "p", res(2.0, 1, 0), 0);
    big_gang.nodes = 3;
    let input = two_runner_input(vec![big_gang, job("small", "b", "p", res(1.0, 1, 0), 1)], vec![]);
    let decided = plan(&input);
    assert_eq!(runners_of(&decided).len(), 1, "only the small job: {decided:?}");
    assert_eq!(decided.placements[0].job, 1);
    assert!(decided.preemptions.is_empty());
    let wait = wait_of(&input, &decided, "gang");
    assert_eq!(
        wait.reason,
        Wait::Gang {
            nodes: 3,
            fit: 2,
            pools: vec!["cpu".into()]
        }
    );
    assert!(
        wait.reason.to_string().contains("room for 2 of them"),
        "{}",
        wait.reason
    );
}
