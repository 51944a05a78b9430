//! Sweeps (issue 15), side by side with Optuna 5.0.0 in one run, printed as one table.
//!
//! ```text
//! cargo run --release -p kiln-bench --bin sweep-bench -- --python target/bench-venv/bin/python [--quick]
//! ```
//!
//! - Search quality: Branin, Hartmann6, 10-D Rosenbrock, `--trials` trials, `--seeds` seeds,
//!   sequential and 4 parallel suggestions: median regret of kiln's TPE, Optuna's multivariate
//!   TPE (constant liar when parallel) and kiln's random search.
//! - Early stopping: ASHA (min 1, 2 or 3, max 81 epochs, eta 3, 8 workers, one or two Hyperband
//!   brackets; the target is checked on min 1 with two brackets) replayed on synthetic curves
//!   with crossing ranks and on SGD classifiers' curves on scikit-learn's digits (recorded by
//!   the Python side), against full random search over the same trials.
//! - Advisor overhead: suggestion + observation p50 per trial at 1,000 trials × 10 parameters.
//!
//! The Python side is bench/sweep_optuna.py, run with `--python` (a venv with optuna==5.0.0,
//! scikit-learn==1.9.1 and numpy==2.4.6; scripts/bench.sh builds it).

mod functions;
mod overhead;
mod stopping;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use kiln_advisor::algo::Algorithm;
use kiln_advisor::stop::{AshaOptions, EarlyStop};
use serde_json::Value;

#[derive(Parser, Debug)]
#[command(about = "kiln's sweep algorithms against Optuna: search quality, early stopping, overhead")]
struct Args {
    /// The Python with optuna, scikit-learn and numpy.
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// A bounded run: 3 seeds, 60 digits configs, 300 trials for the overhead.
    #[arg(long)]
    quick: bool,
    #[arg(long)]
    seeds: Option<u64>,
    #[arg(long, default_value_t = 100)]
    trials: u64,
    /// ASHA's first rungs (epochs) to replay; rungs at min·3^k up to 81.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    asha_min: Vec<f64>,
    /// Hyperband brackets to replay with each first rung (1: plain ASHA).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    asha_brackets: Vec<u32>,
    /// Run only these parts (default: all).
    #[arg(long, value_delimiter = ',', value_parser = ["quality", "stopping", "overhead"])]
    only: Vec<String>,
}

fn python(args: &Args, mode_and_flags: &[String]) -> Result<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sweep_optuna.py");
    let output = Command::new(&args.python)
        .arg(&script)
        .args(mode_and_flags)
        .output()
        .with_context(|| format!("running {} {}", args.python.display(), script.display()))?;
    ensure!(
        output.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_slice(&output.stdout)?)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

fn quality(args: &Args, seeds: u64) -> Result<bool> {
    let optuna = python(
        args,
        &[
            "quality".into(),
            "--seeds".into(),
            seeds.to_string(),
            "--trials".into(),
            args.trials.to_string(),
        ],
    )?;
    println!(
        "\nSearch quality: median regret over {seeds} seeds, {} trials (lower is better)",
        args.trials
    );
    println!(
        "{:<13} {:>8} {:>12} {:>12} {:>12} {:>16} {:>16}",
        "function", "parallel", "kiln TPE", "Optuna TPE", "kiln random", "kiln ≤ Optuna", "random/TPE ≥ 3"
    );
    let mut met = true;
    for function in functions::functions() {
        for parallel in [1u64, 4] {
            let regrets = |algorithm: &dyn Fn(u64) -> Algorithm| {
                (0..seeds)
                    .map(|seed| {
                        functions::optimize(&function, &algorithm(seed), args.trials, parallel) - function.minimum
                    })
                    .collect()
            };
            let kiln = median(regrets(&functions::tpe));
            let random = median(regrets(&|seed| Algorithm::Random { seed }));
            let peer: Vec<f64> = optuna[function.name][parallel.to_string()]
                .as_array()
                .context("optuna's quality output")?
                .iter()
                .map(|best| best.as_f64().unwrap_or(f64::NAN) - function.minimum)
                .collect();
            let peer = median(peer);
            let no_worse = kiln <= peer;
            let ratio_checked = function.name != "branin";
            let ratios = format!("{:.1} / {:.1}", random / kiln, random / peer);
            let three = !ratio_checked || (random >= 3.0 * kiln && random >= 3.0 * peer);
            met &= no_worse && three;
            println!(
                "{:<13} {:>8} {:>12.4} {:>12.4} {:>12.4} {:>16} {:>16}",
                function.name,
                parallel,
                kiln,
                peer,
                random,
                if no_worse { "yes" } else { "NO" },
                if ratio_checked {
                    format!("{ratios} {}", if three { "yes" } else { "NO" })
                } else {
                    format!("{ratios} n/a")
                }
            );
        }
    }
    Ok(met)
}

/// The learning curves of a family for one seed.
type CurvesOf<'a> = Box<dyn Fn(u64) -> Vec<Vec<f64>> + 'a>;

fn stopping(args: &Args, seeds: u64) -> Result<bool> {
    let (configs, epochs, trials, workers) = (if args.quick { 60 } else { 200 }, 81, 100, 8);
    let recorded = python(
        args,
        &[
            "curves".into(),
            "--configs".into(),
            configs.to_string(),
            "--epochs".into(),
            epochs.to_string(),
        ],
    )?;
    let pool: Vec<Vec<f64>> = recorded
        .as_array()
        .context("the curves output")?
        .iter()
        .map(|curve| {
            curve["scores"]
                .as_array()
                .map(|s| s.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default()
        })
        .collect();
    println!("\nEarly stopping: ASHA (eta 3, {workers} workers) vs full random search, {trials} trials, {seeds} seeds");
    println!(
        "{:<28} {:>22} {:>12} {:>12} {:>9} {:>16} {:>11}",
        "curves", "ASHA rungs", "ASHA epochs", "full epochs", "ratio", "best within 0.5", "median gap"
    );
    let mut met = true;
    let digits = format!("digits averaged SGD ({configs})");
    let families: [(&str, CurvesOf); 2] = [
        (
            "synthetic, crossing ranks",
            Box::new(|seed| stopping::synthetic(seed, trials, epochs)),
        ),
        (&digits, Box::new(|seed| stopping::draw(&pool, seed, trials))),
    ];
    for (name, curves) in families {
        for (min, brackets) in args
            .asha_min
            .iter()
            .flat_map(|&min| args.asha_brackets.iter().map(move |&brackets| (min, brackets)))
        {
            let asha = EarlyStop::Asha(AshaOptions {
                resource: None,
                min,
                max: epochs as f64,
                eta: 3.0,
                brackets,
            });
            let outcomes: Vec<stopping::Outcome> = (0..seeds)
                .map(|seed| stopping::replay(&curves(seed), &asha, workers))
                .collect();
            let (used, full): (u64, u64) = outcomes
                .iter()
                .fold((0, 0), |(u, f), o| (u + o.epochs, f + o.full_epochs));
            let within = outcomes.iter().filter(|o| o.full_best - o.best <= 0.5).count();
            let gap = median(outcomes.iter().map(|o| o.full_best - o.best).collect());
            let ratio = used as f64 / full as f64;
            let ok = ratio <= 1.0 / 8.0 && within as f64 >= 0.8 * seeds as f64;
            // The target is checked on the spec's example (min 1, max 81, eta 3) with Hyperband's
            // two brackets, the setting the README recommends when learning curves cross.
            if min == 1.0 && brackets == 2 {
                met &= ok;
            }
            let rungs: Vec<String> = asha.rungs().iter().map(|rung| rung.to_string()).collect();
            let rungs = match brackets {
                1 => rungs.join(","),
                _ => format!("{} ×{brackets}", rungs.join(",")),
            };
            println!(
                "{:<28} {:>22} {:>12} {:>12} {:>9} {:>16} {:>11}",
                name,
                rungs,
                used / seeds,
                full / seeds,
                format!("1/{:.1}", 1.0 / ratio),
                format!("{within}/{seeds} {}", if ok { "yes" } else { "NO" }),
                format!("{gap:.2} pts")
            );
        }
    }
    Ok(met)
}

fn overhead(args: &Args) -> Result<bool> {
    let (trials, params) = (if args.quick { 300 } else { 1000 }, 10);
    let optuna = python(
        args,
        &[
            "overhead".into(),
            "--trials".into(),
            trials.to_string(),
            "--params".into(),
            params.to_string(),
        ],
    )?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("\nAdvisor overhead: suggestion + observation, p50 per trial, {trials} trials × {params} parameters");
    println!("{:<40} {:>10}", "advisor", "p50 ms");
    println!(
        "{:<40} {:>10.3}",
        "kiln TPE, in memory",
        ms(overhead::in_memory_p50(trials, params))
    );
    let durable = overhead::durable(trials, params, 64)?;
    println!("{:<40} {:>10.3}", "kiln TPE, durable record (SQLite)", ms(durable.p50));
    println!(
        "{:<40} {:>10.3}",
        "Optuna 5.0.0 TPE, in memory",
        optuna["memory_ms"].as_f64().unwrap_or(f64::NAN)
    );
    println!(
        "{:<40} {:>10.3}",
        "Optuna 5.0.0 TPE, SQLite storage",
        optuna["sqlite_ms"].as_f64().unwrap_or(f64::NAN)
    );
    println!(
        "{} trials at once: {} trials recorded, {} duplicates (a trial index or a config twice)",
        durable.workers, durable.trials, durable.duplicates
    );
    Ok(durable.p50 <= Duration::from_millis(2) && durable.duplicates == 0 && durable.trials == trials as usize)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let seeds = args.seeds.unwrap_or(if args.quick { 3 } else { 20 });
    let runs = |part: &str| args.only.is_empty() || args.only.iter().any(|only| only == part);
    let quality_met = if runs("quality") { quality(&args, seeds)? } else { true };
    let stopping_met = if runs("stopping") {
        stopping(&args, seeds)?
    } else {
        true
    };
    let overhead_met = if runs("overhead") { overhead(&args)? } else { true };
    let met = |yes: bool| if yes { "met" } else { "NOT met" };
    println!(
        "\ntargets: search quality {}, early stopping {}, overhead and duplicates {}",
        met(quality_met),
        met(stopping_met),
        met(overhead_met)
    );
    Ok(())
}
