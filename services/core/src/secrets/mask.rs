//! Masking secret values in the log lines a runner ships.

use aho_corasick::{AhoCorasick, MatchKind};

use super::MIN_VALUE_BYTES;

/// What a secret's value becomes in a masked line.
pub const MASK: &str = "***";

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
}
