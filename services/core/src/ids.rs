//! Identifiers: UUIDv7, so ids sort by creation time and index well.

use uuid::Uuid;

/// Returns a new time-ordered id in its canonical text form.
pub fn new_id() -> String {
    Uuid::now_v7().to_string()
}

/// Parses a job id given by a user, returning it in canonical form, or a message saying what
/// is wrong with it.
pub fn parse_id(what: &str, text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err(format!("{what} id is empty"));
    }
    Uuid::parse_str(text)
        .map(|id| id.to_string())
        .map_err(|_| format!("{what} id {text:?} is not a valid id (expected a UUID such as 0193…)"))
}

/// Returns the current time in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    let elapsed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_creation() {
        let first = new_id();
        let second = new_id();
        assert!(first < second);
        assert_eq!(parse_id("job", &first).unwrap(), first);
    }

    #[test]
    fn bad_ids_are_explained() {
        assert!(parse_id("job", "").unwrap_err().contains("empty"));
        assert!(parse_id("job", "nope").unwrap_err().contains("not a valid id"));
    }
}
