use super::*;

fn parse(json: &str) -> Vec<(String, ParamSpec)> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json).unwrap();
    map.into_iter()
        .map(|(name, spec)| (name, serde_json::from_value(spec).unwrap()))
        .collect()
}

pub(crate) fn example() -> Space {
    Space::new(parse(
        r#"{
        "lr": {"type": "float", "min": 1e-5, "max": 0.1, "log": true},
        "batch": {"type": "int", "values": [32, 64, 128]},
        "optimizer": {"type": "categorical", "values": ["sgd", "adam"]},
        "momentum": {"type": "float", "min": 0.8, "max": 0.99, "when": {"optimizer": "sgd"}},
        "nesterov": {"type": "categorical", "values": [true, false], "when": {"optimizer": "sgd"}},
        "dampening": {"type": "float", "min": 0.0, "max": 0.5, "step": 0.1, "when": {"nesterov": false}},
        "layers": {"type": "int", "min": 1, "max": 64, "log": true}
    }"#,
    ))
    .unwrap()
}

fn errors(json: &str) -> Vec<(String, String)> {
    Space::new(parse(json))
        .unwrap_err()
        .into_iter()
        .map(|error| (error.field, error.message))
        .collect()
}

#[test]
fn every_problem_is_reported_naming_its_field() {
    let found = errors(
        r#"{
        "a": {"type": "float", "min": 1, "max": 1},
        "b": {"type": "float", "min": 0, "max": 1, "log": true},
        "c": {"type": "categorical", "values": []},
        "d": {"type": "int", "min": 0.5, "max": 3},
        "e": {"type": "float", "min": 0, "max": 1, "when": {"nope": 1}},
        "f": {"type": "integer", "min": 0, "max": 1},
        "g": {"type": "categorical", "values": ["x"], "when": {"g": "x"}},
        "h": {"type": "float", "min": 0, "max": 1, "when": {"i": "z"}},
        "i": {"type": "categorical", "values": ["x", "y"]},
        "j": {"type": "float", "min": 0, "max": 1, "when": {"a": 1}},
        "k": {"type": "float", "max": 1},
        "l": {"type": "int", "values": [1, "two"]}
    }"#,
    );
    let fields: Vec<&str> = found.iter().map(|(field, _)| field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "parameters.a.min",
            "parameters.b.min",
            "parameters.c.values",
            "parameters.d.min",
            "parameters.f.type",
            "parameters.k.min",
            "parameters.l.values[1]",
            "parameters.e.when.nope",
            "parameters.g.when.g",
            "parameters.h.when.i",
        ],
        "{found:#?}"
    );
    assert!(found[0].1.contains("empty"), "{}", found[0].1);
    assert!(found[1].1.contains("positive"), "{}", found[1].1);
    assert!(found[4].1.contains("integer"), "{}", found[4].1);
    assert!(found[7].1.contains("no parameter `nope`"), "{}", found[7].1);
    assert!(found[9].1.contains("`z` is not one of"), "{}", found[9].1);
    assert_eq!(errors("{}")[0].0, "parameters");
    let step = errors(r#"{"a": {"type": "float", "min": 1, "max": 2, "log": true, "step": 0.5}}"#);
    assert_eq!(step[0].0, "parameters.a.step");
    let float_parent = errors(
        r#"{"a": {"type": "float", "min": 0, "max": 1}, "b": {"type": "int", "min": 0, "max": 1, "when": {"a": 0.5}}}"#,
    );
    assert_eq!(float_parent[0].0, "parameters.b.when.a");
}

#[test]
fn cycles_are_refused() {
    let found = errors(
        r#"{
        "a": {"type": "categorical", "values": ["x"], "when": {"b": "y"}},
        "b": {"type": "categorical", "values": ["y"], "when": {"a": "x"}}
    }"#,
    );
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].1.contains("cycle"), "{found:?}");
}

#[test]
fn unknown_keys_are_refused_by_the_parser() {
    let error = serde_json::from_str::<ParamSpec>(r#"{"type": "float", "min": 0, "max": 1, "mni": 0}"#).unwrap_err();
    assert!(error.to_string().contains("mni"), "{error}");
}

#[test]
fn conditions_follow_their_parents() {
    let space = example();
    let mut config: RunConfig = serde_json::from_str(r#"{"optimizer": "sgd", "nesterov": false}"#).unwrap();
    assert!(space.is_active("momentum", &config));
    assert!(space.is_active("dampening", &config));
    config.insert("optimizer".into(), ConfigValue::Str("adam".into()));
    assert!(!space.is_active("momentum", &config));
    // dampening's parent nesterov is itself inactive under adam.
    assert!(!space.is_active("dampening", &config));
    assert!(space.is_active("lr", &config));
    assert!(!space.is_active("unknown", &config));
    let order: Vec<&str> = space
        .order()
        .iter()
        .map(|&at| space.params()[at].name.as_str())
        .collect();
    let at = |name: &str| order.iter().position(|n| *n == name).unwrap();
    assert!(at("optimizer") < at("nesterov") && at("nesterov") < at("dampening"));
}

#[test]
fn grid_sizes_count_only_active_combinations() {
    let space = Space::new(parse(
        r#"{
        "batch": {"type": "int", "values": [32, 64, 128]},
        "optimizer": {"type": "categorical", "values": ["sgd", "adam"]},
        "momentum": {"type": "float", "min": 0.8, "max": 1.0, "step": 0.1, "when": {"optimizer": "sgd"}},
        "layers": {"type": "int", "min": 2, "max": 8, "step": 2}
    }"#,
    ))
    .unwrap();
    // 3 batches × 4 layer counts × (3 momenta for sgd + 1 for adam)
    assert_eq!(space.grid_size(), Some(3 * 4 * 4));
    assert_eq!(example().grid_size(), None);
}

#[test]
fn domains_map_the_unit_interval_into_their_values() {
    let int = Domain::Int {
        low: 1,
        high: 3,
        log: false,
        step: 1,
    };
    assert_eq!(
        [0.0, 0.34, 0.99, 1.0].map(|u| int.from_unit(u)),
        [1, 2, 3, 3].map(ConfigValue::Int)
    );
    let stepped = Domain::Float {
        low: 0.0,
        high: 0.3,
        log: false,
        step: Some(0.1),
    };
    assert_eq!(stepped.grid_len(), Some(4));
    assert_eq!(stepped.grid_value(3), ConfigValue::Float(0.3));
    let log = Domain::Float {
        low: 1e-4,
        high: 1.0,
        log: true,
        step: None,
    };
    assert!((log.from_unit(0.5).as_f64().unwrap() - 1e-2).abs() < 1e-12);
}
