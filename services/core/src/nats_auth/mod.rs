//! Who may talk to NATS, and on which subjects: one NKey user per kiln service.
//!
//! - [`Service`] names the seven services that hold NATS credentials; each connects with its
//!   own inbox prefix ([`Service::inbox_prefix`]), so no service can read another's replies.
//! - [`permissions`]: the table of what each service may publish and subscribe, derived from
//!   every use of [`crate::subjects`] in the services, and the JetStream API subjects behind them.
//! - [`render`]: that table as the `authorization` block of a nats-server config.
//! - [`ensure_seed_file`]: a service's NKey seed, made once (mode 0600) and reused.
//!
//! Jobs, batch workers (`kiln-agent`) and inference workers never get NATS credentials: they
//! speak gRPC only. A server configured from this table admits no connection without a seed.

mod permissions;
mod render;

use std::path::{Path, PathBuf};

pub use permissions::Permissions;
pub use render::{NatsUser, authorization_block};

use crate::streams::NatsError;

/// A kiln service that connects to NATS, as named in its config and its NATS user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    Api,
    Scheduler,
    Runner,
    LogIngest,
    ItemBatch,
    Advisor,
    Predictor,
    Provisioner,
}

impl Service {
    /// Every service that connects to NATS.
    pub const ALL: [Service; 8] = [
        Service::Api,
        Service::Scheduler,
        Service::Runner,
        Service::LogIngest,
        Service::ItemBatch,
        Service::Advisor,
        Service::Predictor,
        Service::Provisioner,
    ];

    /// The service's name (kebab-case, as its binary `kiln-<name>` and its seed file).
    pub fn name(self) -> &'static str {
        match self {
            Service::Api => "api",
            Service::Scheduler => "scheduler",
            Service::Runner => "runner",
            Service::LogIngest => "log-ingest",
            Service::ItemBatch => "item-batch",
            Service::Advisor => "advisor",
            Service::Predictor => "predictor",
            Service::Provisioner => "provisioner",
        }
    }

    /// Parses a [`Service::name`].
    pub fn from_name(name: &str) -> Option<Service> {
        Service::ALL.into_iter().find(|service| service.name() == name)
    }

    /// The prefix of the service's reply subjects (`_INBOX.<name>`): its user may subscribe
    /// under it only, so replies to one service (JetStream acks, explain answers, inference
    /// results) cannot be read by another.
    pub fn inbox_prefix(self) -> String {
        format!("_INBOX.{}", self.name())
    }

    /// What the service may publish and subscribe to.
    pub fn permissions(self) -> Permissions {
        permissions::of(self)
    }

    /// The file name of the service's seed in a credentials directory (`<name>.nk`).
    pub fn seed_file_name(self) -> String {
        format!("{}.nk", self.name())
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn credentials_error(path: &Path, message: impl std::fmt::Display) -> NatsError {
    NatsError::Credentials {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// A new NKey user seed (`SU…`).
pub fn generate_seed() -> String {
    nkeys::KeyPair::new_user()
        .seed()
        .expect("a new user key pair has a seed")
}

/// The public key (`U…`) of a user seed, or why the text is not one.
pub fn public_key(seed: &str) -> Result<String, String> {
    let pair = nkeys::KeyPair::from_seed(seed.trim()).map_err(|e| e.to_string())?;
    let public = pair.public_key();
    if !public.starts_with('U') {
        return Err("the seed is not a user seed (SU…)".into());
    }
    Ok(public)
}

/// Makes the seed file `path` (mode 0600, with a new user seed) unless it exists, and returns
/// the public key of the seed it holds. An existing file is kept as it is, so a service keeps
/// its identity across restarts.
pub fn ensure_seed_file(path: &Path) -> Result<String, NatsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut file) => {
            let written = file
                .write_all(format!("{}\n", generate_seed()).as_bytes())
                .and_then(|()| file.sync_all());
            written.map_err(|e| credentials_error(path, e))?;
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(credentials_error(path, error)),
    }
    let seed = std::fs::read_to_string(path).map_err(|e| credentials_error(path, e))?;
    public_key(&seed).map_err(|message| credentials_error(path, message))
}

/// The seed files of every service in `dir` (made once, see [`ensure_seed_file`]; the
/// directory is made with mode 0700): each service with its seed file and public key.
pub fn ensure_seed_files(dir: &Path) -> Result<Vec<(Service, PathBuf, String)>, NatsError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| credentials_error(dir, e))?;
    Service::ALL
        .into_iter()
        .map(|service| {
            let path = dir.join(service.seed_file_name());
            let public = ensure_seed_file(&path)?;
            Ok((service, path, public))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn names_round_trip_and_inboxes_differ() {
        for service in Service::ALL {
            assert_eq!(Service::from_name(service.name()), Some(service));
        }
        let mut prefixes: Vec<String> = Service::ALL.iter().map(|s| s.inbox_prefix()).collect();
        prefixes.sort();
        prefixes.dedup();
        assert_eq!(prefixes.len(), Service::ALL.len());
        assert_eq!(Service::from_name("kiln-agent"), None);
    }

    #[test]
    fn seed_files_are_private_made_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("nats-users");
        let first = ensure_seed_files(&creds).unwrap();
        assert_eq!(first.len(), Service::ALL.len());
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&creds), 0o700);
        for (_, path, public) in &first {
            assert_eq!(mode(path), 0o600, "{}", path.display());
            assert!(public.starts_with('U'), "{public}");
        }
        let second = ensure_seed_files(&creds).unwrap();
        assert_eq!(first, second, "a second start reuses the seeds");
        let mut keys: Vec<&String> = first.iter().map(|(_, _, public)| public).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), Service::ALL.len(), "one key per service");
    }

    #[test]
    fn a_file_that_holds_no_user_seed_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.nk");
        std::fs::write(&path, "not a seed\n").unwrap();
        let error = ensure_seed_file(&path).unwrap_err().to_string();
        assert!(error.contains("api.nk"), "{error}");
        let account = nkeys::KeyPair::new_account().seed().unwrap();
        std::fs::write(&path, account).unwrap();
        assert!(ensure_seed_file(&path).is_err());
    }
}
