//! The queries of the Grafana dashboards in deploy/compose/grafana/dashboards: every
//! `targets[].expr` of every panel (rows and nested panels included), with Grafana's variables
//! replaced as Prometheus needs them, and the metric names each one reads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr, VectorSelector};
use regex::Regex;

/// One panel query, ready for Prometheus.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    /// `dashboard file / panel title`.
    pub title: String,
    pub query: String,
    /// The metric names it selects.
    pub metrics: BTreeSet<String>,
}

pub fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/compose/grafana/dashboards")
}

/// Every panel query of every dashboard; a query that does not parse as PromQL once its
/// variables are replaced fails here, naming the panel.
pub fn queries() -> Vec<PanelQuery> {
    let dir = dashboards_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a dashboard entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let dashboard: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", file.display()));
        let variables = variables(&dashboard);
        let name = file.file_name().expect("a file name").to_string_lossy().into_owned();
        let mut panels = Vec::new();
        collect(&dashboard, &mut panels);
        for (title, expr) in panels {
            let title = format!("{name} / {title}");
            let query = substitute(&expr, &variables);
            let metrics = metric_names(&query).unwrap_or_else(|e| panic!("{title}: {query:?} is not PromQL: {e}"));
            out.push(PanelQuery { title, query, metrics });
        }
    }
    out
}

/// The dashboard's own variables (`templating.list[].name`), datasources aside.
fn variables(dashboard: &serde_json::Value) -> Vec<String> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|variable| variable["type"] != "datasource")
        .filter_map(|variable| variable["name"].as_str().map(str::to_string))
        .collect()
}

/// (panel title, expr) of every target of every panel, recursing into rows (`panels` inside a
/// panel, or the old `rows`).
fn collect(node: &serde_json::Value, out: &mut Vec<(String, String)>) {
    for key in ["panels", "rows"] {
        for panel in node[key].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("(untitled)").to_string();
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str().filter(|expr| !expr.trim().is_empty()) {
                    out.push((title.clone(), expr.to_string()));
                }
            }
            collect(panel, out);
        }
    }
}

/// Grafana's interval variables as fixed durations, and every dashboard variable (`$pool`,
/// `${pool}`, `${pool:regex}`, `[[pool]]`) as "anything": a matcher `label="$pool"` becomes
/// `label=~".*"`. A `$` left over afterwards is a variable Grafana would have to know.
pub fn substitute(expr: &str, variables: &[String]) -> String {
    let mut out = expr.to_string();
    for (name, value) in [("__rate_interval", "1m"), ("__interval", "15s"), ("__range", "5m")] {
        let pattern = Regex::new(&format!(r"\$\{{{name}\}}|\$\{name}\b|\[\[{name}\]\]")).expect("a regex");
        out = pattern.replace_all(&out, value).into_owned();
    }
    for name in variables {
        let name = regex::escape(name);
        let reference = format!(r"(?:\$\{{{name}(?::[a-z]+)?\}}|\${name}\b|\[\[{name}\]\])");
        let matcher = Regex::new(&format!(
            r#"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|=|!=)\s*"[^"]*{reference}[^"]*""#
        ))
        .expect("a regex");
        out = matcher
            .replace_all(&out, |caps: &regex::Captures| {
                let op = if caps[2].starts_with('!') { "!~" } else { "=~" };
                format!("{}{op}\".*\"", &caps[1])
            })
            .into_owned();
        out = Regex::new(&reference)
            .expect("a regex")
            .replace_all(&out, ".*")
            .into_owned();
    }
    out
}

/// The metric names a query selects (by name, or by an exact `__name__` matcher).
pub fn metric_names(query: &str) -> Result<BTreeSet<String>, String> {
    let expr = parser::parse(query)?;
    let mut names = BTreeSet::new();
    walk(&expr, &mut names);
    Ok(names)
}

fn selector(vs: &VectorSelector, names: &mut BTreeSet<String>) {
    if let Some(name) = &vs.name {
        names.insert(name.clone());
    }
    for matcher in &vs.matchers.matchers {
        if matcher.name == "__name__" && matches!(matcher.op, MatchOp::Equal) {
            names.insert(matcher.value.clone());
        }
    }
}

fn walk(expr: &Expr, names: &mut BTreeSet<String>) {
    match expr {
        Expr::Aggregate(aggregate) => {
            walk(&aggregate.expr, names);
            if let Some(param) = &aggregate.param {
                walk(param, names);
            }
        }
        Expr::Unary(unary) => walk(&unary.expr, names),
        Expr::Binary(binary) => {
            walk(&binary.lhs, names);
            walk(&binary.rhs, names);
        }
        Expr::Paren(paren) => walk(&paren.expr, names),
        Expr::Subquery(subquery) => walk(&subquery.expr, names),
        Expr::VectorSelector(vs) => selector(vs, names),
        Expr::MatrixSelector(matrix) => selector(&matrix.vs, names),
        Expr::Call(call) => {
            for arg in &call.args.args {
                walk(arg, names);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

#[test]
fn variables_are_replaced_and_metric_names_found() {
    let variables = vec!["pool".to_string(), "project".to_string()];
    let query = substitute(
        r#"sum by (pool) (rate(kiln_api_jobs_submitted_total{project=~"$project", pool="${pool}"}[$__rate_interval])) / on() group_left count(up{job="kiln-api"}) + ignoring(x) increase(kiln_runner_stops_total{pool="[[pool]]"}[$__range])"#,
        &variables,
    );
    assert_eq!(
        query,
        r#"sum by (pool) (rate(kiln_api_jobs_submitted_total{project=~".*", pool=~".*"}[1m])) / on() group_left count(up{job="kiln-api"}) + ignoring(x) increase(kiln_runner_stops_total{pool=~".*"}[5m])"#
    );
    assert_eq!(
        metric_names(&query).unwrap(),
        BTreeSet::from([
            "kiln_api_jobs_submitted_total".to_string(),
            "kiln_runner_stops_total".to_string(),
            "up".to_string()
        ])
    );
    assert_eq!(substitute("x[$__interval]", &variables), "x[15s]");
    assert!(metric_names("sum(").is_err());
}
