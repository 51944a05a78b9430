//! The floors kiln's rows are read against: bare Rust proxies with no logic of their own (no
//! auth, parsing, deadline, ensemble rule or metrics), on a runtime of their own (2 threads) in
//! this process. Each takes `POST /infer`, sends the body to one worker of each member and
//! answers with the first member's answer as it came. The member hop is one of:
//!
//! - [`Hop::Worker`]: straight to the worker (what any proxy in front of the workers costs);
//! - [`Hop::Relay`]: to a bare relay per worker over HTTP/1.1 keep-alive, which calls its
//!   worker (kiln's shape with a direct channel from predictor to relay);
//! - [`Hop::Nats`]: request/reply on a subject per member through kiln up's nats-server, a bare
//!   relay per worker in the member's queue group calling its worker (kiln's shape and channel).
//!
//! Set against each other they measure the channel the issue asks to choose (NATS or direct);
//! set against kiln's row, what kiln's own work costs over the same shape.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;

/// How the proxy reaches a member's worker.
#[derive(Clone, Debug)]
pub enum Hop {
    Worker,
    Relay,
    Nats { url: String },
}

/// A proxy, and the relays behind it, until dropped.
pub struct Bare {
    runtime: Option<tokio::runtime::Runtime>,
    /// The proxy's `POST /infer`.
    pub url: String,
}

/// Where the proxy sends a member's request.
enum Member {
    Http(String),
    Nats(String),
}

struct Proxy {
    http: reqwest::Client,
    nats: Option<async_nats::Client>,
    members: Vec<Member>,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(256)
        .build()
        .expect("a plain HTTP client builds")
}

async fn post(http: &reqwest::Client, url: &str, body: Bytes) -> Result<Bytes> {
    let answer = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await?
        .error_for_status()?;
    Ok(answer.bytes().await?)
}

impl Member {
    async fn ask(&self, proxy: &Proxy, body: Bytes) -> Result<Bytes> {
        match self {
            Member::Http(url) => post(&proxy.http, url, body).await,
            Member::Nats(subject) => {
                let nats = proxy.nats.as_ref().context("a NATS connection")?;
                Ok(nats.request(subject.clone(), body).await?.payload)
            }
        }
    }
}

async fn infer(State(proxy): State<Arc<Proxy>>, body: Bytes) -> Response {
    let asked = proxy.members.iter().map(|member| member.ask(&proxy, body.clone()));
    let mut answers = futures::future::join_all(asked).await.into_iter();
    match answers.next() {
        Some(Ok(answer)) => ([(axum::http::header::CONTENT_TYPE, "application/json")], answer).into_response(),
        Some(Err(error)) => (StatusCode::BAD_GATEWAY, format!("{error:#}")).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn serve(router: axum::Router) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

/// A bare relay over HTTP in front of `worker` (its infer URL); its own `POST /infer`.
async fn http_relay(worker: String) -> Result<String> {
    let http = client();
    let router = axum::Router::new().route(
        "/infer",
        axum::routing::post(move |body: Bytes| {
            let (http, worker) = (http.clone(), worker.clone());
            async move {
                match post(&http, &worker, body).await {
                    Ok(answer) => ([(axum::http::header::CONTENT_TYPE, "application/json")], answer).into_response(),
                    Err(error) => (StatusCode::BAD_GATEWAY, format!("{error:#}")).into_response(),
                }
            }
        }),
    );
    Ok(format!("http://{}/infer", serve(router).await?))
}

/// A bare relay in the queue group of `subject`, calling `worker` for each request.
async fn nats_relay(url: &str, subject: String, worker: String) -> Result<()> {
    let nats = async_nats::connect(url).await?;
    let mut requests = nats.queue_subscribe(subject, "relays".into()).await?;
    let http = client();
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            let (nats, http, worker) = (nats.clone(), http.clone(), worker.clone());
            tokio::spawn(async move {
                let Some(reply) = message.reply else { return };
                let answer = post(&http, &worker, message.payload).await.unwrap_or_default();
                let _ = nats.publish(reply, answer).await;
            });
        }
    });
    Ok(())
}

impl Bare {
    /// Starts a proxy whose members are `workers` (each member's one worker's infer URL),
    /// reached as `hop` says.
    pub fn start(workers: &[String], hop: &Hop) -> Result<Bare> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let (workers, hop) = (workers.to_vec(), hop.clone());
        let url = std::thread::scope(|scope| {
            scope
                .spawn(|| runtime.block_on(Bare::build(workers, hop)))
                .join()
                .expect("the bare proxy's start")
        })?;
        Ok(Bare {
            runtime: Some(runtime),
            url,
        })
    }

    async fn build(workers: Vec<String>, hop: Hop) -> Result<String> {
        let mut members = Vec::new();
        let mut nats = None;
        for (n, worker) in workers.into_iter().enumerate() {
            members.push(match &hop {
                Hop::Worker => Member::Http(worker),
                Hop::Relay => Member::Http(http_relay(worker).await?),
                Hop::Nats { url } => {
                    static PROXIES: AtomicUsize = AtomicUsize::new(0);
                    let proxy = PROXIES.fetch_add(1, Ordering::Relaxed);
                    let subject = format!("serve-bench.bare.{}.{proxy}.{n}", std::process::id());
                    nats_relay(url, subject.clone(), worker).await?;
                    if nats.is_none() {
                        nats = Some(async_nats::connect(url.as_str()).await?);
                    }
                    Member::Nats(subject)
                }
            });
        }
        let proxy = Arc::new(Proxy {
            http: client(),
            nats,
            members,
        });
        let router = axum::Router::new()
            .route("/infer", axum::routing::post(infer))
            .with_state(proxy);
        Ok(format!("http://{}/infer", serve(router).await?))
    }
}

impl Drop for Bare {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
