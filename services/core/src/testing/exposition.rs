//! Reading a service's `/metrics` in tests: fetch it, check it with promtool, find samples,
//! and make sure no id became a label.

use std::process::{Command, Stdio};

/// GETs `url` and returns the body; panics with the reason when it cannot.
pub async fn http_get(url: &str) -> String {
    let response = reqwest::get(url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status();
    let body = response.text().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(status.is_success(), "GET {url}: {status}: {body}");
    body
}

/// The promtool binary of the tests (`KILN_TEST_PROMTOOL`, else `promtool` on `PATH`; Debian's
/// `prometheus` package, installed by scripts/setup.sh).
pub fn promtool_binary() -> String {
    std::env::var("KILN_TEST_PROMTOOL").unwrap_or_else(|_| "promtool".into())
}

/// Runs `promtool check metrics` on an exposition and panics with its complaints unless it
/// finds none.
pub fn promtool_check_metrics(exposition: &str) {
    use std::io::Write;
    let binary = promtool_binary();
    let mut child = Command::new(&binary)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start {binary} ({e}): scripts/setup.sh installs Debian's prometheus package")
        });
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(exposition.as_bytes())
        .expect("write to promtool");
    let output = child.wait_with_output().expect("promtool runs");
    assert!(
        output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
        "promtool check metrics found problems:\n{}{}\nin:\n{exposition}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// One sample of an exposition: its metric name, labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Parses the samples of a text-format exposition (comments skipped). Label values are taken
/// as written, escapes included, which is enough to compare them with ids.
pub fn samples(exposition: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in exposition.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample line: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').unwrap_or(rest)),
            None => (series, ""),
        };
        let mut parsed = Vec::new();
        let mut rest = labels;
        while let Some((key, after)) = rest.split_once("=\"") {
            let mut end = 0;
            let bytes = after.as_bytes();
            while end < bytes.len() && !(bytes[end] == b'"' && (end == 0 || bytes[end - 1] != b'\\')) {
                end += 1;
            }
            parsed.push((key.trim_start_matches(',').to_string(), after[..end].to_string()));
            rest = after.get(end + 1..).unwrap_or("");
        }
        samples.push(Sample {
            name: name.to_string(),
            labels: parsed,
            value: value.parse().unwrap_or(f64::NAN),
        });
    }
    samples
}

/// The value of the sample named `name` whose labels include every one of `labels`; panics
/// with the exposition when there is none.
pub fn sample_value(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(exposition)
        .into_iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(key, value)| key == k && value == v))
        })
        .unwrap_or_else(|| panic!("no sample {name}{labels:?} in:\n{exposition}"))
        .value
}

/// The value of one series written exactly as exposed (`name{a="x",b="y"}`, or a bare name).
pub fn series_value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split(' ').next()?.parse().ok()
    })
}

/// Panics when any label value of the exposition is one of `ids` (or contains one): job, item,
/// batch and user ids must never become labels.
pub fn assert_no_ids_in_labels(exposition: &str, ids: &[&str]) {
    for sample in samples(exposition) {
        for (key, value) in &sample.labels {
            for id in ids.iter().filter(|id| !id.is_empty()) {
                assert!(
                    !value.contains(id),
                    "label {key}={value:?} of {} carries the id {id:?}",
                    sample.name
                );
            }
        }
    }
}
