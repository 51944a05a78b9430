//! The exposition's text: Prometheus's format 0.0.4 from prometheus-client's OpenMetrics, and
//! the metrics reference made from it.

/// Turns the OpenMetrics text prometheus-client writes into Prometheus's text format 0.0.4,
/// which every scraper and `promtool check metrics` read: OpenMetrics names a counter family
/// without its `_total` (`# TYPE x counter`, then `x_total 3`), the text format with it, and the
/// text format has no `# UNIT` or `# EOF` lines. Nothing else differs for the types kiln uses.
pub fn to_text_format(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "].into_iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        match descriptor {
            Some(renamed) => text.push_str(renamed.trim_end()),
            None => text.push_str(line),
        }
        text.push('\n');
    }
    text
}

/// The metrics reference: one markdown table row per family of `exposition` (name, type,
/// help), as the README's "Metrics reference" lists them.
pub fn reference(exposition: &str) -> String {
    let mut rows = Vec::new();
    let mut help = std::collections::HashMap::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_string(), text.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            rows.push((name.to_string(), kind.to_string()));
        }
    }
    rows.sort();
    let mut table = String::from("| metric | type | what it counts |\n|---|---|---|\n");
    for (name, kind) in rows {
        let text = help.get(&name).map(String::as_str).unwrap_or("");
        table.push_str(&format!("| `{name}` | {kind} | {} |\n", text.replace('|', "\\|")));
    }
    table
}
