//! The gRPC edge: errors become statuses here, and only here.

use tonic::Status;

use crate::error::Error;

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        kiln_core::error::status(error.kind(), &error)
    }
}
