//! Sweeps end to end: the advisor suggests trials, runs them as jobs on the sim and process
//! providers, stops the losers early, survives being killed, resumes preempted trials, and
//! refuses bad specs naming the field.

use std::time::Duration;

use kiln_e2e::sim::{cloud, cpu_box, sim_runner};
use kiln_e2e::sweeps::{assert_each_trial_once, assert_registered, drive_sim_trials, jobs_of};
use kiln_e2e::{PATIENCE, Stack};
use kiln_proto::v1 as pb;
use kiln_runner::provider::sim::SimConfig;

/// A spec of `trials` trials, `parallel` at a time, TPE and ASHA over epochs 1..9, with the
/// trial command `command` (YAML flow list), registering the best trial as `NAME-best`.
fn spec(name: &str, trials: u32, parallel: u32, command: &str, market: &str) -> String {
    format!(
        r#"
name: {name}
objective: {{metric: val/loss, goal: minimize}}
algorithm: {{name: tpe, seed: 7, startup-trials: 8}}
early-stop: {{name: asha, resource: epoch, min: 1, max: 9, eta: 3}}
budget: {{max-trials: {trials}, max-parallel: {parallel}}}
parameters:
  lr:    {{type: float, min: 1.0e-4, max: 1.0, log: true}}
  width: {{type: int, values: [16, 32, 64]}}
trial: {{command: {command}, cpu: 0.5, mem: 256M, market: {market}}}
register: {{model: {name}-best, alias: candidate}}
"#
    )
}

async fn sim_stack(sim: SimConfig) -> Stack {
    let mut stack = Stack::start_without_runner().await;
    stack.runner = Some(stack.spawn_runner(sim_runner(&stack, sim)).await);
    stack.start_advisor(stack.advisor_config("advisor-1")).await;
    stack
}

#[tokio::test]
async fn a_sim_sweep_reaches_its_budget_and_asha_stops_the_losers() {
    let stack = sim_stack(cloud(cpu_box(), 8, false)).await;
    let sweep = stack
        .create_sweep(&spec("simsweep", 30, 6, "[sleep, '3']", "on-demand"))
        .await;
    assert_eq!(sweep.state, "running");
    drive_sim_trials(&stack, &sweep.id, 9, Duration::from_millis(40)).await;
    let sweep = stack.wait_for_sweep(&sweep.id, "finished", PATIENCE).await;
    assert_each_trial_once(&sweep, 30);
    assert_eq!(jobs_of(&stack, &sweep).await, 30, "one job per trial in the database");
    let stopped: Vec<&pb::Trial> = sweep.trials.iter().filter(|trial| trial.state == "stopped").collect();
    assert!(!stopped.is_empty(), "ASHA stopped no trial: {:?}", sweep.counts);
    for trial in &stopped {
        assert!(trial.reason.starts_with("stopped early at "), "{trial:?}");
        // Stopped at a rung before the full budget of 9 epochs.
        assert!(trial.resource < 9.0, "{trial:?}");
    }
    let best = sweep.best.clone().expect("a best trial");
    let values: Vec<f64> = sweep
        .trials
        .iter()
        .filter(|trial| trial.state == "succeeded")
        .filter_map(|trial| trial.value)
        .collect();
    assert!(!values.is_empty(), "no trial ran to the end");
    let lowest = values.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        best.value.expect("a value") <= lowest,
        "best {best:?} is not the lowest {lowest}"
    );
    let answered = stack
        .sweeps()
        .await
        .best_trial(pb::GetSweepRequest {
            sweep_id: sweep.id.clone(),
        })
        .await
        .expect("best trial")
        .into_inner();
    assert_eq!(answered.job_id, best.job_id);
    assert_registered(&stack, &sweep, "model.txt").await;
}

#[tokio::test]
async fn an_advisor_killed_five_times_runs_exactly_max_trials() {
    let mut stack = sim_stack(cloud(cpu_box(), 8, false)).await;
    let (mut standby, standby_addr) = stack.spawn_advisor(stack.advisor_config("advisor-2")).await;
    let sweep = stack
        .create_sweep(&spec("killsweep", 24, 6, "[sleep, '2']", "on-demand"))
        .await;
    let driver = {
        // The driver reads the sweep through the standby, which stays up while the other dies.
        let mut reader = Stack::start_without_runner().await;
        reader.advisor_addr = Some(standby_addr);
        reader.token = stack.token.clone();
        reader.logs_addr = stack.logs_addr;
        reader.api_addr = stack.api_addr;
        let sweep_id = sweep.id.clone();
        tokio::spawn(async move {
            drive_sim_trials(&reader, &sweep_id, 9, Duration::from_millis(40)).await;
        })
    };
    for kill in 0..5 {
        tokio::time::sleep(Duration::from_millis(700 + 300 * kill)).await;
        if kill % 2 == 0 {
            stack.advisor.take().expect("advisor-1").crash().await;
            stack.start_advisor(stack.advisor_config("advisor-1")).await;
        } else {
            standby.crash().await;
            let mut config = stack.advisor_config("advisor-2");
            config.grpc.listen = standby_addr;
            standby = stack.spawn_advisor(config).await.0;
        }
    }
    driver.await.expect("the driver");
    let sweep = stack.wait_for_sweep(&sweep.id, "finished", PATIENCE).await;
    assert_each_trial_once(&sweep, 24);
    assert_eq!(
        jobs_of(&stack, &sweep).await,
        24,
        "a killed leader submitted a trial twice"
    );
    assert_registered(&stack, &sweep, "model.txt").await;
    standby.stop().await;
}

/// A leader that submitted a trial's job and died before recording it leaves that job behind
/// (the job is submitted first, then recorded with the knobs it holds). The next leader finds
/// it by its idempotency key when it loads the sweep and adopts it, knobs and all, even when it
/// would suggest nothing more (here the sweep was stopped meanwhile), so the job neither runs
/// outside the sweep nor is submitted again.
#[tokio::test]
async fn a_trial_job_a_dead_leader_did_not_record_is_adopted_by_the_next() {
    use kiln_core::runs::{ConfigValue, RunConfig};
    let mut stack = Stack::start_without_runner().await;
    stack.runner = Some(stack.spawn_runner(sim_runner(&stack, cloud(cpu_box(), 8, false))).await);
    // The dead leader's lease is still held: the advisor answers SweepService but runs no sweep.
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    let mut dead = kiln_core::lease::Lease::new(
        &nats,
        kiln_core::subjects::LEASE_ADVISOR,
        "dead-leader",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(dead.tick().await.unwrap(), "the test holds the advisor lease");
    stack.start_advisor(stack.advisor_config("advisor-1")).await;
    let sweep = stack
        .create_sweep(&spec("adopt", 4, 2, "[sleep, '3']", "on-demand"))
        .await;
    // What it left: trial 0's job, with knobs the seeded algorithm would not suggest.
    let knobs = RunConfig::from([
        ("lr".to_string(), ConfigValue::Float(0.000_123)),
        ("width".to_string(), ConfigValue::Int(64)),
    ]);
    let (token_id, secret) = kiln_core::auth::parse_token(&stack.token).unwrap();
    let owner = stack.store.verify_token(token_id, secret).await.unwrap().unwrap();
    let orphan = stack
        .store
        .insert_job(kiln_core::store::NewJob {
            owner_id: owner.user_id,
            project: "default".into(),
            name: "adopt-0".into(),
            command: vec!["sleep".into(), "3".into()],
            cpu_millis: 500,
            memory_bytes: 256 << 20,
            submit_key: kiln_advisor::trials::submit_key(&sweep.id, 0),
            config: knobs,
            sweep_id: sweep.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    kiln_core::events::publish_job_change(&nats, &stack.store, &orphan)
        .await
        .unwrap();
    assert!(
        stack.sweep(&sweep.id).await.trials.is_empty(),
        "no leader ran the sweep yet"
    );
    let stopping = stack
        .sweeps()
        .await
        .stop_sweep(pb::GetSweepRequest {
            sweep_id: sweep.id.clone(),
        })
        .await
        .expect("stop")
        .into_inner();
    assert_eq!(stopping.state, "stopping");

    dead.release().await.unwrap();
    let sweep = stack.wait_for_sweep(&sweep.id, "stopped", PATIENCE).await;
    assert_each_trial_once(&sweep, 1);
    assert_eq!(jobs_of(&stack, &sweep).await, 1, "a trial was submitted after the stop");
    let first = &sweep.trials[0];
    assert_eq!(
        (first.job_id.as_str(), first.state.as_str()),
        (orphan.id.as_str(), "stopped"),
        "{first:?}"
    );
    let job = stack.get(&orphan.id).await;
    assert_eq!(
        job.state,
        pb::JobState::Stopped as i32,
        "the adopted job was stopped with the sweep: {job:?}"
    );
    let lr = first.config.get("lr").and_then(ConfigValue::from_proto);
    assert_eq!(lr, Some(ConfigValue::Float(0.000_123)), "{first:?}");
}

#[tokio::test]
async fn a_preempted_trial_resumes_and_counts_once() {
    let stack = sim_stack(cloud(cpu_box(), 8, false)).await;
    let yaml = spec("spotsweep", 6, 3, "[sleep, '4']", "auto").replace(
        "early-stop: {name: asha, resource: epoch, min: 1, max: 9, eta: 3}",
        "early-stop: {name: none}",
    );
    let sweep = stack.create_sweep(&yaml).await;
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.expect("nats");
    // Trial 0 is taken back (as a spot instance is) once the advisor has seen 3 of its epochs.
    let preempt = async {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let trial = stack
                .sweep(&sweep.id)
                .await
                .trials
                .into_iter()
                .find(|trial| trial.index == 0);
            if let Some(trial) = trial.filter(|trial| trial.resource >= 3.0) {
                let job = stack.store.job(&trial.job_id).await.expect("trial 0's job");
                kiln_core::events::preempt_job(&nats, &job, "").await.expect("preempt");
                return (trial.job_id, trial.resource);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "trial 0 never reported 3 epochs"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (logged, (job_id, before)) = tokio::join!(
        drive_sim_trials(&stack, &sweep.id, 20, Duration::from_millis(100)),
        preempt
    );
    let sweep = stack.wait_for_sweep(&sweep.id, "finished", PATIENCE).await;
    assert_each_trial_once(&sweep, 6);
    assert_eq!(jobs_of(&stack, &sweep).await, 6, "the preempted trial got a second job");
    let trial = &sweep.trials[0];
    assert_eq!(trial.job_id, job_id);
    assert_eq!(trial.preemptions, 1, "{trial:?}");
    assert_eq!(trial.state, "succeeded", "{trial:?}");
    // Its second attempt went on from the epochs it had, and every epoch logged counts.
    assert!(
        trial.resource > before,
        "{trial:?}: nothing after the preemption at {before}"
    );
    assert_eq!(trial.resource, f64::from(logged[&0]), "{trial:?}");
    let job = stack.get(&job_id).await;
    assert_eq!(job.attempt, 2, "{job:?}");
    assert_eq!(sweep.counts.unwrap().failed, 0, "{:?}", sweep.counts);
}

#[tokio::test]
async fn bad_specs_are_refused_naming_the_field() {
    let mut stack = Stack::start_without_runner().await;
    stack.start_advisor(stack.advisor_config("advisor-1")).await;
    let good = spec("badsweep", 4, 2, "[train, '--lr', '${lr}']", "auto");
    let cases = [
        (good.replace("name: tpe,", "name: hyperopt,"), "algorithm"),
        (
            good.replace("min: 1.0e-4, max: 1.0,", "min: 1.0, max: 1.0e-4,"),
            "parameters.lr",
        ),
        (
            good.replace("min: 1.0e-4, max: 1.0, log: true", "min: 0.0, max: 1.0, log: true"),
            "parameters.lr",
        ),
        (
            good.replace(
                "width: {type: int, values: [16, 32, 64]}",
                "width: {type: int, values: [16], when: {depth: 3}}",
            ),
            "parameters.width",
        ),
        (good.replace("'${lr}'", "'${learning_rate}'"), "trial.command"),
        (good.replace("max-trials: 4", "max-trials: 0"), "budget.max-trials"),
        (good.replace("model: badsweep-best", "model: -best"), "register.model"),
        (good.replace("alias: candidate", "alias: '7'"), "register.alias"),
    ];
    let mut sweeps = stack.sweeps().await;
    for (yaml, field) in cases {
        let refused = sweeps
            .create_sweep(pb::CreateSweepRequest {
                spec_yaml: yaml.clone(),
                ..Default::default()
            })
            .await
            .expect_err("a bad spec is refused");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().contains(field),
            "{field} not named in {:?}",
            refused.message()
        );
    }
    // A good one passes, and nothing was recorded for the bad ones.
    let created = sweeps
        .create_sweep(pb::CreateSweepRequest {
            spec_yaml: good,
            ..Default::default()
        })
        .await
        .expect("the good spec")
        .into_inner();
    let listed = sweeps
        .list_sweeps(pb::ListSweepsRequest {
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sweeps;
    assert_eq!(
        listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [created.id.as_str()]
    );
    stack.advisor.take().unwrap().stop().await;
}

/// A trial as users write one: the knobs from `kiln.init()`, the objective and the epoch logged
/// together, and `kiln.should_stop()` checked after each epoch (the same curve as the sim driver).
const TRIAL_PY: &str = r#"
import math, os, sys, time
import kiln

kiln.init(config={"epochs": 9})
lr = kiln.config["lr"]
with open(os.path.join(os.environ["KILN_OUTPUTS"], "model.txt"), "w") as model:
    model.write(f"lr={lr}")
assert kiln.config["width"] in (16, 32, 64), kiln.config
for epoch in range(1, kiln.config["epochs"] + 1):
    quality = (math.log10(lr) + 2.0) ** 2
    speed = 1.0 / (1.0 + 50.0 * lr)
    loss = quality + 3.0 * math.exp(-epoch * speed / 3.0) + 0.1 / epoch
    kiln.log({"val/loss": loss, "epoch": epoch}, step=epoch)
    time.sleep(0.2)
    if kiln.should_stop():
        print(f"stopped early after epoch {epoch}", flush=True)
        break
kiln.finish()
"#;

#[tokio::test]
async fn a_process_sweep_of_sdk_trials_reaches_its_budget_and_stops_losers() {
    let python = std::env::var("KILN_TEST_PYTHON")
        .expect("KILN_TEST_PYTHON names a python with the kiln SDK installed (scripts/test.sh sets it)");
    let mut stack = Stack::start().await;
    let mut config = stack.advisor_config("advisor-1");
    // Long enough for a trial to see kiln.should_stop() (asked once a second) and end itself.
    config.stop_grace_ms = 5_000;
    stack.start_advisor(config).await;
    let script = stack.dir.path().join("trial.py");
    std::fs::write(&script, TRIAL_PY).expect("write the trial");
    let command = format!("['{python}', '{}']", script.display());
    let sweep = stack.create_sweep(&spec("procsweep", 30, 4, &command, "auto")).await;
    let sweep = stack.wait_for_sweep(&sweep.id, "finished", PATIENCE * 8).await;
    assert_each_trial_once(&sweep, 30);
    assert_eq!(jobs_of(&stack, &sweep).await, 30);
    let counts = sweep.counts.unwrap();
    assert_eq!(counts.failed, 0, "{:?}: {:?}", counts, sweep.trials);
    assert!(
        counts.stopped > 0,
        "ASHA stopped no trial: {counts:?} {:?}",
        sweep
            .trials
            .iter()
            .map(|t| (t.index, t.value, t.resource))
            .collect::<Vec<_>>()
    );
    let mut ended_themselves = 0;
    for trial in sweep.trials.iter().filter(|trial| trial.state == "stopped") {
        let job = stack.get(&trial.job_id).await;
        if job.state == pb::JobState::Succeeded as i32 {
            ended_themselves += 1;
            let lines = stack.log_lines(&trial.job_id, false).await;
            assert!(
                lines
                    .iter()
                    .any(|line| line.text.starts_with("stopped early after epoch")),
                "{trial:?} ended without seeing should_stop"
            );
        }
    }
    assert!(
        ended_themselves > 0,
        "no stopped trial ended itself through kiln.should_stop()"
    );
    // Each trial's job carries its knobs as its config.
    let first = stack.get(&sweep.trials[0].job_id).await;
    assert_eq!(first.config.get("lr"), sweep.trials[0].config.get("lr"));
    assert_eq!(first.sweep_id, sweep.id);
    // The best trial's outputs (what it wrote to $KILN_OUTPUTS) became the model.
    assert_registered(&stack, &sweep, "model.txt").await;
}

#[tokio::test]
async fn a_gpu_hour_budget_ends_the_sweep_counted_from_the_runners_gpu_time() {
    // One GPU a box; a simulated hour is a wall second, so a trial of `sleep 7200` holds its GPU
    // for 2 hours (as its runner measures it) in 2 s.
    let gpu_box = kiln_runner::provider::sim::InstanceType {
        name: "g.xlarge".into(),
        gpus: 1,
        ..cpu_box()
    };
    let sim = SimConfig {
        time_scale: 3600.0,
        ..cloud(gpu_box, 2, false)
    };
    let stack = sim_stack(sim).await;
    let yaml = spec("gpusweep", 20, 1, "[sleep, '7200']", "on-demand")
        .replace(
            "early-stop: {name: asha, resource: epoch, min: 1, max: 9, eta: 3}",
            "early-stop: {name: none}",
        )
        .replace(
            "budget: {max-trials: 20, max-parallel: 1}",
            "budget: {max-trials: 20, max-parallel: 1, max-gpu-hours: 5.5}",
        )
        .replace("cpu: 0.5, mem: 256M,", "cpu: 0.5, mem: 256M, gpus: 1,");
    let sweep = stack.create_sweep(&yaml).await;
    let sweep = stack.wait_for_sweep(&sweep.id, "finished", PATIENCE * 2).await;
    // 2 GPU-hours a trial (and the moments of its end): two stay under 5.5, the third crosses it
    // while it runs, and no fourth starts.
    assert_eq!(sweep.trials.len(), 3, "{:?} {:?}", sweep.reason, sweep.trials);
    assert!(sweep.reason.contains("GPU-hours"), "{:?}", sweep.reason);
    let mut recorded = 0.0;
    for trial in &sweep.trials {
        let job = stack.store.job(&trial.job_id).await.expect("the trial's job");
        let hours = job.gpu_ms as f64 / 3_600_000.0;
        assert!(
            (1.95..2.75).contains(&hours),
            "{trial:?}: the runner recorded {hours} GPU-hours"
        );
        recorded += hours;
    }
    assert!(
        (sweep.gpu_hours - recorded).abs() < 1e-6,
        "the sweep counts {} GPU-hours, its trials' jobs {recorded}",
        sweep.gpu_hours
    );
}
