//! `DiscoveryService`: where the other services and the web UI are, for clients that know only
//! the api's address and a token.

use std::net::SocketAddr;

use kiln_core::auth::denied_status;
use kiln_core::authz::Caller;
use kiln_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::config::Config;

/// DiscoveryApi answers with what the configuration says, the same for every caller.
#[derive(Debug, Clone)]
pub struct DiscoveryApi {
    answer: pb::DiscoverResponse,
}

impl DiscoveryApi {
    /// The answer of an api with `config` whose HTTP side listens on `http_addr`.
    pub fn new(config: &Config, http_addr: Option<SocketAddr>) -> DiscoveryApi {
        let public = &config.public;
        let or = |public: &str, fallback: &str| {
            if public.is_empty() {
                fallback.to_string()
            } else {
                public.to_string()
            }
        };
        let scheme = if config.grpc.tls.enabled() { "https" } else { "http" };
        let listened = http_addr
            .filter(|addr| !addr.ip().is_unspecified())
            .map(|addr| format!("{scheme}://{addr}"))
            .unwrap_or_default();
        DiscoveryApi {
            answer: pb::DiscoverResponse {
                logs: or(&public.logs, &config.http.logs),
                batches: or(&public.batches, &config.http.batches),
                advisor: or(&public.advisor, &config.http.advisor),
                predictor: or(&public.predictor, &config.http.predictor),
                ui: or(&public.ui, &listened),
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
        }
    }

    pub fn server(self) -> pb::discovery_service_server::DiscoveryServiceServer<DiscoveryApi> {
        pb::discovery_service_server::DiscoveryServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl pb::discovery_service_server::DiscoveryService for DiscoveryApi {
    async fn discover(&self, request: Request<pb::DiscoverRequest>) -> Result<Response<pb::DiscoverResponse>, Status> {
        Caller::of(&request).map_err(|denied| denied_status(&denied))?;
        Ok(Response::new(self.answer.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PublicConfig;

    #[test]
    fn public_urls_win_and_the_ui_is_where_the_http_side_listens() {
        let mut config = Config::default();
        config.http.logs = "http://10.0.0.5:7071".into();
        config.public = PublicConfig {
            batches: "https://batches.example.com".into(),
            ..PublicConfig::default()
        };
        let answer = DiscoveryApi::new(&config, Some("127.0.0.1:8080".parse().unwrap())).answer;
        assert_eq!(answer.logs, "http://10.0.0.5:7071");
        assert_eq!(answer.batches, "https://batches.example.com");
        assert_eq!(answer.ui, "http://127.0.0.1:8080");
        let everywhere = DiscoveryApi::new(&config, Some("0.0.0.0:8080".parse().unwrap())).answer;
        assert_eq!(
            everywhere.ui, "",
            "every address: the api cannot say which one clients reach"
        );
    }
}
