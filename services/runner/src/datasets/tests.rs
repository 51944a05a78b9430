//! The dataset cache against an in-memory object store wrapped to count gets and to cut
//! streams short.

use std::ops::Range;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use sha2::{Digest, Sha256};

use super::*;

/// An in-memory store that records each get's range and can end the next `cuts` streams
/// with an error after `cut_after` bytes.
#[derive(Debug, Default)]
struct Flaky {
    inner: InMemory,
    gets: Mutex<Vec<Option<object_store::GetRange>>>,
    cuts: AtomicUsize,
    cut_after: AtomicUsize,
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flaky")
    }
}

#[async_trait::async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &ObjectPath, options: GetOptions) -> object_store::Result<GetResult> {
        if !options.head {
            self.gets.lock().unwrap().push(options.range.clone());
        }
        let result = self.inner.get_opts(location, options).await?;
        let cut = self
            .cuts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !cut {
            return Ok(result);
        }
        let limit = self.cut_after.load(Ordering::SeqCst);
        let (meta, range, attributes) = (result.meta.clone(), result.range.clone(), result.attributes.clone());
        let mut taken = 0;
        let stream = result
            .into_stream()
            .map_ok(move |chunk: Bytes| {
                let keep = chunk.len().min(limit.saturating_sub(taken));
                taken += keep;
                chunk.slice(..keep)
            })
            .chain(futures::stream::once(async {
                Err(object_store::Error::Generic {
                    store: "flaky",
                    source: "connection reset".into(),
                })
            }));
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream.boxed()),
            meta,
            range,
            attributes,
            extensions: Default::default(),
        })
    }

    async fn get_ranges(&self, location: &ObjectPath, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&ObjectPath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&ObjectPath>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &ObjectPath, to: &ObjectPath, options: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A tar.gz of (path, content) files and its digest.
fn archive(files: &[(&str, &[u8])]) -> (Bytes, String) {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for (path, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o600);
        header.set_cksum();
        builder.append_data(&mut header, path, *content).unwrap();
    }
    let bytes = builder.into_inner().unwrap().finish().unwrap();
    let digest = hex::encode(Sha256::digest(&bytes));
    (Bytes::from(bytes), digest)
}

/// Stores a dataset of one file `data.bin` of `size` bytes (seeded, so each seed differs).
async fn put_dataset(store: &Flaky, seed: u8, size: usize) -> String {
    let content: Vec<u8> = (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let (bytes, digest) = archive(&[("data.bin", &content), ("sub/seed.txt", &[seed])]);
    store.put(&artifact_path(&digest), bytes.into()).await.unwrap();
    digest
}

struct Fixture {
    dir: tempfile::TempDir,
    store: Arc<Flaky>,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            store: Arc::new(Flaky::default()),
        }
    }

    async fn cache(&self, max_bytes: u64) -> DatasetCache {
        let config = DatasetCacheConfig {
            dir: PathBuf::new(),
            max_bytes,
        };
        DatasetCache::open(&config, self.dir.path(), self.store.clone())
            .await
            .unwrap()
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join(".datasets")
    }

    fn gets(&self) -> usize {
        self.store.gets.lock().unwrap().len()
    }

    /// What the cache root holds besides `.part`, and what `.part` holds.
    fn listing(&self) -> (Vec<String>, Vec<String>) {
        let names = |dir: PathBuf| {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name != ".part")
                .collect();
            names.sort();
            names
        };
        (names(self.root()), names(self.root().join(".part")))
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn a_dataset_is_fetched_once_and_read_only() {
    let fixture = Fixture::new();
    let digest = put_dataset(&fixture.store, 1, 1000).await;
    let cache = fixture.cache(1 << 20).await;
    let first = cache.acquire(&digest).await.unwrap();
    let second = cache.acquire(&digest).await.unwrap();
    assert_eq!(first.path(), second.path());
    assert_eq!(first.path(), fixture.root().canonicalize().unwrap().join(&digest));
    assert_eq!(std::fs::read(first.path().join("sub/seed.txt")).unwrap(), [1]);
    assert_eq!((cache.downloads(), fixture.gets()), (1, 1));
    assert_eq!(cache.entries(), vec![(digest.clone(), 1001)]);
    // Readable by everyone, writable by no one (the archive said 0600).
    assert_eq!(mode(&first.path().join("data.bin")), 0o444);
    assert_eq!(mode(&first.path().join("sub")), 0o555);
    assert_eq!(mode(first.path()), 0o555);
    assert_eq!(fixture.listing(), (vec![digest], vec![]));
}

#[tokio::test]
async fn concurrent_jobs_share_one_fetch() {
    let fixture = Fixture::new();
    let digest = put_dataset(&fixture.store, 2, 200_000).await;
    let cache = fixture.cache(1 << 30).await;
    let leases = futures::future::join_all((0..4).map(|_| cache.acquire(&digest))).await;
    for lease in &leases {
        assert!(lease.as_ref().unwrap().path().join("data.bin").try_exists().unwrap());
    }
    assert_eq!((cache.downloads(), fixture.gets()), (1, 1));
}

#[tokio::test]
async fn a_digest_mismatch_is_refused_and_nothing_is_cached() {
    let fixture = Fixture::new();
    let (bytes, _) = archive(&[("a.txt", b"tampered")]);
    let claimed = hex::encode(Sha256::digest(b"something else"));
    fixture.store.put(&artifact_path(&claimed), bytes.into()).await.unwrap();
    let cache = fixture.cache(1 << 20).await;
    let error = cache.acquire(&claimed).await.unwrap_err().to_string();
    assert!(error.contains("refused"), "{error}");
    assert!(cache.entries().is_empty());
    assert_eq!(fixture.listing(), (vec![], vec![]));
    let missing = hex::encode(Sha256::digest(b"never stored"));
    let error = cache.acquire(&missing).await.unwrap_err().to_string();
    assert!(error.contains("not in the object store"), "{error}");
}

#[tokio::test]
async fn a_bad_archive_is_refused_and_nothing_is_cached() {
    let fixture = Fixture::new();
    let mut header = tar::Header::new_old();
    let name = b"../escape.txt";
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.set_size(1);
    header.set_cksum();
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    builder.append(&header, &b"x"[..]).unwrap();
    let bytes = builder.into_inner().unwrap().finish().unwrap();
    let digest = hex::encode(Sha256::digest(&bytes));
    fixture.store.put(&artifact_path(&digest), bytes.into()).await.unwrap();
    let cache = fixture.cache(1 << 20).await;
    let error = cache.acquire(&digest).await.unwrap_err().to_string();
    assert!(error.contains("leaves the destination"), "{error}");
    assert_eq!(fixture.listing(), (vec![], vec![]));
    assert!(!fixture.dir.path().join("escape.txt").try_exists().unwrap());
}

#[tokio::test]
async fn eviction_drops_the_least_recently_used_entries_no_job_holds() {
    let fixture = Fixture::new();
    let [a, b, c, d] = [
        put_dataset(&fixture.store, 1, 999).await,
        put_dataset(&fixture.store, 2, 999).await,
        put_dataset(&fixture.store, 3, 999).await,
        put_dataset(&fixture.store, 4, 999).await,
    ];
    // Room for two entries of 1000 bytes.
    let cache = fixture.cache(2500).await;
    let held = cache.acquire(&a).await.unwrap();
    drop(cache.acquire(&b).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(cache.acquire(&c).await.unwrap());
    // a is older than b but in use: b goes.
    let cached: Vec<String> = cache.entries().into_iter().map(|(digest, _)| digest).collect();
    assert_eq!(cached, sorted(vec![a.clone(), c.clone()]));
    drop(held);
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(cache.acquire(&c).await.unwrap());
    drop(cache.acquire(&d).await.unwrap());
    // a was used before c: a goes.
    let cached: Vec<String> = cache.entries().into_iter().map(|(digest, _)| digest).collect();
    assert_eq!(cached, sorted(vec![c.clone(), d.clone()]));
    let (on_disk, _) = fixture.listing();
    assert_eq!(on_disk, sorted(vec![c.clone(), d.clone()]));
    // A dataset deleted from the object store leaves at the next eviction, even with room.
    fixture.store.delete(&artifact_path(&c)).await.unwrap();
    let e = put_dataset(&fixture.store, 5, 10).await;
    drop(cache.acquire(&e).await.unwrap());
    let cached: Vec<String> = cache.entries().into_iter().map(|(digest, _)| digest).collect();
    assert_eq!(cached, sorted(vec![d, e]));
}

fn sorted(mut digests: Vec<String>) -> Vec<String> {
    digests.sort();
    digests
}

#[tokio::test]
async fn a_restarted_runner_keeps_complete_entries_and_drops_partial_ones() {
    let fixture = Fixture::new();
    let digest = put_dataset(&fixture.store, 1, 1000).await;
    let cache = fixture.cache(1 << 20).await;
    drop(cache.acquire(&digest).await.unwrap());
    drop(cache);
    // What a crash mid-fetch leaves: a partial download, a partial unpack, a partial eviction.
    let other = hex::encode(Sha256::digest(b"other"));
    std::fs::write(fixture.root().join(".part").join(format!("{other}.tar.gz")), b"partial").unwrap();
    std::fs::create_dir_all(fixture.root().join(format!(".{other}.unpack/sub"))).unwrap();
    std::fs::create_dir_all(fixture.root().join(format!(".{other}.evict"))).unwrap();
    let reopened = fixture.cache(1 << 20).await;
    assert_eq!(reopened.entries(), vec![(digest.clone(), 1001)]);
    assert_eq!(fixture.listing(), (vec![digest.clone()], vec![]));
    let lease = reopened.acquire(&digest).await.unwrap();
    assert_eq!(std::fs::read(lease.path().join("sub/seed.txt")).unwrap(), [1]);
    assert_eq!((reopened.downloads(), fixture.gets()), (0, 1));
}

#[tokio::test]
async fn an_interrupted_download_resumes_with_a_ranged_get() {
    let fixture = Fixture::new();
    let digest = put_dataset(&fixture.store, 7, 300_000).await;
    fixture.store.cuts.store(1, Ordering::SeqCst);
    fixture.store.cut_after.store(1000, Ordering::SeqCst);
    let cache = fixture.cache(1 << 30).await;
    let lease = cache.acquire(&digest).await.unwrap();
    let gets = fixture.store.gets.lock().unwrap().clone();
    assert_eq!(gets, vec![None, Some(object_store::GetRange::Offset(1000))]);
    let content = std::fs::read(lease.path().join("data.bin")).unwrap();
    assert_eq!(content.len(), 300_000);
    assert_eq!(content[299_999], (299_999usize as u8).wrapping_mul(31).wrapping_add(7));
}

#[tokio::test]
async fn an_interrupted_download_is_never_taken_for_complete() {
    let fixture = Fixture::new();
    let digest = put_dataset(&fixture.store, 8, 300_000).await;
    // Every attempt is cut: the fetch fails, leaving only a partial download.
    fixture.store.cuts.store(usize::MAX, Ordering::SeqCst);
    fixture.store.cut_after.store(1000, Ordering::SeqCst);
    let cache = fixture.cache(1 << 30).await;
    let error = cache.acquire(&digest).await.unwrap_err();
    assert!(matches!(error, Error::Objects(_)), "{error}");
    assert!(cache.entries().is_empty());
    assert_eq!(fixture.listing(), (vec![], vec![format!("{digest}.tar.gz")]));
    // After a restart, the partial is gone and the next fetch starts from zero.
    drop(cache);
    fixture.store.cuts.store(0, Ordering::SeqCst);
    let reopened = fixture.cache(1 << 30).await;
    assert!(reopened.entries().is_empty());
    assert_eq!(fixture.listing(), (vec![], vec![]));
    fixture.store.gets.lock().unwrap().clear();
    reopened.acquire(&digest).await.unwrap();
    assert_eq!(fixture.store.gets.lock().unwrap().clone(), vec![None]);
}

#[tokio::test]
async fn a_stale_partial_that_spoils_the_digest_starts_again() {
    let fixture = Fixture::new();
    let digest = put_dataset(&fixture.store, 9, 5000).await;
    let cache = fixture.cache(1 << 30).await;
    // Left by an earlier fetch in this run, then corrupted.
    std::fs::write(fetch::part_path(&fixture.root(), &digest), b"garbage").unwrap();
    let lease = cache.acquire(&digest).await.unwrap();
    assert_eq!(std::fs::read(lease.path().join("sub/seed.txt")).unwrap(), [9]);
    let gets = fixture.store.gets.lock().unwrap().clone();
    assert_eq!(gets, vec![Some(object_store::GetRange::Offset(7)), None]);
}
