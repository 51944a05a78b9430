//! `kiln up` serves one `/metrics` for every service it runs, and prints its address.

use std::time::Duration;

use crate::common;

use common::{Up, text};
use kiln_core::testing::{http_get, promtool_check_metrics, sample_value};

#[test]
fn kiln_up_serves_the_metrics_of_every_service_and_of_its_nats_server() {
    let up = Up::start();
    let run = up.kiln(&["run", "--", "true"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let url = up.metrics_url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut exposition = String::new();
    for _ in 0..100 {
        exposition = runtime.block_on(http_get(&url));
        if exposition.contains("kiln_nats_server_connections{")
            && exposition.contains("kiln_scheduler_placements_total{")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    promtool_check_metrics(&exposition);
    for service in ["api", "scheduler", "log_ingest", "runner", "item_batch", "provisioner"] {
        assert_eq!(
            sample_value(&exposition, &format!("kiln_{service}_build_info"), &[]),
            1.0,
            "{exposition}"
        );
    }
    assert!(sample_value(&exposition, "kiln_nats_server_connections", &[]) >= 1.0);
    assert_eq!(sample_value(&exposition, "kiln_scheduler_leader", &[]), 1.0);
}

/// The README's metrics reference is the table of every family a fresh `kiln up` exposes (every
/// service registers all of its families at start, empty ones included). Run with
/// `KILN_UPDATE_README=1` to rewrite it after adding a metric.
#[test]
fn the_readme_lists_every_metric_kiln_exports() {
    let up = Up::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let exposition = runtime.block_on(http_get(&up.metrics_url()));
    let table = kiln_core::metrics::reference(&exposition);
    let readme_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let (begin, end) = ("<!-- metrics-reference:begin -->\n", "<!-- metrics-reference:end -->");
    let start = readme.find(begin).expect("the README's metrics-reference:begin marker") + begin.len();
    let stop = readme.find(end).expect("the README's metrics-reference:end marker");
    if std::env::var_os("KILN_UPDATE_README").is_some() {
        std::fs::write(&readme_path, format!("{}{table}{}", &readme[..start], &readme[stop..])).unwrap();
        return;
    }
    assert!(
        table.lines().count() > 60,
        "too few families for every service:\n{table}"
    );
    assert_eq!(
        readme[start..stop],
        table,
        "the README's metrics reference is out of date: run KILN_UPDATE_README=1 cargo test --workspace --test cli metrics::"
    );
}
