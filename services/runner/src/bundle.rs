//! Unpacking a code bundle, a dataset or restored outputs (tar.gz), with the checks of
//! [`kiln_formats::archive`] (no entry leaves the directory; bytes, entries and headers bounded).

use std::io::Read;
use std::path::Path;

use kiln_formats::archive::{self, Limits};

use crate::error::{Error, Result};

/// Largest size a code bundle or a resumed attempt's restored outputs may unpack to.
pub const MAX_UNPACKED_BYTES: u64 = 64 << 30;
/// Most entries a code bundle or restored outputs may hold.
pub const MAX_ENTRIES: u64 = 1 << 20;
/// The limits of a code bundle and of restored outputs.
pub const LIMITS: Limits = Limits {
    max_bytes: MAX_UNPACKED_BYTES,
    max_entries: MAX_ENTRIES,
};

/// Unpacks a gzip-compressed tar from `reader` into `dest` (which should be empty), refusing
/// anything that could escape it or pass `limits`. Returns the number of entries.
pub fn unpack(reader: impl Read, dest: &Path, limits: Limits) -> Result<u64> {
    archive::unpack(reader, dest, limits).map_err(bad)
}

/// Checks a gzip-compressed tar as [`unpack`] would, without writing anything, so an archive
/// can be handed to an engine that unpacks it itself. Returns the number of entries.
pub fn check(reader: impl Read, limits: Limits) -> Result<u64> {
    archive::check(reader, limits).map_err(bad)
}

fn bad(error: kiln_formats::Error) -> Error {
    Error::BadBundle(error.to_string())
}
