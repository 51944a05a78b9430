//! `kiln sweep` end to end on `kiln up`: a sweep of real SDK trials from the packed working
//! directory, `status`/`best`/`ls` as tables and JSON, the best trial registered as a model,
//! `kiln runs ls --sweep`, and `stop`/`resume` of a sweep whose trials run long.

use std::time::{Duration, Instant};

use crate::common;

use common::{Up, text};

fn ok(up: &Up, args: &[&str]) -> String {
    let output = up.kiln(args);
    assert!(output.status.success(), "kiln {args:?}: {}", text(&output.stderr));
    text(&output.stdout)
}

fn json(up: &Up, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(up, args)).unwrap()
}

/// A trial: the knobs from `kiln.init()`, a loss per epoch, a file in its outputs.
const TRAIN_PY: &str = r#"
import os, time
import kiln

kiln.init()
x = kiln.config["x"]
with open(os.path.join(os.environ["KILN_OUTPUTS"], "model.txt"), "w") as model:
    model.write(f"x={x}")
for epoch in range(1, 4):
    kiln.log({"loss": (x - 0.3) ** 2 + 1.0 / epoch, "epoch": epoch}, step=epoch)
    time.sleep(float(os.environ.get("EPOCH_SECONDS", "0.05")))
    if kiln.should_stop():
        break
kiln.finish()
"#;

fn spec(name: &str, python: &str, trials: u32, epoch_seconds: &str) -> String {
    format!(
        r#"
name: {name}
objective: {{metric: loss, goal: minimize}}
algorithm: {{name: random, seed: 1}}
budget: {{max-trials: {trials}, max-parallel: 2}}
parameters:
  x: {{type: float, min: 0.0, max: 1.0}}
  width: {{type: int, values: [8, 16]}}
trial: {{command: ['{python}', train.py], cpu: 0.5, mem: 256M, env: {{EPOCH_SECONDS: '{epoch_seconds}'}}}}
register: {{model: {name}-best, alias: candidate}}
"#
    )
}

/// Creates a sweep from `yaml` (written to the project directory, which is packed as the code)
/// and returns its id, the last line `kiln sweep create` prints.
fn create(up: &Up, yaml: &str) -> String {
    std::fs::write(up.project.path().join("train.py"), TRAIN_PY).unwrap();
    std::fs::write(up.project.path().join("sweep.yaml"), yaml).unwrap();
    let created = ok(up, &["sweep", "create", "-f", "sweep.yaml"]);
    created
        .lines()
        .last()
        .expect("the id on the last line")
        .trim()
        .to_string()
}

fn wait_for(up: &Up, sweep: &str, state: &str, patience: Duration) -> serde_json::Value {
    let deadline = Instant::now() + patience;
    loop {
        let status = json(up, &["sweep", "status", sweep, "-o", "json"]);
        if status["state"] == state {
            return status;
        }
        assert!(Instant::now() < deadline, "sweep never reached {state}: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn python() -> String {
    std::env::var("KILN_TEST_PYTHON")
        .expect("KILN_TEST_PYTHON names a python with the kiln SDK installed (scripts/test.sh sets it)")
}

#[test]
fn a_sweep_runs_its_trials_and_registers_the_best() {
    let up = Up::start();
    let sweep = create(&up, &spec("clisweep", &python(), 6, "0.05"));
    let status = wait_for(&up, &sweep, "finished", Duration::from_secs(240));
    let trials = status["trials"].as_array().expect("trials");
    assert_eq!(trials.len(), 6, "{status}");
    for trial in trials {
        assert_eq!(trial["state"], "succeeded", "{trial}");
        assert!(trial["job_id"].as_str().is_some_and(|id| !id.is_empty()), "{trial}");
        let x = trial["config"]["x"].as_f64().expect("a float knob");
        assert!((0.0..=1.0).contains(&x), "{trial}");
        assert!([8, 16].contains(&trial["config"]["width"].as_i64().expect("an int knob")));
    }

    let best = json(&up, &["sweep", "best", &sweep, "-o", "json"]);
    let lowest = trials
        .iter()
        .filter_map(|trial| trial["value"].as_f64())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(best["value"].as_f64(), Some(lowest), "{best}");
    let x = best["config"]["x"].as_f64().unwrap();
    assert!((best["value"].as_f64().unwrap() - ((x - 0.3).powi(2) + 1.0 / 3.0)).abs() < 1e-9);
    assert!(ok(&up, &["sweep", "best", &sweep]).contains(best["job_id"].as_str().unwrap()));

    // The best trial's outputs became the model, with the trial's lineage.
    assert_eq!(status["registered"], "clisweep-best:1");
    let shown = json(&up, &["model", "show", "clisweep-best@candidate", "-o", "json"]);
    assert_eq!(shown["lineage"]["job_id"], best["job_id"]);
    assert_eq!(shown["lineage"]["sweep_id"], sweep.as_str());
    let dest = up.project.path().join("best");
    ok(
        &up,
        &[
            "model",
            "get",
            "clisweep-best@candidate",
            "--dest",
            dest.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("model.txt")).unwrap(),
        format!("x={x}")
    );

    let listed = ok(&up, &["sweep", "ls", "--all"]);
    assert!(listed.contains(&sweep) && listed.contains("finished"), "{listed}");
    let runs = json(&up, &["runs", "ls", "--sweep", &sweep, "-o", "json"]);
    assert_eq!(runs.as_array().map(Vec::len), Some(6), "{runs}");
    assert!(ok(&up, &["sweep", "status", &sweep]).contains("clisweep-best:1"));
    // A finished sweep does not stop: the message says what would.
    let refused = up.kiln(&["sweep", "stop", &sweep]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("only a running sweep stops"),
        "{}",
        text(&refused.stderr)
    );
}

#[test]
fn a_stopped_sweep_stops_its_trials_and_resumes_within_its_budget() {
    let up = Up::start();
    // Slow trials: 3 epochs of 4 s, so the sweep is stopped while they run.
    let sweep = create(&up, &spec("slowsweep", &python(), 4, "4"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = json(&up, &["sweep", "status", &sweep, "-o", "json"]);
        let running = status["trials"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|trial| trial["state"] == "running")
            .count();
        if running > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no trial started: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
    ok(&up, &["sweep", "stop", &sweep]);
    let stopped = wait_for(&up, &sweep, "stopped", Duration::from_secs(60));
    let trials = stopped["trials"].as_array().unwrap().clone();
    assert!(!trials.is_empty() && trials.len() < 4, "{stopped}");
    for trial in &trials {
        assert_eq!(trial["state"], "stopped", "{trial}");
    }
    // Stopping again changes nothing; resuming goes on within the budget.
    ok(&up, &["sweep", "stop", &sweep]);
    ok(&up, &["sweep", "resume", &sweep]);
    let status = json(&up, &["sweep", "status", &sweep, "-o", "json"]);
    assert_eq!(status["state"], "running", "{status}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while json(&up, &["sweep", "status", &sweep, "-o", "json"])["trials"]
        .as_array()
        .unwrap()
        .len()
        == trials.len()
    {
        assert!(Instant::now() < deadline, "the resumed sweep started no trial");
        std::thread::sleep(Duration::from_millis(200));
    }
    ok(&up, &["sweep", "stop", &sweep]);
    wait_for(&up, &sweep, "stopped", Duration::from_secs(60));
}
