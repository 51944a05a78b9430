//! Advisor overhead: suggestion + observation per trial at 1,000 trials × 10 parameters, in
//! memory and through the advisor's durable record, and a check of 64 trials at once.

use std::time::{Duration, Instant};

use anyhow::Result;
use kiln_advisor::algo::{Trial, TrialState};
use kiln_advisor::record::{Event, SweepRecord, SweepStore};
use kiln_advisor::state::SweepView;
use kiln_core::config::{DatabaseConfig, DatabaseUrl};
use kiln_core::runs::RunConfig;
use kiln_core::store::Store;

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

/// What the durable runs measured.
pub(crate) struct Durable {
    /// p50 per trial of a leader's pass, one trial at a time: the last trial's observation and
    /// end and this trial's suggestion, recorded in one transaction.
    pub(crate) p50: Duration,
    /// With `workers` trials running at once: trials run, and how many were duplicates (a trial
    /// index recorded twice, or two trials given the same knobs).
    pub(crate) workers: usize,
    pub(crate) trials: usize,
    pub(crate) duplicates: usize,
}

/// A sweep of `trials` TPE trials over `params` floats in [0, 1], `parallel` at a time, as
/// `kiln sweep create` would record it.
fn sweep_record(trials: u64, params: usize, parallel: usize) -> Result<SweepRecord> {
    let parameters: String = (0..params)
        .map(|i| format!("  x{i}: {{type: float, min: 0.0, max: 1.0}}\n"))
        .collect();
    let yaml = format!(
        "name: overhead\nobjective: {{metric: loss, goal: minimize}}\nalgorithm: {{name: tpe, seed: 0}}\n\
         budget: {{max-trials: {trials}, max-parallel: {parallel}}}\nparameters:\n{parameters}\
         trial: {{command: [train]}}\n"
    );
    let checked = kiln_advisor::spec::parse(&yaml).map_err(|problems| anyhow::anyhow!("{problems:?}"))?;
    Ok(SweepRecord {
        id: kiln_core::ids::new_id(),
        owner_id: "bench".into(),
        project: "default".into(),
        name: checked.spec.name.clone(),
        spec_yaml: yaml,
        spec_json: serde_json::to_string(&checked.spec)?,
        code_digest: String::new(),
        state: kiln_advisor::record::RUNNING.into(),
        reason: String::new(),
        submit_key: String::new(),
        registered: String::new(),
        created_at_ms: kiln_core::ids::now_ms(),
        finished_at_ms: None,
        paused_reason: String::new(),
    })
}

/// The loss of a config: a bowl around 0.3 in every parameter.
fn loss(config: &RunConfig, params: usize) -> f64 {
    (0..params)
        .map(|i| config[&format!("x{i}")].as_f64().expect("a float knob"))
        .map(|x| (x - 0.3).powi(2))
        .sum()
}

/// The suggestion of trial `index`, with its job.
fn suggested(index: u64, config: RunConfig) -> (i32, Event) {
    (
        index as i32,
        Event::Suggest {
            config,
            job_id: format!("job-{index}"),
        },
    )
}

/// The events the leader records for one finished trial: the objective point, the end.
fn finished(index: u64, value: f64) -> Vec<(i32, Event)> {
    let trial = index as i32;
    vec![
        (
            trial,
            Event::Observe {
                step: 1,
                resource: 1.0,
                value,
            },
        ),
        (
            trial,
            Event::End {
                state: "succeeded".into(),
                value: Some(value),
                preemptions: 0,
                gpu_hours: 0.0,
            },
        ),
    ]
}

/// kiln's durable path, through the advisor's own record on SQLite (the embedded default, WAL):
/// each trial is one leader pass, as the leader makes it for a sweep of one trial at a time —
/// the last trial's observation and end (staged when they were read), this trial's suggestion
/// (TPE over the view's history) and its job, recorded in one transaction. (The job's own
/// insert is the submission every job pays, measured by the submit benchmark.) Then the same
/// sweep with `workers` trials running at once, finishing in random order, and the record
/// checked for duplicates.
pub(crate) fn durable(trials: u64, params: usize, workers: usize) -> Result<Durable> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let dir = tempfile::tempdir()?;
        let database = DatabaseConfig {
            url: DatabaseUrl::new(format!("sqlite://{}/kiln.db?mode=rwc", dir.path().display())),
            max_connections: 4,
        };
        let store = Store::connect(&database).await?;
        store.migrate().await?;
        let sweeps = SweepStore::new(&store);

        let record = sweep_record(trials, params, 1)?;
        sweeps.insert_sweep(record.clone()).await?;
        let mut view = SweepView::new(record)?;
        let mut times = Vec::with_capacity(trials as usize);
        let mut ended = None;
        for index in 0..trials {
            let start = Instant::now();
            if let Some(events) = ended.take() {
                view.stage(events);
            }
            let config = suggest(&view, index);
            let value = loss(&config, params);
            view.stage(vec![suggested(index, config)]);
            view.flush(&sweeps).await?;
            times.push(start.elapsed());
            ended = Some(finished(index, value));
        }
        times.sort();
        let p50 = times[times.len() / 2];

        let (ran, duplicates) = concurrent(&sweeps, trials, params, workers).await?;
        Ok(Durable {
            p50,
            workers,
            trials: ran,
            duplicates,
        })
    })
}

fn suggest(view: &SweepView, index: u64) -> RunConfig {
    view.spec()
        .algorithm
        .suggest(&view.checked.space, view.history(), index)
        .expect("tpe always suggests")
}

/// `workers` tasks run trials (a random 0 to 2 ms each) while the leader keeps `workers` of them
/// running, recording as it goes; then the record, read back, is checked: every trial index
/// once, every config once.
async fn concurrent(sweeps: &SweepStore, trials: u64, params: usize, workers: usize) -> Result<(usize, usize)> {
    use rand::{Rng, SeedableRng};
    let record = sweep_record(trials, params, workers)?;
    sweeps.insert_sweep(record.clone()).await?;
    let mut view = SweepView::new(record.clone())?;
    let (work_tx, work_rx) = tokio::sync::mpsc::channel::<(u64, RunConfig)>(workers);
    let work_rx = std::sync::Arc::new(tokio::sync::Mutex::new(work_rx));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<(u64, f64)>(workers);
    let mut pool = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let (work, done) = (work_rx.clone(), done_tx.clone());
        pool.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(worker as u64);
            loop {
                let Some((index, config)) = work.lock().await.recv().await else {
                    break;
                };
                tokio::time::sleep(Duration::from_micros(rng.random_range(0..2000))).await;
                if done.send((index, loss(&config, params))).await.is_err() {
                    break;
                }
            }
        });
    }
    drop(done_tx);
    let (mut suggested, mut ended, mut live) = (0u64, 0u64, 0usize);
    while ended < trials {
        while live < workers && suggested < trials {
            let config = suggest(&view, suggested);
            view.append(sweeps, vec![self::suggested(suggested, config.clone())])
                .await?;
            work_tx.send((suggested, config)).await?;
            suggested += 1;
            live += 1;
        }
        let (index, value) = done_rx.recv().await.expect("workers run until the work ends");
        view.append(sweeps, finished(index, value)).await?;
        ended += 1;
        live -= 1;
    }
    drop(work_tx);
    while pool.join_next().await.is_some() {}

    // What a new leader would read back.
    let events = sweeps.events(&record.id).await?;
    let mut indexes = std::collections::HashSet::new();
    let mut configs = std::collections::HashSet::new();
    let mut duplicates = 0;
    for recorded in &events {
        if let Event::Suggest { config, .. } = &recorded.event {
            let fresh_index = indexes.insert(recorded.trial);
            let fresh_config = configs.insert(serde_json::to_string(config)?);
            duplicates += usize::from(!fresh_index || !fresh_config);
        }
    }
    Ok((indexes.len(), duplicates))
}
