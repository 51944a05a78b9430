//! Inference services' shared contract: the live definition of a service the api writes to
//! [`BUCKET_SERVICES`](crate::subjects::BUCKET_SERVICES) and every predictor watches, and what
//! travels on a [`serve`](crate::subjects::serve) subject between a predictor and the relay of
//! an inference worker.
//!
//! A request on that subject is an Open Inference Protocol request body (JSON) with the header
//! [`BUDGET_HEADER`]; the reply is the worker's response body with [`STATUS_HEADER`] (the
//! worker's HTTP status) and, when the body has a binary part, the protocol's
//! `Inference-Header-Content-Length`. A relay answers nothing for work whose budget ran out:
//! the predictor has answered without it.

use serde::{Deserialize, Serialize};

/// Request header: the microseconds left of the request's deadline when it was sent. A relay
/// counts them from the moment it receives the request (no clocks are compared across
/// machines) and drops work it cannot start within them.
pub const BUDGET_HEADER: &str = "Kiln-Budget-Us";
/// Request header of a readiness probe: the relay answers at once, without the worker. A
/// relay is in its member's queue group only while its worker is ready, so any answer means
/// the member has a ready worker.
pub const PROBE_HEADER: &str = "Kiln-Probe";
/// Reply header: the HTTP status the worker answered with (`200` for an answer).
pub const STATUS_HEADER: &str = "Kiln-Status";

/// Environment of a service's worker job: the service, revision and member it serves and the
/// model version (`name:version`) it loads. The runner reads them to stage the model's files
/// into [`ENV_MODEL_DIR`] and to relay the member's subject to the worker's [`ENV_PORT`].
pub const ENV_SERVICE: &str = "KILN_SERVE_SERVICE";
pub const ENV_REVISION: &str = "KILN_SERVE_REVISION";
pub const ENV_MEMBER: &str = "KILN_SERVE_MEMBER";
pub const ENV_MODEL: &str = "KILN_SERVE_MODEL";
/// Set by the runner: the port the worker listens on and its model's files.
pub const ENV_PORT: &str = "KILN_SERVE_PORT";
pub const ENV_MODEL_DIR: &str = "KILN_MODEL_DIR";
/// Set by the docker provider: the address the worker listens on in its container (`0.0.0.0`,
/// so the port published on the host's 127.0.0.1 reaches it); elsewhere it is `127.0.0.1`.
pub const ENV_HOST: &str = "KILN_SERVE_HOST";

/// Words of the predictor's URLs (`/v2/models/NAME/ready`, `.../infer`) that a new service may
/// not be called, so that `/v2/models/PROJECT/NAME` never reads two ways.
pub const RESERVED_SERVICE_NAMES: [&str; 2] = ["ready", "infer"];

/// The key of service `name` of `project` in
/// [`BUCKET_SERVICES`](crate::subjects::BUCKET_SERVICES), and what a predictor knows it by:
/// `PROJECT.NAME` (neither has a `.`; names are unique per project).
pub fn service_key(project: &str, name: &str) -> String {
    format!("{project}.{name}")
}

/// The ensemble rule that combines the members' answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ensemble {
    /// The element-wise mean of numeric outputs (BOOL and BYTES outputs are voted).
    Mean,
    /// The element-wise mean weighted by the members' weights, over the members that answered.
    WeightedMean,
    /// The element-wise majority (weighted by the members' weights); a tie goes to the value
    /// of the earliest member, in the service's order, among the tied ones.
    Vote,
    /// The first answer to arrive; the others are not waited for.
    First,
}

impl Ensemble {
    pub fn parse(text: &str) -> Option<Ensemble> {
        match text {
            "mean" => Some(Ensemble::Mean),
            "weighted-mean" => Some(Ensemble::WeightedMean),
            "vote" => Some(Ensemble::Vote),
            "first" => Some(Ensemble::First),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Ensemble::Mean => "mean",
            Ensemble::WeightedMean => "weighted-mean",
            Ensemble::Vote => "vote",
            Ensemble::First => "first",
        }
    }
}

/// One model of an ensemble, served by its own workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// A NATS token, unique in the service (the model's name by default).
    pub name: String,
    /// The registry version it serves (`name:version` of the service's project,
    /// `project/name:version` of another), as resolved when the revision was made.
    pub model: String,
    /// Its weight in `weighted-mean` and `vote` (1 by default).
    pub weight: f64,
}

/// A tensor a service takes or gives, as its metadata states it; `-1` in a shape is any size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
}

/// A service's live definition: what a predictor needs to answer for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// A NATS token, unique in its project: the model name clients infer with.
    pub name: String,
    /// The project whose viewers may infer (clients name it when another project they may
    /// read has a service of the same name).
    pub project: String,
    /// The revision serving the traffic; its workers listen on its own subjects.
    pub revision: u64,
    pub members: Vec<Member>,
    pub ensemble: Ensemble,
    /// The deadline of a request that gives none (`parameters.timeout`), in milliseconds.
    pub deadline_ms: u64,
    /// The fewest members whose answers make an answer (at least 1).
    pub quorum: usize,
    /// The inputs requests must give; empty when the service does not say (the workers check).
    #[serde(default)]
    pub inputs: Vec<TensorSpec>,
    #[serde(default)]
    pub outputs: Vec<TensorSpec>,
    /// How long a request that finds no worker of a member waits for one (asking the
    /// controller for it on [`serve_demand`](crate::subjects::serve_demand)), in
    /// milliseconds; 0 answers UNAVAILABLE at once. Its deadline counts from when the wait ends.
    #[serde(default)]
    pub cold_wait_ms: u64,
    /// A newer revision taking a share of the requests, or copies of them, while it is tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
}

/// A revision tried beside the serving one: it answers `traffic` percent of the requests, or,
/// in `shadow`, gets a copy of every request and its answers are only compared and counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Split {
    /// Its definition (`split` is always empty there).
    pub spec: Box<ServiceSpec>,
    /// 1 to 99: the percent of requests it answers (ignored in shadow).
    pub traffic: u32,
    pub shadow: bool,
}

/// How many workers a member has: `min_replicas` to `max_replicas`, set by the controller from
/// its workers' load ([`LoadReport`]) when the two differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scaling {
    /// 0 lets an idle member go without workers (scale to zero).
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// In-flight requests per worker the controller aims at.
    pub target_in_flight: f64,
    /// When the workers' mean time per request is above it, one more worker is asked for;
    /// 0: latency does not scale.
    pub target_latency_ms: u64,
    /// How long a member's load must stay low before its workers are cut (and, with
    /// `min_replicas` 0, how long it stays up after its last request).
    pub scale_down_delay_ms: u64,
    /// [`ServiceSpec::cold_wait_ms`].
    pub cold_wait_ms: u64,
}

/// The defaults of [`Scaling`] a definition leaves out.
pub const DEFAULT_TARGET_IN_FLIGHT: f64 = 2.0;
pub const DEFAULT_SCALE_DOWN_DELAY_MS: u64 = 30_000;
/// The cold-start wait of a service that scales to zero, when it gives none.
pub const DEFAULT_COLD_WAIT_MS: u64 = 60_000;

impl Default for Scaling {
    fn default() -> Self {
        Scaling::fixed(1)
    }
}

impl Scaling {
    /// Exactly `replicas` workers per member.
    pub fn fixed(replicas: u32) -> Scaling {
        Scaling {
            min_replicas: replicas,
            max_replicas: replicas,
            target_in_flight: DEFAULT_TARGET_IN_FLIGHT,
            target_latency_ms: 0,
            scale_down_delay_ms: DEFAULT_SCALE_DOWN_DELAY_MS,
            cold_wait_ms: 0,
        }
    }

    pub fn autoscaled(&self) -> bool {
        self.max_replicas > self.min_replicas
    }
}

/// What a relay tells the controller about its worker, every report interval, on
/// [`serve_load`](crate::subjects::serve_load).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub job_id: String,
    /// The service's project.
    #[serde(default)]
    pub project: String,
    pub service: String,
    pub revision: u64,
    pub member: String,
    /// Requests in the relay (waiting for the worker or being answered), averaged over the
    /// interval.
    pub in_flight: f64,
    /// Requests answered in the interval.
    pub answered: u64,
    /// Their mean time from arrival at the relay to the answer, in milliseconds.
    pub mean_ms: f64,
    /// Whether the relay is in its member's queue group (its worker ready, not ejected).
    pub in_rotation: bool,
    /// The relay's direct channel (`http://ADDR`, `POST /infer`), empty when it has none.
    #[serde(default)]
    pub direct_url: String,
    /// What a request on the direct channel must carry in [`DIRECT_TOKEN_HEADER`].
    #[serde(default)]
    pub direct_token: String,
}

/// The header carrying a relay's direct-channel token ([`LoadReport::direct_token`]).
pub const DIRECT_TOKEN_HEADER: &str = "Kiln-Relay-Token";

impl LoadReport {
    /// The reporting worker's service's [`service_key`].
    pub fn service_key(&self) -> String {
        service_key(&self.project, &self.service)
    }
}

impl ServiceSpec {
    /// The service's [`service_key`].
    pub fn key(&self) -> String {
        service_key(&self.project, &self.name)
    }

    /// How a person names the service: `PROJECT/NAME`.
    pub fn qualified(&self) -> String {
        format!("{}/{}", self.project, self.name)
    }

    /// Every problem of the definition, each naming its field.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(problem) = check_name("name", &self.name) {
            problems.push(problem);
        }
        if self.members.is_empty() {
            problems.push("members: a service needs at least one model".into());
        }
        for (at, member) in self.members.iter().enumerate() {
            if let Err(problem) = check_name(&format!("members[{at}].name"), &member.name) {
                problems.push(problem);
            }
            if self.members[..at].iter().any(|other| other.name == member.name) {
                problems.push(format!("members[{at}].name: `{}` is named twice", member.name));
            }
            if !(member.weight.is_finite() && member.weight > 0.0) {
                problems.push(format!(
                    "members[{at}].weight is {}; give a positive number",
                    member.weight
                ));
            }
        }
        if self.quorum == 0 || self.quorum > self.members.len().max(1) {
            problems.push(format!(
                "quorum is {}; give 1 to {} (the number of members)",
                self.quorum,
                self.members.len().max(1)
            ));
        }
        if self.deadline_ms == 0 {
            problems.push("deadline-ms must be at least 1".into());
        }
        problems
    }
}

/// Checks a service or member name: 1 to 63 of `a-z`, `0-9` and `-`, starting with a letter
/// (a NATS subject token, and a name that reads well in a URL).
pub fn check_name(field: &str, name: &str) -> Result<(), String> {
    let valid = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{field} `{name}` must be 1 to 63 of a-z, 0-9 and -, starting with a letter"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ServiceSpec {
        ServiceSpec {
            name: "digits".into(),
            project: "default".into(),
            revision: 1,
            members: vec![Member {
                name: "svm".into(),
                model: "digits-svm:3".into(),
                weight: 1.0,
            }],
            ensemble: Ensemble::Mean,
            deadline_ms: 50,
            quorum: 1,
            inputs: Vec::new(),
            outputs: Vec::new(),
            cold_wait_ms: 0,
            split: None,
        }
    }

    #[test]
    fn a_good_definition_has_no_problems_and_round_trips_through_json() {
        let spec = spec();
        assert!(spec.problems().is_empty());
        let text = serde_json::to_string(&spec).unwrap();
        assert!(text.contains("\"ensemble\":\"mean\""), "{text}");
        assert_eq!(serde_json::from_str::<ServiceSpec>(&text).unwrap(), spec);
    }

    #[test]
    fn each_problem_names_its_field() {
        let mut bad = spec();
        bad.name = "Digits.v2".into();
        bad.members.push(bad.members[0].clone());
        bad.members[1].weight = -1.0;
        bad.quorum = 3;
        bad.deadline_ms = 0;
        let problems = bad.problems();
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(problems[0].starts_with("name `Digits.v2`"), "{problems:?}");
        assert!(
            problems[1].contains("members[1].name: `svm` is named twice"),
            "{problems:?}"
        );
        assert!(problems[2].starts_with("members[1].weight is -1"), "{problems:?}");
        assert!(problems[3].starts_with("quorum is 3; give 1 to 2"), "{problems:?}");
        assert!(problems[4].starts_with("deadline-ms"), "{problems:?}");
    }

    #[test]
    fn names_are_subject_tokens() {
        for good in ["a", "resnet-cifar", "m2"] {
            assert!(check_name("name", good).is_ok(), "{good}");
        }
        for bad in ["", "2m", "a.b", "a*", "a>", "A", "a b", &"a".repeat(64)] {
            assert!(check_name("name", bad).is_err(), "{bad}");
        }
    }
}
