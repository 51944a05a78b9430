//! The NATS users of `kiln up`: one NKey seed per service in `KILN_HOME/nats-users/<service>.nk`
//! (mode 0600 in a 0700 directory, made on the first start and kept after), and the child
//! nats-server's config, `KILN_HOME/nats-server.conf`, which admits those users only, each with
//! the subjects of `kiln_core::nats_auth` (written at every start, so an upgraded kiln brings its
//! table). There is no `no_auth_user`: a process on this machine's loopback without a seed — a
//! job's — is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kiln_core::config::NatsConfig;
use kiln_core::nats_auth::{self, NatsUser, Service};

/// The seeds of the services, and the server config that admits them.
pub struct UpNatsUsers {
    seeds: BTreeMap<Service, PathBuf>,
    /// The `authorization` block, the file given to the child with `-c`.
    pub server_config: PathBuf,
}

impl UpNatsUsers {
    /// Makes the seeds (once) and writes the server config in `home`.
    pub fn prepare(home: &Path) -> Result<UpNatsUsers> {
        let seeds = nats_auth::ensure_seed_files(&home.join("nats-users"))?;
        let users: Vec<NatsUser> = seeds
            .iter()
            .map(|(service, _, public)| NatsUser::service(*service, public.clone()))
            .collect();
        let server_config = home.join("nats-server.conf");
        std::fs::write(&server_config, nats_auth::authorization_block(&users))
            .with_context(|| format!("cannot write {}", server_config.display()))?;
        Ok(UpNatsUsers {
            seeds: seeds.into_iter().map(|(service, path, _)| (service, path)).collect(),
            server_config,
        })
    }

    /// `nats` with the seed of `service`.
    pub fn config(&self, service: Service, nats: &NatsConfig) -> NatsConfig {
        NatsConfig {
            nkey_seed_file: Some(self.seeds[&service].clone()),
            ..nats.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_admits_the_seeds_of_this_home_and_keeps_them() {
        let home = tempfile::tempdir().unwrap();
        let first = UpNatsUsers::prepare(home.path()).unwrap();
        let text = std::fs::read_to_string(&first.server_config).unwrap();
        for service in Service::ALL {
            let config = first.config(service, &NatsConfig::default());
            let seed = std::fs::read_to_string(config.nkey_seed_file.unwrap()).unwrap();
            let public = nats_auth::public_key(&seed).unwrap();
            assert!(text.contains(&format!("nkey: \"{public}\"")), "{service}");
        }
        assert!(!text.contains("no_auth_user"));
        let again = UpNatsUsers::prepare(home.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&again.server_config).unwrap(), text);
    }
}
