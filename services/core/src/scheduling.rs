//! The names the scheduler, api and runner share: priority classes, markets and quota scopes.

use std::fmt;

/// A priority class: jobs of a higher value come first; a class that `may_preempt` may stop
/// running jobs of lower classes to make room (rate-limited by the scheduler).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityClass {
    pub name: &'static str,
    pub value: i32,
    pub may_preempt: bool,
}

/// The classes, lowest first. `normal` is the default.
pub const PRIORITY_CLASSES: [PriorityClass; 3] = [
    PriorityClass {
        name: "low",
        value: 0,
        may_preempt: false,
    },
    PriorityClass {
        name: "normal",
        value: 100,
        may_preempt: false,
    },
    PriorityClass {
        name: "high",
        value: 200,
        may_preempt: true,
    },
];

/// The class of a name; empty is `normal`.
pub fn priority_class(name: &str) -> Option<PriorityClass> {
    let name = if name.is_empty() { "normal" } else { name };
    PRIORITY_CLASSES.into_iter().find(|class| class.name == name)
}

/// The class of a priority value (for jobs recorded with a value only).
pub fn class_of_priority(value: i32) -> Option<PriorityClass> {
    PRIORITY_CLASSES.into_iter().find(|class| class.value == value)
}

/// The reason a spot preemption records (a priority preemption records another), so the
/// scheduler can count a pool's spot preemptions from job events.
pub const SPOT_PREEMPTION: &str = "spot preemption";

/// Where an attempt runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Market {
    Spot,
    OnDemand,
}

impl Market {
    pub fn as_str(self) -> &'static str {
        match self {
            Market::Spot => "spot",
            Market::OnDemand => "on-demand",
        }
    }

    pub fn parse(text: &str) -> Option<Market> {
        match text {
            "spot" => Some(Market::Spot),
            "on-demand" => Some(Market::OnDemand),
            _ => None,
        }
    }
}

impl fmt::Display for Market {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a job allows: `--spot`, `--on-demand`, or `auto` (the default: the scheduler chooses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum MarketPolicy {
    #[default]
    Auto,
    Spot,
    OnDemand,
}

impl MarketPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            MarketPolicy::Auto => "auto",
            MarketPolicy::Spot => Market::Spot.as_str(),
            MarketPolicy::OnDemand => Market::OnDemand.as_str(),
        }
    }

    /// Unknown text reads as `auto` (the column's default).
    pub fn parse(text: &str) -> MarketPolicy {
        match Market::parse(text) {
            Some(Market::Spot) => MarketPolicy::Spot,
            Some(Market::OnDemand) => MarketPolicy::OnDemand,
            None => MarketPolicy::Auto,
        }
    }

    pub fn from_proto(market: kiln_proto::v1::Market) -> MarketPolicy {
        use kiln_proto::v1::Market as Pb;
        match market {
            Pb::Unspecified => MarketPolicy::Auto,
            Pb::Spot => MarketPolicy::Spot,
            Pb::OnDemand => MarketPolicy::OnDemand,
        }
    }

    pub fn to_proto(self) -> kiln_proto::v1::Market {
        use kiln_proto::v1::Market as Pb;
        match self {
            MarketPolicy::Auto => Pb::Unspecified,
            MarketPolicy::Spot => Pb::Spot,
            MarketPolicy::OnDemand => Pb::OnDemand,
        }
    }
}

/// Who a quota limits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaScope {
    Global,
    Project(String),
    User(String),
}

impl QuotaScope {
    /// Reads `global`, `project:<name>` or `user:<name>`; the message says what is accepted.
    pub fn parse(text: &str) -> Result<QuotaScope, String> {
        let bad = || format!("quota scope {text:?} is not one of global, project:<name>, user:<name>");
        if text == "global" {
            return Ok(QuotaScope::Global);
        }
        let (kind, name) = text.split_once(':').ok_or_else(bad)?;
        if name.is_empty() {
            return Err(bad());
        }
        match kind {
            "project" => Ok(QuotaScope::Project(name.to_string())),
            "user" => Ok(QuotaScope::User(name.to_string())),
            _ => Err(bad()),
        }
    }
}

impl QuotaScope {
    /// Tells whether a job of `user` (a name) in `project` falls under this scope.
    pub fn covers(&self, user: &str, project: &str) -> bool {
        match self {
            QuotaScope::Global => true,
            QuotaScope::Project(name) => name == project,
            QuotaScope::User(name) => name == user,
        }
    }
}

impl fmt::Display for QuotaScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaScope::Global => f.write_str("global"),
            QuotaScope::Project(name) => write!(f, "project:{name}"),
            QuotaScope::User(name) => write!(f, "user:{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_read_back_as_written() {
        for text in ["global", "project:vision", "user:alice"] {
            assert_eq!(QuotaScope::parse(text).unwrap().to_string(), text);
        }
        for bad in ["", "team:x", "user:", "project"] {
            assert!(QuotaScope::parse(bad).unwrap_err().contains("not one of"), "{bad}");
        }
    }

    #[test]
    fn classes_and_markets() {
        assert_eq!(priority_class("").unwrap().name, "normal");
        assert!(priority_class("urgent").is_none());
        assert!(priority_class("high").unwrap().may_preempt);
        assert_eq!(MarketPolicy::parse("on-demand"), MarketPolicy::OnDemand);
        assert_eq!(MarketPolicy::parse("auto"), MarketPolicy::Auto);
    }
}
