//! A sweep's spec: the YAML a user writes (`kiln sweep create -f sweep.yaml`), checked at
//! CreateSweep with every problem reported and each naming its field, then stored as JSON.
//!
//! ```yaml
//! name: resnet-lr
//! objective: {metric: val/loss, goal: minimize}
//! algorithm: {name: tpe, seed: 0, startup-trials: 10}   # random | sobol | grid | tpe
//! early-stop: {name: asha, resource: epoch, min: 1, max: 81, eta: 3}   # asha | median | none
//! budget: {max-trials: 200, max-parallel: 8, max-failed: 10, max-gpu-hours: 50}
//! parameters: {lr: {type: float, min: 1.0e-5, max: 1.0e-1, log: true}}
//! trial: {image: IMG, command: "python train.py --lr ${lr}", cpu: 2, gpus: 1, market: auto}
//! register: {model: resnet-cifar, alias: candidate}
//! ```

use std::collections::BTreeMap;

use kiln_core::capacity::DiskShmProblem;
use kiln_core::runs::RunConfig;
use serde::{Deserialize, Serialize};

use crate::algo::Algorithm;
use crate::space::{FieldError, ParamSpec, Space};
use crate::stop::EarlyStop;

/// Largest budget a spec may ask for (a typo such as `max-trials: 2000000` is refused).
pub const LARGEST_MAX_TRIALS: u32 = 100_000;
pub const LARGEST_MAX_PARALLEL: u32 = 1_000;
/// Longest spec accepted, in bytes.
pub const MAX_SPEC_BYTES: usize = 256 << 10;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SweepSpec {
    pub name: String,
    #[serde(default)]
    pub project: String,
    pub objective: Objective,
    pub algorithm: Algorithm,
    #[serde(default)]
    pub early_stop: EarlyStop,
    pub budget: Budget,
    /// The parameters in the order written (checked into a [`Space`] by [`SweepSpec::space`]).
    pub parameters: Vec<(String, ParamSpec)>,
    pub trial: TrialSpec,
    #[serde(default)]
    pub register: Option<Register>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Goal {
    Minimize,
    Maximize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Objective {
    pub metric: String,
    pub goal: Goal,
}

impl Objective {
    /// The value the algorithms see: lower is better.
    pub fn oriented(&self, value: f64) -> f64 {
        match self.goal {
            Goal::Minimize => value,
            Goal::Maximize => -value,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Budget {
    pub max_trials: u32,
    #[serde(default = "one")]
    pub max_parallel: u32,
    /// Failed trials after which the sweep fails; absent: max-trials.
    #[serde(default)]
    pub max_failed: Option<u32>,
    #[serde(default)]
    pub max_gpu_hours: Option<f64>,
}

fn one() -> u32 {
    1
}

/// A trial's command: one string (split as a shell would, without running a shell) or argv.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Command {
    Line(String),
    Argv(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TrialSpec {
    /// Empty runs the command as a process (the `process` provider).
    #[serde(default)]
    pub image: String,
    pub command: Command,
    #[serde(default = "default_cpu")]
    pub cpu: f64,
    /// Memory, as `kiln run --mem` takes it (`4G`).
    #[serde(default = "default_mem")]
    pub mem: String,
    #[serde(default)]
    pub gpus: u32,
    /// `auto`, `spot` or `on-demand`.
    #[serde(default = "default_market")]
    pub market: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub datasets: Vec<String>,
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub max_runtime_secs: u64,
    /// Nodes of each trial (a gang job, `kiln run --nodes`); 1 for one.
    #[serde(default = "default_nodes")]
    pub nodes: u32,
    /// The trial's own disk, as `kiln run --disk` takes it (`20G`); empty for none.
    #[serde(default)]
    pub disk: String,
    /// The size of its /dev/shm, as `kiln run --shm` takes it; empty for Docker's default.
    #[serde(default)]
    pub shm: String,
}

fn default_nodes() -> u32 {
    1
}

fn default_cpu() -> f64 {
    1.0
}

fn default_mem() -> String {
    "1G".into()
}

fn default_market() -> String {
    "auto".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Register {
    pub model: String,
    #[serde(default)]
    pub alias: Option<String>,
}

/// A spec that passed every check, with what the checks derived.
#[derive(Debug, Clone)]
pub struct Checked {
    pub spec: SweepSpec,
    pub space: Space,
    /// The trial's argv before the knobs are put in (`${lr}` still in it).
    pub argv: Vec<String>,
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    /// `trial.disk` and `trial.shm` in bytes; 0 for none.
    pub disk_bytes: u64,
    pub shm_bytes: u64,
}

/// Reads and checks a spec; every problem found is returned, each naming its field.
pub fn parse(yaml: &str) -> Result<Checked, Vec<FieldError>> {
    if yaml.len() > MAX_SPEC_BYTES {
        return Err(vec![FieldError::new(
            "spec",
            format!("is {} bytes; at most {MAX_SPEC_BYTES}", yaml.len()),
        )]);
    }
    let spec = read(yaml)?;
    spec.check()
}

/// The YAML read into a spec, section by section so that each problem names its section (and
/// its parameter); `parameters` keeps its order.
fn read(yaml: &str) -> Result<SweepSpec, Vec<FieldError>> {
    let document: yaml_serde::Value =
        yaml_serde::from_str(yaml).map_err(|error| vec![FieldError::new("spec", yaml_message(&error))])?;
    let yaml_serde::Value::Mapping(mut mapping) = document else {
        return Err(vec![FieldError::new(
            "spec",
            "must be a mapping (name:, objective:, parameters: ...)",
        )]);
    };
    let mut problems = Vec::new();
    let mut section = |key: &str, required: bool| -> Option<yaml_serde::Value> {
        let value = mapping.remove(key);
        if value.is_none() && required {
            problems.push(FieldError::new(key, "is missing"));
        }
        value
    };
    let name = section("name", true);
    let project = section("project", false);
    let objective = section("objective", true);
    let algorithm = section("algorithm", true);
    let early_stop = section("early-stop", false);
    let budget = section("budget", true);
    let parameters = section("parameters", true);
    let trial = section("trial", true);
    let register = section("register", false);
    for (key, _) in &mapping {
        problems.push(FieldError::new(
            key.as_str().unwrap_or("spec"),
            "is not a field of a sweep spec (name, project, objective, algorithm, early-stop, budget, parameters, trial, register)",
        ));
    }
    let name = typed(name, "name", &mut problems).unwrap_or_default();
    let project = typed(project, "project", &mut problems).unwrap_or_default();
    let objective = typed(objective, "objective", &mut problems);
    let algorithm = typed(algorithm, "algorithm", &mut problems);
    let early_stop = typed(early_stop, "early-stop", &mut problems).unwrap_or_default();
    let budget = typed(budget, "budget", &mut problems);
    let parameters = read_parameters(parameters, &mut problems);
    let trial = typed(trial, "trial", &mut problems);
    let register = typed(register, "register", &mut problems);
    match (objective, algorithm, budget, trial) {
        (Some(objective), Some(algorithm), Some(budget), Some(trial)) if problems.is_empty() => Ok(SweepSpec {
            name,
            project,
            objective,
            algorithm,
            early_stop,
            budget,
            parameters,
            trial,
            register,
        }),
        _ => Err(problems),
    }
}

/// One section of the spec as its type; a problem naming the section when it does not fit.
fn typed<T: serde::de::DeserializeOwned>(
    value: Option<yaml_serde::Value>,
    field: &str,
    problems: &mut Vec<FieldError>,
) -> Option<T> {
    match yaml_serde::from_value(value?) {
        Ok(typed) => Some(typed),
        Err(error) => {
            problems.push(FieldError::new(field, yaml_message(&error)));
            None
        }
    }
}

fn read_parameters(value: Option<yaml_serde::Value>, problems: &mut Vec<FieldError>) -> Vec<(String, ParamSpec)> {
    let mut params = Vec::new();
    match value {
        None => {}
        Some(yaml_serde::Value::Mapping(entries)) => {
            for (name, value) in entries {
                let Some(name) = name.as_str().map(str::to_string) else {
                    problems.push(FieldError::new("parameters", "parameter names must be strings"));
                    continue;
                };
                if let Some(param) = typed(Some(value), &format!("parameters.{name}"), problems) {
                    params.push((name, param));
                }
            }
        }
        Some(_) => problems.push(FieldError::new(
            "parameters",
            "must be a mapping of parameter names to their ranges",
        )),
    }
    params
}

fn yaml_message(error: &yaml_serde::Error) -> String {
    error.to_string()
}

impl SweepSpec {
    /// Every semantic check; the spec and what they derived when all pass.
    pub fn check(self) -> Result<Checked, Vec<FieldError>> {
        let mut problems = Vec::new();
        if let Err(message) = kiln_core::subjects::validate_token("name", &self.name) {
            problems.push(FieldError::new("name", message));
        }
        if self.objective.metric.trim().is_empty() {
            problems.push(FieldError::new(
                "objective.metric",
                "is empty: name the metric key trials log",
            ));
        }
        if let Err(errors) = self.early_stop.check() {
            problems.extend(errors);
        }
        self.check_budget(&mut problems);
        let space = match Space::new(self.parameters.clone()) {
            Ok(space) => Some(space),
            Err(errors) => {
                problems.extend(errors);
                None
            }
        };
        if let Some(space) = &space
            && let Err(errors) = self.algorithm.check(space)
        {
            problems.extend(errors);
        }
        let argv = self.check_trial(&mut problems);
        let cpu_millis = kiln_formats::units::parse_cpu(&self.trial.cpu.to_string())
            .map_err(|message| problems.push(FieldError::new("trial.cpu", message)))
            .ok();
        if cpu_millis == Some(0) {
            problems.push(FieldError::new("trial.cpu", "must be more than 0"));
        }
        let memory_bytes = kiln_formats::units::parse_size(&self.trial.mem)
            .map_err(|message| problems.push(FieldError::new("trial.mem", message)))
            .ok();
        if memory_bytes == Some(0) {
            problems.push(FieldError::new("trial.mem", "must be more than 0"));
        }
        let size = |field: &'static str, text: &str, problems: &mut Vec<FieldError>| {
            if text.is_empty() {
                return 0;
            }
            kiln_formats::units::parse_size(text)
                .map_err(|message| problems.push(FieldError::new(field, message)))
                .unwrap_or(0)
        };
        let disk_bytes = size("trial.disk", &self.trial.disk, &mut problems);
        let shm_bytes = size("trial.shm", &self.trial.shm, &mut problems);
        let memory = memory_bytes.unwrap_or(u64::MAX);
        match kiln_core::capacity::check_disk_and_shm(disk_bytes, shm_bytes, memory, &self.trial.image) {
            Err(DiskShmProblem::DiskTooSmall) => {
                problems.push(FieldError::new("trial.disk", "is less than 16M, the smallest disk"));
            }
            Err(DiskShmProblem::DiskWithoutImage) => problems.push(FieldError::new(
                "trial.disk",
                "needs trial.image: a trial's own disk is a container's",
            )),
            Err(DiskShmProblem::ShmOverMemory) => problems.push(FieldError::new(
                "trial.shm",
                "is more than trial.mem, which /dev/shm counts against",
            )),
            Ok(()) => {}
        }
        if !(1..=64).contains(&self.trial.nodes) {
            problems.push(FieldError::new("trial.nodes", "must be 1 to 64"));
        }
        if let Some(register) = &self.register {
            if let Err(error) = kiln_core::models::validate_model_name(&register.model) {
                problems.push(FieldError::new("register.model", error.to_string()));
            }
            if let Some(alias) = &register.alias
                && let Err(error) = kiln_core::models::validate_alias(alias)
            {
                problems.push(FieldError::new("register.alias", error.to_string()));
            }
        }
        match (space, argv, cpu_millis, memory_bytes) {
            (Some(space), Some(argv), Some(cpu_millis), Some(memory_bytes)) if problems.is_empty() => Ok(Checked {
                spec: self,
                space,
                argv,
                cpu_millis,
                memory_bytes,
                disk_bytes,
                shm_bytes,
            }),
            _ => Err(problems),
        }
    }

    fn check_budget(&self, problems: &mut Vec<FieldError>) {
        let budget = &self.budget;
        if !(1..=LARGEST_MAX_TRIALS).contains(&budget.max_trials) {
            problems.push(FieldError::new(
                "budget.max-trials",
                format!("must be 1 to {LARGEST_MAX_TRIALS}"),
            ));
        }
        if !(1..=LARGEST_MAX_PARALLEL).contains(&budget.max_parallel) {
            problems.push(FieldError::new(
                "budget.max-parallel",
                format!("must be 1 to {LARGEST_MAX_PARALLEL}"),
            ));
        }
        if let Some(hours) = budget.max_gpu_hours
            && !(hours.is_finite() && hours > 0.0)
        {
            problems.push(FieldError::new("budget.max-gpu-hours", "must be more than 0"));
        }
    }

    /// The argv, with each `${knob}` checked against the parameters.
    fn check_trial(&self, problems: &mut Vec<FieldError>) -> Option<Vec<String>> {
        let argv = match &self.trial.command {
            Command::Line(line) => match shlex::split(line) {
                Some(argv) => argv,
                None => {
                    problems.push(FieldError::new(
                        "trial.command",
                        "has an unclosed quote or a trailing backslash",
                    ));
                    return None;
                }
            },
            Command::Argv(argv) => argv.clone(),
        };
        if argv.is_empty() {
            problems.push(FieldError::new("trial.command", "is empty: give the program to run"));
            return None;
        }
        let names: Vec<&str> = self.parameters.iter().map(|(name, _)| name.as_str()).collect();
        let mut fine = true;
        for arg in &argv {
            for knob in knobs_named(arg) {
                if !names.contains(&knob.as_str()) {
                    problems.push(FieldError::new(
                        "trial.command",
                        format!(
                            "names ${{{knob}}}, which is not among the parameters ({})",
                            names.join(", ")
                        ),
                    ));
                    fine = false;
                }
            }
        }
        if !["auto", "spot", "on-demand"].contains(&self.trial.market.as_str()) {
            problems.push(FieldError::new("trial.market", "must be auto, spot or on-demand"));
        }
        if !self.trial.image.is_empty() && !kiln_formats::image::valid_reference(&self.trial.image) {
            problems.push(FieldError::new(
                "trial.image",
                "is not an image reference (name[:tag][@digest])",
            ));
        }
        fine.then_some(argv)
    }
}

/// The `${name}` references in one argument.
fn knobs_named(arg: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = arg;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        names.push(after[..end].to_string());
        rest = &after[end + 1..];
    }
    names
}

/// A trial's argv: each `${knob}` replaced by its value (an inactive conditional knob by "").
pub fn trial_argv(argv: &[String], config: &RunConfig) -> Vec<String> {
    argv.iter()
        .map(|arg| {
            let mut out = String::new();
            let mut rest = arg.as_str();
            while let Some(start) = rest.find("${") {
                let after = &rest[start + 2..];
                let Some(end) = after.find('}') else { break };
                out.push_str(&rest[..start]);
                if let Some(value) = config.get(&after[..end]) {
                    out.push_str(&value.to_string());
                }
                rest = &after[end + 1..];
            }
            out.push_str(rest);
            out
        })
        .collect()
}

#[cfg(test)]
mod tests;
