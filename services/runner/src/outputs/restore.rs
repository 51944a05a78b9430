//! Packing the outputs earlier attempts synced into an archive for the attempt that resumes: a
//! restore streams each object into a tar.gz on the runner's disk, under the same relative
//! path, which the provider then unpacks into the new instance's outputs directory.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kiln_core::objects::relative_path;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use tokio::runtime::Handle;

use super::Synced;
use crate::error::{Error, Result};

/// Packs the objects under `prefix` (the outputs earlier attempts synced) into a tar.gz at
/// `archive`, each at its path below the prefix, with an entry for each directory above it,
/// refusing more than `max_bytes` in all. Entries belong to `owner` (uid, gid), or to root: an
/// engine that unpacks as root keeps the owner, so a job run as that user can write over what
/// it restored. Returns what it packed; when the prefix holds nothing, nothing is written.
pub async fn pack_synced(
    objects: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    archive: PathBuf,
    max_bytes: u64,
    owner: Option<(u64, u64)>,
) -> Result<Synced> {
    let mut listed: Vec<ObjectMeta> = objects.list(Some(&prefix)).try_collect().await?;
    listed.sort_by(|a, b| a.location.cmp(&b.location));
    let total = listed.iter().fold(0u64, |sum, meta| sum.saturating_add(meta.size));
    if total > max_bytes {
        return Err(Error::Restore(format!(
            "{prefix} holds {total} bytes, more than the limit of {max_bytes}"
        )));
    }
    if listed.is_empty() {
        return Ok(Synced::default());
    }
    let handle = Handle::current();
    let owner = owner.unwrap_or((0, 0));
    tokio::task::spawn_blocking(move || {
        pack_objects(&handle, objects.as_ref(), &prefix, listed, &archive, max_bytes, owner)
    })
    .await
    .map_err(|e| Error::Restore(e.to_string()))?
}

fn pack_objects(
    handle: &Handle,
    objects: &dyn ObjectStore,
    prefix: &ObjectPath,
    listed: Vec<ObjectMeta>,
    archive: &Path,
    max_bytes: u64,
    (uid, gid): (u64, u64),
) -> Result<Synced> {
    if let Some(dir) = archive.parent() {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("cannot create {}", dir.display())))?;
    }
    let file = std::fs::File::create(archive).map_err(Error::io(format!("cannot create {}", archive.display())))?;
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(file, flate2::Compression::fast()));
    let mut packed = Synced::default();
    let mut directories: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
    let mtime = u64::try_from(kiln_core::ids::now_ms() / 1000).unwrap_or(0);
    for meta in listed {
        let Some(inside) = meta.location.prefix_match(prefix) else {
            continue;
        };
        let inside: Vec<String> = inside.map(|part| part.as_ref().to_string()).collect();
        // Object names are checked like any path a job gave: only normal components.
        let Some(relative) = relative_path(&inside.join("/")) else {
            tracing::warn!(location = %meta.location, "skipping an output with an unsafe path");
            continue;
        };
        // Parents first, once each (the listing is sorted, so a directory's files follow it).
        let parents: Vec<&Path> = Path::new(relative.as_ref())
            .ancestors()
            .skip(1)
            .filter(|parent| !parent.as_os_str().is_empty())
            .collect();
        for directory in parents.into_iter().rev() {
            if directories.insert(directory.to_path_buf()) {
                let mut header = directory_header((uid, gid), mtime);
                builder
                    .append_data(&mut header, directory, std::io::empty())
                    .map_err(Error::io(format!("cannot pack {}", directory.display())))?;
            }
        }
        let got = handle.block_on(objects.get(&meta.location))?;
        let size = got.meta.size;
        packed.bytes = packed.bytes.saturating_add(size);
        if packed.bytes > max_bytes {
            return Err(Error::Restore(format!("{prefix} holds more than {max_bytes} bytes")));
        }
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_uid(uid);
        header.set_gid(gid);
        header.set_size(size);
        header.set_mtime(u64::try_from(meta.last_modified.timestamp()).unwrap_or(0));
        let mut reader = ObjectReader {
            handle,
            stream: got.into_stream(),
            chunk: Bytes::new(),
        }
        .take(size);
        builder
            .append_data(&mut header, relative.as_ref(), &mut reader)
            .map_err(Error::io(format!("cannot pack {}", meta.location)))?;
        if reader.limit() != 0 {
            return Err(Error::Restore(format!("{} changed while it was read", meta.location)));
        }
        packed.files += 1;
    }
    builder
        .into_inner()
        .and_then(|gz| gz.finish())
        .and_then(|mut file| file.flush())
        .map_err(Error::io(format!("cannot write {}", archive.display())))?;
    Ok(packed)
}

/// The tar header of a directory (mode 755) of `owner` (uid, gid), modified at `mtime`
/// (seconds since the epoch).
pub(crate) fn directory_header((uid, gid): (u64, u64), mtime: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_size(0);
    header.set_mtime(mtime);
    header
}

/// An object's bytes as a blocking reader, for a blocking thread.
struct ObjectReader<'a> {
    handle: &'a Handle,
    stream: BoxStream<'static, object_store::Result<Bytes>>,
    /// What is left of the last chunk read.
    chunk: Bytes,
}

impl Read for ObjectReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.handle.block_on(self.stream.next()) {
                None => return Ok(0),
                Some(Ok(chunk)) => self.chunk = chunk,
                Some(Err(error)) => return Err(std::io::Error::other(error)),
            }
        }
        let count = buffer.len().min(self.chunk.len());
        buffer[..count].copy_from_slice(&self.chunk.split_to(count));
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use kiln_core::objects::outputs_prefix;
    use object_store::PutPayload;
    use object_store::local::LocalFileSystem;

    use super::*;
    use crate::outputs::{Manifest, PART, sync};
    use crate::provider::Outputs;

    #[tokio::test]
    async fn synced_outputs_pack_into_an_archive_that_unpacks_under_their_paths() {
        let store_dir = tempfile::tempdir().unwrap();
        let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(store_dir.path()).unwrap());
        let outputs = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outputs.path().join("ckpt")).unwrap();
        std::fs::write(outputs.path().join("ckpt/step.txt"), "step-42\n").unwrap();
        std::fs::write(outputs.path().join("model.bin"), vec![7u8; PART + 10]).unwrap();
        sync(
            objects.clone(),
            "j1",
            Outputs::Dir(outputs.path().to_path_buf()),
            Manifest::default(),
        )
        .await
        .unwrap();
        // Another job's outputs, with a longer name, are not packed.
        objects
            .put(&ObjectPath::from("outputs/j10/other.txt"), PutPayload::from("x"))
            .await
            .unwrap();

        let work = tempfile::tempdir().unwrap();
        let archive = work.path().join("restore.tar.gz");
        let packed = pack_synced(
            objects.clone(),
            outputs_prefix("j1"),
            archive.clone(),
            1 << 30,
            Some((1000, 1001)),
        )
        .await
        .unwrap();
        assert_eq!(
            packed,
            Synced {
                files: 2,
                bytes: 8 + PART as u64 + 10
            }
        );
        // Every entry, the directory `ckpt` included, belongs to the owner asked.
        let file = std::fs::File::open(&archive).unwrap();
        let mut entries: Vec<(String, u64, u64, bool)> = tar::Archive::new(flate2::read::GzDecoder::new(file))
            .entries()
            .unwrap()
            .map(|entry| {
                let header = entry.unwrap().header().clone();
                let path = header.path().unwrap().to_string_lossy().into_owned();
                let directory = header.entry_type() == tar::EntryType::Directory;
                (path, header.uid().unwrap(), header.gid().unwrap(), directory)
            })
            .collect();
        entries.sort();
        assert_eq!(
            entries,
            [
                ("ckpt".to_string(), 1000, 1001, true),
                ("ckpt/step.txt".to_string(), 1000, 1001, false),
                ("model.bin".to_string(), 1000, 1001, false),
            ]
        );
        let restored = work.path().join("outputs");
        std::fs::create_dir(&restored).unwrap();
        let file = std::fs::File::open(&archive).unwrap();
        assert_eq!(
            crate::bundle::unpack(file, &restored, crate::bundle::LIMITS).unwrap(),
            3
        );
        assert_eq!(
            std::fs::read_to_string(restored.join("ckpt/step.txt")).unwrap(),
            "step-42\n"
        );
        assert_eq!(std::fs::read(restored.join("model.bin")).unwrap().len(), PART + 10);

        // Nothing synced: nothing written.
        let nothing = work.path().join("nothing/restore.tar.gz");
        let packed = pack_synced(objects.clone(), outputs_prefix("j2"), nothing.clone(), 1 << 30, None)
            .await
            .unwrap();
        assert_eq!(packed, Synced::default());
        assert!(!nothing.parent().unwrap().try_exists().unwrap());
        // More than the limit: refused before anything is read.
        let error = pack_synced(objects, outputs_prefix("j1"), archive, PART as u64, None)
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Restore(_)), "{error}");
    }
}
