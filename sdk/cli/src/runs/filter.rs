//! `--where` conditions and `--sort` of a table of runs, and how a metric's best value is chosen.

use std::cmp::Ordering;

use anyhow::{Result, bail};
use kiln_core::runs::ConfigValue;

/// A comparison of `--where KEY OP VALUE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// The value a condition compares with: a finite number, or text (for = and != only).
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    Number(f64),
    Text(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub key: String,
    pub op: Op,
    pub value: Operand,
}

const OPERATORS: [(&str, Op); 7] = [
    ("<=", Op::Le),
    (">=", Op::Ge),
    ("!=", Op::Ne),
    ("==", Op::Eq),
    ("=", Op::Eq),
    ("<", Op::Lt),
    (">", Op::Gt),
];

const HINT: &str = "use KEY OP VALUE with OP one of =, !=, <, <=, >, >= (e.g. 'lr<0.01', 'optimizer=adam')";

impl Condition {
    /// Parses `lr<0.01`, `optimizer = adam`, `val/loss>=0.5`.
    pub fn parse(text: &str) -> Result<Condition> {
        let Some(at) = text.find(['<', '>', '=', '!']) else {
            bail!("--where {text:?} has no operator: {HINT}");
        };
        let key = text[..at].trim();
        let rest = &text[at..];
        let Some((symbol, op)) = OPERATORS.iter().find(|(symbol, _)| rest.starts_with(symbol)) else {
            bail!("--where {text:?}: unknown operator: {HINT}");
        };
        let raw = rest[symbol.len()..].trim();
        if key.is_empty() {
            bail!("--where {text:?} names no key: {HINT}");
        }
        if raw.is_empty() || raw.starts_with(['<', '>', '=', '!']) {
            bail!("--where {text:?}: unknown operator or no value: {HINT}");
        }
        let value = match raw.parse::<f64>() {
            Ok(number) if !number.is_finite() => bail!("--where {text:?}: {raw} is not a finite number"),
            Ok(number) => Operand::Number(number),
            Err(_) if matches!(op, Op::Eq | Op::Ne) => Operand::Text(raw.to_string()),
            Err(_) => bail!("--where {text:?}: {symbol} compares numbers, and {raw:?} is not one"),
        };
        Ok(Condition {
            key: key.to_string(),
            op: *op,
            value,
        })
    }

    /// Whether the condition holds for a run's value of its key (none: it does not).
    pub fn holds(&self, actual: Option<&Cell>) -> bool {
        let Some(actual) = actual else { return false };
        match (&self.value, actual) {
            (Operand::Number(wanted), Cell::Number(have)) => {
                let order = have.partial_cmp(wanted);
                matches!(
                    (self.op, order),
                    (Op::Eq, Some(Ordering::Equal))
                        | (Op::Ne, Some(Ordering::Less | Ordering::Greater) | None)
                        | (Op::Lt, Some(Ordering::Less))
                        | (Op::Le, Some(Ordering::Less | Ordering::Equal))
                        | (Op::Gt, Some(Ordering::Greater))
                        | (Op::Ge, Some(Ordering::Greater | Ordering::Equal))
                )
            }
            (wanted, have) => {
                let wanted = match wanted {
                    Operand::Number(number) => number.to_string(),
                    Operand::Text(text) => text.clone(),
                };
                match self.op {
                    Op::Eq => have.text() == wanted,
                    Op::Ne => have.text() != wanted,
                    _ => false,
                }
            }
        }
    }
}

/// One value of a run's row: a number (sorted as one) or text.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Number(f64),
    Text(String),
}

impl Cell {
    pub fn of(value: &ConfigValue) -> Cell {
        match value.as_f64() {
            Some(number) => Cell::Number(number),
            None => Cell::Text(value.to_string()),
        }
    }

    pub fn text(&self) -> String {
        match self {
            Cell::Number(number) => number.to_string(),
            Cell::Text(text) => text.clone(),
        }
    }

    /// Numbers before text, NaN last among numbers.
    pub fn compare(&self, other: &Cell) -> Ordering {
        match (self, other) {
            (Cell::Number(a), Cell::Number(b)) => a.total_cmp(b),
            (Cell::Number(_), Cell::Text(_)) => Ordering::Less,
            (Cell::Text(_), Cell::Number(_)) => Ordering::Greater,
            (Cell::Text(a), Cell::Text(b)) => a.cmp(b),
        }
    }
}

/// How the best value of a metric key is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Goal {
    /// max for keys that name a score (acc, auc, f1, precision, recall, score, reward, iou,
    /// map, bleu, rouge), min for the others (losses, errors).
    Auto,
    Min,
    Max,
}

const SCORES: [&str; 11] = [
    "acc",
    "auc",
    "f1",
    "precision",
    "recall",
    "score",
    "reward",
    "iou",
    "map",
    "bleu",
    "rouge",
];

impl Goal {
    /// Whether the best value of `key` is its largest.
    pub fn maximizes(self, key: &str) -> bool {
        match self {
            Goal::Min => false,
            Goal::Max => true,
            Goal::Auto => {
                let name = key.rsplit('/').next().unwrap_or(key).to_ascii_lowercase();
                SCORES.iter().any(|score| name.contains(score))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_parse_and_bad_ones_say_why() {
        let lr = Condition::parse("lr<0.01").unwrap();
        assert_eq!(
            (lr.key.as_str(), lr.op, &lr.value),
            ("lr", Op::Lt, &Operand::Number(0.01))
        );
        assert!(lr.holds(Some(&Cell::Number(0.001))));
        assert!(!lr.holds(Some(&Cell::Number(0.1))));
        assert!(!lr.holds(None), "a run without the key does not match");
        let opt = Condition::parse("optimizer = adam").unwrap();
        assert!(opt.holds(Some(&Cell::Text("adam".into()))));
        assert!(
            Condition::parse("val/loss>=0.5")
                .unwrap()
                .holds(Some(&Cell::Number(0.5)))
        );
        assert!(
            Condition::parse("on=true")
                .unwrap()
                .holds(Some(&Cell::Text("true".into())))
        );
        for (bad, says) in [
            ("lr~0.1", "no operator"),
            ("lr=<0.1", "unknown operator"),
            ("lr<", "no value"),
            ("<3", "names no key"),
            ("lr<nan", "not a finite number"),
            ("lr>inf", "not a finite number"),
            ("opt<adam", "compares numbers"),
        ] {
            let error = Condition::parse(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn the_best_of_a_score_is_its_max() {
        assert!(Goal::Auto.maximizes("val/acc"));
        assert!(Goal::Auto.maximizes("eval/F1"));
        assert!(!Goal::Auto.maximizes("val/loss"));
        assert!(Goal::Max.maximizes("val/loss"));
    }
}
