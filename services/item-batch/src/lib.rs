//! kiln-item-batch: batch jobs (item intake, fan-out, retries, dead letters, progress,
//! autoscaling). For now it serves only its health endpoint; the batch system lands with its
//! own issue.
#![forbid(unsafe_code)]

use std::net::SocketAddr;

use kiln_core::config::{ConfigError, GrpcConfig};
use kiln_core::service::{ServiceConfig, problems_to_result};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

pub const DEFAULT_PORT: u16 = 7075;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    pub grpc: GrpcConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
        }
    }
}

impl ServiceConfig for Config {
    fn validate(&self) -> Result<(), ConfigError> {
        problems_to_result(Vec::new())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

impl Error {
    pub fn kind(&self) -> kiln_core::ErrorKind {
        kiln_core::ErrorKind::Internal
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// item-batch, listening, not yet serving.
pub struct ItemBatch {
    listener: TcpListener,
}

impl ItemBatch {
    pub async fn bind(config: Config) -> Result<ItemBatch> {
        let listener = TcpListener::bind(config.grpc.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.grpc.listen,
                source,
            })?;
        Ok(ItemBatch { listener })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        tonic::transport::Server::builder()
            .add_service(health_service)
            .serve_with_incoming_shutdown(TcpListenerStream::new(self.listener), shutdown.cancelled_owned())
            .await?;
        Ok(())
    }
}

pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    ItemBatch::bind(config).await?.serve(shutdown).await
}
