//! gRPC transcoding: a JSON request becomes its method's protobuf message (read from kiln/v1's
//! descriptors, so every method is reached the same way), goes with the caller's token to the
//! service that serves it (in-process for the api's own services, over a channel for the
//! others), and its answers come back as JSON. Validation, authorization and errors are the
//! gRPC services' own: this layer adds none of its own.

use std::collections::HashMap;

use futures::{Stream, StreamExt};
use prost::Message;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, MethodDescriptor, SerializeOptions,
};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::MetadataValue;

/// What answers a service's calls: a tower service speaking gRPC, failing (when it cannot take
/// a call at all) with the status to answer.
pub type Upstream =
    tower::util::BoxCloneSyncService<http::Request<tonic::body::Body>, http::Response<tonic::body::Body>, Status>;

/// The methods that can be called, and who serves each service.
pub struct Transcoder {
    pool: DescriptorPool,
    /// By the service's short name (`JobService`); a service with none here is not offered.
    upstreams: HashMap<String, Upstream>,
}

/// How a method is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Unary,
    ServerStreaming,
    /// A stream of requests, one answer: only a file's upload (`POST /api/v1/upload`).
    ClientStreaming,
}

/// A method found by its short service name and method name, with its upstream.
pub struct Call {
    method: MethodDescriptor,
    upstream: Upstream,
}

impl Transcoder {
    pub fn new(upstreams: HashMap<String, Upstream>) -> Transcoder {
        let pool = DescriptorPool::decode(kiln_proto::FILE_DESCRIPTOR_SET).expect("kiln/v1's descriptors decode");
        Transcoder { pool, upstreams }
    }

    /// The method `service`/`method` of kiln.v1, when it is offered with this shape.
    pub fn call(&self, service: &str, method: &str, shape: Shape) -> Result<Call, Status> {
        let unknown = || Status::not_found(format!("no method {service}/{method} (see proto/kiln/v1)"));
        let descriptor = self
            .pool
            .get_service_by_name(&format!("kiln.v1.{service}"))
            .ok_or_else(unknown)?;
        let method = descriptor.methods().find(|m| m.name() == method).ok_or_else(unknown)?;
        let found = match (method.is_client_streaming(), method.is_server_streaming()) {
            (false, false) => Shape::Unary,
            (false, true) => Shape::ServerStreaming,
            (true, false) if shape == Shape::ClientStreaming => Shape::ClientStreaming,
            (true, _) => {
                return Err(Status::unimplemented(format!(
                    "{service}/{method} takes a stream of requests: call it over gRPC",
                    method = method.name()
                )));
            }
        };
        if found != shape {
            let other = match found {
                Shape::Unary => "POST /api/v1/rpc",
                Shape::ServerStreaming => "GET /api/v1/stream",
                Shape::ClientStreaming => unreachable!("found only when asked for"),
            };
            return Err(Status::invalid_argument(format!(
                "{service}/{} is called with {other}/{service}/{}",
                method.name(),
                method.name()
            )));
        }
        let upstream = self.upstreams.get(service).cloned().ok_or_else(|| {
            Status::unavailable(format!(
                "this api has no address for {service}'s service ([http] in its config)"
            ))
        })?;
        Ok(Call { method, upstream })
    }
}

impl Call {
    /// Whether the method's request resumes after a position (`after_seq`, as `GetLogs` and
    /// `WatchJobs` take).
    pub fn resumes(&self) -> bool {
        self.method.input().get_field_by_name("after_seq").is_some()
    }

    /// Calls a unary method with a JSON request; its answer as JSON.
    pub async fn unary(self, token: &str, json: &[u8]) -> Result<Vec<u8>, Status> {
        let request = self.request(token, json)?;
        let path = self.path()?;
        let mut grpc = tonic::client::Grpc::new(self.upstream);
        grpc.ready().await?;
        let codec = DynamicCodec(self.method.output());
        let answer = grpc.unary(request, path, codec).await?;
        to_json(&answer.into_inner())
    }

    /// Calls a server-streaming method with a JSON request; its answers as JSON, each with its
    /// `seq` field when it has one.
    pub async fn server_streaming(
        self,
        token: &str,
        json: &[u8],
    ) -> Result<impl Stream<Item = Result<(Option<u64>, Vec<u8>), Status>> + use<>, Status> {
        let answers = self.server_streaming_messages(token, json).await?;
        Ok(answers.map(|answer| {
            let answer = answer?;
            // 0 is no position (stream sequences start at 1): such an answer gets no event id.
            let seq = answer
                .get_field_by_name("seq")
                .and_then(|value| value.as_u64())
                .filter(|seq| *seq > 0);
            Ok((seq, to_json(&answer)?))
        }))
    }

    /// Calls a server-streaming method whose answers carry a `bytes data` field (a file in
    /// chunks); the chunks' bytes.
    pub async fn download(
        self,
        token: &str,
        json: &[u8],
    ) -> Result<impl Stream<Item = Result<bytes::Bytes, Status>> + use<>, Status> {
        let output = self.method.output();
        if output.get_field_by_name("data").map(|field| field.kind()) != Some(prost_reflect::Kind::Bytes) {
            return Err(Status::invalid_argument(format!(
                "{} answers no file (its {} has no `bytes data`)",
                self.method.name(),
                output.name()
            )));
        }
        let answers = self.server_streaming_messages(token, json).await?;
        Ok(answers.map(|answer| {
            let answer = answer?;
            let data = answer.get_field_by_name("data");
            Ok(data.and_then(|value| value.as_bytes().cloned()).unwrap_or_default())
        }))
    }

    /// Calls a client-streaming method with `first` (JSON) as its first message, then one
    /// message per chunk with `field` set to the chunk's bytes; its answer as JSON.
    pub async fn client_streaming(
        self,
        token: &str,
        first: &[u8],
        field: &str,
        chunks: Vec<bytes::Bytes>,
    ) -> Result<Vec<u8>, Status> {
        let input = self.method.input();
        let chunk_field = input
            .get_field_by_name(field)
            .filter(|found| found.kind() == prost_reflect::Kind::Bytes)
            .ok_or_else(|| Status::internal(format!("{} has no `bytes {field}`", input.name())))?;
        let head = self.request(token, first)?;
        let (metadata, extensions, head) = head.into_parts();
        let mut messages = vec![head];
        for chunk in chunks {
            let mut message = DynamicMessage::new(input.clone());
            message.set_field(&chunk_field, prost_reflect::Value::Bytes(chunk));
            messages.push(message);
        }
        let request = tonic::Request::from_parts(metadata, extensions, futures::stream::iter(messages));
        let path = self.path()?;
        let mut grpc = tonic::client::Grpc::new(self.upstream);
        grpc.ready().await?;
        let codec = DynamicCodec(self.method.output());
        let answer = grpc.client_streaming(request, path, codec).await?;
        to_json(&answer.into_inner())
    }

    async fn server_streaming_messages(
        self,
        token: &str,
        json: &[u8],
    ) -> Result<tonic::Streaming<DynamicMessage>, Status> {
        let request = self.request(token, json)?;
        let path = self.path()?;
        let mut grpc = tonic::client::Grpc::new(self.upstream);
        grpc.ready().await?;
        let codec = DynamicCodec(self.method.output());
        Ok(grpc.server_streaming(request, path, codec).await?.into_inner())
    }

    fn request(&self, token: &str, json: &[u8]) -> Result<tonic::Request<DynamicMessage>, Status> {
        let json = if json.iter().all(u8::is_ascii_whitespace) {
            &b"{}"[..]
        } else {
            json
        };
        let mut deserializer = serde_json::Deserializer::from_slice(json);
        let message = DynamicMessage::deserialize_with_options(
            self.method.input(),
            &mut deserializer,
            &DeserializeOptions::new(),
        )
        .and_then(|message| deserializer.end().map(|()| message))
        .map_err(|error| {
            Status::invalid_argument(format!(
                "the body is not a {} in JSON: {error}",
                self.method.input().name()
            ))
        })?;
        let mut request = tonic::Request::new(message);
        let bearer = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Status::unauthenticated("the token is not valid text"))?;
        request.metadata_mut().insert("authorization", bearer);
        Ok(request)
    }

    fn path(&self) -> Result<http::uri::PathAndQuery, Status> {
        let path = format!("/{}/{}", self.method.parent_service().full_name(), self.method.name());
        path.parse().map_err(|_| Status::internal(format!("{path} is no path")))
    }
}

/// A message in the JSON the web UI reads: lowerCamelCase names, 64-bit integers as numbers,
/// enums by name, fields at their default included.
pub fn to_json(message: &DynamicMessage) -> Result<Vec<u8>, Status> {
    let options = SerializeOptions::new()
        .stringify_64_bit_integers(false)
        .skip_default_fields(false);
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::new(&mut out);
    message
        .serialize_with_options(&mut serializer, &options)
        .map_err(|error| Status::internal(format!("cannot write the answer as JSON: {error}")))?;
    Ok(out)
}

/// Encodes and decodes dynamic messages of one type.
struct DynamicCodec(MessageDescriptor);

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicCodec;
    type Decoder = DynamicCodec;

    fn encoder(&mut self) -> Self::Encoder {
        DynamicCodec(self.0.clone())
    }

    fn decoder(&mut self) -> Self::Decoder {
        DynamicCodec(self.0.clone())
    }
}

impl Encoder for DynamicCodec {
    type Item = DynamicMessage;
    type Error = Status;

    fn encode(&mut self, item: DynamicMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|error| Status::internal(format!("cannot encode the request: {error}")))
    }
}

impl Decoder for DynamicCodec {
    type Item = DynamicMessage;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, Status> {
        DynamicMessage::decode(self.0.clone(), src)
            .map(Some)
            .map_err(|error| Status::internal(format!("cannot decode the answer: {error}")))
    }
}
