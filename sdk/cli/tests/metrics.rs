//! `kiln up` serves one `/metrics` for every service it runs, and prints its address.

use std::time::Duration;

mod common;

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
    for service in ["api", "scheduler"] {
        assert_eq!(
            sample_value(&exposition, &format!("kiln_{service}_build_info"), &[]),
            1.0,
            "{exposition}"
        );
    }
    assert!(sample_value(&exposition, "kiln_nats_server_connections", &[]) >= 1.0);
    assert_eq!(sample_value(&exposition, "kiln_scheduler_leader", &[]), 1.0);
}
