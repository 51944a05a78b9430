use super::*;

/// The spec of the issue, with a process trial.
const GOOD: &str = r#"
name: resnet-lr
objective: {metric: val/loss, goal: minimize}
algorithm: {name: tpe, seed: 0, startup-trials: 10}
early-stop: {name: asha, resource: epoch, min: 1, max: 81, eta: 3}
budget: {max-trials: 200, max-parallel: 8, max-failed: 10, max-gpu-hours: 50}
parameters:
  lr:        {type: float, min: 1.0e-5, max: 1.0e-1, log: true}
  batch:     {type: int, values: [32, 64, 128]}
  optimizer: {type: categorical, values: [sgd, adam]}
  momentum:  {type: float, min: 0.8, max: 0.99, when: {optimizer: sgd}}
trial: {image: IMG, command: "python train.py --lr ${lr} --batch=${batch}", cpu: 2, gpus: 1, market: auto}
register: {model: resnet-cifar, alias: candidate}
"#;

fn problems(yaml: &str) -> Vec<FieldError> {
    parse(yaml).expect_err("the spec is refused")
}

fn fields(yaml: &str) -> Vec<String> {
    problems(yaml).into_iter().map(|problem| problem.field).collect()
}

#[test]
fn the_issue_spec_checks() {
    let checked = parse(GOOD).expect("the spec checks");
    assert_eq!(checked.spec.name, "resnet-lr");
    assert_eq!(
        checked
            .spec
            .parameters
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        ["lr", "batch", "optimizer", "momentum"],
        "parameters keep their order"
    );
    assert_eq!(
        checked.argv,
        ["python", "train.py", "--lr", "${lr}", "--batch=${batch}"]
    );
    assert_eq!(checked.cpu_millis, 2000);
    assert_eq!(checked.memory_bytes, 1 << 30);
    assert_eq!(checked.spec.objective.oriented(2.0), 2.0);
    // Stored as JSON and read back, it checks again (the leader re-checks what it loads).
    let json = serde_json::to_string(&checked.spec).unwrap();
    let again: SweepSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(again, checked.spec);
    again.check().expect("the stored spec checks");
}

#[test]
fn knobs_go_into_the_argv() {
    let checked = parse(GOOD).unwrap();
    let mut config = RunConfig::new();
    config.insert("lr".into(), kiln_core::runs::ConfigValue::Float(0.01));
    config.insert("batch".into(), kiln_core::runs::ConfigValue::Int(64));
    assert_eq!(
        trial_argv(&checked.argv, &config),
        ["python", "train.py", "--lr", "0.01", "--batch=64"]
    );
}

#[test]
fn an_unknown_algorithm_is_refused_naming_the_field() {
    let found = problems(&GOOD.replace("name: tpe, seed: 0, startup-trials: 10", "name: bayes"));
    assert!(
        found.iter().any(|problem| problem.field.starts_with("algorithm")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|problem| problem.message.contains("bayes")),
        "{found:?}"
    );
}

#[test]
fn an_empty_range_is_refused_naming_the_parameter() {
    let found = fields(&GOOD.replace("min: 0.8, max: 0.99", "min: 0.99, max: 0.8"));
    assert!(
        found.iter().any(|field| field.starts_with("parameters.momentum")),
        "{found:?}"
    );
}

#[test]
fn log_with_a_non_positive_bound_is_refused() {
    let found = fields(&GOOD.replace(
        "min: 1.0e-5, max: 1.0e-1, log: true",
        "min: 0.0, max: 1.0e-1, log: true",
    ));
    assert!(
        found.iter().any(|field| field.starts_with("parameters.lr")),
        "{found:?}"
    );
}

#[test]
fn a_when_on_an_unknown_parameter_is_refused() {
    let found = fields(&GOOD.replace("when: {optimizer: sgd}", "when: {solver: sgd}"));
    assert!(
        found.iter().any(|field| field.starts_with("parameters.momentum")),
        "{found:?}"
    );
}

#[test]
fn a_knob_the_parameters_lack_is_refused() {
    let found = problems(&GOOD.replace("--lr ${lr}", "--lr ${learning_rate}"));
    assert!(
        found
            .iter()
            .any(|problem| problem.field == "trial.command" && problem.message.contains("learning_rate")),
        "{found:?}"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let yaml = GOOD
        .replace("max-trials: 200", "max-trials: 0")
        .replace("--lr ${lr}", "--lr ${nope}")
        .replace("cpu: 2", "cpu: 0");
    let found = fields(&yaml);
    for field in ["budget.max-trials", "trial.command", "trial.cpu"] {
        assert!(
            found.iter().any(|found| found == field),
            "{field} missing from {found:?}"
        );
    }
}

#[test]
fn unknown_keys_and_bad_yaml_are_refused() {
    let found = problems(&GOOD.replace("budget: {", "budget: {max-trails: 3, "));
    assert!(
        found.iter().any(|problem| problem.message.contains("max-trails")),
        "{found:?}"
    );
    assert_eq!(fields("name: [unclosed"), ["spec"]);
    assert_eq!(
        fields(&GOOD.replace("parameters:", "params:")),
        ["parameters", "params"]
    );
}

/// A trial may be a gang with its own disk and shared memory, each checked.
#[test]
fn trials_take_nodes_disk_and_shm() {
    let gang = GOOD.replace(
        "gpus: 1, market: auto}",
        "gpus: 1, mem: 4G, nodes: 2, disk: 20G, shm: 2G}",
    );
    let checked = parse(&gang).expect("the spec checks");
    assert_eq!(checked.spec.trial.nodes, 2);
    assert_eq!((checked.disk_bytes, checked.shm_bytes), (20 << 30, 2 << 30));
    assert_eq!(parse(GOOD).unwrap().spec.trial.nodes, 1, "one node by default");
    for (change, field) in [
        ("gpus: 1, nodes: 0}", "trial.nodes"),
        ("gpus: 1, mem: 1G, shm: 2G}", "trial.shm"),
        ("gpus: 1, disk: 1M}", "trial.disk"),
        ("gpus: 1, disk: lots}", "trial.disk"),
    ] {
        let bad = GOOD.replace("gpus: 1, market: auto}", change);
        assert!(
            fields(&bad).contains(&field.to_string()),
            "{change}: {:?}",
            fields(&bad)
        );
    }
    let no_image = GOOD
        .replace("image: IMG, ", "")
        .replace("gpus: 1, market: auto}", "gpus: 1, disk: 20G}");
    assert!(fields(&no_image).contains(&"trial.disk".to_string()));
}
