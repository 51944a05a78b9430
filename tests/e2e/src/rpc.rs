//! Calling any RPC of kiln by its path with raw protobuf bytes, and building each method's
//! request from the proto descriptors: what the authorisation matrix (tests/authz.rs) runs on,
//! so a new RPC is called the day it is added.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BufMut};
use kiln_proto::v1 as pb;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet, MethodDescriptorProto};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// The objects of the project the requests address.
#[derive(Debug, Clone)]
pub struct Targets {
    pub job_id: String,
    pub batch_id: String,
    pub sweep_id: String,
}

// === generic calls ===

/// Sends and receives raw protobuf bytes.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Calls `path` at `addr` with one request message; returns the first answer's bytes.
pub async fn call(
    addr: SocketAddr,
    method: &MethodDescriptorProto,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    call_within(addr, method, path, token, body, Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("{path} did not answer"))
}

/// [`call`], or `None` when no answer came within `patience` (a stream that waits for events).
pub async fn call_within(
    addr: SocketAddr,
    method: &MethodDescriptorProto,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
    patience: Duration,
) -> Option<Result<Vec<u8>, tonic::Status>> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path: http::uri::PathAndQuery = path.parse().expect("path");
    let client_streaming = method.client_streaming();
    let server_streaming = method.server_streaming();
    let answer = async {
        match (client_streaming, server_streaming) {
            (false, false) => Ok(grpc
                .unary(with_token(token, tonic::Request::new(body)), path, RawCodec)
                .await?
                .into_inner()),
            (true, false) => {
                let stream = futures::stream::iter(vec![body]);
                Ok(grpc
                    .client_streaming(with_token(token, tonic::Request::new(stream)), path, RawCodec)
                    .await?
                    .into_inner())
            }
            (false, true) => {
                let mut stream = grpc
                    .server_streaming(with_token(token, tonic::Request::new(body)), path, RawCodec)
                    .await?
                    .into_inner();
                Ok(stream.message().await?.unwrap_or_default())
            }
            (true, true) => {
                let stream = futures::stream::iter(vec![body]);
                let mut stream = grpc
                    .streaming(with_token(token, tonic::Request::new(stream)), path, RawCodec)
                    .await?
                    .into_inner();
                Ok(stream.message().await?.unwrap_or_default())
            }
        }
    };
    tokio::time::timeout(patience, answer).await.ok()
}

/// Adds the bearer token, when there is one.
fn with_token<T>(token: Option<&str>, mut request: tonic::Request<T>) -> tonic::Request<T> {
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().expect("header"));
    }
    request
}

// === requests from descriptors ===

pub struct Requests<'a> {
    messages: Vec<(String, &'a DescriptorProto)>,
}

impl<'a> Requests<'a> {
    pub fn new(set: &'a FileDescriptorSet) -> Requests<'a> {
        let mut messages = Vec::new();
        for file in &set.file {
            for message in &file.message_type {
                messages.push((format!(".{}.{}", file.package(), message.name()), message));
            }
        }
        Requests { messages }
    }

    pub fn get(&self, name: &str) -> &'a DescriptorProto {
        self.messages
            .iter()
            .find(|(full, _)| full == name)
            .map(|(_, message)| *message)
            .unwrap_or_else(|| panic!("no message {name}"))
    }

    /// Encodes a request of type `name`: its id, project and name fields point at alpha's
    /// objects, nested specs (and a watched list) are filled the same way, everything else is
    /// left at its default.
    pub fn request(&self, name: &str, targets: &Targets) -> Vec<u8> {
        let message = self.get(name);
        let short = name.rsplit('.').next().unwrap_or(name);
        let mut out = Vec::new();
        for field in &message.field {
            let number = field.number() as u32;
            let repeated = field.label() == Label::Repeated;
            let text = match field.name() {
                "job_id" | "job_ids" => Some(targets.job_id.clone()),
                "batch_id" => Some(targets.batch_id.clone()),
                "sweep_id" => Some(targets.sweep_id.clone()),
                "project" => Some("alpha".to_string()),
                "scope" => Some("project:alpha".to_string()),
                "user" => Some("bystander".to_string()),
                "token" => Some("no-such-token".to_string()),
                "digest" => Some("0".repeat(64)),
                "path" => Some("out.txt".to_string()),
                "value" => Some("matrix-value".to_string()),
                "command" => Some(if short == "BatchSpec" { "echo {uri}" } else { "true" }.to_string()),
                "name" => Some(
                    match short {
                        "ProjectRef" | "CreateProjectRequest" => "alpha",
                        "SetSecretRequest" | "DeleteSecretRequest" => "ALPHA_KEY",
                        "DeleteDatasetRequest" | "CreateDatasetRequest" => "alpha-data",
                        "UserRef" | "CreateUserRequest" => "alpha-maintainer",
                        _ => "matrix",
                    }
                    .to_string(),
                ),
                _ => None,
            };
            match (field.r#type(), text) {
                (Type::String, Some(text)) => {
                    let values: Vec<String> = if repeated {
                        text.split(' ').map(String::from).collect()
                    } else {
                        vec![text]
                    };
                    for value in values {
                        prost::encoding::string::encode(number, &value, &mut out);
                    }
                }
                // Members are added as members; tokens are narrowed to viewer, which every role
                // of alpha may hand out (narrowing above one's role is its own test).
                (Type::Enum, _) if field.name() == "role" => {
                    let role = if short == "CreateTokenRequest" {
                        pb::Role::Viewer
                    } else {
                        pb::Role::Member
                    };
                    prost::encoding::int32::encode(number, &(role as i32), &mut out)
                }
                // (`list`: the list a WatchJobs watches, with the filters of a ListJobs.)
                (Type::Message, _) if matches!(field.name(), "spec" | "header" | "hello" | "list") => {
                    let nested = self.request(field.type_name(), targets);
                    prost::encoding::encode_key(number, prost::encoding::WireType::LengthDelimited, &mut out);
                    prost::encoding::encode_varint(nested.len() as u64, &mut out);
                    out.extend_from_slice(&nested);
                }
                _ => {}
            }
        }
        out
    }
}
