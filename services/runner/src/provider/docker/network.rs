//! The jobs' own network: a bridge the runner makes once (idempotently, at its start), whose
//! containers cannot reach each other, with the firewall of [`super::firewall`] around it.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{Ipam, IpamConfig, NetworkCreateRequest};
use bollard::query_parameters::InspectNetworkOptions;

use super::config::{DockerConfig, FirewallMode};
use super::firewall::{self, JobNetwork};
use super::{bridge_gateway, docker_error, not_found};
use crate::error::{Error, Result};

/// Label of the networks kiln makes.
pub const LABEL_NETWORK: &str = "kiln.network";
/// Bridge driver options: no traffic between containers of the network, and its interface's name.
const ENABLE_ICC: &str = "com.docker.network.bridge.enable_icc";
const BRIDGE_NAME: &str = "com.docker.network.bridge.name";

/// Makes the jobs' network unless it exists, and reads back its subnet and gateway. A network
/// of that name that kiln did not make, or that lets containers talk to each other, is refused.
pub async fn ensure(docker: &Docker, config: &DockerConfig) -> Result<JobNetwork> {
    let name = config.job_network.as_str();
    let inspected = match docker.inspect_network(name, None::<InspectNetworkOptions>).await {
        Ok(inspected) => inspected,
        Err(error) if not_found(&error) => {
            let request = NetworkCreateRequest {
                name: name.to_string(),
                driver: Some("bridge".into()),
                enable_ipv6: Some(false),
                ipam: (!config.job_subnet.is_empty()).then(|| Ipam {
                    config: Some(vec![IpamConfig {
                        subnet: Some(config.job_subnet.clone()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                options: Some(HashMap::from([
                    (ENABLE_ICC.to_string(), "false".to_string()),
                    (BRIDGE_NAME.to_string(), name.to_string()),
                ])),
                labels: Some(HashMap::from([(LABEL_NETWORK.to_string(), "jobs".to_string())])),
                ..Default::default()
            };
            match docker.create_network(request).await {
                Ok(_) => tracing::info!(network = name, "created the jobs' network"),
                // Another runner of this engine made it meanwhile.
                Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {}
                Err(error) => return Err(docker_error("create the jobs' network")(error)),
            }
            docker
                .inspect_network(name, None::<InspectNetworkOptions>)
                .await
                .map_err(docker_error("inspect the jobs' network"))?
        }
        Err(error) => return Err(docker_error("inspect the jobs' network")(error)),
    };
    let options = inspected.options.unwrap_or_default();
    let labels = inspected.labels.unwrap_or_default();
    if labels.get(LABEL_NETWORK).map(String::as_str) != Some("jobs")
        || options.get(ENABLE_ICC).map(String::as_str) != Some("false")
        || inspected.driver.as_deref() != Some("bridge")
    {
        return Err(Error::Firewall {
            message: format!(
                "the network {name} exists but kiln did not make it as the jobs' network (a bridge with {ENABLE_ICC}=false); remove it or name another docker.job-network"
            ),
        });
    }
    let configs = inspected.ipam.and_then(|ipam| ipam.config).unwrap_or_default();
    let subnet = configs
        .iter()
        .filter_map(|c| c.subnet.clone())
        .find(|subnet| firewall::parse_cidr(subnet).is_some())
        .ok_or_else(|| Error::Firewall {
            message: format!("the network {name} has no IPv4 subnet"),
        })?;
    if !config.job_subnet.is_empty() && subnet != config.job_subnet {
        return Err(Error::Firewall {
            message: format!(
                "the network {name} has the subnet {subnet}, not docker.job-subnet {}; remove the network to change it",
                config.job_subnet
            ),
        });
    }
    let gateway = bridge_gateway(configs).ok_or_else(|| Error::Firewall {
        message: format!("the network {name} has no gateway"),
    })?;
    Ok(JobNetwork {
        name: name.to_string(),
        bridge: options.get(BRIDGE_NAME).cloned().unwrap_or_else(|| name.to_string()),
        subnet,
        gateway,
    })
}

/// Makes the jobs' network and installs (or keeps) its firewall: the endpoints are the
/// addresses kiln gives jobs (`api-url`, `logs-url`) and `job-endpoints`.
pub async fn isolate(docker: &Docker, config: &DockerConfig, endpoints: &[String]) -> Result<JobNetwork> {
    let network = ensure(docker, config).await?;
    if config.firewall == FirewallMode::External {
        tracing::warn!(
            network = %network.name,
            "docker.firewall = external: the jobs' firewall is installed on the Docker host by something else (compose: jobs-firewall); this runner does not check it"
        );
        return Ok(network);
    }
    let mut all = endpoints.to_vec();
    all.extend(config.job_endpoints.iter().cloned());
    let endpoints = firewall::resolve_endpoints(&all).await?;
    let rules = firewall::rules(&network, &endpoints, &config.job_blocked_ranges);
    firewall::install(&config.iptables, &rules, &network.name).await?;
    tracing::info!(
        network = %network.name,
        subnet = %network.subnet,
        gateway = %network.gateway,
        endpoints = ?endpoints,
        "jobs run on their own network, confined to kiln's job endpoints"
    );
    Ok(network)
}

/// Keeps the jobs' network and firewall in place until `shutdown` (`docker.firewall =
/// "keeper"`): installs them, then checks every 30 s (a Docker Engine or host restart may have
/// dropped them) and puts back what is missing. A failed check is logged and tried again.
pub async fn keep(
    docker: &Docker,
    config: &DockerConfig,
    endpoints: &[String],
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<()> {
    isolate(docker, config, endpoints).await?;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(std::time::Duration::from_secs(30)) => {}
        }
        if let Err(error) = isolate(docker, config, endpoints).await {
            tracing::error!(error = %error, "the jobs' firewall is not in place");
        }
    }
}

/// Removes the jobs' network and its firewall (tests, and an operator turning isolation off).
pub async fn remove(docker: &Docker, iptables: &str, name: &str) -> Result<()> {
    firewall::remove(iptables, name).await?;
    match docker.remove_network(name).await {
        Ok(()) => Ok(()),
        Err(error) if not_found(&error) => Ok(()),
        Err(error) => Err(docker_error("remove the jobs' network")(error)),
    }
}
