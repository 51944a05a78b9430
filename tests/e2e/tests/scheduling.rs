//! The scheduler's policy behind real services, on the `sim` provider: quotas, fair share,
//! spot preemptions with resume and the switch to on-demand, and leader fail-over.

use std::time::Duration;

use kiln_e2e::sim::{GIB, cloud, cpu_box, explain, job_spec, sim_runner, submit_as, user};
use kiln_e2e::{PATIENCE, Stack, job_events, spawn_scheduler};
use kiln_proto::v1 as pb;
use kiln_proto::v1::quota_service_client::QuotaServiceClient;
use kiln_runner::provider::sim::{InstanceType, SimConfig};

/// Ten spot CPU boxes, 1000 times faster than the clock, where a simulated hour of work is all
/// but sure to be preempted (20 an hour), with a 30 s notice.
fn stormy_spot() -> SimConfig {
    SimConfig {
        time_scale: 1000.0,
        preemptions_per_hour: 20.0,
        notice_ms: 30_000,
        ..cloud(cpu_box(), 10, true)
    }
}

fn gpu_box() -> InstanceType {
    InstanceType {
        name: "g.xlarge".into(),
        cpu_millis: 4000,
        memory_bytes: 16 * GIB,
        gpus: 1,
        on_demand_per_hour: 0.53,
        spot_per_hour: 0.21,
    }
}

/// A second user, `bob`, and a token of his.
async fn bob(stack: &Stack) -> String {
    user(stack, "bob").await
}

async fn quotas_as(stack: &Stack, token: &str) -> QuotaServiceClient<kiln_e2e::Authed> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", stack.api_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    QuotaServiceClient::with_interceptor(channel, kiln_core::auth::BearerInterceptor::new(token))
}

fn state(job: &pb::Job) -> pb::JobState {
    pb::JobState::try_from(job.state).unwrap()
}

#[tokio::test]
async fn a_user_at_their_gpu_quota_waits_until_it_is_raised() {
    let mut stack = Stack::start_without_runner().await;
    stack.runner = Some(stack.spawn_runner(sim_runner(&stack, cloud(gpu_box(), 3, false))).await);
    let bob = bob(&stack).await;
    let mut quotas = quotas_as(&stack, &stack.token).await;
    let gpus = |n| pb::Quota {
        scope: "user:admin".into(),
        gpus: Some(n),
        ..Default::default()
    };
    quotas.set_quota(gpus(1)).await.unwrap();
    // Only admins set quotas.
    let denied = quotas_as(&stack, &bob).await.set_quota(gpus(5)).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");

    let first = stack.submit_spec(job_spec(&["sleep", "3600"], 1000, 1)).await;
    let second = stack.submit_spec(job_spec(&["sleep", "3600"], 1000, 1)).await;
    let bobs = submit_as(&stack, &bob, job_spec(&["sleep", "3600"], 1000, 1))
        .await
        .unwrap();
    stack.wait_for_state(&first.id, pb::JobState::Running).await;
    // Bob's job runs past admin's second one, which waits on admin's quota.
    stack.wait_for_state(&bobs.id, pb::JobState::Running).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(state(&stack.get(&second.id).await), pb::JobState::Queued);
    let why = explain(&stack, &second.id).await;
    assert!(why.summary.contains("GPU quota of user:admin"), "{why:?}");

    quotas.set_quota(gpus(2)).await.unwrap();
    stack.wait_for_state(&second.id, pb::JobState::Running).await;

    // The queued-jobs quota refuses a submit, naming itself; the cloud is full, so bob's next job waits.
    quotas
        .set_quota(pb::Quota {
            scope: "user:bob".into(),
            queued_jobs: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    let waiting = submit_as(&stack, &bob, job_spec(&["sleep", "3600"], 1000, 1))
        .await
        .unwrap();
    assert_eq!(state(&waiting), pb::JobState::Queued);
    let refused = submit_as(&stack, &bob, job_spec(&["sleep", "3600"], 1000, 1))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("queued-jobs quota of user:bob is 1"),
        "{refused:?}"
    );
    let why = explain(&stack, &waiting.id).await;
    assert!(why.summary.contains("no pool that can hold it has room now"), "{why:?}");
}

/// Admin and bob each submit 20 two-core jobs before any capacity appears (admin's first),
/// then a cloud of `instances` four-core boxes comes up; returns how many of admin's and of
/// bob's run once it is full, and bob's last job.
async fn flood(stack: &mut Stack, bob: &str, instances: usize) -> (usize, usize, String) {
    let mut admins = Vec::new();
    let mut bobs = Vec::new();
    for _ in 0..20 {
        admins.push(stack.submit_spec(job_spec(&["sleep", "3600"], 2000, 0)).await.id);
    }
    for _ in 0..20 {
        bobs.push(
            submit_as(stack, bob, job_spec(&["sleep", "3600"], 2000, 0))
                .await
                .unwrap()
                .id,
        );
    }
    stack.runner = Some(
        stack
            .spawn_runner(sim_runner(stack, cloud(cpu_box(), instances, false)))
            .await,
    );
    let running = |jobs: &[pb::Job], ids: &[String]| {
        jobs.iter()
            .filter(|job| ids.contains(&job.id) && state(job) == pb::JobState::Running)
            .count()
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let jobs = stack
            .jobs()
            .await
            .list_jobs(pb::ListJobsRequest {
                all: false,
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .jobs;
        let (a, b) = (running(&jobs, &admins), running(&jobs, &bobs));
        if a + b == instances {
            return (a, b, bobs.pop().unwrap());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cloud did not fill: {a} + {b}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn two_users_flooding_the_queue_get_equal_dominant_shares() {
    let mut stack = Stack::start_without_runner().await;
    let bob = bob(&stack).await;
    let (a, b, last) = flood(&mut stack, &bob, 10).await;
    // Equal weights, equal jobs: equal dominant shares (within 5%).
    let (a, b) = (a as f64, b as f64);
    assert!((a - b).abs() <= 0.05 * a.max(b), "admin runs {a} jobs, bob {b}");
    let why = explain(&stack, &last).await;
    assert!(why.jobs_ahead > 0, "{why:?}");
}

#[tokio::test]
async fn a_user_of_weight_three_gets_three_times_the_share() {
    let mut stack = Stack::start_without_runner().await;
    let bob = bob(&stack).await;
    let mut quotas = quotas_as(&stack, &stack.token).await;
    let weight = |scope: &str, weight: f64| pb::Quota {
        scope: scope.into(),
        weight: Some(weight),
        ..Default::default()
    };
    for (bad, why) in [
        (weight("global", 2.0), "the global scope has no fair-share weight"),
        (weight("user:bob", 0.0), "weight 0 is out of range"),
        (weight("user:bob", f64::NAN), "is out of range"),
    ] {
        let refused = quotas.set_quota(bad).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(why), "{refused:?}");
    }
    let saved = quotas.set_quota(weight("user:bob", 3.0)).await.unwrap().into_inner();
    assert_eq!(saved.weight, Some(3.0));
    let (a, b, _) = flood(&mut stack, &bob, 8).await;
    assert_eq!((a, b), (2, 6), "weights 1 and 3 share 8 boxes 2 to 6");
}

#[tokio::test]
async fn spot_preemptions_resume_the_job_and_then_it_runs_on_demand() {
    let mut stack = Stack::start_without_runner().await;
    // K = 2, and no switch on the observed rate alone.
    let mut config = stack.scheduler_config("scheduler-k2");
    config.max_spot_preemptions = 2;
    config.max_restart_probability = 1.0;
    stack.scheduler.take().unwrap().stop().await;
    stack.scheduler = Some(spawn_scheduler(config).await);
    stack.runner = Some(stack.spawn_runner(sim_runner(&stack, stormy_spot())).await);
    let job = stack.submit_spec(job_spec(&["sleep", "3600"], 1000, 0)).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!((done.attempt, done.preemptions), (3, 2), "{done:?}");
    assert_eq!(done.market, "on-demand", "{done:?}");
    assert_eq!(done.resume_from, format!("outputs/{}", job.id), "{done:?}");
    assert!(done.cost > 0.0 && done.cost < done.on_demand_cost, "{done:?}");
    let lines: Vec<String> = stack
        .log_lines(&job.id, false)
        .await
        .into_iter()
        .map(|l| l.text)
        .collect();
    let boots: Vec<&String> = lines.iter().filter(|l| l.starts_with("sim: ")).collect();
    assert_eq!(boots.len(), 3, "{lines:?}");
    assert!(
        boots[0].contains("(spot)") && !boots[0].contains("KILN_RESUME_FROM"),
        "{boots:?}"
    );
    assert!(
        boots[1].contains("(spot)") && boots[1].contains("KILN_RESUME_FROM=/kiln/outputs"),
        "{boots:?}"
    );
    assert!(
        boots[2].contains("(on-demand)") && boots[2].contains("KILN_RESUME_FROM=/kiln/outputs"),
        "{boots:?}"
    );
}

#[tokio::test]
async fn a_standby_takes_over_and_no_job_is_launched_twice() {
    let mut stack = Stack::start_without_runner().await;
    let standby = spawn_scheduler(stack.scheduler_config("scheduler-2")).await;
    let sim = SimConfig {
        time_scale: 1000.0,
        ..cloud(cpu_box(), 40, false)
    };
    stack.runner = Some(stack.spawn_runner(sim_runner(&stack, sim)).await);
    let mut ids = Vec::new();
    for n in 0..150 {
        if n == 50 {
            // The leader dies mid-storm, without giving its lease up.
            stack.scheduler.take().unwrap().crash().await;
        }
        ids.push(stack.submit_spec(job_spec(&["sleep", "30"], 2000, 0)).await.id);
    }
    for id in &ids {
        let done = stack.wait_for_state(id, pb::JobState::Succeeded).await;
        assert_eq!(done.attempt, 1, "{done:?}");
        let scheduled = job_events(&stack, &done)
            .await
            .iter()
            .filter(|event| event.state == pb::JobState::Scheduled as i32)
            .count();
        assert_eq!(scheduled, 1, "job {id} was scheduled {scheduled} times");
    }
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    let holder = kiln_core::lease::Lease::current(&nats, kiln_core::subjects::LEASE_SCHEDULER)
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(holder.holder, "scheduler-2");
    standby.stop().await;
}

#[tokio::test]
async fn a_new_leader_knows_the_preemption_rate_the_last_one_learnt() {
    let mut stack = Stack::start_without_runner().await;
    stack.runner = Some(stack.spawn_runner(sim_runner(&stack, stormy_spot())).await);
    // The first job goes to spot (nothing observed yet) and teaches the leader the pool's rate.
    let first = stack.submit_spec(job_spec(&["sleep", "3600"], 1000, 0)).await;
    let first = stack.wait_for_state(&first.id, pb::JobState::Succeeded).await;
    assert!(first.preemptions >= 1, "{first:?}");
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    let saved = kiln_scheduler::SavedRates::open(&nats).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let rates = saved.load().await.unwrap();
        if rates
            .values()
            .any(|rate| rate.rate_per_hour(kiln_core::ids::now_ms()) > 0.5)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader never saved the rate: {rates:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A scheduler started after the preemption saw none of it; it leads once the old leader dies.
    stack.scheduler.take().unwrap().crash().await;
    let successor = spawn_scheduler(stack.scheduler_config("scheduler-2")).await;
    let second = stack.submit_spec(job_spec(&["sleep", "3600"], 1000, 0)).await;
    let second = stack.wait_for_state(&second.id, pb::JobState::Succeeded).await;
    assert_eq!(
        (second.attempt, second.market.as_str()),
        (1, "on-demand"),
        "the new leader should find spot too likely to restart an hour's job: {second:?}"
    );
    successor.stop().await;
}

#[tokio::test]
async fn a_victim_no_runner_took_yet_is_queued_again_for_a_higher_priority() {
    let stack = Stack::start_without_runner().await;
    // A pool a runner reported but that nobody serves: its launches stay unread, so a job
    // placed there stays SCHEDULED, where no runner would see a control message.
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    let report = kiln_core::capacity::CapacityReport {
        runner_id: "gone-1".into(),
        pool: "gone".into(),
        provider: "sim".into(),
        cpu_millis: 2000,
        memory_bytes: 4 * GIB,
        gpus: 0,
        updated_at_ms: kiln_core::ids::now_ms(),
        instance: kiln_core::capacity::Instance::default(),
        on_demand_per_hour: 0.1,
        spot_per_hour: 0.0,
        spot: false,
        ..Default::default()
    };
    kiln_core::capacity::report(&nats, &report).await.unwrap();
    // A report counts only while its runner's lease is live: one that outlasts the test.
    let lease = kiln_core::runners::RunnerLease {
        pool: "gone".into(),
        lost: kiln_core::runners::LostPolicy::UNKNOWN,
    };
    let mut lease = kiln_core::runners::lease(&nats, "gone-1", std::time::Duration::from_secs(600), &lease)
        .await
        .unwrap();
    assert!(lease.tick().await.unwrap());
    let low = stack.submit_spec(job_spec(&["sleep", "600"], 2000, 0)).await;
    stack.wait_for_state(&low.id, pb::JobState::Scheduled).await;

    let high = stack
        .submit_spec(pb::JobSpec {
            priority_class: "high".into(),
            ..job_spec(&["sleep", "600"], 2000, 0)
        })
        .await;
    let high = stack.wait_for_state(&high.id, pb::JobState::Scheduled).await;
    let low = stack.get(&low.id).await;
    assert_eq!(state(&low), pb::JobState::Queued, "{low:?}");
    assert_eq!(
        low.reason,
        format!("preempted for {} before it started; queued again", high.id)
    );
    // Nothing ran, so nothing counts: the same attempt, no preemption.
    assert_eq!((low.attempt, low.preemptions), (1, 0), "{low:?}");
}

/// A process runner of pool `local` with `cpu_millis` and its own work directory (a runner
/// starting cleans up what it finds in its directory).
fn own_runner(stack: &Stack, runner_id: &str, cpu_millis: i64) -> kiln_runner::Config {
    kiln_runner::Config {
        work_dir: stack.dir.path().join(format!("work-{runner_id}")),
        cpu_millis,
        ..stack.runner_config(runner_id)
    }
}

/// Placement on runners, not on a pool's sum: two process runners of 2 CPUs each (4 in all)
/// take two 2-CPU jobs, one each; a 3-CPU job fits their sum but neither of them, so it is never
/// SCHEDULED and its explanation says why; a 4-CPU runner that joins the pool takes it.
#[tokio::test]
async fn two_runners_of_two_cpus_take_two_two_cpu_jobs_and_not_a_three_cpu_one() {
    let mut stack = Stack::start_without_runner().await;
    stack.runner = Some(stack.spawn_runner(own_runner(&stack, "r-1", 2000)).await);
    let second = stack.spawn_runner(own_runner(&stack, "r-2", 2000)).await;
    let big = stack.submit_spec(job_spec(&["sleep", "3600"], 3000, 0)).await;
    let first = stack.submit_spec(job_spec(&["sleep", "3600"], 2000, 0)).await;
    let other = stack.submit_spec(job_spec(&["sleep", "3600"], 2000, 0)).await;
    let first = stack.wait_for_state(&first.id, pb::JobState::Running).await;
    let other = stack.wait_for_state(&other.id, pb::JobState::Running).await;
    let mut runners = [first.runner_id.clone(), other.runner_id.clone()];
    runners.sort();
    assert_eq!(runners, ["r-1", "r-2"], "one 2-CPU job on each runner");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let waiting = stack.get(&big.id).await;
    assert_eq!(state(&waiting), pb::JobState::Queued);
    // Never SCHEDULED (and queued again): its record has not changed since the submit.
    assert_eq!(waiting.version, big.version, "{waiting:?}");
    let why = explain(&stack, &big.id).await;
    assert!(why.summary.contains("no runner of any pool can hold it"), "{why:?}");
    assert!(why.summary.contains("a job runs on one runner"), "{why:?}");

    // A runner large enough joins the pool: the job starts there.
    let third = stack.spawn_runner(own_runner(&stack, "r-3", 4000)).await;
    let started = stack.wait_for_state(&big.id, pb::JobState::Running).await;
    assert_eq!(started.runner_id, "r-3");
    for job in [&first, &other, &started] {
        stack.stop_job(&job.id).await;
    }
    third.stop().await;
    second.stop().await;
}
