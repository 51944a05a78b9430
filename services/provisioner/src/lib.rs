//! kiln-provisioner: launches the machines the queue needs, adopts what a crash left, and
//! releases what is idle, unregistered or unknown (docs/provisioner.md).
#![forbid(unsafe_code)]

pub mod config;
pub mod cycle;
pub mod error;
pub mod launch;
pub mod plan;
pub mod release;
pub mod service;
pub mod unavailable;
