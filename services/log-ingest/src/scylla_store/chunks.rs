//! Metric points packed into chunks of a CQL row, in kiln-formats (which the fuzz targets link
//! alone, since a stored row is read back as it is).

pub use kiln_formats::chunks::{CHUNK_POINTS, Chunk, Sample, merge, pack, samples, steps};
