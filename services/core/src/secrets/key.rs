//! The key that seals secret values at rest (AES-256-GCM, through `ring`), and where it comes
//! from: `[secrets] key-file` (a file holding 64 hex digits) or `[secrets] key` (the hex itself).
//!
//! A sealed value is `version (1) ‖ nonce (12) ‖ ciphertext ‖ tag (16)`. Each seal draws a fresh
//! random nonce, and the additional data is `project/name`, so a sealed value copied to another
//! row (another project or name) does not open.

use std::fmt;
use std::path::{Path, PathBuf};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use crate::config::Secret;
use crate::error::ErrorKind;

/// The format byte that starts every sealed value.
const VERSION: u8 = 1;
/// Bytes of a key.
pub const KEY_LEN: usize = 32;

/// SecretsError is a failure to load the key, or to seal or open a value.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// No key is configured where one is needed; `service` names whose config lacks it.
    #[error(
        "{service} has no secrets key: set [secrets] key-file (a file of 64 hex digits, e.g. from `openssl rand -hex 32`) or key in its config"
    )]
    NoKey { service: &'static str },
    #[error("{0}")]
    BadKey(String),
    #[error("cannot read the secrets key file {path}: {source}")]
    KeyFile { path: String, source: std::io::Error },
    #[error("cannot seal a secret: {0}")]
    Seal(&'static str),
    /// The value does not open with this key: another key sealed it, or it was changed.
    #[error("secret {project}/{name} does not open with this secrets key (sealed with another key, or altered)")]
    Open { project: String, name: String },
}

impl SecretsError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            SecretsError::NoKey { .. } | SecretsError::Open { .. } => ErrorKind::FailedPrecondition,
            SecretsError::BadKey(_) | SecretsError::KeyFile { .. } | SecretsError::Seal(_) => ErrorKind::Internal,
        }
    }
}

/// SecretsConfig says where the key is; at most one of the two is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct SecretsConfig {
    /// A file holding the key as 64 hex digits (whitespace around them is ignored); keep it 0600.
    pub key_file: PathBuf,
    /// The key itself as 64 hex digits (masked when the config is printed).
    pub key: Secret,
}

impl SecretsConfig {
    pub fn validate(&self, problems: &mut Vec<String>) {
        let has_file = !self.key_file.as_os_str().is_empty();
        let has_key = !self.key.expose().is_empty();
        if has_file && has_key {
            problems.push("secrets.key-file and secrets.key are both set: give one".into());
        }
        if has_key && let Err(error) = SecretsKey::from_hex(self.key.expose(), "secrets.key") {
            problems.push(error.to_string());
        }
    }

    /// Reads the configured key; `None` when none is configured.
    pub fn load(&self) -> Result<Option<SecretsKey>, SecretsError> {
        if !self.key.expose().is_empty() {
            return SecretsKey::from_hex(self.key.expose(), "secrets.key").map(Some);
        }
        if self.key_file.as_os_str().is_empty() {
            return Ok(None);
        }
        SecretsKey::from_file(&self.key_file).map(Some)
    }
}

/// SecretsKey seals and opens secret values. Its `Debug` shows no key material.
pub struct SecretsKey {
    key: LessSafeKey,
}

impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretsKey(***)")
    }
}

impl SecretsKey {
    /// A key from 64 hex digits; `what` names where they came from in the error.
    pub fn from_hex(text: &str, what: &str) -> Result<SecretsKey, SecretsError> {
        let bad = || SecretsError::BadKey(format!("{what} must be {} hex digits ({KEY_LEN} bytes)", KEY_LEN * 2));
        let bytes = hex::decode(text.trim()).map_err(|_| bad())?;
        if bytes.len() != KEY_LEN {
            return Err(bad());
        }
        let unbound = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| bad())?;
        Ok(SecretsKey {
            key: LessSafeKey::new(unbound),
        })
    }

    pub fn from_file(path: &Path) -> Result<SecretsKey, SecretsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SecretsError::KeyFile {
            path: path.display().to_string(),
            source,
        })?;
        SecretsKey::from_hex(&text, &format!("the secrets key file {}", path.display()))
    }

    /// Seals `value` for the secret `name` of `project`.
    pub fn seal(&self, project: &str, name: &str, value: &[u8]) -> Result<Vec<u8>, SecretsError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SecretsError::Seal("no random nonce"))?;
        let mut in_out = value.to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), aad(project, name), &mut in_out)
            .map_err(|_| SecretsError::Seal("encryption failed"))?;
        let mut sealed = Vec::with_capacity(1 + NONCE_LEN + in_out.len());
        sealed.push(VERSION);
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&in_out);
        Ok(sealed)
    }

    /// Opens what [`SecretsKey::seal`] sealed for the same project and name.
    pub fn open(&self, project: &str, name: &str, sealed: &[u8]) -> Result<Vec<u8>, SecretsError> {
        let fail = || SecretsError::Open {
            project: project.to_string(),
            name: name.to_string(),
        };
        let (version, rest) = sealed.split_first().ok_or_else(fail)?;
        if *version != VERSION || rest.len() < NONCE_LEN {
            return Err(fail());
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| fail())?;
        let mut in_out = ciphertext.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, aad(project, name), &mut in_out)
            .map_err(|_| fail())?;
        Ok(plain.to_vec())
    }
}

fn aad(project: &str, name: &str) -> Aad<Vec<u8>> {
    Aad::from(format!("{project}/{name}").into_bytes())
}

/// Makes a new random key as 64 hex digits.
pub fn generate_key_hex() -> Result<String, SecretsError> {
    let mut bytes = [0u8; KEY_LEN];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| SecretsError::Seal("no random key"))?;
    Ok(hex::encode(bytes))
}

/// Creates `path` (mode 0600) holding a new random key, unless it exists; either way returns
/// the key in it. For `kiln up`, which keeps one key under KILN_HOME.
pub fn ensure_key_file(path: &Path) -> Result<SecretsKey, SecretsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io_error = |source| SecretsError::KeyFile {
        path: path.display().to_string(),
        source,
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut file) => {
            let hex = generate_key_hex()?;
            file.write_all(format!("{hex}\n").as_bytes()).map_err(io_error)?;
            file.sync_all().map_err(io_error)?;
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(io_error(error)),
    }
    SecretsKey::from_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SecretsKey {
        SecretsKey::from_hex(&generate_key_hex().unwrap(), "test").unwrap()
    }

    #[test]
    fn sealed_values_open_with_their_key_project_and_name_only() {
        let key = key();
        let sealed = key.seal("p", "TOKEN", b"hunter22").unwrap();
        assert!(!sealed.windows(8).any(|w| w == b"hunter22"));
        assert_eq!(key.open("p", "TOKEN", &sealed).unwrap(), b"hunter22");
        // A fresh nonce each time.
        assert_ne!(sealed, key.seal("p", "TOKEN", b"hunter22").unwrap());
        // Another key, another project or name (swapped AAD), altered bytes: none opens.
        assert!(matches!(
            self::key().open("p", "TOKEN", &sealed),
            Err(SecretsError::Open { .. })
        ));
        assert!(key.open("q", "TOKEN", &sealed).is_err());
        assert!(key.open("p", "OTHER", &sealed).is_err());
        assert!(key.open("p/TOKEN", "", &sealed).is_err());
        for index in 0..sealed.len() {
            let mut tampered = sealed.clone();
            tampered[index] ^= 1;
            assert!(key.open("p", "TOKEN", &tampered).is_err(), "byte {index}");
        }
        assert!(key.open("p", "TOKEN", &sealed[..sealed.len() - 1]).is_err());
        assert!(key.open("p", "TOKEN", &[]).is_err());
    }

    #[test]
    fn keys_are_64_hex_digits_and_never_printed() {
        let hex = generate_key_hex().unwrap();
        assert_eq!(hex.len(), 64);
        assert!(SecretsKey::from_hex(&hex[..62], "k").is_err());
        assert!(SecretsKey::from_hex(&"zz".repeat(32), "k").is_err());
        let key = SecretsKey::from_hex(&format!(" {hex}\n"), "k").unwrap();
        assert_eq!(format!("{key:?}"), "SecretsKey(***)");
        let config = SecretsConfig {
            key: Secret::new(hex.clone()),
            ..SecretsConfig::default()
        };
        assert!(!format!("{config:?}").contains(&hex));
        let mut problems = Vec::new();
        SecretsConfig {
            key_file: "/k".into(),
            key: Secret::new("12"),
        }
        .validate(&mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn the_key_file_is_made_once_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        let first = ensure_key_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let sealed = first.seal("p", "N", b"value").unwrap();
        let again = ensure_key_file(&path).unwrap();
        assert_eq!(again.open("p", "N", &sealed).unwrap(), b"value");
        let config = SecretsConfig {
            key_file: path,
            ..SecretsConfig::default()
        };
        assert!(config.load().unwrap().is_some());
        assert!(SecretsConfig::default().load().unwrap().is_none());
    }
}
