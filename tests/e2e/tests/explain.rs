//! `kiln explain` is answered by the scheduler leader over NATS request/reply: with its own
//! configuration and the preemption rates it learnt, so it gives the reason it acts on; and
//! with no scheduler the api says so.

use std::collections::HashMap;

use kiln_e2e::sim::{cloud, cpu_box, explain, job_spec, sim_runner, submit_as, user};
use kiln_e2e::{PATIENCE, Stack, spawn_scheduler};
use kiln_proto::v1 as pb;
use kiln_scheduler::policy::{Order, PreemptionRate};

/// What a leader saves after one spot preemption in one instance-hour of spot on pool `local`:
/// 0.5 preemptions per instance-hour (one preemption over the hour and its one-hour prior).
async fn save_learnt_rate(stack: &Stack) {
    let now = kiln_core::ids::now_ms();
    let mut rate = PreemptionRate::new(PreemptionRate::DEFAULT_HALF_LIFE_HOURS, 0.0, 1.0);
    rate.observe_exposure(1.0, now);
    rate.observe_preemption(now);
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    let saved = kiln_scheduler::SavedRates::open(&nats).await.unwrap();
    saved.save(&HashMap::from([("local".to_string(), rate)])).await.unwrap();
}

async fn wait_for_leader(stack: &Stack, name: &str) {
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let holder = kiln_core::lease::Lease::current(&nats, kiln_core::subjects::LEASE_SCHEDULER)
            .await
            .unwrap();
        if holder.is_some_and(|holder| holder.holder == name) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} never led");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Under the default order and settings, bob (holding nothing) would come first and have room
/// held for him, and spot would be taken; the leader orders projects first (carol's project
/// holds less than bob's) and finds spot too likely to restart at the rate it took over.
#[tokio::test]
async fn explain_gives_the_reason_the_leaders_own_configuration_and_learnt_rates_act_on() {
    let mut stack = Stack::start_without_runner().await;
    stack.scheduler.take().unwrap().stop().await;
    save_learnt_rate(&stack).await;
    let mut tuned = stack.scheduler_config("scheduler-tuned");
    tuned.order = Order::Hierarchical;
    tuned.max_restart_probability = 0.25;
    stack.scheduler = Some(spawn_scheduler(tuned).await);
    wait_for_leader(&stack, "scheduler-tuned").await;
    // A standby with the defaults must not answer.
    let standby = spawn_scheduler(stack.scheduler_config("scheduler-default")).await;

    let (bob, carol) = (user(&stack, "bob").await, user(&stack, "carol").await);
    for (project, member) in [("x", "bob"), ("y", "carol")] {
        stack.create_project(project).await;
        stack.add_member(project, member, pb::Role::Member).await;
    }
    let in_project = |project: &str| pb::JobSpec {
        project: project.into(),
        ..job_spec(&["sleep", "3600"], 2000, 0)
    };
    // Four two-core boxes: admin holds three in project x, carol one in project y.
    let mut running = Vec::new();
    for _ in 0..3 {
        running.push(stack.submit_spec(in_project("x")).await.id);
    }
    running.push(submit_as(&stack, &carol, in_project("y")).await.unwrap().id);
    stack.runner = Some(stack.spawn_runner(sim_runner(&stack, cloud(cpu_box(), 4, true))).await);
    for id in &running {
        let job = stack.wait_for_state(id, pb::JobState::Running).await;
        assert_eq!(
            job.market, "on-demand",
            "the leader's rate and settings rule out spot: {job:?}"
        );
    }
    let bobs = submit_as(&stack, &bob, in_project("x")).await.unwrap();
    let carols = submit_as(&stack, &carol, in_project("y")).await.unwrap();

    // Asked several times, so an answer from the standby would show.
    for _ in 0..5 {
        let why = explain(&stack, &bobs.id).await;
        assert_eq!(why.state, pb::JobState::Queued as i32, "{why:?}");
        assert_eq!(why.jobs_ahead, 1, "carol's job comes first: {why:?}");
        assert!(
            why.summary
                .starts_with("it waits: no pool that can hold it has room now")
                && why
                    .summary
                    .ends_with("; 1 job is ahead of it: 1 of projects or users with a smaller weighted share"),
            "{why:?}"
        );
        assert!(
            why.details.iter().any(|line| line
                == "on pool local it would run on-demand: a spot restart is 39% likely over its expected \
                    runtime at 0.50 preemptions per instance-hour (max-restart-probability 25%)"),
            "{why:?}"
        );
        let carols_why = explain(&stack, &carols.id).await;
        assert!(
            // Room is held on one runner of pool local, named with its pool.
            carols_why.summary.contains(" (local) is held for it") && carols_why.jobs_ahead == 0,
            "{carols_why:?}"
        );
    }
    standby.stop().await;
}

#[tokio::test]
async fn explain_without_a_scheduler_is_unavailable_and_says_what_to_start() {
    let mut stack = Stack::start_without_runner().await;
    stack.scheduler.take().unwrap().stop().await;
    let job = stack.submit_spec(job_spec(&["sleep", "60"], 1000, 0)).await;
    let refused = stack
        .jobs()
        .await
        .explain_job(pb::GetJobRequest { job_id: job.id.clone() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(
        refused.message(),
        "no scheduler leader answered within 5s; is a kiln-scheduler running?"
    );
    // A job that is not queued is the api's to explain, scheduler or not.
    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap();
    let why = explain(&stack, &job.id).await;
    assert!(why.summary.starts_with("it has ended"), "{why:?}");
}
