//! The kiln services of `deploy/compose/compose.yaml`, as compose itself reads them
//! (`docker-compose config --format json`, the binary of `KILN_TEST_COMPOSE`), and the rewriting
//! that turns a container's view into one process on 127.0.0.1: host names of compose's network
//! become loopback addresses, container ports free loopback ports, volume paths directories of
//! the topology. Each rewritten value reaches the process as one of kiln's own environment
//! overrides (`KILN_<SVC>__SECTION__KEY`), so the TOML file it reads is compose's, unchanged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// One kiln service of the compose file.
#[derive(Debug, Clone)]
pub struct Service {
    /// The compose service (`kiln-api`).
    pub name: String,
    /// The program's file name (`kiln-api`), from its entrypoint.
    pub program: String,
    /// The host path of the TOML file bind-mounted where `--config` points.
    pub config: PathBuf,
    /// Its environment, interpolated from `.env.example`.
    pub environment: BTreeMap<String, String>,
    /// The container ports it publishes.
    pub ports: Vec<u16>,
    /// The container paths of its other volumes (data directories).
    pub volumes: Vec<String>,
}

impl Service {
    /// The env prefix kiln's config loader reads: `kiln-log-ingest` → `KILN_LOG_INGEST__`.
    pub fn env_prefix(&self) -> String {
        format!("{}__", self.name.to_uppercase().replace('-', "_"))
    }

    /// The parsed TOML file.
    pub fn table(&self) -> toml::Table {
        let text = std::fs::read_to_string(&self.config)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", self.config.display()));
        text.parse()
            .unwrap_or_else(|e| panic!("{} is not TOML: {e}", self.config.display()))
    }
}

/// The directory of the compose file.
pub fn compose_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/compose")
}

/// The docker-compose v2 binary (`KILN_TEST_COMPOSE`, which scripts/test.sh sets from
/// scripts/compose-check.sh); fails loudly when it is not there.
pub fn compose_binary() -> PathBuf {
    let path = std::env::var("KILN_TEST_COMPOSE").unwrap_or_else(|_| {
        panic!(
            "KILN_TEST_COMPOSE is not set: run the tests through scripts/test.sh, or set it to \
             the docker-compose binary that `scripts/compose-check.sh --path` installs"
        )
    });
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "KILN_TEST_COMPOSE={} does not exist: run scripts/compose-check.sh",
        path.display()
    );
    path
}

/// Every service of the compose file as compose resolves it (`config --format json`).
pub fn config_json() -> Value {
    let dir = compose_dir();
    let output = Command::new(compose_binary())
        .arg("--project-directory")
        .arg(&dir)
        .arg("-f")
        .arg(dir.join("compose.yaml"))
        .arg("--env-file")
        .arg(dir.join(".env.example"))
        .args(["config", "--format", "json"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run docker-compose: {e}"));
    assert!(
        output.status.success(),
        "docker-compose config failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("docker-compose config --format json is JSON")
}

/// The compose file as the harness uses it.
#[derive(Debug, Clone)]
pub struct Compose {
    /// The kiln services (`kiln-*`), by compose name.
    pub services: BTreeMap<String, Service>,
    /// Every service name of the file: the host names of compose's network.
    pub hosts: Vec<String>,
}

/// Reads the compose file through compose itself.
pub fn load() -> Compose {
    let json = config_json();
    let all = json["services"].as_object().expect("compose services");
    Compose {
        services: all
            .iter()
            .filter(|(name, _)| name.starts_with("kiln-"))
            .map(|(name, spec)| (name.clone(), service(name, spec)))
            .collect(),
        hosts: all.keys().cloned().collect(),
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn service(name: &str, spec: &Value) -> Service {
    let entrypoint = strings(&spec["entrypoint"]);
    let program = entrypoint
        .first()
        .and_then(|path| Path::new(path).file_name())
        .unwrap_or_else(|| panic!("compose service {name} has no entrypoint naming its binary"))
        .to_string_lossy()
        .into_owned();
    let command = strings(&spec["command"]);
    let config_target = command
        .iter()
        .position(|arg| arg == "--config")
        .and_then(|index| command.get(index + 1))
        .unwrap_or_else(|| panic!("compose service {name}: its command has no --config FILE"));
    let mut config = None;
    let mut volumes = Vec::new();
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        let target = volume["target"].as_str().expect("a volume target").to_string();
        if &target == config_target {
            config = volume["source"].as_str().map(PathBuf::from);
        } else {
            volumes.push(target);
        }
    }
    let config =
        config.unwrap_or_else(|| panic!("compose service {name}: nothing is mounted at its --config {config_target}"));
    let environment = spec["environment"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, value)| (key.clone(), value.as_str().unwrap_or_default().to_string()))
        .collect();
    let ports = spec["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|port| {
            port["target"]
                .as_u64()
                .and_then(|port| u16::try_from(port).ok())
                .unwrap_or_else(|| panic!("compose service {name}: a port without a target"))
        })
        .collect();
    Service {
        name: name.to_string(),
        program,
        config,
        environment,
        ports,
        volumes,
    }
}

/// What stands in for the addresses and paths of one instance's container.
#[derive(Debug, Default, Clone)]
pub struct Rewrite {
    /// `host:port` of compose's network → the loopback addresses that replace it (more than one
    /// only where a list may grow, e.g. every Cassandra node for `scylla:9042`).
    pub authorities: BTreeMap<String, Vec<String>>,
    /// Container path prefix → the directory that replaces it.
    pub paths: BTreeMap<String, String>,
    /// Names that must not be left over once rewritten (compose's service names).
    pub hosts: Vec<String>,
}

impl Rewrite {
    /// One string: authorities replaced where they start (after `//`, `,`, `@`, `"` or at the
    /// beginning), path prefixes replaced at the start.
    pub fn string(&self, value: &str) -> String {
        let mut out = value.to_string();
        for (from, to) in &self.authorities {
            out = replace_authority(&out, from, &to[0]);
        }
        for (from, to) in &self.paths {
            if out == *from || out.starts_with(&format!("{from}/")) {
                out = format!("{to}{}", &out[from.len()..]);
            }
        }
        for host in &self.hosts {
            assert!(
                replace_authority(&out, &format!("{host}:"), "") == out,
                "{value:?} names compose's {host}, for which the topology harness has no stand-in"
            );
        }
        out
    }

    /// A TOML value: strings rewritten, list items that are one authority expanded.
    fn value(&self, value: &toml::Value) -> toml::Value {
        match value {
            toml::Value::String(text) => toml::Value::String(self.string(text)),
            toml::Value::Array(items) => {
                let mut out = Vec::new();
                for item in items {
                    match item.as_str().and_then(|text| self.authorities.get(text)) {
                        Some(all) => out.extend(all.iter().cloned().map(toml::Value::String)),
                        None => out.push(self.value(item)),
                    }
                }
                toml::Value::Array(out)
            }
            other => other.clone(),
        }
    }

    /// The environment overrides (`PREFIX` + `SECTION__KEY` → value) for every leaf of `table`
    /// that the rewriting changes.
    pub fn overrides(&self, prefix: &str, table: &toml::Table) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        self.walk(prefix, table, &mut out);
        out
    }

    fn walk(&self, prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, String>) {
        for (key, value) in table {
            let name = format!("{prefix}{}", key.to_uppercase().replace('-', "_"));
            if let toml::Value::Table(inner) = value {
                self.walk(&format!("{name}__"), inner, out);
                continue;
            }
            let rewritten = self.value(value);
            if rewritten != *value {
                out.insert(name, env_value(&rewritten));
            }
        }
    }
}

/// A value as kiln's env loader parses it (figment's value syntax): strings quoted, so that one
/// holding `,` or digits stays a string.
pub fn env_value(value: &toml::Value) -> String {
    match value {
        toml::Value::String(text) => format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\"")),
        toml::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(env_value).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// Replaces `from` (a `host:port`, or `host:` for any port) where an authority starts, keeping
/// longer host names (`xnats-1:4222`) and longer ports (`nats-1:42220`) alone.
fn replace_authority(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(index) = rest.find(from) {
        let before = if index > 0 {
            rest[..index].chars().last()
        } else {
            out.chars().last()
        };
        let after = rest[index + from.len()..].chars().next();
        let starts = before.is_none_or(|c| matches!(c, '/' | ',' | '@' | '"' | ' '));
        let ends = if from.ends_with(':') {
            after.is_some_and(|c| c.is_ascii_digit())
        } else {
            after.is_none_or(|c| !c.is_ascii_digit())
        };
        out.push_str(&rest[..index]);
        out.push_str(if starts && ends { to } else { from });
        rest = &rest[index + from.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite() -> Rewrite {
        Rewrite {
            authorities: BTreeMap::from([
                ("nats-1:4222".to_string(), vec!["127.0.0.1:1001".to_string()]),
                ("0.0.0.0:7070".to_string(), vec!["127.0.0.1:2002".to_string()]),
                (
                    "scylla:9042".to_string(),
                    vec!["127.0.0.1:9042".to_string(), "127.0.0.1:9043".to_string()],
                ),
            ]),
            paths: BTreeMap::from([("/var/lib/kiln".to_string(), "/tmp/t/api-1".to_string())]),
            hosts: vec!["nats-1".to_string(), "postgres".to_string()],
        }
    }

    #[test]
    fn authorities_paths_and_lists_are_rewritten_and_nothing_else() {
        let r = rewrite();
        assert_eq!(
            r.string("nats://nats-1:4222,nats://xnats-1:4222"),
            "nats://127.0.0.1:1001,nats://xnats-1:4222"
        );
        assert_eq!(r.string("0.0.0.0:7070"), "127.0.0.1:2002");
        assert_eq!(r.string("0.0.0.0:70701"), "0.0.0.0:70701");
        assert_eq!(r.string("/var/lib/kiln/admin.token"), "/tmp/t/api-1/admin.token");
        assert_eq!(r.string("/var/lib/kiln-runner"), "/var/lib/kiln-runner");
        assert_eq!(r.string("s3://postgres/x"), "s3://postgres/x");
        let table: toml::Table = "a = \"0.0.0.0:7070\"\nb = 3\n[s]\nnodes = [\"scylla:9042\"]\nx-y = \"same\"\n"
            .parse()
            .unwrap();
        let overrides = r.overrides("KILN_API__", &table);
        assert_eq!(
            overrides,
            BTreeMap::from([
                ("KILN_API__A".to_string(), "\"127.0.0.1:2002\"".to_string()),
                (
                    "KILN_API__S__NODES".to_string(),
                    "[\"127.0.0.1:9042\", \"127.0.0.1:9043\"]".to_string()
                ),
            ])
        );
    }

    #[test]
    fn a_host_without_a_stand_in_fails_loudly() {
        let r = rewrite();
        let left = std::panic::catch_unwind(|| r.string("postgres://u@postgres:5432/db"));
        assert!(left.is_err());
    }
}
