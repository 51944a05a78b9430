//! kiln-provisioner: launches the machines the queue needs, adopts what a crash left, and
//! releases what is idle, unregistered or unknown (docs/provisioner.md).
#![forbid(unsafe_code)]

pub mod config;
pub mod cycle;
pub mod error;
pub mod launch;
pub mod plan;
pub mod release;
pub mod service;

use std::collections::HashMap;
use std::sync::Arc;

use kiln_cloud::Cloud;
use tokio_util::sync::CancellationToken;

pub use config::Config;
pub use error::{Error, Result};

/// Makes the cloud of each pool from its declaration.
pub fn clouds(config: &Config) -> Result<HashMap<String, Arc<dyn Cloud>>> {
    let mut clouds: HashMap<String, Arc<dyn Cloud>> = HashMap::new();
    for pool in &config.pools {
        let cloud: Arc<dyn Cloud> = match pool.cloud.as_str() {
            other => {
                return Err(Error::Corrupt(format!(
                    "pool {}: cloud {other:?} is not built into this provisioner yet",
                    pool.name
                )));
            }
        };
        clouds.insert(pool.name.clone(), cloud);
    }
    Ok(clouds)
}

/// Runs the provisioner until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    let clouds = clouds(&config)?;
    service::serve(config, clouds, shutdown).await
}
pub mod unavailable;
