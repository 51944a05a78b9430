//! The tower layer every gRPC server wears: requests, errors by gRPC code and latency, by
//! method. Put it outside the auth layer so refused calls count too.
//!
//! The code is read from the response headers (a trailers-only answer: every error tonic
//! returns before streaming) or from the trailers at the end of the body; the latency runs to
//! the end of the body, so a streaming call's is the length of its stream. A body dropped before
//! its end (the caller went away) counts as `CANCELLED`. Paths that are no kiln method (and the
//! health service's) are labelled `other`, so callers cannot grow the label sets.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tonic::body::Body;

use super::{HistogramFamily, Metrics, RegistryExt, seconds_histogram};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    grpc_service: &'static str,
    grpc_method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    grpc_service: &'static str,
    grpc_method: &'static str,
    grpc_code: &'static str,
}

struct RpcMetrics {
    requests: Family<MethodLabels, Counter>,
    errors: Family<CodeLabels, Counter>,
    duration: HistogramFamily<MethodLabels>,
}

/// The layer; cloning shares its counters.
#[derive(Clone)]
pub struct RpcMetricsLayer {
    metrics: std::sync::Arc<RpcMetrics>,
}

impl RpcMetricsLayer {
    /// Registers `kiln_<service>_rpc_*` and returns the layer that counts into them.
    pub fn new(metrics: &Metrics, service: &str) -> Self {
        let rpc = metrics.register(service, |registry| {
            let requests = Family::default();
            registry.add("rpc_requests", "gRPC calls received, by method", requests.clone());
            let errors = Family::default();
            registry.add(
                "rpc_errors",
                "gRPC calls answered with a code other than OK, by method and code",
                errors.clone(),
            );
            let duration = HistogramFamily::new_with_constructor(seconds_histogram as fn() -> _);
            registry.add_with_unit(
                "rpc_duration",
                "Time from a gRPC call's arrival to the end of its answer (of its stream, for streams), by method",
                prometheus_client::registry::Unit::Seconds,
                duration.clone(),
            );
            RpcMetrics {
                requests,
                errors,
                duration,
            }
        });
        RpcMetricsLayer {
            metrics: std::sync::Arc::new(rpc),
        }
    }
}

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`RpcMetricsLayer`] wraps around a server's routes.
#[derive(Clone)]
pub struct RpcMetricsService<S> {
    inner: S,
    metrics: std::sync::Arc<RpcMetrics>,
}

/// Splits a request path into the labels of a known kiln method, or `other`.
fn method_labels(path: &str) -> MethodLabels {
    match kiln_proto::RPC_METHODS.binary_search(&path) {
        Ok(index) => {
            let known: &'static str = kiln_proto::RPC_METHODS[index];
            let (service, method) = known[1..].split_once('/').expect("a method path has a slash");
            MethodLabels {
                grpc_service: service,
                grpc_method: method,
            }
        }
        Err(_) => MethodLabels {
            grpc_service: "other",
            grpc_method: "other",
        },
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S> tower::Service<http::Request<Body>> for RpcMetricsService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let labels = method_labels(request.uri().path());
        let metrics = self.metrics.clone();
        metrics.requests.get_or_create(&labels).inc();
        let call = Call {
            metrics,
            labels,
            started: Instant::now(),
            done: false,
        };
        Box::pin(async move {
            let response = inner.call(request).await?;
            let (parts, body) = response.into_parts();
            let mut call = call;
            if let Some(code) = status_of(&parts.headers) {
                // A trailers-only answer: the call ends here.
                call.finish(code);
            }
            Ok(http::Response::from_parts(
                parts,
                Body::new(MeteredBody { inner: body, call }),
            ))
        })
    }
}

/// One call under way; records itself once, when its answer ends or is dropped.
struct Call {
    metrics: std::sync::Arc<RpcMetrics>,
    labels: MethodLabels,
    started: Instant,
    done: bool,
}

impl Call {
    fn finish(&mut self, code: tonic::Code) {
        if self.done {
            return;
        }
        self.done = true;
        if code != tonic::Code::Ok {
            self.metrics
                .errors
                .get_or_create(&CodeLabels {
                    grpc_service: self.labels.grpc_service,
                    grpc_method: self.labels.grpc_method,
                    grpc_code: code_name(code),
                })
                .inc();
        }
        self.metrics
            .duration
            .get_or_create(&self.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(tonic::Code::Cancelled);
    }
}

fn status_of(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let value = headers.get("grpc-status")?;
    let code: i32 = value.to_str().ok()?.parse().ok()?;
    Some(tonic::Code::from_i32(code))
}

/// The gRPC code's name as the spec spells it (`NOT_FOUND`).
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The answer's body, watched for the trailers that carry the code of a streamed answer.
struct MeteredBody {
    inner: Body,
    call: Call,
}

impl http_body::Body for MeteredBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(status_of) {
                    this.call.finish(code);
                }
            }
            Poll::Ready(Some(Err(_))) => this.call.finish(tonic::Code::Internal),
            // An end without a grpc-status is no gRPC answer at all.
            Poll::Ready(None) => this.call.finish(tonic::Code::Unknown),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kiln_methods_are_labelled() {
        let known = method_labels("/kiln.v1.JobService/SubmitJob");
        assert_eq!(
            (known.grpc_service, known.grpc_method),
            ("kiln.v1.JobService", "SubmitJob")
        );
        let made_up = method_labels("/kiln.v1.JobService/Nope123");
        assert_eq!((made_up.grpc_service, made_up.grpc_method), ("other", "other"));
        assert_eq!(method_labels("/grpc.health.v1.Health/Check").grpc_method, "other");
    }

    #[test]
    fn every_code_has_its_spec_name() {
        for code in 0..17 {
            let name = code_name(tonic::Code::from_i32(code));
            assert!(name.chars().all(|c| c.is_ascii_uppercase() || c == '_'), "{name}");
        }
    }
}
