//! The printed report: kiln's and Ray Serve's figures side by side, then each target of
//! issue 16 with PASS or MISS.

use std::time::Duration;

use crate::load::{Summary, Throughput};
use crate::pause::{PauseReport, Plan};

#[derive(Debug)]
pub struct LatencyRow {
    pub model: String,
    pub direct: Summary,
    pub kiln: Summary,
    pub ray: Summary,
    /// The bare proxies' rows ([`crate::bare`]), by what they are.
    pub floors: Vec<(&'static str, Summary)>,
}

#[derive(Debug)]
pub struct ThroughputRow {
    pub model: String,
    pub clients: usize,
    pub fan_out: Throughput,
    pub kiln: Throughput,
    pub ray: Throughput,
    pub floors: Vec<(&'static str, Throughput)>,
}

#[derive(Debug, Default)]
pub struct Report {
    pub ray_version: String,
    pub ray_startup_s: f64,
    pub ray_notes: Vec<String>,
    pub kiln_setup_s: f64,
    pub latency: Vec<LatencyRow>,
    pub throughput: Vec<ThroughputRow>,
    pub pause_plan_opt: Option<Plan>,
    pub pause_opt: Option<PauseReport>,
    pub load_start: String,
    pub load_end: String,
    pub wall_s: f64,
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn verdict(met: bool) -> &'static str {
    if met { "PASS" } else { "MISS" }
}

fn ms(duration_opt: Option<Duration>) -> String {
    duration_opt.map_or("never".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
}

impl Report {
    pub fn print(&self) {
        println!(
            "serving, 2 workers per system: kiln (release kiln up, process workers) and Ray Serve {} (ray.init(num_cpus=2)), \
             one run on this machine; load average {} at the start, {} at the end; {:.0} s",
            self.ray_version, self.load_start, self.load_end, self.wall_s
        );
        println!(
            "setup (not measured): kiln jobs, registrations and 4 services ready in {:.1} s; Ray and Serve up in {:.1} s",
            self.kiln_setup_s, self.ray_startup_s
        );
        println!(
            "one client for all: tokio + reqwest, a keep-alive connection per client; the body: OIP JSON, x FP64 [1,64]"
        );
        let mut targets: Vec<(bool, String)> = Vec::new();
        if !self.latency.is_empty() {
            println!(
                "\nlatency: sequential calls, one connection, {} timed per system and model, systems taking turns in blocks",
                self.latency[0].direct.n
            );
            println!(
                "{:<8} {:<36} {:>9} {:>9} {:>9} {:>11} {:>11}",
                "model", "path", "p50 ms", "p99 ms", "mean ms", "added p50", "added p99"
            );
            for row in &self.latency {
                let line = |path: &str, s: &Summary, added: bool| {
                    let (p50, p99) = if added {
                        (
                            format!("{:+.3}", s.p50_ms - row.direct.p50_ms),
                            format!("{:+.3}", s.p99_ms - row.direct.p99_ms),
                        )
                    } else {
                        (String::new(), String::new())
                    };
                    println!(
                        "{:<8} {:<36} {:>9.3} {:>9.3} {:>9.3} {:>11} {:>11}",
                        row.model, path, s.p50_ms, s.p99_ms, s.mean_ms, p50, p99
                    );
                };
                line("direct to a worker (kiln.serve)", &row.direct, false);
                line("kiln predictor -> relay -> worker", &row.kiln, true);
                line("Ray Serve HTTP proxy (2 replicas)", &row.ray, true);
                for (floor, summary) in &row.floors {
                    line(floor, summary, true);
                }
                let kiln_added = (row.kiln.p50_ms - row.direct.p50_ms, row.kiln.p99_ms - row.direct.p99_ms);
                let ray_added = (row.ray.p50_ms - row.direct.p50_ms, row.ray.p99_ms - row.direct.p99_ms);
                targets.push((
                    kiln_added.0 <= 0.5,
                    format!("{}: kiln adds {:.3} ms p50 (target <= 0.5 ms)", row.model, kiln_added.0),
                ));
                targets.push((
                    kiln_added.1 <= 2.0,
                    format!("{}: kiln adds {:.3} ms p99 (target <= 2 ms)", row.model, kiln_added.1),
                ));
                for (what, kiln, ray) in [("p50", kiln_added.0, ray_added.0), ("p99", kiln_added.1, ray_added.1)] {
                    targets.push((
                        kiln <= ray / 4.0,
                        format!(
                            "{}: kiln's added {what} is {:.2} of Ray Serve's ({kiln:.3} / {ray:.3} ms; target <= 0.25)",
                            row.model,
                            kiln / ray
                        ),
                    ));
                }
            }
        }
        if !self.throughput.is_empty() {
            println!(
                "\nthroughput: 2-member mean ensemble (1 worker per member), closed loop; complete answers per second"
            );
            println!(
                "{:<8} {:>7} {:>14} {:>14} {:>14} {:>12} {:>10}   p50 / p99 ms (fan-out, kiln, Ray)",
                "model", "clients", "client fan-out", "kiln ensemble", "Ray ensemble", "kiln/fanout", "kiln/Ray",
            );
            for row in &self.throughput {
                let of_fan_out = row.kiln.rps / row.fan_out.rps;
                let of_ray = row.kiln.rps / row.ray.rps;
                println!(
                    "{:<8} {:>7} {:>14.0} {:>14.0} {:>14.0} {:>11.0}% {:>9.2}x   {}",
                    row.model,
                    row.clients,
                    row.fan_out.rps,
                    row.kiln.rps,
                    row.ray.rps,
                    of_fan_out * 100.0,
                    of_ray,
                    [&row.fan_out, &row.kiln, &row.ray]
                        .iter()
                        .map(|t| format!("{:.1}/{:.1}", t.latency.p50_ms, t.latency.p99_ms))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                for (floor, t) in &row.floors {
                    println!(
                        "         {floor}: {:.0} answers/s, {:.0}% of the fan-out; p50 / p99 {:.1}/{:.1} ms",
                        t.rps,
                        t.rps / row.fan_out.rps * 100.0,
                        t.latency.p50_ms,
                        t.latency.p99_ms
                    );
                }
                let systems = [("fan-out", &row.fan_out), ("kiln", &row.kiln), ("Ray", &row.ray)];
                let floors = row.floors.iter().map(|(floor, t)| (*floor, t));
                for (system, t) in systems.into_iter().chain(floors) {
                    let answers = (t.rps * t.seconds).max(1.0);
                    let parts: Vec<String> = t
                        .server_cpu_s
                        .iter()
                        .map(|(label, cpu)| format!("{label} {:.2}", cpu * 1e3 / answers))
                        .collect();
                    println!(
                        "         CPU ms per answer, {system}: {}; the client {:.2}",
                        parts.join(", "),
                        t.client_cpu_s * 1e3 / answers
                    );
                }
                let systems = [("fan-out", &row.fan_out), ("kiln", &row.kiln), ("Ray", &row.ray)];
                let floors = row.floors.iter().map(|(floor, t)| (*floor, t));
                for (system, t) in systems.into_iter().chain(floors) {
                    if t.partial > 0 || t.failed > 0 {
                        println!(
                            "         {system}: {} partial, {} failed answers in the window (first error: {})",
                            t.partial,
                            t.failed,
                            t.first_error_opt.as_deref().unwrap_or("none")
                        );
                    }
                }
                targets.push((
                    of_fan_out >= 0.85,
                    format!(
                        "{} at {} clients: kiln's ensemble is {:.0}% of the client's own fan-out (target >= 85%)",
                        row.model,
                        row.clients,
                        of_fan_out * 100.0
                    ),
                ));
                targets.push((
                    of_ray >= 2.0,
                    format!(
                        "{} at {} clients: kiln's ensemble is {of_ray:.2}x Ray Serve's (target >= 2x)",
                        row.model, row.clients
                    ),
                ));
            }
        }
        if let (Some(plan), Some(pause)) = (&self.pause_plan_opt, &self.pause_opt) {
            println!(
                "\npause: {} ({} clients, {} ms deadline, quorum 1), worker digits-b SIGSTOPped for {:.0} s after {:.0} s, {:.0} s after SIGCONT",
                plan.service,
                plan.clients,
                plan.deadline.as_millis(),
                plan.paused.as_secs_f64(),
                plan.before.as_secs_f64(),
                plan.after.as_secs_f64()
            );
            let (d, a) = (&pause.during_latency, &pause.all_latency);
            println!(
                "while paused: {} calls, p50 {:.1} ms, p99 {:.1} ms; {} partial, {} complete, {} failed",
                pause.during,
                d.p50_ms,
                d.p99_ms,
                pause.during - pause.during_complete - pause.during_failed,
                pause.during_complete,
                pause.during_failed
            );
            println!(
                "whole run:    {} calls, p50 {:.1} ms, p99 {:.1} ms, {} failed",
                a.n, a.p50_ms, a.p99_ms, pause.all_failed
            );
            println!(
                "after SIGSTOP: relay's gauge at 0 after {}, first partial answer in under half the deadline after {}",
                ms(pause.ejected_gauge_opt),
                ms(pause.first_quick_partial_opt)
            );
            println!(
                "after SIGCONT: gauge back at 1 after {}, first answer of both members after {}",
                ms(pause.back_gauge_opt),
                ms(pause.back_complete_opt)
            );
            if let Some(error) = &pause.first_failure_opt {
                println!("first failure while paused: {error}");
            }
            targets.push((
                d.p99_ms <= 55.0,
                format!("pause: p99 {:.1} ms while paused (target <= 55 ms)", d.p99_ms),
            ));
            targets.push((
                pause.during > 0 && pause.during_failed == 0 && pause.during_complete == 0,
                format!(
                    "pause: {} of {} calls answered and flagged partial while paused (target: all)",
                    pause.during - pause.during_complete - pause.during_failed,
                    pause.during
                ),
            ));
            let ejected = pause.ejected_gauge_opt.max(pause.first_quick_partial_opt);
            targets.push((
                ejected.is_some_and(|d| d <= Duration::from_secs(1)),
                format!("pause: ejected after {} (target <= 1 s)", ms(ejected)),
            ));
            let back = pause.back_gauge_opt.max(pause.back_complete_opt);
            targets.push((
                back.is_some_and(|d| d <= Duration::from_secs(2)),
                format!("pause: back after {} of SIGCONT (target <= 2 s)", ms(back)),
            ));
        }
        for note in &self.ray_notes {
            println!("ray: {note}");
        }
        println!("\ntargets (issue 16):");
        for (met, text) in &targets {
            println!("{} {text}", verdict(*met));
        }
    }
}
