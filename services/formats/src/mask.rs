//! Masking secret values in log lines: the runner masks what a job prints, kiln-agent what each
//! item prints, with this one masker.

use aho_corasick::{AhoCorasick, MatchKind};

/// What a secret's value becomes in a masked line.
pub const MASK: &str = "***";

/// The shortest value, in bytes: logs are masked by value, and masking a value of a byte or two
/// would mask half of every line, so shorter values are refused (and pieces shorter than this
/// are not masked).
pub const MIN_VALUE_BYTES: usize = 4;

/// The variable that tells a job which of its environment variables are secrets (their names,
/// comma-separated), so kiln-agent masks their values in per-item logs.
pub const NAMES_VAR: &str = "KILN_SECRET_NAMES";

/// Masker replaces every occurrence of a secret value in a line with [`MASK`]. A value of
/// several lines is also masked line by line (logs are shipped a line at a time); pieces
/// shorter than [`MIN_VALUE_BYTES`] are left alone, so masking cannot wreck every line.
#[derive(Clone, Default)]
pub struct Masker {
    matcher: Option<AhoCorasick>,
}

impl std::fmt::Debug for Masker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Masker(***)")
    }
}

impl Masker {
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Masker {
        let mut needles: Vec<&str> = Vec::new();
        for value in values {
            needles.push(value);
            needles.extend(value.lines().map(|line| line.trim_end_matches('\r')));
        }
        needles.retain(|needle| needle.len() >= MIN_VALUE_BYTES);
        needles.sort_unstable();
        needles.dedup();
        if needles.is_empty() {
            return Masker::default();
        }
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&needles)
            .ok();
        Masker { matcher }
    }

    /// The masker of the secrets `lookup(NAMES_VAR)` names, their values read with `lookup`
    /// (the environment, in kiln-agent).
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Masker {
        let names = lookup(NAMES_VAR).unwrap_or_default();
        let values: Vec<String> = names
            .split(',')
            .filter(|name| !name.is_empty())
            .filter_map(&lookup)
            .collect();
        Masker::new(values.iter().map(String::as_str))
    }

    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// The line with every secret value in it replaced by [`MASK`].
    pub fn mask(&self, line: String) -> String {
        match &self.matcher {
            Some(matcher) if matcher.is_match(&line) => matcher.replace_all(&line, &vec![MASK; matcher.patterns_len()]),
            _ => line,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_masked_wherever_they_appear() {
        let masker = Masker::new(["s3cr3t-value", "-----BEGIN KEY-----\nAAAABBBB\n-----END KEY-----", "ab"]);
        assert_eq!(
            masker.mask("token=s3cr3t-value; again s3cr3t-value".into()),
            "token=***; again ***"
        );
        assert_eq!(masker.mask("AAAABBBB".into()), "***");
        // Short values (and short lines of long ones) are left alone.
        assert_eq!(masker.mask("ab cd".into()), "ab cd");
        assert_eq!(masker.mask("nothing here".into()), "nothing here");
        assert!(Masker::new(["ab"]).is_empty());
        assert!(!format!("{masker:?}").contains("s3cr3t"));
    }

    #[test]
    fn the_named_variables_values_are_masked() {
        let env = std::collections::HashMap::from([
            (NAMES_VAR, "API_KEY,SHORT,GONE"),
            ("API_KEY", "k-123456"),
            ("SHORT", "ab"),
            ("PLAIN", "visible"),
        ]);
        let masker = Masker::from_env(|name| env.get(name).map(|v| v.to_string()));
        assert_eq!(
            masker.mask("key=k-123456 plain=visible ab".into()),
            "key=*** plain=visible ab"
        );
        let none = Masker::from_env(|_| None);
        assert_eq!(none.mask("k-123456".into()), "k-123456");
    }
}
