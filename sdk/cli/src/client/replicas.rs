//! A service's replicas behind one client: `KILN_ADDR` (and a discovered address) may list
//! several, comma-separated; calls go to one at a time and move on when it cannot be reached.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use anyhow::{Result, bail};
use kiln_core::tls::ClientTlsConfig;
use kiln_formats::error::with_sources;
use tonic::codegen::http;
use tonic::transport::{Channel, Endpoint};

/// How long a connect to one replica may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The replicas of a service, one at a time: `KILN_ADDR` (and a discovered address) may list
/// several, comma-separated. Calls go to the one that answered last; a call that cannot reach
/// it (refused, reset, timed out) fails as Unavailable and moves later calls to the next, so a
/// command that tries again (a submit, with the same idempotency key) reaches a live replica
/// without a load balancer in front.
#[derive(Clone)]
pub struct Replicas {
    channels: Arc<[Channel]>,
    current: Arc<AtomicUsize>,
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Replicas {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<Self::Response, Self::Error>> + Send>>;

    /// Ready at once: the call waits for the replica it goes to.
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let index = self.current.load(Ordering::Relaxed);
        let mut channel = self.channels[index].clone();
        let (current, count) = (self.current.clone(), self.channels.len());
        Box::pin(async move {
            let answer = match std::future::poll_fn(|cx| channel.poll_ready(cx)).await {
                Ok(()) => channel.call(request).await,
                Err(error) => Err(error),
            };
            if answer.is_err() {
                // Only the first call to find this replica gone moves on.
                let _ = current.compare_exchange(index, (index + 1) % count, Ordering::Relaxed, Ordering::Relaxed);
            }
            answer
        })
    }
}

/// A call tried again while its service is unavailable (a replica that went away: the next
/// call goes to the next replica), with doubling waits up to 10 s. Only for calls that are
/// safe to repeat: reads, and writes with an idempotency key.
pub async fn while_unavailable<T>(
    mut call: impl AsyncFnMut() -> std::result::Result<T, tonic::Status>,
) -> std::result::Result<T, tonic::Status> {
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        match call().await {
            Err(status) if status.code() == tonic::Code::Unavailable && delay < WHILE_UNAVAILABLE_LIMIT => {
                eprintln!("kiln: unavailable ({}); trying again", status.message());
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            answer => return answer,
        }
    }
}

/// The longest wait of [`while_unavailable`].
const WHILE_UNAVAILABLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The addresses of a comma-separated list, each as a URL.
pub fn replica_urls(addrs: &str) -> Vec<String> {
    addrs
        .split(',')
        .map(str::trim)
        .filter(|addr| !addr.is_empty())
        .map(super::normalize)
        .collect()
}

/// Connects to the first of `addrs` (comma-separated) that answers; the others are connected
/// when calls move to them (see [`Replicas`]).
pub(crate) async fn channel(addrs: &str, tls: &ClientTlsConfig) -> Result<Replicas> {
    let urls = replica_urls(addrs);
    let Some(first) = urls.first() else {
        bail!("no address given (an empty KILN_ADDR or service address)");
    };
    let hint = if first.starts_with("https://") {
        "is kiln running there, and does --ca-file (KILN_CA_FILE) name the CA of its certificate?"
    } else {
        "is `kiln up` running? (an https:// server refuses http:// clients)"
    };
    let endpoints = endpoints(&urls, tls)?;
    let mut failures = Vec::new();
    for (index, endpoint) in endpoints.iter().enumerate() {
        match endpoint.connect().await {
            Ok(connected) => {
                let channels = endpoints
                    .iter()
                    .enumerate()
                    .map(|(other, endpoint)| {
                        if other == index {
                            connected.clone()
                        } else {
                            endpoint.connect_lazy()
                        }
                    })
                    .collect();
                return Ok(Replicas {
                    channels,
                    current: Arc::new(AtomicUsize::new(index)),
                });
            }
            Err(error) => failures.push(format!("{} ({})", urls[index], with_sources(&error))),
        }
    }
    bail!("cannot reach kiln at {}; {hint}", failures.join(", "))
}

/// A service's replicas connected on first use (a service a command does not call may be down).
pub(crate) fn lazy_channel(addrs: &str, tls: &ClientTlsConfig) -> Result<Replicas> {
    let urls = replica_urls(addrs);
    if urls.is_empty() {
        bail!("no address given for a service");
    }
    Ok(Replicas {
        channels: endpoints(&urls, tls)?.iter().map(Endpoint::connect_lazy).collect(),
        current: Arc::new(AtomicUsize::new(0)),
    })
}

/// The endpoint of each replica, with the connect timeout every client call has.
fn endpoints(urls: &[String], tls: &ClientTlsConfig) -> Result<Vec<Endpoint>> {
    urls.iter()
        .map(|url| Ok(kiln_core::tls::endpoint(url, tls)?.connect_timeout(CONNECT_TIMEOUT)))
        .collect()
}
