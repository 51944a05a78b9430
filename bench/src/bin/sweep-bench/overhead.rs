//! Advisor overhead: suggestion + observation per trial at 1,000 trials × 10 parameters.

use std::time::{Duration, Instant};

use kiln_advisor::algo::{Trial, TrialState};

use crate::functions::{point, space, tpe};

/// The p50 of suggest + observe per trial with kiln's TPE over an in-memory history.
pub(crate) fn in_memory_p50(trials: u64, params: usize) -> Duration {
    let space = space(&vec![(0.0, 1.0); params]);
    let algorithm = tpe(0);
    let mut history: Vec<Trial> = Vec::new();
    let mut times = Vec::with_capacity(trials as usize);
    for index in 0..trials {
        let start = Instant::now();
        let config = algorithm.suggest(&space, &history, index).expect("tpe always suggests");
        let value = point(&config, params).iter().map(|x| (x - 0.3).powi(2)).sum::<f64>();
        history.push(Trial {
            index,
            config,
            state: TrialState::Done,
            value: Some(value),
            curve: vec![(1.0, value)],
        });
        times.push(start.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

/// kiln's durable path: each suggestion and each observation written to the advisor's record
/// in the database before the next, as the advisor service does. `None` until the service's
/// record exists; the lead fills this in (same loop as [`in_memory_p50`], plus the writes) and
/// the table prints it as its own row.
pub(crate) fn durable_p50(_trials: u64, _params: usize) -> Option<Duration> {
    None
}
