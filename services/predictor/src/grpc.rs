//! The Open Inference Protocol over gRPC: `inference.GRPCInferenceService` (KServe v2, with
//! Triton's model configuration), answering as the REST API in [`crate::http`] does.
//!
//! | method | answers |
//! |---|---|
//! | `ServerLive`, `ServerReady` | true (no token needed) |
//! | `ServerMetadata` | `kiln`, its version and extensions |
//! | `ModelMetadata`, `ModelConfig` | the service's inputs and outputs |
//! | `ModelReady` | true for a service the caller may use |
//! | `ModelInfer` | inference: inputs raw (`raw_input_contents`) or typed (`contents`), outputs raw |
//! | `ModelStatistics` | UNIMPLEMENTED: the statistics are the predictor's Prometheus metrics |
//!
//! A model is named as over HTTP: a service's `NAME`, or `PROJECT/NAME` (names are unique per
//! project; [`infer::service`]), and the answers name it as the request did.
//!
//! Every other call needs `authorization: Bearer <token>` of a viewer of the service's project,
//! checked here rather than by kiln's `AuthLayer` (whose policy table lists kiln's methods only:
//! [`ExceptInference`] keeps it off these calls). Parameters are bool, int64, uint64, double
//! or string values; `parameters["timeout"]` (µs) is the deadline, as over HTTP; the reply's
//! `kiln.*` parameters say how it was made. Errors carry their kind's code: INVALID_ARGUMENT
//! for the request's fault (an unknown model included), UNAUTHENTICATED, PERMISSION_DENIED,
//! UNAVAILABLE (no worker), DEADLINE_EXCEEDED (too few members in time) or INTERNAL.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use kiln_core::serving::{ServiceSpec, TensorSpec};
use kiln_proto::inference as pb;
use kiln_proto::inference::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::{Error, Result, Shared, infer};

mod convert;

use convert::config_type;
pub use convert::{infer_request, infer_response};

/// The path prefix of the service's methods.
pub const SERVICE_PATH: &str = "/inference.GRPCInferenceService/";

/// The protocol extensions the gRPC service has.
const EXTENSIONS: [&str; 3] = ["binary_tensor_data", "parameters", "model_configuration"];

/// `GRPCInferenceService` over the predictor's services.
pub struct InferenceApi {
    shared: Arc<Shared>,
}

impl InferenceApi {
    pub fn new(shared: Arc<Shared>) -> InferenceApi {
        InferenceApi { shared }
    }

    /// The tonic service, taking messages up to the predictor's `max-body-bytes`.
    pub fn server(self) -> GrpcInferenceServiceServer<InferenceApi> {
        let limit = self.shared.config.max_body_bytes;
        GrpcInferenceServiceServer::new(self).max_decoding_message_size(limit)
    }

    /// The service `name` at `version` (empty: the serving revision), if the caller may use it.
    async fn spec(&self, metadata: &MetadataMap, name: &str, version: &str) -> Result<Arc<ServiceSpec>, Status> {
        let headers = metadata.clone().into_headers();
        let principal = kiln_core::auth::authenticate(&self.shared.tokens, &headers).await?;
        let spec = infer::service(&self.shared, &principal, name).await.map_err(status)?;
        infer::at_version(spec, Some(version).filter(|version| !version.is_empty())).map_err(status)
    }
}

fn status(error: Error) -> Status {
    Status::new(error.kind().code(), error.public_message())
}

fn platform(spec: &ServiceSpec) -> String {
    format!("kiln-ensemble-{}", spec.ensemble.as_str())
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceApi {
    async fn server_live(
        &self,
        _request: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _request: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        Ok(Response::new(pb::ServerReadyResponse { ready: true }))
    }

    async fn model_ready(
        &self,
        request: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let asked = request.get_ref();
        self.spec(request.metadata(), &asked.name, &asked.version).await?;
        Ok(Response::new(pb::ModelReadyResponse { ready: true }))
    }

    async fn server_metadata(
        &self,
        request: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        let headers = request.metadata().clone().into_headers();
        kiln_core::auth::authenticate(&self.shared.tokens, &headers).await?;
        Ok(Response::new(pb::ServerMetadataResponse {
            name: "kiln".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: EXTENSIONS.iter().map(|extension| (*extension).into()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let asked = request.get_ref();
        let spec = self.spec(request.metadata(), &asked.name, &asked.version).await?;
        let tensors = |specs: &[TensorSpec]| {
            specs
                .iter()
                .map(|tensor| pb::model_metadata_response::TensorMetadata {
                    name: tensor.name.clone(),
                    datatype: tensor.datatype.clone(),
                    shape: tensor.shape.clone(),
                })
                .collect()
        };
        Ok(Response::new(pb::ModelMetadataResponse {
            // As the client named it (`PROJECT/NAME` too).
            name: asked.name.clone(),
            versions: vec![spec.revision.to_string()],
            platform: platform(&spec),
            inputs: tensors(&spec.inputs),
            outputs: tensors(&spec.outputs),
            properties: HashMap::new(),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        let (metadata, _, message) = request.into_parts();
        let spec = self
            .spec(&metadata, &message.model_name, &message.model_version)
            .await?;
        let named = message.model_name.clone();
        let request = infer_request(message, &self.shared.limits).map_err(status)?;
        let mut response = infer::infer(&self.shared, &spec, request).await.map_err(status)?;
        response.model_name = named;
        Ok(Response::new(infer_response(response)))
    }

    async fn model_config(
        &self,
        request: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let asked = request.get_ref();
        let spec = self.spec(request.metadata(), &asked.name, &asked.version).await?;
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(pb::ModelConfig {
                name: asked.name.clone(),
                platform: platform(&spec),
                backend: "kiln".into(),
                max_batch_size: 0,
                input: spec
                    .inputs
                    .iter()
                    .map(|tensor| pb::ModelInput {
                        name: tensor.name.clone(),
                        data_type: config_type(&tensor.datatype) as i32,
                        dims: tensor.shape.clone(),
                        optional: false,
                    })
                    .collect(),
                output: spec
                    .outputs
                    .iter()
                    .map(|tensor| pb::ModelOutput {
                        name: tensor.name.clone(),
                        data_type: config_type(&tensor.datatype) as i32,
                        dims: tensor.shape.clone(),
                    })
                    .collect(),
            }),
        }))
    }

    async fn model_statistics(
        &self,
        _request: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        Err(Status::unimplemented(
            "the predictor keeps no per-model statistics to answer with; its Prometheus metrics (kiln_predictor_requests, kiln_predictor_request_duration_seconds, per service) are served at /metrics",
        ))
    }
}

// === impl ExceptInference ===

/// Applies a layer (kiln's `AuthLayer`) to every call but this service's, which authenticate
/// in their handlers: the layer's policy table lists kiln's methods only and would refuse
/// these, and `ServerLive` and `ServerReady` need no token.
#[derive(Clone)]
pub struct ExceptInference<L> {
    layer: L,
}

impl<L> ExceptInference<L> {
    pub fn new(layer: L) -> ExceptInference<L> {
        ExceptInference { layer }
    }
}

impl<S: Clone, L: tower::Layer<S>> tower::Layer<S> for ExceptInference<L> {
    type Service = ExceptInferenceService<L::Service, S>;

    fn layer(&self, inner: S) -> Self::Service {
        ExceptInferenceService {
            guarded: self.layer.layer(inner.clone()),
            open: inner,
        }
    }
}

/// The service [`ExceptInference`] makes: `open` for this service's calls, `guarded` (the
/// same routes inside the layer) for the others.
#[derive(Clone)]
pub struct ExceptInferenceService<G, S> {
    guarded: G,
    open: S,
}

impl<G, S, B> tower::Service<http::Request<B>> for ExceptInferenceService<G, S>
where
    G: tower::Service<http::Request<B>>,
    S: tower::Service<http::Request<B>, Response = G::Response, Error = G::Error>,
{
    type Response = G::Response;
    type Error = G::Error;
    type Future = Either<G::Future, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match (self.guarded.poll_ready(cx)?, self.open.poll_ready(cx)?) {
            (Poll::Ready(()), Poll::Ready(())) => Poll::Ready(Ok(())),
            _ => Poll::Pending,
        }
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path().starts_with(SERVICE_PATH) {
            Either::Right(self.open.call(request))
        } else {
            Either::Left(self.guarded.call(request))
        }
    }
}
