//! `kiln doctor`: checks each service this client uses, as it finds them (the environment, the
//! credentials file, the api's `DiscoveryService`): reachable (TLS included), the right service
//! answering, the token accepted; and the api's version beside this CLI's. One line each (each
//! replica of a service given as several); exit 1 when anything is wrong.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use kiln_core::auth::BearerInterceptor;
use kiln_proto::v1 as pb;
use kiln_proto::v1::discovery_service_client::DiscoveryServiceClient;
use kiln_proto::v1::node_service_client::NodeServiceClient;

use crate::client::{self, Credentials};
use crate::format::out;

/// What a check found: fine, or what is wrong, in a line a person can act on.
type Verdict = std::result::Result<String, String>;

pub async fn doctor() -> Result<ExitCode> {
    let mine = env!("CARGO_PKG_VERSION");
    let credentials = match client::resolve().await {
        Ok(credentials) => credentials,
        Err(error) => {
            out!("api        {error:#}");
            return Ok(ExitCode::from(1));
        }
    };
    let mut healthy = true;
    let services: [(&str, &String, &str, &str); 5] = [
        ("api", &credentials.api, "api", "KILN_ADDR"),
        ("logs", &credentials.logs, "log-ingest", "KILN_LOGS_ADDR"),
        ("batches", &credentials.batches, "item-batch", "KILN_BATCH_ADDR"),
        ("advisor", &credentials.advisor, "advisor", "KILN_ADVISOR_ADDR"),
        ("predictor", &credentials.predictor, "predictor", "KILN_PREDICTOR_ADDR"),
    ];
    // A service given as several replicas (comma-separated) gets a line for each.
    for (name, urls, service, variable) in services {
        for url in client::replica_urls(urls) {
            let verdict = check(&credentials, &url, service, variable).await;
            healthy &= verdict.is_ok();
            out!("{name:<10} {url:<32} {}", verdict.unwrap_or_else(|wrong| wrong));
        }
    }
    let ui = if credentials.ui.is_empty() {
        Ok("none: the api knows no web UI address (its [public] ui)".to_string())
    } else {
        reachable(&credentials.ui).await
    };
    healthy &= ui.is_ok();
    out!(
        "{:<10} {:<32} {}",
        "ui",
        credentials.ui,
        ui.unwrap_or_else(|wrong| wrong)
    );
    match api_version(&credentials).await {
        Some(theirs) if theirs != mine => {
            healthy = false;
            out!("version    this CLI is kiln {mine}, the api kiln {theirs}: use a CLI of the api's version");
        }
        Some(theirs) => out!("version    kiln {theirs}, the same as this CLI"),
        None => out!("version    the api does not say its version (older than this CLI's {mine})"),
    }
    Ok(if healthy { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Connects to `url` and asks who the token is: the answer names the service that answered.
async fn check(credentials: &Credentials, url: &str, service: &str, variable: &str) -> Verdict {
    let channel = client::channel(url, &credentials.tls())
        .await
        .map_err(|error| format!("unreachable: {error:#}"))?;
    let mut node = NodeServiceClient::with_interceptor(channel, BearerInterceptor::new(&credentials.token));
    let me = match tokio::time::timeout(Duration::from_secs(10), node.who_am_i(pb::WhoAmIRequest {})).await {
        Err(_) => return Err("no answer in 10 s".into()),
        Ok(Err(status)) if status.code() == tonic::Code::Unauthenticated => {
            return Err(format!("token refused: {}", status.message()));
        }
        Ok(Err(status)) => return Err(format!("answered {:?}: {}", status.code(), status.message())),
        Ok(Ok(me)) => me.into_inner(),
    };
    if me.service != service {
        return Err(format!(
            "{:?} answers there, not {service}: set {variable}, or the api's [public] address of it",
            me.service
        ));
    }
    Ok(format!("ok: {service}, the token of {} accepted", me.user))
}

async fn reachable(url: &str) -> Verdict {
    let authority = client::authority_of(url);
    match tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(authority)).await {
        Ok(Ok(_)) => Ok("ok: reachable (`kiln ui` signs a browser in)".into()),
        Ok(Err(error)) => Err(format!("unreachable: {error}")),
        Err(_) => Err("unreachable: no answer in 5 s".into()),
    }
}

async fn api_version(credentials: &Credentials) -> Option<String> {
    let channel = client::channel(&credentials.api, &credentials.tls()).await.ok()?;
    let mut discovery = DiscoveryServiceClient::with_interceptor(channel, BearerInterceptor::new(&credentials.token));
    let found = discovery.discover(pb::DiscoverRequest {}).await.ok()?.into_inner();
    (!found.version.is_empty()).then_some(found.version)
}
