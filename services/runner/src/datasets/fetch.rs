//! Getting one dataset onto the disk: a streamed, resumable download whose sha256 is checked,
//! then a checked unpack into a hidden directory that is made read-only and renamed into place.
//! Nothing is ever held whole in memory, and nothing half-made carries a digest's name.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use kiln_core::objects::artifact_path;
use object_store::{GetOptions, GetRange, ObjectStore};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};

/// The directory of partial downloads, under the cache root.
pub(super) const PART_DIR: &str = ".part";
/// Tries of one download (an interrupted one resumes where it stopped).
const ATTEMPTS: u32 = 3;

/// Where the download of `digest` is kept until it is unpacked.
pub(super) fn part_path(root: &Path, digest: &str) -> PathBuf {
    root.join(PART_DIR).join(format!("{digest}.tar.gz"))
}

/// Downloads the archive `digest` to `part`, continuing a partial file with a ranged get, and
/// checks its sha256. Returns its size. A file that does not check out is removed; a stale
/// partial that spoils the digest is dropped and the download starts again from zero, once.
pub(super) async fn download(objects: &Arc<dyn ObjectStore>, digest: &str, part: &Path) -> Result<u64> {
    let mut restarted = false;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let offset = file_len(part).await?;
        let mut hasher = hash_prefix(part.to_path_buf(), offset).await?;
        match stream_into(objects, digest, part, offset, &mut hasher).await {
            Ok(size) => {
                let actual = hex::encode(hasher.finalize());
                if actual == digest {
                    return Ok(size);
                }
                remove_file(part).await;
                if offset > 0 && !restarted {
                    tracing::warn!(digest, "a resumed dataset download does not check out; starting again");
                    restarted = true;
                    continue;
                }
                return Err(Error::Dataset(format!(
                    "the archive of {digest} has sha256 {actual}: refused"
                )));
            }
            Err(Error::Objects(error)) if attempt < ATTEMPTS => {
                tracing::warn!(digest, attempt, error = %error, "dataset download interrupted; resuming");
            }
            Err(error) => return Err(error),
        }
    }
}

/// One get from `offset` to the end, appended to `part` and to `hasher`.
async fn stream_into(
    objects: &Arc<dyn ObjectStore>,
    digest: &str,
    part: &Path,
    offset: u64,
    hasher: &mut Sha256,
) -> Result<u64> {
    let options = GetOptions {
        range: (offset > 0).then_some(GetRange::Offset(offset)),
        ..Default::default()
    };
    let result = match objects.get_opts(&artifact_path(digest), options).await {
        Ok(result) => result,
        Err(object_store::Error::NotFound { .. }) => {
            remove_file(part).await;
            return Err(Error::Dataset(format!(
                "the archive of {digest} is not in the object store"
            )));
        }
        Err(error) => {
            // A range the store refuses (a partial longer than the object): start from zero.
            if offset > 0 {
                remove_file(part).await;
            }
            return Err(error.into());
        }
    };
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(part)
        .await
        .map_err(Error::io(format!("cannot write {}", part.display())))?;
    let mut written = offset;
    if result.range.start != offset {
        // The store sent the whole object although a range was asked for.
        file.set_len(0)
            .await
            .map_err(Error::io(format!("cannot truncate {}", part.display())))?;
        *hasher = Sha256::new();
        written = 0;
    }
    let mut chunks = result.into_stream();
    let mut streamed = Ok(());
    while let Some(chunk) = chunks.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(error) => {
                streamed = Err(error.into());
                break;
            }
        };
        file.write_all(&chunk)
            .await
            .map_err(Error::io(format!("cannot write {}", part.display())))?;
        hasher.update(&chunk);
        written += chunk.len() as u64;
    }
    // Flushed on an interrupted stream too: tokio finishes a write in the background after
    // `write_all` returns, and one landing after the resume measured the file would be appended
    // behind the resumed bytes (seen as a corrupt archive under load).
    file.flush()
        .await
        .map_err(Error::io(format!("cannot write {}", part.display())))?;
    streamed.map(|()| written)
}

async fn file_len(path: &Path) -> Result<u64> {
    match tokio::fs::metadata(path).await {
        Ok(metadata) => Ok(metadata.len()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(error) => Err(Error::io(format!("cannot read {}", path.display()))(error)),
    }
}

/// A hasher fed the first `len` bytes of the file (a partial download being resumed).
async fn hash_prefix(path: PathBuf, len: u64) -> Result<Sha256> {
    if len == 0 {
        return Ok(Sha256::new());
    }
    tokio::task::spawn_blocking(move || {
        let mut hasher = Sha256::new();
        let file = std::fs::File::open(&path).map_err(Error::io(format!("cannot read {}", path.display())))?;
        let mut reader = file.take(len);
        let mut buffer = vec![0u8; 1 << 20];
        loop {
            let n = reader
                .read(&mut buffer)
                .map_err(Error::io(format!("cannot read {}", path.display())))?;
            if n == 0 {
                return Ok(hasher);
            }
            hasher.update(&buffer[..n]);
        }
    })
    .await
    .map_err(|e| Error::Dataset(format!("hashing a partial download failed: {e}")))?
}

/// Removes a file, saying so when it cannot (a missing one is fine).
pub(crate) async fn remove_file(path: &Path) {
    if let Err(error) = tokio::fs::remove_file(path).await
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %error, "cannot remove a file");
    }
}

/// Most entries a dataset may hold (a million images and more is a common dataset).
const MAX_ENTRIES: u64 = 16 << 20;

/// Unpacks the checked archive into `<root>/.<digest>.unpack` (with the bundle rules: no path
/// leaves it; at most `max_bytes`, the cache's size, since a larger one could not stay), makes
/// it read-only for everyone, and renames it to `<root>/<digest>`. Returns the bytes of its
/// files. Blocking.
pub(super) fn unpack(root: &Path, digest: &str, archive: &Path, max_bytes: u64) -> Result<u64> {
    let limits = kiln_formats::archive::Limits {
        max_bytes,
        max_entries: MAX_ENTRIES,
    };
    let staging = root.join(format!(".{digest}.unpack"));
    remove_tree(&staging)?;
    std::fs::create_dir(&staging).map_err(Error::io(format!("cannot create {}", staging.display())))?;
    let file = std::fs::File::open(archive).map_err(Error::io(format!("cannot read {}", archive.display())))?;
    let unpacked = crate::bundle::unpack(std::io::BufReader::with_capacity(1 << 20, file), &staging, limits)
        .and_then(|_| tree_bytes(&staging))
        .and_then(|bytes| {
            seal(&staging).map_err(Error::io(format!("cannot make {} read-only", staging.display())))?;
            Ok(bytes)
        });
    let bytes = match unpacked {
        Ok(bytes) => bytes,
        Err(error) => {
            let _ = remove_tree(&staging);
            return Err(match error {
                Error::BadBundle(message) => Error::Dataset(format!("the archive of {digest}: {message}")),
                other => other,
            });
        }
    };
    let target = root.join(digest);
    // Same parent: a read-only directory may be renamed, and the rename is atomic.
    std::fs::rename(&staging, &target).map_err(Error::io(format!("cannot move {} into place", target.display())))?;
    Ok(bytes)
}

/// Bytes of the regular files under `dir`. Blocking.
pub(super) fn tree_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let entries = std::fs::read_dir(&next).map_err(Error::io(format!("cannot list {}", next.display())))?;
        for entry in entries {
            let entry = entry.map_err(Error::io(format!("cannot list {}", next.display())))?;
            let metadata = entry
                .metadata()
                .map_err(Error::io(format!("cannot read {}", entry.path().display())))?;
            if metadata.is_dir() {
                pending.push(entry.path());
            } else if metadata.is_file() {
                total += metadata.len();
            }
        }
    }
    Ok(total)
}

/// Makes everything under `path` readable and not writable by anyone: directories 0555,
/// files their mode plus 0444 minus 0222; symlinks are left alone. Blocking.
pub(crate) fn seal(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let metadata = std::fs::symlink_metadata(path)?;
    if metadata.file_type().is_symlink() {
        return Ok(());
    }
    let mode = if metadata.is_dir() {
        for entry in std::fs::read_dir(path)? {
            seal(&entry?.path())?;
        }
        0o555
    } else {
        (metadata.permissions().mode() | 0o444) & !0o222 & 0o7777
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Removes a tree, read-only parts included; a missing one is fine. Blocking.
pub(crate) fn remove_tree(path: &Path) -> Result<()> {
    let removed = match std::fs::symlink_metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => Err(error),
        Ok(metadata) if metadata.is_dir() => {
            crate::provider::process::set_writable(path, true).and_then(|()| std::fs::remove_dir_all(path))
        }
        Ok(_) => std::fs::remove_file(path),
    };
    removed.map_err(Error::io(format!("cannot remove {}", path.display())))
}
