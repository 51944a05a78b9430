//! The rules of model names, aliases and tags.

use std::collections::BTreeMap;

use super::ModelError;
use crate::subjects::validate_token;

/// A model name: 1 to 64 letters, digits, `-` or `_`, starting with a letter or digit.
pub fn validate_model_name(name: &str) -> Result<(), ModelError> {
    validate_token("model", name).map_err(ModelError::Invalid)?;
    if name.starts_with(['-', '_']) {
        return Err(ModelError::Invalid(format!(
            "model {name:?} must start with a letter or digit"
        )));
    }
    Ok(())
}

/// An alias: as a model name, and not all digits (`NAME:3` is a version, `NAME@prod` an alias).
pub fn validate_alias(alias: &str) -> Result<(), ModelError> {
    validate_token("alias", alias).map_err(ModelError::Invalid)?;
    if !alias.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(ModelError::Invalid(format!("alias {alias:?} must start with a letter")));
    }
    Ok(())
}

/// Tags: keys as names, values up to 256 characters without control characters; an empty
/// value (removing the tag) only where `removals` allows it.
pub fn validate_tags(tags: &BTreeMap<String, String>, removals: bool) -> Result<(), ModelError> {
    for (key, value) in tags {
        validate_token("tag key", key).map_err(ModelError::Invalid)?;
        if value.is_empty() && !removals {
            return Err(ModelError::Invalid(format!("tag {key} has an empty value")));
        }
        if value.chars().count() > 256 || value.chars().any(char::is_control) {
            return Err(ModelError::Invalid(format!(
                "tag {key}'s value must be at most 256 characters, none of them control characters"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_aliases_and_tags_are_checked() {
        assert!(validate_model_name("resnet-cifar_2").is_ok());
        for bad in ["", "-x", "a/b", "a b", &"x".repeat(65)] {
            assert!(validate_model_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_alias("production").is_ok());
        assert!(
            validate_alias("3")
                .unwrap_err()
                .to_string()
                .contains("start with a letter")
        );
        let tags = BTreeMap::from([("stage".to_string(), String::new())]);
        assert!(validate_tags(&tags, true).is_ok());
        assert!(validate_tags(&tags, false).is_err());
        let tags = BTreeMap::from([("bad key".to_string(), "v".to_string())]);
        assert!(validate_tags(&tags, true).unwrap_err().to_string().contains("tag key"));
    }
}
