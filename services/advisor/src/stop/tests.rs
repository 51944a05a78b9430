use super::*;
use crate::algo::TrialState;

fn asha(brackets: u32) -> EarlyStop {
    EarlyStop::Asha(AshaOptions {
        resource: None,
        min: 1.0,
        max: 27.0,
        eta: 3.0,
        brackets,
    })
}

/// A trial that reported `value` at every resource up to `upto`.
fn trial(index: u64, upto: u32, value: f64, state: TrialState) -> Trial {
    let curve = (1..=upto).map(|at| (f64::from(at), value)).collect();
    Trial {
        index,
        config: Default::default(),
        state,
        value: None,
        curve,
    }
}

#[test]
fn rungs_grow_by_eta_up_to_max() {
    assert_eq!(asha(1).rungs(), [1.0, 3.0, 9.0, 27.0]);
    assert_eq!(asha(2).rungs(), [1.0, 3.0, 9.0, 27.0]);
    let EarlyStop::Asha(options) = asha(3) else {
        unreachable!()
    };
    assert_eq!(options.rungs(2), [9.0, 27.0]);
    assert!(asha(4).check().is_err());
    assert!(EarlyStop::Median(MedianOptions::default()).rungs().is_empty());
}

#[test]
fn asha_keeps_the_top_third_at_each_rung_and_judges_once() {
    let stop = asha(1);
    // The first trial to reach a rung goes on.
    assert_eq!(
        stop.decide(&trial(0, 1, 5.0, TrialState::Running), &[]),
        Decision::Continue
    );
    let others: Vec<Trial> = (1..=5).map(|i| trial(i, 3, i as f64, TrialState::Running)).collect();
    // At rung 1 with 6 recorded, the best 2 go on: 0.5 and 2.0 do (2.0 is second), 3.0 does not.
    assert_eq!(
        stop.decide(&trial(9, 1, 0.5, TrialState::Running), &others),
        Decision::Continue
    );
    assert_eq!(
        stop.decide(&trial(9, 1, 2.0, TrialState::Running), &others),
        Decision::Continue
    );
    assert!(matches!(
        stop.decide(&trial(9, 1, 3.0, TrialState::Running), &others),
        Decision::Stop { rung: 1.0, .. }
    ));
    // At resource 2 (no rung crossed) nothing is judged, however bad.
    assert_eq!(
        stop.decide(&trial(9, 2, 9.0, TrialState::Running), &others),
        Decision::Continue
    );
    // Crossing rung 3 judges it there.
    let Decision::Stop { rung, reason } = stop.decide(&trial(9, 3, 9.0, TrialState::Running), &others) else {
        panic!()
    };
    assert_eq!(rung, 3.0);
    assert!(reason.contains("best 2 of the 6"), "{reason}");
    // Failed trials do not count as competitors.
    let failed: Vec<Trial> = (1..=5).map(|i| trial(i, 3, 0.0, TrialState::Failed)).collect();
    assert_eq!(
        stop.decide(&trial(9, 1, 2.0, TrialState::Running), &failed),
        Decision::Continue
    );
}

#[test]
fn hyperband_brackets_compete_apart() {
    let stop = asha(2);
    // Trial 9 is in bracket 1 (rungs 3, 9, 27); the odd-indexed peers compete with it.
    let even: Vec<Trial> = (0..6).map(|i| trial(i * 2, 3, 0.0, TrialState::Running)).collect();
    assert_eq!(
        stop.decide(&trial(9, 1, 5.0, TrialState::Running), &even),
        Decision::Continue
    );
    assert_eq!(
        stop.decide(&trial(9, 3, 5.0, TrialState::Running), &even),
        Decision::Continue
    );
    let odd: Vec<Trial> = (0..6).map(|i| trial(i * 2 + 1, 3, 0.0, TrialState::Running)).collect();
    assert!(matches!(
        stop.decide(&trial(9, 3, 5.0, TrialState::Running), &odd),
        Decision::Stop { rung: 3.0, .. }
    ));
}

#[test]
fn median_stopping_compares_with_finished_running_averages() {
    let stop = EarlyStop::Median(MedianOptions {
        resource: None,
        grace: 2.0,
        min_trials: 3,
    });
    let done: Vec<Trial> = (0..3).map(|i| trial(i, 10, 1.0 + i as f64, TrialState::Done)).collect();
    assert_eq!(
        stop.decide(&trial(7, 1, 9.0, TrialState::Running), &done),
        Decision::Continue,
        "within grace"
    );
    assert!(matches!(
        stop.decide(&trial(7, 4, 2.5, TrialState::Running), &done),
        Decision::Stop { rung: 4.0, .. }
    ));
    assert_eq!(
        stop.decide(&trial(7, 4, 1.5, TrialState::Running), &done),
        Decision::Continue
    );
    assert_eq!(
        stop.decide(&trial(7, 4, 9.0, TrialState::Running), &done[..2]),
        Decision::Continue,
        "too few finished"
    );
}

#[test]
fn specs_parse_into_early_stops() {
    let parsed: EarlyStop =
        serde_json::from_str(r#"{"name": "asha", "resource": "epoch", "min": 1, "max": 81, "eta": 3}"#).unwrap();
    assert_eq!(
        parsed,
        EarlyStop::Asha(AshaOptions {
            resource: Some("epoch".into()),
            min: 1.0,
            max: 81.0,
            eta: 3.0,
            brackets: 1
        })
    );
    assert_eq!(parsed.rungs(), [1.0, 3.0, 9.0, 27.0, 81.0]);
    assert_eq!(
        serde_json::from_str::<EarlyStop>(r#"{"name": "none"}"#).unwrap(),
        EarlyStop::None
    );
    let median: EarlyStop = serde_json::from_str(r#"{"name": "median", "min-trials": 2}"#).unwrap();
    assert_eq!(
        median,
        EarlyStop::Median(MedianOptions {
            min_trials: 2,
            ..MedianOptions::default()
        })
    );
    assert!(serde_json::from_str::<EarlyStop>(r#"{"name": "asha", "min": 1, "max": 9, "etta": 3}"#).is_err());
    let bad = EarlyStop::Asha(AshaOptions {
        resource: None,
        min: 4.0,
        max: 2.0,
        eta: 1.0,
        brackets: 1,
    })
    .check()
    .unwrap_err();
    let fields: Vec<&str> = bad.iter().map(|error| error.field.as_str()).collect();
    assert_eq!(fields, ["early-stop.max", "early-stop.eta"]);
}
