//! Retry rules: what a failed attempt leads to. A batch's rules are an ordered list; the first
//! that matches the attempt (how it failed, its exit code) decides between another attempt and a
//! dead letter at once; when none matches, the item is retried while `max_attempts` allows (as
//! AWS Batch's `evaluateOnExit` does). Attempts lost with their worker meet no rule: they are not
//! failed attempts (see [`crate::work`]).

use kiln_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Rules a batch may have, and exit codes one rule may list.
const MAX_RULES: usize = 32;
const MAX_CODES_PER_RULE: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    Any,
    Exit,
    Timeout,
    OutOfMemory,
    NotStarted,
}

impl Failure {
    fn from_proto(value: i32) -> Option<Failure> {
        Some(match pb::ItemFailure::try_from(value).ok()? {
            pb::ItemFailure::Unspecified => Failure::Any,
            pb::ItemFailure::Exit => Failure::Exit,
            pb::ItemFailure::Timeout => Failure::Timeout,
            pb::ItemFailure::OutOfMemory => Failure::OutOfMemory,
            pb::ItemFailure::NotStarted => Failure::NotStarted,
        })
    }

    fn to_proto(self) -> pb::ItemFailure {
        match self {
            Failure::Any => pb::ItemFailure::Unspecified,
            Failure::Exit => pb::ItemFailure::Exit,
            Failure::Timeout => pb::ItemFailure::Timeout,
            Failure::OutOfMemory => pb::ItemFailure::OutOfMemory,
            Failure::NotStarted => pb::ItemFailure::NotStarted,
        }
    }

    /// As a person says it, in the rule's description.
    fn describe(self) -> &'static str {
        match self {
            Failure::Any => "failure",
            Failure::Exit => "exit",
            Failure::Timeout => "timeout",
            Failure::OutOfMemory => "out-of-memory",
            Failure::NotStarted => "not-started",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub on: Failure,
    /// Empty matches any exit code (and none).
    pub exit_codes: Vec<i32>,
    /// Whether a matching attempt is retried (else the item is dead at once).
    pub retry: bool,
}

/// What a failed attempt leads to, and the rule that decided it (1-based), if one did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub retry: bool,
    pub rule: Option<(usize, String)>,
}

impl Rule {
    /// Checks the rules of a request, in order.
    pub fn from_protos(rules: &[pb::RetryRule]) -> Result<Vec<Rule>> {
        if rules.len() > MAX_RULES {
            return Err(Error::InvalidArgument(format!(
                "retry_rules has {} rules; at most {MAX_RULES}",
                rules.len()
            )));
        }
        rules
            .iter()
            .enumerate()
            .map(|(n, rule)| {
                Rule::from_proto(rule).map_err(|why| Error::InvalidArgument(format!("retry rule {}: {why}", n + 1)))
            })
            .collect()
    }

    fn from_proto(rule: &pb::RetryRule) -> std::result::Result<Rule, String> {
        let on = Failure::from_proto(rule.on).ok_or_else(|| format!("`on` {} is not a kind of failure", rule.on))?;
        let retry = match pb::RetryAction::try_from(rule.action) {
            Ok(pb::RetryAction::Retry) => true,
            Ok(pb::RetryAction::Fail) => false,
            _ => return Err(format!("action {} must be RETRY or FAIL", rule.action)),
        };
        if rule.exit_codes.len() > MAX_CODES_PER_RULE {
            return Err(format!(
                "{} exit codes; at most {MAX_CODES_PER_RULE}",
                rule.exit_codes.len()
            ));
        }
        if rule.exit_codes.contains(&0) {
            return Err("exit code 0 is a success, which no rule sees".into());
        }
        if !rule.exit_codes.is_empty() && matches!(on, Failure::Timeout | Failure::NotStarted) {
            return Err(format!(
                "a {} has no exit code of the command's; leave exit_codes empty",
                on.describe()
            ));
        }
        let mut exit_codes = rule.exit_codes.clone();
        exit_codes.sort_unstable();
        exit_codes.dedup();
        Ok(Rule { on, exit_codes, retry })
    }

    pub fn to_proto(&self) -> pb::RetryRule {
        pb::RetryRule {
            on: self.on.to_proto() as i32,
            exit_codes: self.exit_codes.clone(),
            action: if self.retry {
                pb::RetryAction::Retry
            } else {
                pb::RetryAction::Fail
            } as i32,
        }
    }

    fn matches(&self, failure: Failure, exit_code: Option<i32>) -> bool {
        let kind = self.on == Failure::Any || self.on == failure;
        let code =
            self.exit_codes.is_empty() || exit_code.is_some_and(|code| self.exit_codes.binary_search(&code).is_ok());
        kind && code
    }

    /// "fail on exit 2,3", "retry on timeout".
    fn describe(&self) -> String {
        let action = if self.retry { "retry" } else { "fail" };
        let codes = self.exit_codes.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
        match (self.on, codes.is_empty()) {
            (Failure::Any, true) => format!("{action} on any failure"),
            (Failure::Any | Failure::Exit, false) => format!("{action} on exit {codes}"),
            (on, true) => format!("{action} on {}", on.describe()),
            (on, false) => format!("{action} on {} with exit {codes}", on.describe()),
        }
    }
}

/// How an outcome failed: the agent's word, or for an older agent's outcome, its exit code.
pub fn failure_of(outcome: &pb::ItemOutcome) -> Failure {
    match Failure::from_proto(outcome.failure) {
        Some(Failure::Any) | None => {
            if outcome.exit_code.is_some() {
                Failure::Exit
            } else {
                Failure::Any
            }
        }
        Some(failure) => failure,
    }
}

/// The first rule matching a failed attempt decides; none retries.
pub fn decide(rules: &[Rule], failure: Failure, exit_code: Option<i32>) -> Decision {
    rules
        .iter()
        .enumerate()
        .find(|(_, rule)| rule.matches(failure, exit_code))
        .map_or(
            Decision {
                retry: true,
                rule: None,
            },
            |(n, rule)| Decision {
                retry: rule.retry,
                rule: Some((n + 1, rule.describe())),
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(on: pb::ItemFailure, codes: &[i32], action: pb::RetryAction) -> pb::RetryRule {
        pb::RetryRule {
            on: on as i32,
            exit_codes: codes.to_vec(),
            action: action as i32,
        }
    }

    #[test]
    fn the_first_matching_rule_decides_and_none_retries() {
        use pb::ItemFailure as F;
        use pb::RetryAction as A;
        let rules = Rule::from_protos(&[
            rule(F::Exit, &[2, 3], A::Fail),
            rule(F::Timeout, &[], A::Fail),
            rule(F::Exit, &[1], A::Retry),
            rule(F::Unspecified, &[], A::Fail),
        ])
        .unwrap();
        let fail_2 = decide(&rules, Failure::Exit, Some(2));
        assert_eq!(
            fail_2,
            Decision {
                retry: false,
                rule: Some((1, "fail on exit 2,3".into()))
            }
        );
        assert!(!decide(&rules, Failure::Timeout, None).retry);
        assert_eq!(
            decide(&rules, Failure::Exit, Some(1)).rule,
            Some((3, "retry on exit 1".into()))
        );
        assert_eq!(
            decide(&rules, Failure::Exit, Some(9)).rule,
            Some((4, "fail on any failure".into()))
        );
        // No rules: every failure is retried.
        assert_eq!(
            decide(&[], Failure::OutOfMemory, Some(137)),
            Decision {
                retry: true,
                rule: None
            }
        );
        // An out-of-memory kill matches a rule on its exit code as well as one on its kind.
        let oom = Rule::from_protos(&[rule(F::Unspecified, &[137], A::Fail)]).unwrap();
        assert!(!decide(&oom, Failure::OutOfMemory, Some(137)).retry);
        assert!(
            decide(&oom, Failure::Timeout, None).retry,
            "a timeout has no exit code to match"
        );
    }

    #[test]
    fn rules_that_cannot_match_are_refused_with_their_number() {
        use pb::ItemFailure as F;
        use pb::RetryAction as A;
        let cases = [
            (rule(F::Exit, &[0], A::Fail), "exit code 0"),
            (rule(F::Timeout, &[1], A::Fail), "no exit code"),
            (rule(F::Exit, &[1], A::Unspecified), "RETRY or FAIL"),
            (
                pb::RetryRule {
                    on: 99,
                    ..rule(F::Exit, &[1], A::Fail)
                },
                "not a kind of failure",
            ),
        ];
        for (bad, why) in cases {
            let error = Rule::from_protos(&[rule(F::Exit, &[1], A::Retry), bad])
                .unwrap_err()
                .to_string();
            assert!(error.contains("retry rule 2") && error.contains(why), "{error}");
        }
        let many = vec![rule(F::Exit, &[1], A::Retry); MAX_RULES + 1];
        assert!(Rule::from_protos(&many).is_err());
    }

    #[test]
    fn an_older_agents_outcome_fails_by_its_exit_code() {
        let exited = pb::ItemOutcome {
            exit_code: Some(3),
            ..Default::default()
        };
        assert_eq!(failure_of(&exited), Failure::Exit);
        assert_eq!(failure_of(&pb::ItemOutcome::default()), Failure::Any);
        let timed_out = pb::ItemOutcome {
            failure: pb::ItemFailure::Timeout as i32,
            ..Default::default()
        };
        assert_eq!(failure_of(&timed_out), Failure::Timeout);
    }
}
