//! Project secrets: their names (environment variable names), their values' limits, the key
//! that seals them at rest ([`key`]); their values are masked in logs by
//! [`kiln_formats::mask::Masker`].

mod key;

pub use key::{KEY_LEN, SecretsConfig, SecretsError, SecretsKey, ensure_key_file, generate_key_hex};
pub use kiln_formats::mask::{MASK, MIN_VALUE_BYTES, Masker, NAMES_VAR};

/// The longest secret name.
pub const MAX_NAME_LEN: usize = 128;

/// The most secrets one job or batch may name.
pub const MAX_PER_JOB: usize = 64;

/// The largest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// Checks a secret's value: [`MIN_VALUE_BYTES`] to [`MAX_VALUE_BYTES`] bytes, no NUL (an
/// environment variable cannot hold one).
pub fn validate_value(value: &str) -> Result<(), String> {
    if value.len() < MIN_VALUE_BYTES {
        return Err(format!(
            "the value has {} bytes; a secret has at least {MIN_VALUE_BYTES} (shorter ones cannot be masked in logs)",
            value.len()
        ));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "the value has {} bytes; a secret has at most {MAX_VALUE_BYTES}",
            value.len()
        ));
    }
    if value.contains('\0') {
        return Err("the value holds a NUL byte, which an environment variable cannot".into());
    }
    Ok(())
}

/// Checks a secret's name: an environment variable name (letters, digits and `_`, not starting
/// with a digit), outside the `KILN_` names kiln sets itself.
pub fn validate_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid = first_ok && name.len() <= MAX_NAME_LEN && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "secret name {name:?} is not valid: an environment variable name (letters, digits and _, not starting with a digit, at most {MAX_NAME_LEN})"
        ));
    }
    if name.starts_with("KILN_") {
        return Err(format!(
            "secret name {name:?} is reserved: KILN_* variables are set by kiln"
        ));
    }
    Ok(())
}

/// Checks the secret names of a job or batch spec against its environment: valid, unique, not
/// also given as a plain variable. Returns them sorted.
pub fn validate_names<'a>(
    names: &[String],
    env_keys: impl IntoIterator<Item = &'a String>,
) -> Result<Vec<String>, String> {
    if names.len() > MAX_PER_JOB {
        return Err(format!("{} secrets named; at most {MAX_PER_JOB}", names.len()));
    }
    let env: std::collections::BTreeSet<&String> = env_keys.into_iter().collect();
    let mut sorted = Vec::with_capacity(names.len());
    for name in names {
        validate_name(name)?;
        if env.contains(name) {
            return Err(format!("{name} is both a secret and an env variable; give it once"));
        }
        sorted.push(name.clone());
    }
    sorted.sort();
    sorted.dedup();
    Ok(sorted)
}

/// What starts the stored name of a registry's credentials (`registry:ghcr.io`): not an
/// environment variable name, so no job can name it as a secret and see it.
pub const REGISTRY_PREFIX: &str = "registry:";

/// The credentials for pulling a project's images from one registry (`kiln secret set
/// --registry HOST`), sealed as JSON under the name [`registry_secret_name`] gives.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegistryCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredentials")
            .field("username", &self.username)
            .field("password", &MASK)
            .finish()
    }
}

/// Checks a registry's host as images name it (`ghcr.io`, `127.0.0.1:5000`,
/// `123456789012.dkr.ecr.eu-west-1.amazonaws.com`; `docker.io` for Docker Hub) and returns the
/// name its credentials are stored under.
pub fn registry_secret_name(registry: &str) -> Result<String, String> {
    let registry = normalize_registry(registry);
    let (host, port) = registry.split_once(':').unwrap_or((&registry, ""));
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
    let port_ok = port.is_empty() || port.parse::<u16>().is_ok_and(|p| p > 0);
    if !host_ok || !port_ok {
        return Err(format!(
            "registry {registry:?} is not a registry host: a lowercase host name or address with an optional port, as images name it (ghcr.io, 127.0.0.1:5000)"
        ));
    }
    Ok(format!("{REGISTRY_PREFIX}{registry}"))
}

/// Docker Hub under the one name images resolve to.
fn normalize_registry(registry: &str) -> String {
    match registry {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io".into(),
        other => other.to_string(),
    }
}

/// The registry an image reference pulls from, as Docker resolves it: the first path component
/// when it has a `.` or a `:` or is `localhost`, else Docker Hub (`docker.io`).
pub fn image_registry(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            normalize_registry(first)
        }
        _ => "docker.io".into(),
    }
}

/// Checks a stored secret's name: an environment variable name, or a registry's.
pub fn validate_stored_name(name: &str) -> Result<(), String> {
    match name.strip_prefix(REGISTRY_PREFIX) {
        Some(registry) => registry_secret_name(registry).map(|_| ()),
        None => validate_name(name),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any list of names is answered without a panic; valid ones come back sorted and
        /// unique; a list with a bad name is refused naming it.
        #[test]
        fn secret_names_are_checked(
            good in prop::collection::vec("[A-Z_][A-Z0-9_]{0,30}", 0..8),
            bad in ".{0,40}",
        ) {
            let good: Vec<String> = good.into_iter().filter(|name| !name.starts_with("KILN_")).collect();
            let env: Vec<String> = Vec::new();
            let accepted = validate_names(&good, &env).unwrap();
            let mut expected = good.clone();
            expected.sort();
            expected.dedup();
            prop_assert_eq!(accepted, expected);
            let mut with_bad = good.clone();
            with_bad.push(bad.clone());
            if validate_name(&bad).is_err() {
                let refused = validate_names(&with_bad, &env).unwrap_err();
                prop_assert!(refused.contains(&format!("{bad:?}")), "{}", refused);
            }
        }
    }

    #[test]
    fn names_are_environment_variable_names() {
        for good in ["HF_TOKEN", "_x", "a1"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "1A", "A-B", "A B", "KILN_TOKEN", "é"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        let env = ["PLAIN".to_string()];
        assert!(validate_names(&["PLAIN".into()], &env).unwrap_err().contains("both"));
        assert_eq!(
            validate_names(&["B".into(), "A".into(), "B".into()], &env).unwrap(),
            ["A", "B"]
        );
    }

    #[test]
    fn images_name_their_registry() {
        for (image, registry) in [
            ("python:3.11", "docker.io"),
            ("team/trainer:1", "docker.io"),
            ("ghcr.io/team/trainer:1", "ghcr.io"),
            ("127.0.0.1:5000/team/private:1", "127.0.0.1:5000"),
            ("localhost/x", "localhost"),
            ("index.docker.io/library/busybox", "docker.io"),
        ] {
            assert_eq!(image_registry(image), registry, "{image}");
        }
        assert_eq!(
            registry_secret_name("127.0.0.1:5000").unwrap(),
            "registry:127.0.0.1:5000"
        );
        assert_eq!(registry_secret_name("index.docker.io").unwrap(), "registry:docker.io");
        for bad in ["", "GHCR.io", "ghcr.io/team", "host:0", "host:x", "a b"] {
            assert!(registry_secret_name(bad).is_err(), "{bad}");
        }
        assert!(validate_stored_name("registry:ghcr.io").is_ok());
        assert!(validate_stored_name("registry:").is_err());
        assert!(validate_stored_name("HF_TOKEN").is_ok());
        let shown = format!(
            "{:?}",
            RegistryCredentials {
                username: "u".into(),
                password: "hunter22".into()
            }
        );
        assert!(!shown.contains("hunter22"), "{shown}");
    }

    #[test]
    fn values_are_bounded() {
        assert!(validate_value("abcd").is_ok());
        assert!(validate_value("abc").unwrap_err().contains("at least 4"));
        assert!(validate_value(&"x".repeat(MAX_VALUE_BYTES + 1)).is_err());
        assert!(validate_value("ab\0cd").unwrap_err().contains("NUL"));
    }
}
