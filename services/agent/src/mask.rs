//! Masking secret values in per-item logs. The runner names the job's secrets in
//! `KILN_SECRET_NAMES` (comma-separated environment variable names); every occurrence of their
//! values in an item's output line is kept as `***`. The same rule as the runner's masker
//! (`kiln_core::secrets::Masker`, not used here to keep the agent free of kiln-core): a value
//! of several lines is also masked line by line, and pieces under 4 bytes are left alone.

use aho_corasick::{AhoCorasick, MatchKind};

/// The variable naming the secrets among the agent's environment variables.
pub const NAMES_VAR: &str = "KILN_SECRET_NAMES";
/// Pieces shorter than this are not masked (the api refuses shorter values).
const MIN_BYTES: usize = 4;
const MASK: &str = "***";

/// Masker replaces the secrets' values in a line with `***`.
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
    /// The masker of the secrets `lookup(NAMES_VAR)` names, their values read with `lookup`.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Masker {
        let names = lookup(NAMES_VAR).unwrap_or_default();
        let values: Vec<String> = names
            .split(',')
            .filter(|name| !name.is_empty())
            .filter_map(&lookup)
            .collect();
        let mut needles: Vec<&str> = Vec::new();
        for value in &values {
            needles.push(value);
            needles.extend(value.lines().map(|line| line.trim_end_matches('\r')));
        }
        needles.retain(|needle| needle.len() >= MIN_BYTES);
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
