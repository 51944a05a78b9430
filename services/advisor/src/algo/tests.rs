use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::space::tests::example;

fn algorithms(seed: u64) -> Vec<Algorithm> {
    vec![
        Algorithm::Random { seed },
        Algorithm::Sobol { seed },
        Algorithm::LatinHypercube { seed, trials: 16 },
        Algorithm::Tpe(TpeOptions {
            seed,
            startup_trials: 4,
            ..TpeOptions::default()
        }),
    ]
}

/// A made-up objective over the example space, lower is better.
fn objective(config: &RunConfig) -> f64 {
    let lr = config["lr"].as_f64().unwrap();
    let layers = config["layers"].as_f64().unwrap();
    let sgd = config["optimizer"] == ConfigValue::Str("sgd".into());
    (lr.log10() + 3.0).powi(2) + (layers.ln() - 2.0).powi(2) + if sgd { 0.5 } else { 0.0 }
}

/// Trials suggested one after the other, each finishing before the next.
fn sequential(algorithm: &Algorithm, space: &Space, count: u64) -> Vec<Trial> {
    let mut history = Vec::new();
    for index in 0..count {
        let config = algorithm.suggest(space, &history, index).unwrap();
        let value = objective(&config);
        history.push(Trial {
            index,
            config,
            state: TrialState::Done,
            value: Some(value),
            curve: vec![(1.0, value)],
        });
    }
    history
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn suggestions_stay_in_the_space_without_inactive_parameters(seed in any::<u64>(), count in 1u64..30) {
        let space = example();
        for algorithm in algorithms(seed) {
            for trial in sequential(&algorithm, &space, count) {
                prop_assert!(space.admits(&trial.config), "{algorithm:?} {:?}", trial.config);
            }
        }
    }

    #[test]
    fn suggestions_depend_only_on_seed_index_and_history(seed in any::<u64>(), index in 0u64..40) {
        let space = example();
        for algorithm in algorithms(seed) {
            let mut history = sequential(&algorithm, &space, 20);
            let first = algorithm.suggest(&space, &history, index);
            history.reverse();
            prop_assert_eq!(&first, &algorithm.suggest(&space, &history, index), "{:?}", algorithm);
        }
    }
}

#[test]
fn the_grid_enumerates_each_point_once_then_ends() {
    let specs: Vec<(String, crate::space::ParamSpec)> = serde_json::from_str(
        r#"[["batch", {"type": "int", "values": [32, 64, 128]}],
            ["optimizer", {"type": "categorical", "values": ["sgd", "adam"]}],
            ["momentum", {"type": "float", "min": 0.8, "max": 1.0, "step": 0.1, "when": {"optimizer": "sgd"}}],
            ["layers", {"type": "int", "min": 2, "max": 8, "step": 2}]]"#,
    )
    .unwrap();
    let space = Space::new(specs).unwrap();
    let size = space.grid_size().unwrap();
    let points: Vec<RunConfig> = (0..size)
        .map(|index| Algorithm::Grid.suggest(&space, &[], index).unwrap())
        .collect();
    let distinct: BTreeSet<String> = points.iter().map(|config| format!("{config:?}")).collect();
    assert_eq!(distinct.len() as u64, size);
    assert!(points.iter().all(|config| space.admits(config)));
    assert_eq!(Algorithm::Grid.suggest(&space, &[], size), None);
    assert!(Algorithm::Grid.check(&example()).is_err());
}

#[test]
fn tpe_beats_random_search() {
    let space = example();
    let best = |algorithm: &Algorithm| {
        sequential(algorithm, &space, 60)
            .iter()
            .filter_map(|trial| trial.value)
            .fold(f64::INFINITY, f64::min)
    };
    let (mut tpe, mut random) = (Vec::new(), Vec::new());
    for seed in 0..9 {
        tpe.push(best(&Algorithm::Tpe(TpeOptions {
            seed,
            ..TpeOptions::default()
        })));
        random.push(best(&Algorithm::Random { seed }));
    }
    tpe.sort_by(f64::total_cmp);
    random.sort_by(f64::total_cmp);
    assert!(tpe[4] < random[4], "median best: tpe {} random {}", tpe[4], random[4]);
}

/// The mean pairwise distance of 8 parallel suggestions (in log lr and log layers).
fn parallel_spread(constant_liar: bool, seed: u64) -> f64 {
    let space = example();
    let tpe = Algorithm::Tpe(TpeOptions {
        seed,
        constant_liar,
        ..TpeOptions::default()
    });
    let mut history = sequential(&tpe, &space, 30);
    let mut points = Vec::new();
    for index in 30..38 {
        let config = tpe.suggest(&space, &history, index).unwrap();
        points.push((
            config["lr"].as_f64().unwrap().log10(),
            config["layers"].as_f64().unwrap().ln(),
        ));
        history.push(Trial {
            index,
            config,
            state: TrialState::Running,
            value: None,
            curve: vec![],
        });
    }
    let mut total = 0.0;
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            total += ((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt();
        }
    }
    total / 28.0
}

#[test]
fn the_constant_liar_spreads_parallel_suggestions() {
    let liar: f64 = (0..6).map(|seed| parallel_spread(true, seed)).sum();
    let none: f64 = (0..6).map(|seed| parallel_spread(false, seed)).sum();
    assert!(liar > 1.2 * none, "spread with the liar {liar}, without {none}");
}

#[test]
fn specs_parse_into_algorithms() {
    let tpe: Algorithm = serde_json::from_str(r#"{"name": "tpe", "seed": 4, "startup-trials": 5}"#).unwrap();
    assert_eq!(
        tpe,
        Algorithm::Tpe(TpeOptions {
            seed: 4,
            startup_trials: 5,
            ..TpeOptions::default()
        })
    );
    let grid: Algorithm = serde_json::from_str(r#"{"name": "grid"}"#).unwrap();
    assert_eq!(grid, Algorithm::Grid);
    let random: Algorithm = serde_json::from_str(r#"{"name": "random"}"#).unwrap();
    assert_eq!(random, Algorithm::Random { seed: 0 });
    for bad in [
        r#"{"name": "bayes"}"#,
        r#"{"name": "tpe", "startup": 5}"#,
        r#"{"name": "random", "sed": 1}"#,
    ] {
        assert!(serde_json::from_str::<Algorithm>(bad).is_err(), "{bad}");
    }
    let bad = Algorithm::Tpe(TpeOptions {
        gamma: 0.0,
        ..TpeOptions::default()
    })
    .check(&example())
    .unwrap_err();
    assert_eq!(bad[0].field, "algorithm.gamma");
}
