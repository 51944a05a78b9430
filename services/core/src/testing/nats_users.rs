//! NATS users for tests: one NKey per service with the permissions of
//! [`crate::nats_auth`], the same `authorization` block `kiln up` writes, plus a test harness
//! user with every subject (for tests that read streams back or play an attacker's part).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::NatsConfig;
use crate::nats_auth::{self, NatsUser, Service};

/// Seeds of every service and of the test harness, in a temp dir of their own.
pub struct NatsUsers {
    seeds: BTreeMap<Service, (PathBuf, String)>,
    /// The seed of the harness user (every subject).
    pub harness_seed_file: PathBuf,
    harness_public: String,
    _dir: tempfile::TempDir,
}

impl NatsUsers {
    pub fn new() -> NatsUsers {
        let dir = tempfile::tempdir().expect("temp dir");
        let seeds = nats_auth::ensure_seed_files(&dir.path().join("users"))
            .expect("the services' seeds")
            .into_iter()
            .map(|(service, path, public)| (service, (path, public)))
            .collect();
        let harness_seed_file = dir.path().join("harness.nk");
        let harness_public = nats_auth::ensure_seed_file(&harness_seed_file).expect("the harness seed");
        NatsUsers {
            seeds,
            harness_seed_file,
            harness_public,
            _dir: dir,
        }
    }

    /// The `authorization` block: every service's user, and the harness's.
    pub fn authorization_block(&self) -> String {
        let mut users: Vec<NatsUser> = self
            .seeds
            .iter()
            .map(|(service, (_, public))| NatsUser::service(*service, public.clone()))
            .collect();
        users.push(NatsUser {
            comment: "the test harness (every subject)".into(),
            nkey: self.harness_public.clone(),
            permissions: None,
        });
        nats_auth::authorization_block(&users)
    }

    /// The seed file of `service`.
    pub fn seed_file(&self, service: Service) -> &Path {
        &self.seeds[&service].0
    }

    /// Every service's seed file.
    pub fn seed_files(&self) -> BTreeMap<Service, PathBuf> {
        self.seeds
            .iter()
            .map(|(service, (path, _))| (*service, path.clone()))
            .collect()
    }

    /// `config` with the seed of `service`.
    pub fn service_config(&self, service: Service, config: NatsConfig) -> NatsConfig {
        NatsConfig {
            nkey_seed_file: Some(self.seed_file(service).to_path_buf()),
            ..config
        }
    }

    /// `config` with the harness's seed.
    pub fn harness_config(&self, config: NatsConfig) -> NatsConfig {
        NatsConfig {
            nkey_seed_file: Some(self.harness_seed_file.clone()),
            ..config
        }
    }
}

impl Default for NatsUsers {
    fn default() -> Self {
        NatsUsers::new()
    }
}
