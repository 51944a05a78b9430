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
pub mod service_metrics;

use std::collections::HashMap;
use std::sync::Arc;

use kiln_cloud::Cloud;
use kiln_cloud::ec2::{Ec2Cloud, Ec2Config, OnDemandTable};
use kiln_cloud::sim::{SimCatalogue, SimCloud, SimConfig};
use tokio_util::sync::CancellationToken;

pub use config::Config;
pub use error::{Error, Result};

/// Makes the cloud of each pool from its declaration: one EC2 client per region (credentials
/// from the AWS chain: environment, web identity, container or instance role), one simulated
/// cloud for every `sim` pool.
pub fn clouds(config: &Config) -> Result<HashMap<String, Arc<dyn Cloud>>> {
    let mut clouds: HashMap<String, Arc<dyn Cloud>> = HashMap::new();
    let mut ec2_by_region: HashMap<String, Arc<dyn Cloud>> = HashMap::new();
    let mut sim: Option<Arc<dyn Cloud>> = None;
    for pool in &config.pools {
        let cloud = match pool.cloud.as_str() {
            "ec2" => match ec2_by_region.get(&pool.region) {
                Some(cloud) => cloud.clone(),
                None => {
                    let ec2 = Ec2Config {
                        region: pool.region.clone(),
                        endpoint: (!config.ec2_endpoint.is_empty()).then(|| config.ec2_endpoint.clone()),
                        ..Ec2Config::default()
                    };
                    let cloud: Arc<dyn Cloud> = Arc::new(Ec2Cloud::from_env(ec2).map_err(error::in_pool(&pool.name))?);
                    tracing::info!(region = %pool.region, prices = %OnDemandTable::shipped().dated(), "EC2 client ready");
                    ec2_by_region.insert(pool.region.clone(), cloud.clone());
                    cloud
                }
            },
            "sim" => sim
                .get_or_insert_with(|| Arc::new(SimCloud::new(SimCatalogue::standard(), SimConfig::default())))
                .clone(),
            other => {
                return Err(Error::Corrupt(format!(
                    "pool {}: cloud {other:?} is unknown",
                    pool.name
                )));
            }
        };
        clouds.insert(pool.name.clone(), cloud);
    }
    Ok(clouds)
}

/// Runs the provisioner until `shutdown` is cancelled, serving `/metrics` as `[metrics]` says.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    let metrics = kiln_core::metrics::Metrics::default();
    let service = service::ProvisionerService::bind(config.clone())
        .await?
        .with_metrics(&metrics);
    kiln_core::metrics::export(&config.metrics, &metrics, service.nats(), &shutdown).await?;
    service.serve(shutdown).await
}
pub mod unavailable;
