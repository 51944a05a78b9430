//! The runner's dataset cache: each dataset archive (by sha256 digest) is fetched once per
//! runner from object storage, unpacked read-only on the runner's disk and handed to every job
//! that names it (a read-only bind mount for containers, the directory itself for processes).
//!
//! - Layout under the root: `<digest>/` a complete entry (read-only for everyone);
//!   `.part/<digest>.tar.gz` a download in progress; `.<digest>.unpack` an unpack in progress;
//!   `.<digest>.evict` an entry being removed. Only a verified, fully unpacked tree is ever
//!   renamed to a digest's name, so a crash at any point leaves nothing that looks complete.
//! - One fetch per digest at a time ([`DatasetCache::acquire`] holds a per-digest lock): two
//!   jobs asking at once share one download.
//! - A [`DatasetLease`] marks an entry in use until the job is released. After each fetch,
//!   entries no job holds are removed when their archive left the object store (the dataset
//!   was deleted), then least recently used first while the cache exceeds `max-bytes`.
//! - At start the root is rescanned: complete entries are kept (last use from their mtime),
//!   partial downloads and unpacks are removed.
//!
//! `config` is the `[dataset-cache]` section; `fetch` downloads, verifies and unpacks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use kiln_core::objects::{artifact_path, is_sha256_hex};
use object_store::{ObjectStore, ObjectStoreExt};

use crate::error::{Error, Result};

mod config;
pub(crate) mod fetch;
#[cfg(test)]
mod tests;

pub use config::DatasetCacheConfig;

/// Datasets on this runner's disk, by digest.
#[derive(Clone)]
pub struct DatasetCache {
    inner: Arc<Inner>,
}

struct Inner {
    /// Absolute, so entries can be bind-mounted.
    root: PathBuf,
    max_bytes: u64,
    objects: Arc<dyn ObjectStore>,
    state: Mutex<State>,
    /// Archives downloaded since the start.
    downloads: AtomicU64,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Held while a digest is fetched or removed.
    locks: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    last_used: SystemTime,
    in_use: usize,
}

/// A cached dataset held for a job: it is not evicted while the lease lives.
#[derive(Debug)]
pub struct DatasetLease {
    inner: Arc<Inner>,
    digest: String,
    path: PathBuf,
}

impl DatasetLease {
    /// The entry's directory (read-only).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DatasetLease {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock().expect("dataset cache lock");
        if let Some(entry) = state.entries.get_mut(&self.digest) {
            entry.in_use = entry.in_use.saturating_sub(1);
            entry.last_used = SystemTime::now();
        }
        drop(state);
        touch(&self.path);
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetCache")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// Records the time of use in the entry's mtime, which a restarted runner reads back.
fn touch(dir: &Path) {
    let touched = std::fs::File::open(dir).and_then(|dir| dir.set_modified(SystemTime::now()));
    if let Err(error) = touched {
        tracing::debug!(dir = %dir.display(), error = %error, "cannot record a dataset's use");
    }
}

impl DatasetCache {
    /// Opens the cache at `config.dir` (default `<work-dir>/.datasets`), keeping the complete
    /// entries a previous run left and removing partial ones.
    pub async fn open(
        config: &DatasetCacheConfig,
        work_dir: &Path,
        objects: Arc<dyn ObjectStore>,
    ) -> Result<DatasetCache> {
        let dir = config.dir_under(work_dir);
        let (root, entries) = tokio::task::spawn_blocking(move || rescan(&dir))
            .await
            .map_err(|e| Error::Dataset(format!("rescanning the dataset cache failed: {e}")))??;
        let bytes: u64 = entries.values().map(|e| e.bytes).sum();
        tracing::info!(dir = %root.display(), entries = entries.len(), bytes, "dataset cache open");
        Ok(DatasetCache {
            inner: Arc::new(Inner {
                root,
                max_bytes: config.max_bytes,
                objects,
                state: Mutex::new(State {
                    entries,
                    locks: HashMap::new(),
                }),
                downloads: AtomicU64::new(0),
            }),
        })
    }

    /// The dataset with this archive digest, fetched unless cached, held until the lease drops.
    pub async fn acquire(&self, digest: &str) -> Result<DatasetLease> {
        if !is_sha256_hex(digest) {
            return Err(Error::Dataset(format!("{digest:?} is not a sha256 digest")));
        }
        let lock = self.inner.lock_of(digest);
        let guard = lock.lock().await;
        if let Some(lease) = self.inner.lease(digest) {
            return Ok(lease);
        }
        let root = self.inner.root.clone();
        let part = fetch::part_path(&root, digest);
        let archive_bytes = fetch::download(&self.inner.objects, digest, &part).await?;
        let owned_digest = digest.to_string();
        let archive = part.clone();
        let max_bytes = self.inner.max_bytes;
        let unpacked = tokio::task::spawn_blocking(move || fetch::unpack(&root, &owned_digest, &archive, max_bytes))
            .await
            .map_err(|e| Error::Dataset(format!("unpacking failed: {e}")));
        fetch::remove_file(&part).await;
        let bytes = unpacked??;
        self.inner.downloads.fetch_add(1, Ordering::SeqCst);
        self.inner.state.lock().expect("dataset cache lock").entries.insert(
            digest.to_string(),
            Entry {
                bytes,
                last_used: SystemTime::now(),
                in_use: 0,
            },
        );
        let lease = self.inner.lease(digest).expect("the entry was just inserted");
        drop(guard);
        tracing::info!(digest, archive_bytes, bytes, "dataset cached");
        self.evict().await;
        Ok(lease)
    }

    /// The cache's directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Makes the root traversable but not listable (0711): a job reaches the entries its
    /// links name, and cannot find the digests of the others.
    pub fn hide_entries(&self) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.inner.root, std::fs::Permissions::from_mode(0o711)).map_err(Error::io(format!(
            "cannot set the mode of {}",
            self.inner.root.display()
        )))
    }

    /// How many archives this cache downloaded since it was opened.
    pub fn downloads(&self) -> u64 {
        self.inner.downloads.load(Ordering::SeqCst)
    }

    /// The digests cached, with their bytes.
    pub fn entries(&self) -> Vec<(String, u64)> {
        let state = self.inner.state.lock().expect("dataset cache lock");
        let mut entries: Vec<(String, u64)> = state.entries.iter().map(|(d, e)| (d.clone(), e.bytes)).collect();
        entries.sort();
        entries
    }

    /// Removes entries no job holds: those whose archive is gone from the object store, then
    /// the least recently used while the cache is over its size.
    pub async fn evict(&self) {
        let (idle, mut total) = {
            let state = self.inner.state.lock().expect("dataset cache lock");
            let mut idle: Vec<(String, Entry)> = state
                .entries
                .iter()
                .filter(|(_, e)| e.in_use == 0)
                .map(|(d, e)| (d.clone(), *e))
                .collect();
            idle.sort_by_key(|(_, e)| e.last_used);
            (idle, state.entries.values().map(|e| e.bytes).sum::<u64>())
        };
        let mut victims = Vec::new();
        for (digest, entry) in &idle {
            if let Err(object_store::Error::NotFound { .. }) = self.inner.objects.head(&artifact_path(digest)).await {
                victims.push(digest.clone());
                total = total.saturating_sub(entry.bytes);
            }
        }
        for (digest, entry) in &idle {
            if total <= self.inner.max_bytes {
                break;
            }
            if !victims.contains(digest) {
                victims.push(digest.clone());
                total = total.saturating_sub(entry.bytes);
            }
        }
        for digest in victims {
            if let Err(error) = self.remove(&digest).await {
                tracing::warn!(digest, error = %error, "cannot evict a dataset");
            }
        }
    }

    /// Removes one entry unless a job holds it or it is being fetched.
    async fn remove(&self, digest: &str) -> Result<()> {
        let lock = self.inner.lock_of(digest);
        let Ok(_guard) = lock.try_lock() else {
            return Ok(());
        };
        let bytes = {
            let mut state = self.inner.state.lock().expect("dataset cache lock");
            match state.entries.get(digest) {
                Some(entry) if entry.in_use == 0 => {}
                _ => return Ok(()),
            }
            state.entries.remove(digest).map(|e| e.bytes).unwrap_or(0)
        };
        let root = self.inner.root.clone();
        let owned_digest = digest.to_string();
        tokio::task::spawn_blocking(move || {
            // Out of the digest's name first (atomically), then away.
            let doomed = root.join(format!(".{owned_digest}.evict"));
            fetch::remove_tree(&doomed)?;
            let entry = root.join(&owned_digest);
            std::fs::rename(&entry, &doomed).map_err(Error::io(format!("cannot move {} away", entry.display())))?;
            fetch::remove_tree(&doomed)
        })
        .await
        .map_err(|e| Error::Dataset(format!("evicting failed: {e}")))??;
        tracing::info!(digest, bytes, "dataset evicted");
        Ok(())
    }
}

impl Inner {
    fn lock_of(&self, digest: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut state = self.state.lock().expect("dataset cache lock");
        state.locks.entry(digest.to_string()).or_default().clone()
    }

    /// A lease on a cached entry, if there is one.
    fn lease(self: &Arc<Self>, digest: &str) -> Option<DatasetLease> {
        let mut state = self.state.lock().expect("dataset cache lock");
        let entry = state.entries.get_mut(digest)?;
        entry.in_use += 1;
        entry.last_used = SystemTime::now();
        drop(state);
        let path = self.root.join(digest);
        touch(&path);
        Some(DatasetLease {
            inner: self.clone(),
            digest: digest.to_string(),
            path,
        })
    }
}

/// Creates the root (made absolute), removes partial downloads and unpacks, and reads the
/// complete entries. Blocking.
fn rescan(dir: &Path) -> Result<(PathBuf, HashMap<String, Entry>)> {
    let part_dir = dir.join(fetch::PART_DIR);
    std::fs::create_dir_all(&part_dir).map_err(Error::io(format!("cannot create {}", part_dir.display())))?;
    let root = std::fs::canonicalize(dir).map_err(Error::io(format!("cannot resolve {}", dir.display())))?;
    let listing = |path: &Path| std::fs::read_dir(path).map_err(Error::io(format!("cannot list {}", path.display())));
    for partial in listing(&part_dir)? {
        let partial = partial.map_err(Error::io("cannot list the partial downloads"))?;
        fetch::remove_tree(&partial.path())?;
    }
    let mut entries = HashMap::new();
    for found in listing(&root)? {
        let found = found.map_err(Error::io(format!("cannot list {}", root.display())))?;
        let name = found.file_name().to_string_lossy().into_owned();
        if name == fetch::PART_DIR {
            continue;
        }
        if name.starts_with('.') {
            fetch::remove_tree(&found.path())?;
            continue;
        }
        let metadata = found
            .metadata()
            .map_err(Error::io(format!("cannot read {}", found.path().display())))?;
        if !is_sha256_hex(&name) || !metadata.is_dir() {
            tracing::warn!(path = %found.path().display(), "not a dataset; left alone");
            continue;
        }
        let entry = Entry {
            bytes: fetch::tree_bytes(&found.path())?,
            last_used: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            in_use: 0,
        };
        entries.insert(name, entry);
    }
    Ok((root, entries))
}
