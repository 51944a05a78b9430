//! kiln/v1 protobuf messages and gRPC clients and servers, generated from `proto/kiln/v1` at
//! build time. The Python SDK generates from the same files.

pub mod v1 {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("kiln.v1");
}

include!(concat!(env!("OUT_DIR"), "/rpc_methods.rs"));

/// The encoded `FileDescriptorSet` of kiln/v1: what tests read to reach every RPC generically.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kiln_v1_descriptors.bin"));
