//! registry-search: how fast the model registry's searches answer at 10,000 versions of one
//! model. It records the versions through the store (as `RegisterModel` does, each in its own
//! transaction, with tags and files), then times each search as `ListModelVersions` runs it
//! (the filtered page, its tags, the model's aliases) and prints p50/p99 per query. The same
//! searches on MLflow's registry (SQLite) are bench/registry_search.py.
//!
//!   cargo run -p kiln-bench --bin registry-search -- [--versions 10000] [--database-url URL]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use kiln_core::authz::Visible;
use kiln_core::config::{DatabaseConfig, DatabaseUrl};
use kiln_core::store::{NewModelVersion, Store, VersionFilter};

#[derive(Parser)]
struct Args {
    /// Versions of the searched model.
    #[arg(long, default_value_t = 10_000)]
    versions: i64,
    /// Other models (one version each), for the model-name search.
    #[arg(long, default_value_t = 1_000)]
    models: i64,
    /// Times each search runs.
    #[arg(long, default_value_t = 200)]
    runs: usize,
    /// The database (default: a SQLite file in a temp dir).
    #[arg(long)]
    database_url: Option<String>,
}

const MODEL: &str = "bench-model";

fn version(i: i64) -> NewModelVersion {
    let stage = match i % 50 {
        0 => "prod",
        1..=9 => "staging",
        _ => "dev",
    };
    NewModelVersion {
        model: MODEL.into(),
        project: "default".into(),
        created_by: "bench".into(),
        job_id: format!("01900000-0000-7000-8000-{i:012}"),
        description: format!("resnet lr={:.5} seed={i}", 0.1 / (1 + i % 97) as f64),
        lineage_json: "{}".into(),
        digest: format!("sha256:{i:064}"),
        files: (0..3)
            .map(|f| (format!("model/part-{f}.bin"), format!("{:064}", i * 3 + f), 1 << 20))
            .collect(),
        tags: BTreeMap::from([
            ("stage".to_string(), stage.to_string()),
            ("team".to_string(), format!("team-{}", i % 10)),
            ("run".to_string(), format!("run-{i}")),
        ]),
        alias: (i == 1).then(|| "production".to_string()),
    }
}

/// What `ListModelVersions` does for one page.
async fn search(store: &Store, filter: &VersionFilter) -> Result<usize> {
    let key = kiln_core::store::ModelKey::new("default", MODEL);
    let records = store.list_model_versions(&key, filter).await?;
    let numbers: Vec<i64> = records.iter().map(|r| r.version).collect();
    let tags = store.model_tags(&key, &numbers).await?;
    let aliases = store.model_aliases(&key).await?;
    std::hint::black_box((&tags, &aliases));
    Ok(records.len())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}/kiln.db?mode=rwc", dir.path().display()));
    let store = Store::connect(&DatabaseConfig {
        url: DatabaseUrl::new(url),
        max_connections: 4,
    })
    .await?;
    store.migrate().await?;
    let started = Instant::now();
    for i in 1..=args.versions {
        store.insert_model_version(version(i)).await?;
    }
    for i in 0..args.models {
        let other = NewModelVersion {
            model: format!("model-{i}"),
            tags: BTreeMap::new(),
            alias: None,
            ..version(i)
        };
        store.insert_model_version(other).await?;
    }
    let recorded = started.elapsed();
    println!(
        "recorded {} versions of {MODEL} and {} other models in {:.1}s ({:.2} ms per register)",
        args.versions,
        args.models,
        recorded.as_secs_f64(),
        recorded.as_secs_f64() * 1000.0 / (args.versions + args.models) as f64
    );
    let filter = |query: &str, tags: &[(&str, &str)], before_version: i64| VersionFilter {
        query: query.into(),
        tags: tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        before_version,
        limit: 100,
    };
    let searches = [
        ("newest page (100)", filter("", &[], 0)),
        ("page at version 5000", filter("", &[], 5000)),
        ("tag stage=prod (200 match)", filter("", &[("stage", "prod")], 0)),
        ("tag run=run-4242 (1 match)", filter("", &[("run", "run-4242")], 0)),
        (
            "two tags stage+team",
            filter("", &[("stage", "staging"), ("team", "team-3")], 0),
        ),
        ("text \"seed=4242\" (1 match)", filter("seed=4242", &[], 0)),
        ("text + tag stage=prod", filter("lr=0.00", &[("stage", "prod")], 0)),
    ];
    println!("{:<32} {:>7} {:>9} {:>9}", "search", "found", "p50 ms", "p99 ms");
    for (name, filter) in &searches {
        let mut times = Vec::with_capacity(args.runs);
        let mut found = 0;
        for _ in 0..args.runs {
            let start = Instant::now();
            found = search(&store, filter).await?;
            times.push(start.elapsed());
        }
        times.sort();
        println!(
            "{name:<32} {found:>7} {:>9.3} {:>9.3}",
            percentile(&times, 0.5),
            percentile(&times, 0.99)
        );
    }
    let mut times = Vec::with_capacity(args.runs);
    let mut found = 0;
    for _ in 0..args.runs {
        let start = Instant::now();
        found = store.list_models(&Visible::All, "model-4", ("", ""), 100).await?.len();
        times.push(start.elapsed());
    }
    times.sort();
    println!(
        "{:<32} {found:>7} {:>9.3} {:>9.3}",
        "models named *model-4*",
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );
    Ok(())
}
