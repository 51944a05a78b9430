//! Clients of the topology's replicas that ride out a dead replica: each call is retried on
//! the next replica while the error says the service may be back soon.

use std::future::Future;
use std::time::{Duration, Instant};

use kiln_core::auth::BearerInterceptor;
use kiln_proto::v1::batch_service_client::BatchServiceClient;
use kiln_proto::v1::job_service_client::JobServiceClient;
use kiln_proto::v1::log_service_client::LogServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

pub type Authed = InterceptedService<Channel, BearerInterceptor>;

/// How long one call keeps trying replicas before the test fails.
const CALL_PATIENCE: Duration = Duration::from_secs(120);

/// The replicas of each service, and the admin's token.
#[derive(Clone)]
pub struct Clients {
    pub token: String,
    pub api: Vec<String>,
    pub logs: Vec<String>,
    pub batches: Vec<String>,
}

/// Errors a retry on another replica (or the same one a moment later) can cure.
fn transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Internal | Code::Cancelled
    )
}

fn channel(url: &str) -> Channel {
    Endpoint::from_shared(url.to_string())
        .expect("a URL")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .connect_lazy()
}

impl Clients {
    /// Calls `call` with a client of each replica in turn until it answers with something
    /// other than a transient error.
    async fn retry<C, T, F, Fut>(
        &self,
        what: &str,
        urls: &[String],
        make: impl Fn(Channel, BearerInterceptor) -> C,
        mut call: F,
    ) -> Result<T, Status>
    where
        F: FnMut(C) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let deadline = Instant::now() + CALL_PATIENCE;
        let mut attempt = 0usize;
        loop {
            let url = &urls[attempt % urls.len()];
            attempt += 1;
            match call(make(channel(url), BearerInterceptor::new(&self.token))).await {
                Err(status) if transient(&status) && Instant::now() < deadline => {
                    if attempt.is_multiple_of(20) {
                        eprintln!("chaos: {what} still failing on {url}: {status}");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => return other,
            }
        }
    }

    pub async fn jobs<T, F, Fut>(&self, what: &str, call: F) -> Result<T, Status>
    where
        F: FnMut(JobServiceClient<Authed>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.retry(what, &self.api, JobServiceClient::with_interceptor, call)
            .await
    }

    pub async fn logs<T, F, Fut>(&self, what: &str, call: F) -> Result<T, Status>
    where
        F: FnMut(LogServiceClient<Authed>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.retry(
            what,
            &self.logs,
            |channel, auth| LogServiceClient::with_interceptor(channel, auth).max_decoding_message_size(64 << 20),
            call,
        )
        .await
    }

    pub async fn batches<T, F, Fut>(&self, what: &str, call: F) -> Result<T, Status>
    where
        F: FnMut(BatchServiceClient<Authed>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.retry(
            what,
            &self.batches,
            |channel, auth| BatchServiceClient::with_interceptor(channel, auth).max_encoding_message_size(16 << 20),
            call,
        )
        .await
    }
}
