//! Items from object storage: the objects under a prefix (their paths as URIs), or the lines of
//! a manifest object, both among the outputs of the batch's project's jobs (what its members may
//! read; no other object of kiln's store). Both are read as streams and added in messages of at most
//! [`MAX_ITEMS_PER_MESSAGE`], so neither a listing of millions of objects nor a manifest of
//! gigabytes is ever held whole; items go in listing order (lexicographic on S3).

use std::sync::Arc;

use futures::StreamExt;
use kiln_proto::v1 as pb;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

use crate::Shared;
use crate::error::{Error, Result};
use crate::grpc::{MAX_ITEMS_PER_MESSAGE, MAX_URI_BYTES, check_items};
use crate::intake::Intake;

/// Adds URIs to a batch a message at a time.
struct Adder {
    intake: Intake,
    pending: Vec<String>,
    seen: u64,
}

impl Adder {
    fn new(shared: &Arc<Shared>, batch_id: &str) -> Self {
        Adder {
            intake: Intake::start(shared.clone(), batch_id.to_string()),
            pending: Vec::new(),
            seen: 0,
        }
    }

    async fn push(&mut self, uri: String) -> Result<()> {
        self.pending.push(uri);
        self.seen += 1;
        if self.pending.len() == MAX_ITEMS_PER_MESSAGE {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let items = self
            .pending
            .drain(..)
            .map(|uri| pb::Item {
                key: String::new(),
                uri,
                params: Default::default(),
            })
            .collect();
        self.intake.add(check_items(items)?).await
    }

    /// Adds what is left; returns (added, duplicates).
    async fn finish(mut self) -> Result<(u64, u64)> {
        self.flush().await?;
        self.intake.finish().await
    }
}

/// Where a batch may take items from: the outputs of jobs of its own project
/// (`outputs/<job id>/...`). `None` for a location of a job of another project or of no job,
/// which the caller is told about as of a location that holds nothing; an error for a path
/// that is no outputs location at all.
async fn readable_location(shared: &Shared, project: &str, text: &str) -> Result<Option<ObjectPath>> {
    let path = kiln_core::objects::relative_path(text)
        .ok_or_else(|| Error::InvalidArgument(format!("{text:?} is not a relative object path")))?;
    let mut parts = path.parts();
    let (Some(root), Some(job_id)) = (parts.next(), parts.next()) else {
        return Err(Error::InvalidArgument(format!(
            "{text:?} is not a job's outputs: a batch takes items from outputs/<job id>/... of its project's jobs"
        )));
    };
    if root.as_ref() != "outputs" {
        return Err(Error::InvalidArgument(format!(
            "{text:?} is not a job's outputs: a batch takes items from outputs/<job id>/... of its project's jobs"
        )));
    }
    let Ok(job_id) = kiln_core::ids::parse_id("job", job_id.as_ref()) else {
        return Ok(None);
    };
    match shared.store.job(&job_id).await {
        Ok(job) if job.project == project => Ok(Some(path)),
        Ok(_) | Err(kiln_core::store::StoreError::JobNotFound { .. }) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Adds the objects under `prefix` (outputs of a job of the batch's `project`) as items;
/// returns (added, duplicates).
pub(crate) async fn add_from_prefix(
    shared: &Arc<Shared>,
    batch_id: &str,
    project: &str,
    prefix: &str,
) -> Result<(u64, u64)> {
    let Some(prefix) = readable_location(shared, project, prefix).await? else {
        return Err(Error::InvalidArgument(format!("no objects under {prefix}")));
    };
    let mut adder = Adder::new(shared, batch_id);
    let mut listing = shared.objects.list(Some(&prefix));
    while let Some(meta) = listing.next().await {
        adder.push(meta?.location.to_string()).await?;
    }
    if adder.seen == 0 {
        return Err(Error::InvalidArgument(format!("no objects under {prefix}")));
    }
    adder.finish().await
}

/// Adds the lines of a manifest object as items, one URI per line (blank lines and lines
/// starting with # are skipped); returns (added, duplicates).
pub(crate) async fn add_from_manifest(
    shared: &Arc<Shared>,
    batch_id: &str,
    project: &str,
    path: &str,
) -> Result<(u64, u64)> {
    let Some(location) = readable_location(shared, project, path).await? else {
        return Err(Error::InvalidArgument(format!("manifest {path} does not exist")));
    };
    let mut chunks = match shared.objects.get(&location).await {
        Ok(object) => object.into_stream(),
        Err(object_store::Error::NotFound { .. }) => {
            return Err(Error::InvalidArgument(format!("manifest {location} does not exist")));
        }
        Err(error) => return Err(error.into()),
    };
    let mut adder = Adder::new(shared, batch_id);
    let mut lines = ManifestLines::default();
    while let Some(chunk) = chunks.next().await {
        for line in lines.feed(&chunk?).map_err(|why| manifest_error(&location, why))? {
            adder.push(line).await?;
        }
    }
    if let Some(line) = lines.finish().map_err(|why| manifest_error(&location, why))? {
        adder.push(line).await?;
    }
    adder.finish().await
}

fn manifest_error(location: &object_store::path::Path, why: String) -> Error {
    Error::InvalidArgument(format!("manifest {location}: {why}"))
}

/// Splits a manifest's bytes into its item lines as they arrive, holding at most one line.
#[derive(Default)]
struct ManifestLines {
    /// The start of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// Lines read so far, for messages.
    number: u64,
}

impl ManifestLines {
    /// Returns the item lines `bytes` completes.
    fn feed(&mut self, mut bytes: &[u8]) -> std::result::Result<Vec<String>, String> {
        let mut lines = Vec::new();
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            self.partial.extend_from_slice(&bytes[..end]);
            bytes = &bytes[end + 1..];
            let line = std::mem::take(&mut self.partial);
            lines.extend(self.line(line)?);
        }
        self.partial.extend_from_slice(bytes);
        self.check_length()?;
        Ok(lines)
    }

    /// Returns the last line when the manifest does not end with a newline.
    fn finish(mut self) -> std::result::Result<Option<String>, String> {
        let line = std::mem::take(&mut self.partial);
        self.line(line)
    }

    fn check_length(&self) -> std::result::Result<(), String> {
        // A URI of MAX_URI_BYTES, and room for blanks around it and a \r.
        if self.partial.len() > MAX_URI_BYTES + 64 {
            return Err(format!("line {} is longer than {MAX_URI_BYTES} bytes", self.number + 1));
        }
        Ok(())
    }

    fn line(&mut self, line: Vec<u8>) -> std::result::Result<Option<String>, String> {
        self.number += 1;
        if line.len() > MAX_URI_BYTES + 64 {
            return Err(format!("line {} is longer than {MAX_URI_BYTES} bytes", self.number));
        }
        let text = String::from_utf8(line).map_err(|_| format!("line {} is not UTF-8 text", self.number))?;
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            return Ok(None);
        }
        Ok(Some(text.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_come_out_whole() {
        let mut lines = ManifestLines::default();
        let mut got = Vec::new();
        for chunk in ["# uris\nmem:", "//x\r\n\n  mem://y  \ninbox", "/a"] {
            got.extend(lines.feed(chunk.as_bytes()).unwrap());
        }
        got.extend(lines.finish().unwrap());
        assert_eq!(got, ["mem://x", "mem://y", "inbox/a"]);
    }

    #[test]
    fn an_endless_line_is_refused_without_being_held() {
        let mut lines = ManifestLines::default();
        let chunk = vec![b'x'; 1024];
        let error = (0..100)
            .find_map(|_| lines.feed(&chunk).err())
            .expect("a long line is refused");
        assert!(error.contains("line 1 is longer"), "{error}");
        assert!(lines.partial.len() < MAX_URI_BYTES + 2048);

        let mut lines = ManifestLines::default();
        assert!(
            lines
                .feed(b"ok\n\xff\xfe\n")
                .unwrap_err()
                .contains("line 2 is not UTF-8")
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// However a manifest is cut into chunks, the same lines come out (or the same
            /// refusal), and no more than one line's worth is ever held.
            #[test]
            fn chunks_do_not_change_the_lines(
                manifest in prop::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b' '), Just(b'#'), Just(0xff), any::<u8>()], 0..600),
                cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            ) {
                let read = |chunks: Vec<&[u8]>| -> std::result::Result<Vec<String>, String> {
                    let mut lines = ManifestLines::default();
                    let mut got = Vec::new();
                    for chunk in chunks {
                        got.extend(lines.feed(chunk)?);
                        assert!(lines.partial.len() <= MAX_URI_BYTES + 64);
                    }
                    got.extend(lines.finish()?);
                    Ok(got)
                };
                let mut at: Vec<usize> = cuts.iter().map(|cut| cut.index(manifest.len() + 1)).collect();
                at.sort_unstable();
                let mut chunks = Vec::new();
                let mut start = 0;
                for end in at {
                    chunks.push(&manifest[start..end]);
                    start = end;
                }
                chunks.push(&manifest[start..]);
                let whole = read(vec![manifest.as_slice()]);
                prop_assert_eq!(read(chunks), whole.clone());
                if let Ok(lines) = whole {
                    prop_assert!(lines.iter().all(|line| !line.is_empty() && !line.starts_with('#') && line.trim() == line));
                }
            }
        }
    }
}
