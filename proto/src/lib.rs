//! kiln/v1 protobuf messages and gRPC clients and servers, generated from `proto/kiln/v1` at
//! build time (the Python SDK generates from the same files), and apart from them the Open
//! Inference Protocol's gRPC service in [`inference`].

pub mod v1 {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("kiln.v1");
}

/// The Open Inference Protocol's gRPC service (`inference.GRPCInferenceService`, KServe v2 with
/// Triton's model configuration and statistics), generated from
/// `proto/inference/grpc_predict_v2.proto`. It is not kiln/v1: neither [`RPC_METHODS`] nor
/// [`FILE_DESCRIPTOR_SET`] lists it.
pub mod inference {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("inference");
}

include!(concat!(env!("OUT_DIR"), "/rpc_methods.rs"));

/// The encoded `FileDescriptorSet` of kiln/v1: what tests read to reach every RPC generically.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kiln_v1_descriptors.bin"));
