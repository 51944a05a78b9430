//! Search quality: Branin, Hartmann6 and 10-D Rosenbrock (the same definitions as
//! bench/sweep_optuna.py), optimised by kiln's TPE and random search.

use kiln_advisor::algo::{Algorithm, TpeOptions, Trial, TrialState};
use kiln_advisor::space::{ParamSpec, ParamType, Space};
use kiln_core::runs::RunConfig;

pub(crate) struct Function {
    pub(crate) name: &'static str,
    pub(crate) bounds: Vec<(f64, f64)>,
    pub(crate) minimum: f64,
    pub(crate) eval: fn(&[f64]) -> f64,
}

fn branin(x: &[f64]) -> f64 {
    use std::f64::consts::PI;
    let (b, c, t) = (5.1 / (4.0 * PI * PI), 5.0 / PI, 1.0 / (8.0 * PI));
    (x[1] - b * x[0] * x[0] + c * x[0] - 6.0).powi(2) + 10.0 * (1.0 - t) * x[0].cos() + 10.0
}

const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
const A: [[f64; 6]; 4] = [
    [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
    [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
    [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
    [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
];
const P: [[f64; 6]; 4] = [
    [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
    [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
    [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
    [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
];

fn hartmann6(x: &[f64]) -> f64 {
    -(0..4)
        .map(|i| ALPHA[i] * (-(0..6).map(|j| A[i][j] * (x[j] - P[i][j]).powi(2)).sum::<f64>()).exp())
        .sum::<f64>()
}

fn rosenbrock(x: &[f64]) -> f64 {
    x.windows(2)
        .map(|w| 100.0 * (w[1] - w[0] * w[0]).powi(2) + (1.0 - w[0]).powi(2))
        .sum()
}

pub(crate) fn functions() -> Vec<Function> {
    vec![
        Function {
            name: "branin",
            bounds: vec![(-5.0, 10.0), (0.0, 15.0)],
            minimum: 0.397_887_357_729_738,
            eval: branin,
        },
        Function {
            name: "hartmann6",
            bounds: vec![(0.0, 1.0); 6],
            minimum: -3.322_368_011_415_51,
            eval: hartmann6,
        },
        Function {
            name: "rosenbrock10",
            bounds: vec![(-5.0, 10.0); 10],
            minimum: 0.0,
            eval: rosenbrock,
        },
    ]
}

/// A space of floats `x0..` over `bounds`.
pub(crate) fn space(bounds: &[(f64, f64)]) -> Space {
    let params = bounds
        .iter()
        .enumerate()
        .map(|(i, &(min, max))| {
            let spec = ParamSpec {
                r#type: ParamType::Float,
                min: Some(min),
                max: Some(max),
                log: false,
                values: None,
                step: None,
                when: None,
            };
            (format!("x{i}"), spec)
        })
        .collect();
    Space::new(params).expect("a valid benchmark space")
}

pub(crate) fn point(config: &RunConfig, dims: usize) -> Vec<f64> {
    (0..dims)
        .map(|i| config[&format!("x{i}")].as_f64().expect("a float"))
        .collect()
}

/// The best value `algorithm` finds in `trials` trials, `parallel` suggested before their
/// results return (the earlier ones of a batch are `Running` when the later are suggested).
pub(crate) fn optimize(function: &Function, algorithm: &Algorithm, trials: u64, parallel: u64) -> f64 {
    let space = space(&function.bounds);
    let mut history: Vec<Trial> = Vec::new();
    let mut best = f64::INFINITY;
    let mut index = 0;
    while index < trials {
        let batch = parallel.min(trials - index);
        let start = history.len();
        for _ in 0..batch {
            let config = algorithm
                .suggest(&space, &history, index)
                .expect("an unbounded algorithm");
            history.push(Trial {
                index,
                config,
                state: TrialState::Running,
                value: None,
                curve: Vec::new(),
            });
            index += 1;
        }
        for trial in &mut history[start..] {
            let value = (function.eval)(&point(&trial.config, function.bounds.len()));
            best = best.min(value);
            trial.state = TrialState::Done;
            trial.value = Some(value);
        }
    }
    best
}

pub(crate) fn tpe(seed: u64) -> Algorithm {
    Algorithm::Tpe(TpeOptions {
        seed,
        ..TpeOptions::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minima_are_where_the_literature_puts_them() {
        let f = functions();
        assert!(((f[0].eval)(&[std::f64::consts::PI, 2.275]) - f[0].minimum).abs() < 1e-6);
        let h = [0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573];
        assert!(((f[1].eval)(&h) - f[1].minimum).abs() < 1e-4);
        assert_eq!((f[2].eval)(&[1.0; 10]), 0.0);
    }
}
