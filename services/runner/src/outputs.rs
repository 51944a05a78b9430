//! Syncing an ended instance's outputs to object storage, under `outputs/<job>/<path>`, and
//! packing them again for the attempt that resumes a preempted one.
//!
//! Files are read one at a time and streamed up in parts, so a large checkpoint never sits in
//! memory whole. Paths are checked like any user input: nothing outside the job's prefix is
//! written; symlinks and special files are skipped. A restore streams each object into a tar.gz
//! on the runner's disk, under the same relative path, which the provider then unpacks into the
//! new instance's outputs directory.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kiln_core::objects::{join, outputs_prefix, relative_path};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use tokio::runtime::Handle;

use crate::error::{Error, Result};
use crate::provider::Outputs;

/// Bytes read and sent per part.
const PART: usize = 8 << 20;

/// What a sync wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    pub files: u64,
    pub bytes: u64,
}

/// Copies the outputs to `outputs/<job>/` in the object store.
pub async fn sync(objects: Arc<dyn ObjectStore>, job_id: &str, outputs: Outputs) -> Result<Synced> {
    let prefix = outputs_prefix(job_id);
    let handle = Handle::current();
    tokio::task::spawn_blocking(move || match outputs {
        Outputs::None => Ok(Synced::default()),
        Outputs::Dir(dir) => sync_dir(&handle, objects.as_ref(), &prefix, &dir),
        Outputs::Tar(path) => sync_tar(&handle, objects.as_ref(), &prefix, &path),
    })
    .await
    .map_err(|e| Error::io("output sync")(std::io::Error::other(e)))?
}

fn sync_dir(handle: &Handle, objects: &dyn ObjectStore, prefix: &ObjectPath, dir: &Path) -> Result<Synced> {
    let mut synced = Synced::default();
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
            let relative = path
                .strip_prefix(dir)
                .expect("walked paths are under the dir")
                .to_string_lossy()
                .into_owned();
            let Some(location) = relative_path(&relative) else {
                continue;
            };
            let file = std::fs::File::open(&path).map_err(Error::io(format!("cannot read {}", path.display())))?;
            synced.bytes += put(handle, objects, &join(prefix, &location), file)?;
            synced.files += 1;
        }
    }
    Ok(synced)
}

fn sync_tar(handle: &Handle, objects: &dyn ObjectStore, prefix: &ObjectPath, path: &Path) -> Result<Synced> {
    let file = std::fs::File::open(path).map_err(Error::io(format!("cannot read {}", path.display())))?;
    let mut archive = tar::Archive::new(file);
    let mut synced = Synced::default();
    let entries = archive
        .entries()
        .map_err(Error::io("cannot read the outputs archive"))?;
    for entry in entries {
        let entry = entry.map_err(Error::io("cannot read the outputs archive"))?;
        if !entry.header().entry_type().is_file() {
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
        let Some(location) = relative_path(inside) else {
            continue;
        };
        synced.bytes += put(handle, objects, &join(prefix, &location), entry)?;
        synced.files += 1;
    }
    Ok(synced)
}

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
mod tests {
    use futures::TryStreamExt;
    use object_store::local::LocalFileSystem;

    use super::*;

    async fn listed(objects: &dyn ObjectStore) -> Vec<(String, u64)> {
        let mut all: Vec<(String, u64)> = objects
            .list(None)
            .map_ok(|meta| (meta.location.to_string(), meta.size))
            .try_collect()
            .await
            .unwrap();
        all.sort();
        all
    }

    #[tokio::test]
    async fn directories_and_archives_sync_the_same() {
        let store_dir = tempfile::tempdir().unwrap();
        let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(store_dir.path()).unwrap());
        let outputs = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outputs.path().join("ckpt")).unwrap();
        std::fs::write(outputs.path().join("model.txt"), "weights").unwrap();
        std::fs::write(outputs.path().join("ckpt/big.bin"), vec![7u8; PART + 10]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", outputs.path().join("link")).unwrap();

        let synced = sync(objects.clone(), "j1", Outputs::Dir(outputs.path().to_path_buf()))
            .await
            .unwrap();
        assert_eq!(
            synced,
            Synced {
                files: 2,
                bytes: 7 + PART as u64 + 10
            }
        );
        let expected = vec![
            ("outputs/j1/ckpt/big.bin".to_string(), PART as u64 + 10),
            ("outputs/j1/model.txt".to_string(), 7),
        ];
        assert_eq!(listed(objects.as_ref()).await, expected);

        // The same tree as an engine's archive: everything under "outputs/".
        let tar_path = outputs.path().join("../outputs-j2.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&tar_path).unwrap());
        builder.follow_symlinks(false);
        builder.append_dir_all("outputs", outputs.path()).unwrap();
        builder.finish().unwrap();
        let synced = sync(objects.clone(), "j2", Outputs::Tar(tar_path.clone()))
            .await
            .unwrap();
        assert_eq!(synced.files, 2);
        std::fs::remove_file(tar_path).unwrap();
    }

    #[tokio::test]
    async fn synced_outputs_pack_into_an_archive_that_unpacks_under_their_paths() {
        let store_dir = tempfile::tempdir().unwrap();
        let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(store_dir.path()).unwrap());
        let outputs = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outputs.path().join("ckpt")).unwrap();
        std::fs::write(outputs.path().join("ckpt/step.txt"), "step-42\n").unwrap();
        std::fs::write(outputs.path().join("model.bin"), vec![7u8; PART + 10]).unwrap();
        sync(objects.clone(), "j1", Outputs::Dir(outputs.path().to_path_buf()))
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
