//! Syncing an instance's outputs to object storage, under `outputs/<job>/<path>`: while the job
//! runs (every `sync-interval-secs`, when it asks, at a checkpoint notice) and when it ends; and
//! packing them again for the attempt that resumes ([`restore`]).
//!
//! A sync is incremental. The [`Manifest`] of an instance remembers each file's size,
//! modification time and SHA-256 as last synced: a file whose size and time are unchanged is
//! skipped unread; one whose time moved is hashed and sent only when its content changed; a
//! file gone since is deleted from the store. A time is trusted only when it lies in a whole
//! second before the sync that read it began (git's "racily clean" rule), since a file written
//! again within that second may keep both its size and its time. Only what this instance's own
//! syncs stored is ever deleted: a fresh manifest (the first sync of an instance, or the one
//! after a failed sync) sends everything and deletes nothing, so objects others put under the
//! prefix, and what an earlier attempt synced that this one never saw, are left alone.
//!
//! Files are read one at a time and streamed up in parts, so a large checkpoint never sits in
//! memory whole. Paths are checked like any user input: nothing outside the job's prefix is
//! written; symlinks and special files are skipped.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek};
use std::path::Path;
use std::sync::Arc;

use kiln_core::objects::{join, outputs_prefix, relative_path};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::runtime::Handle;

use crate::error::{Error, Result};
use crate::provider::Outputs;

mod restore;
pub(crate) use restore::directory_header;
pub use restore::pack_synced;

/// Bytes read and sent per part.
const PART: usize = 8 << 20;

/// Files and bytes written (or packed).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    pub files: u64,
    pub bytes: u64,
}

/// What one sync did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncReport {
    /// What was sent: new and changed files.
    pub written: Synced,
    /// Every file the outputs hold now, sent or not.
    pub total: Synced,
    /// Objects deleted because their files are gone.
    pub deleted: u64,
}

/// What the last sync of one instance's outputs stored, by relative path.
#[derive(Debug, Default, Clone)]
pub struct Manifest {
    files: HashMap<String, Recorded>,
}

#[derive(Debug, Clone)]
struct Recorded {
    size: u64,
    /// Seconds and nanoseconds since the epoch.
    mtime: (i64, u32),
    sha256: [u8; 32],
    /// The time lies in a whole second before the sync that recorded it began.
    settled: bool,
}

/// One file of the outputs, as a sync meets it.
struct Found<'a> {
    path: String,
    size: u64,
    mtime: (i64, u32),
    /// Opens the file's content afresh (it is read once to hash and once to send).
    open: &'a dyn Fn() -> Result<Box<dyn Read>>,
}

/// Brings `outputs/<job>/` in the object store to the outputs as they are now, sending only
/// what changed since `manifest`. Returns the manifest for the next sync; on an error the
/// caller keeps a fresh one, so the next sync sends everything again.
pub async fn sync(
    objects: Arc<dyn ObjectStore>,
    job_id: &str,
    outputs: Outputs,
    manifest: Manifest,
) -> Result<(SyncReport, Manifest)> {
    let prefix = outputs_prefix(job_id);
    let handle = Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut syncing = Syncing::new(&handle, objects.as_ref(), prefix, manifest);
        match outputs {
            Outputs::None => return Ok((SyncReport::default(), syncing.manifest)),
            Outputs::Dir(dir) => sync_dir(&mut syncing, &dir)?,
            Outputs::Tar(path) => sync_tar(&mut syncing, &path)?,
        }
        syncing.finish()
    })
    .await
    .map_err(|e| Error::io("output sync")(std::io::Error::other(e)))?
}

/// One sync under way.
struct Syncing<'a> {
    handle: &'a Handle,
    objects: &'a dyn ObjectStore,
    prefix: ObjectPath,
    manifest: Manifest,
    /// Whole seconds since the epoch when the sync began.
    began: i64,
    seen: HashSet<String>,
    report: SyncReport,
}

impl<'a> Syncing<'a> {
    fn new(handle: &'a Handle, objects: &'a dyn ObjectStore, prefix: ObjectPath, manifest: Manifest) -> Self {
        Syncing {
            handle,
            objects,
            prefix,
            manifest,
            began: kiln_core::ids::now_ms().div_euclid(1000),
            seen: HashSet::new(),
            report: SyncReport::default(),
        }
    }

    /// Sends `found` unless the store holds it already.
    fn file(&mut self, found: Found<'_>) -> Result<()> {
        let Some(location) = relative_path(&found.path) else {
            return Ok(());
        };
        if location.as_ref() == crate::provider::SYNC_MARKER {
            return Ok(());
        }
        let key = location.to_string();
        if !self.seen.insert(key.clone()) {
            return Ok(());
        }
        self.report.total.files += 1;
        self.report.total.bytes += found.size;
        let settled = found.mtime.0 < self.began;
        let known = self.manifest.files.get(&key);
        if known.is_some_and(|known| known.settled && known.size == found.size && known.mtime == found.mtime) {
            return Ok(());
        }
        let sha256 = hash((found.open)()?)?;
        let same = known.is_some_and(|known| known.size == found.size && known.sha256 == sha256);
        if !same {
            let sent = put(
                self.handle,
                self.objects,
                &join(&self.prefix, &location),
                (found.open)()?,
            )?;
            self.report.written.files += 1;
            self.report.written.bytes += sent;
        }
        self.manifest.files.insert(
            key,
            Recorded {
                size: found.size,
                mtime: found.mtime,
                sha256,
                settled,
            },
        );
        Ok(())
    }

    /// Deletes what is gone from the outputs.
    fn finish(mut self) -> Result<(SyncReport, Manifest)> {
        let gone: Vec<String> = self
            .manifest
            .files
            .keys()
            .filter(|path| !self.seen.contains(*path))
            .cloned()
            .collect();
        for path in gone {
            self.manifest.files.remove(&path);
            let Ok(relative) = ObjectPath::parse(&path) else {
                continue;
            };
            match self
                .handle
                .block_on(self.objects.delete(&join(&self.prefix, &relative)))
            {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
            self.report.deleted += 1;
        }
        Ok((self.report, self.manifest))
    }
}

/// A file's modification time since the epoch (zero when the filesystem cannot say).
pub(crate) fn modified(metadata: &std::fs::Metadata) -> std::time::Duration {
    metadata
        .modified()
        .ok()
        .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default()
}

fn hash(mut reader: impl Read) -> Result<[u8; 32]> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut reader, &mut hasher).map_err(Error::io("cannot read an output"))?;
    Ok(hasher.finalize().into())
}

fn sync_dir(syncing: &mut Syncing<'_>, dir: &Path) -> Result<()> {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = match std::fs::read_dir(&current) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(Error::io(format!("cannot list {}", current.display()))(error)),
        };
        for entry in entries {
            let entry = entry.map_err(Error::io("cannot list the outputs"))?;
            let file_type = entry.file_type().map_err(Error::io("cannot list the outputs"))?;
            let path = entry.path();
            if file_type.is_dir() {
                pending.push(path);
                continue;
            }
            if !file_type.is_file() {
                continue;
            }
            let metadata = match entry.metadata() {
                Ok(metadata) => metadata,
                // Deleted since it was listed: gone from the outputs.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(Error::io(format!("cannot read {}", path.display()))(error)),
            };
            let modified = modified(&metadata);
            let open = || -> Result<Box<dyn Read>> {
                let file = std::fs::File::open(&path).map_err(Error::io(format!("cannot read {}", path.display())))?;
                Ok(Box::new(file))
            };
            syncing.file(Found {
                path: path
                    .strip_prefix(dir)
                    .expect("walked paths are under the dir")
                    .to_string_lossy()
                    .into_owned(),
                size: metadata.len(),
                mtime: (
                    i64::try_from(modified.as_secs()).unwrap_or(i64::MAX),
                    modified.subsec_nanos(),
                ),
                open: &open,
            })?;
        }
    }
    Ok(())
}

/// An engine's archive (a spooled tar on this host): each changed entry is read twice, from its
/// place in the file.
fn sync_tar(syncing: &mut Syncing<'_>, path: &Path) -> Result<()> {
    let file = std::fs::File::open(path).map_err(Error::io(format!("cannot read {}", path.display())))?;
    let mut archive = tar::Archive::new(file);
    let entries = archive
        .entries()
        .map_err(Error::io("cannot read the outputs archive"))?;
    for entry in entries {
        let entry = entry.map_err(Error::io("cannot read the outputs archive"))?;
        let header = entry.header();
        if !header.entry_type().is_file() {
            continue;
        }
        let name = entry
            .path()
            .map_err(Error::io("cannot read the outputs archive"))?
            .to_string_lossy()
            .into_owned();
        // The engine's archive holds the directory itself first: outputs/<path>.
        let Some((_, inside)) = name.split_once('/') else {
            continue;
        };
        let size = entry.size();
        let mtime = header.mtime().map_err(Error::io("cannot read the outputs archive"))?;
        let offset = entry.raw_file_position();
        let open = || -> Result<Box<dyn Read>> {
            let mut file = std::fs::File::open(path).map_err(Error::io(format!("cannot read {}", path.display())))?;
            file.seek(std::io::SeekFrom::Start(offset))
                .map_err(Error::io("cannot read the outputs archive"))?;
            Ok(Box::new(file.take(size)))
        };
        syncing.file(Found {
            path: inside.to_string(),
            size,
            mtime: (i64::try_from(mtime).unwrap_or(i64::MAX), 0),
            open: &open,
        })?;
    }
    Ok(())
}

/// Streams `reader` to `location`: one put when it is small, parts otherwise.
fn put(handle: &Handle, objects: &dyn ObjectStore, location: &ObjectPath, mut reader: impl Read) -> Result<u64> {
    let mut first = Vec::with_capacity(PART.min(1 << 20));
    (&mut reader)
        .take(PART as u64)
        .read_to_end(&mut first)
        .map_err(Error::io("cannot read an output"))?;
    if first.len() < PART {
        let size = first.len() as u64;
        handle.block_on(objects.put(location, PutPayload::from(first)))?;
        return Ok(size);
    }
    let upload = handle.block_on(objects.put_multipart(location))?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
    let mut size = first.len() as u64;
    writer.write(&first);
    let mut buffer = vec![0u8; PART];
    // At most 4 parts in flight: memory stays bounded however slow the store is.
    let streamed: Result<()> = loop {
        let read = match reader.read(&mut buffer) {
            Ok(0) => break Ok(()),
            Ok(read) => read,
            Err(error) => break Err(Error::io("cannot read an output")(error)),
        };
        if let Err(error) = handle.block_on(writer.wait_for_capacity(4)) {
            break Err(error.into());
        }
        writer.write(&buffer[..read]);
        size += read as u64;
    };
    if let Err(error) = streamed {
        // An upload left open would keep its parts (and their storage) on S3.
        let _ = handle.block_on(writer.abort());
        return Err(error);
    }
    handle.block_on(writer.finish())?;
    Ok(size)
}

#[cfg(test)]
mod tests;
