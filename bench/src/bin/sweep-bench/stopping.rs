//! Early stopping: ASHA replayed on recorded learning curves, against full random search.
//!
//! A trial's curve is its validation score (%, higher is better) after each epoch. `workers`
//! trials run at once, one epoch per time step; after each epoch the trial's prefix is judged by
//! [`EarlyStop::decide`] against the prefixes the others have run so far (the advisor never
//! sees an epoch before it is run). Full random search runs every trial to the last epoch.

use kiln_advisor::algo::{Trial, TrialState};
use kiln_advisor::stop::{Decision, EarlyStop};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// What one replay used and found.
pub(crate) struct Outcome {
    pub(crate) epochs: u64,
    pub(crate) full_epochs: u64,
    /// Best final score (%) among trials run to the end.
    pub(crate) best: f64,
    /// Best final score of full random search over the same trials.
    pub(crate) full_best: f64,
}

/// Replays `stop` on `curves` (scores, higher is better) with `workers` trials at a time.
pub(crate) fn replay(curves: &[Vec<f64>], stop: &EarlyStop, workers: usize) -> Outcome {
    let epochs = curves[0].len();
    let mut trials: Vec<Trial> = Vec::new();
    let mut running: Vec<usize> = Vec::new();
    let mut next = 0;
    loop {
        while running.len() < workers && next < curves.len() {
            trials.push(Trial {
                index: next as u64,
                config: Default::default(),
                state: TrialState::Running,
                value: None,
                curve: Vec::new(),
            });
            running.push(next);
            next += 1;
        }
        if running.is_empty() {
            break;
        }
        let mut still = Vec::with_capacity(running.len());
        for at in running {
            let epoch = trials[at].curve.len();
            trials[at].curve.push(((epoch + 1) as f64, -curves[at][epoch]));
            if epoch + 1 == epochs {
                trials[at].state = TrialState::Done;
                trials[at].value = Some(-curves[at][epoch]);
                continue;
            }
            match stop.decide(&trials[at], &trials) {
                Decision::Continue => still.push(at),
                Decision::Stop { .. } => trials[at].state = TrialState::Stopped,
            }
        }
        running = still;
    }
    let final_of = |curve: &Vec<f64>| curve[epochs - 1];
    Outcome {
        epochs: trials.iter().map(|trial| trial.curve.len() as u64).sum(),
        full_epochs: (curves.len() * epochs) as u64,
        best: trials
            .iter()
            .filter(|trial| trial.state == TrialState::Done)
            .map(|trial| final_of(&curves[trial.index as usize]))
            .fold(f64::NEG_INFINITY, f64::max),
        full_best: curves.iter().map(final_of).fold(f64::NEG_INFINITY, f64::max),
    }
}

/// `trials` synthetic curves of `epochs` epochs whose ranks cross: each config has a final
/// score and a learning speed drawn independently, so a slow learner with a high final score is
/// behind a fast one with a lower score for its first epochs; plus evaluation noise.
pub(crate) fn synthetic(seed: u64, trials: usize, epochs: usize) -> Vec<Vec<f64>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..trials)
        .map(|_| {
            let start = 10.0;
            let last = 60.0 + 35.0 * rng.random::<f64>();
            let tau = 0.5 * (rng.random::<f64>() * 10f64.ln()).exp(); // 0.5 to 5 epochs
            (1..=epochs)
                .map(|epoch| {
                    last - (last - start) * (-(epoch as f64) / tau).exp() + 0.2 * rng.sample::<f64, _>(StandardNormal)
                })
                .collect()
        })
        .collect()
}

/// `trials` of the recorded digits curves, a different draw for each seed.
pub(crate) fn draw(pool: &[Vec<f64>], seed: u64, trials: usize) -> Vec<Vec<f64>> {
    use rand::seq::SliceRandom;
    let mut order: Vec<usize> = (0..pool.len()).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    order.into_iter().take(trials).map(|at| pool[at].clone()).collect()
}
