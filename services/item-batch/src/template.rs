//! The per-item command template, parsed in kiln-formats (which the fuzz targets link alone).

pub use kiln_formats::template::{BUILTINS, MAX_COMMAND_BYTES, PLACEHOLDERS, Values, render, validate};
