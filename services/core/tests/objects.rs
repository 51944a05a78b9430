//! The object store's conformance suite: every test runs on a local directory and on S3 (the
//! versitygw that scripts/test.sh starts, `KILN_TEST_S3_*`), both opened through
//! `kiln_core::objects::open` from an `ObjectStoreConfig` as the services open theirs.

use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use kiln_core::config::ObjectStoreConfig;
use kiln_core::objects;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};

/// An opened store and what keeps it alive (a local store's temp dir).
struct Opened {
    objects: Arc<dyn ObjectStore>,
    _dir: Option<tempfile::TempDir>,
}

fn open_checked(config: &ObjectStoreConfig) -> Arc<dyn ObjectStore> {
    let mut problems = Vec::new();
    config.validate(&mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    objects::open(config).expect("the object store opens")
}

fn local() -> Opened {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = ObjectStoreConfig {
        url: format!("file://{}", dir.path().join("objects").display()),
        ..ObjectStoreConfig::default()
    };
    Opened {
        objects: open_checked(&config),
        _dir: Some(dir),
    }
}

/// The test S3 bucket, each test under a prefix of its own so that runs never see each other.
fn s3() -> Opened {
    Opened {
        objects: open_checked(&kiln_core::testing::s3_objects_config("conformance")),
        _dir: None,
    }
}

macro_rules! object_store_suite {
    ($backend:ident) => {
        mod $backend {
            #[tokio::test]
            async fn put_get_list_delete() {
                super::put_get_list_delete(super::$backend()).await;
            }

            #[tokio::test]
            async fn multipart_uploads_appear_whole_or_not_at_all() {
                super::multipart_uploads_appear_whole_or_not_at_all(super::$backend()).await;
            }

            #[tokio::test]
            async fn create_refuses_an_existing_object() {
                super::create_refuses_an_existing_object(super::$backend()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_gibibyte_streams_in_bounded_memory() {
                super::a_gibibyte_streams_in_bounded_memory(super::$backend()).await;
            }
        }
    };
}

object_store_suite!(local);
object_store_suite!(s3);

fn path(text: &str) -> ObjectPath {
    ObjectPath::from(text)
}

async fn listed(objects: &dyn ObjectStore, prefix: Option<&str>) -> Vec<(String, u64)> {
    let prefix = prefix.map(path);
    let mut all: Vec<(String, u64)> = objects
        .list(prefix.as_ref())
        .map_ok(|meta| (meta.location.to_string(), meta.size))
        .try_collect()
        .await
        .expect("list");
    all.sort();
    all
}

async fn put_get_list_delete(opened: Opened) {
    let objects = opened.objects.as_ref();
    for (name, content) in [
        ("a/b.txt", "bee"),
        ("a/c/d.txt", "dee"),
        ("ab.txt", "a-bee"),
        ("e.txt", ""),
    ] {
        objects.put(&path(name), PutPayload::from(content)).await.expect("put");
    }
    let got = objects.get(&path("a/b.txt")).await.expect("get");
    assert_eq!(got.meta.size, 3);
    assert_eq!(got.bytes().await.expect("read"), Bytes::from("bee"));
    assert_eq!(objects.head(&path("e.txt")).await.expect("head").size, 0);
    assert_eq!(
        objects.get_range(&path("a/c/d.txt"), 1..3).await.expect("range"),
        Bytes::from("ee")
    );
    // A prefix is whole path parts: `a` holds a/b.txt and a/c/d.txt, not ab.txt.
    assert_eq!(
        listed(objects, Some("a")).await,
        [("a/b.txt".to_string(), 3), ("a/c/d.txt".to_string(), 3)]
    );
    assert_eq!(listed(objects, None).await.len(), 4);
    let top = objects.list_with_delimiter(None).await.expect("list with delimiter");
    assert_eq!(top.common_prefixes, [path("a")]);
    let mut names: Vec<String> = top.objects.iter().map(|meta| meta.location.to_string()).collect();
    names.sort();
    assert_eq!(names, ["ab.txt", "e.txt"]);
    // Put replaces.
    objects
        .put(&path("a/b.txt"), PutPayload::from("bee2"))
        .await
        .expect("put again");
    assert_eq!(
        objects.get(&path("a/b.txt")).await.unwrap().bytes().await.unwrap(),
        Bytes::from("bee2")
    );

    objects.delete(&path("a/b.txt")).await.expect("delete");
    match objects.get(&path("a/b.txt")).await {
        Err(object_store::Error::NotFound { .. }) => {}
        other => panic!("a deleted object reads as not found, not {other:?}"),
    }
    match objects.head(&path("never/written")).await {
        Err(object_store::Error::NotFound { .. }) => {}
        other => panic!("a missing object reads as not found, not {other:?}"),
    }
    assert_eq!(listed(objects, Some("a")).await, [("a/c/d.txt".to_string(), 3)]);
}

async fn multipart_uploads_appear_whole_or_not_at_all(opened: Opened) {
    let objects = opened.objects.as_ref();
    let location = path("multi/part.bin");
    let upload = objects.put_multipart(&location).await.expect("start an upload");
    // Parts of 5 MiB (S3's smallest but the last); 12 MiB written in uneven pieces.
    let mut writer = WriteMultipart::new_with_chunk_size(upload, 5 << 20);
    let mut written = Vec::new();
    for piece in 0..12u8 {
        let bytes = vec![piece; (1 << 20) + usize::from(piece)];
        writer.wait_for_capacity(2).await.expect("capacity");
        writer.write(&bytes);
        written.extend_from_slice(&bytes);
    }
    // Nothing is visible before the upload completes.
    assert!(matches!(
        objects.head(&location).await,
        Err(object_store::Error::NotFound { .. })
    ));
    writer.finish().await.expect("complete the upload");
    let got = objects.get(&location).await.expect("get");
    assert_eq!(got.meta.size, written.len() as u64);
    assert!(got.bytes().await.expect("read") == written, "the parts join in order");
    let tail = objects
        .get_range(&location, (written.len() as u64 - 10)..written.len() as u64)
        .await
        .expect("range");
    assert_eq!(tail.as_ref(), &written[written.len() - 10..]);

    // An aborted upload leaves nothing.
    let aborted = path("multi/aborted.bin");
    let mut writer = WriteMultipart::new_with_chunk_size(objects.put_multipart(&aborted).await.unwrap(), 5 << 20);
    writer.write(&vec![1u8; 6 << 20]);
    writer.abort().await.expect("abort");
    assert!(matches!(
        objects.head(&aborted).await,
        Err(object_store::Error::NotFound { .. })
    ));
    assert_eq!(
        listed(objects, Some("multi")).await,
        [("multi/part.bin".to_string(), written.len() as u64)]
    );
}

async fn create_refuses_an_existing_object(opened: Opened) {
    let objects = opened.objects.as_ref();
    let location = path("artifacts/sha256/once");
    let create = || PutOptions::from(PutMode::Create);
    objects
        .put_opts(&location, PutPayload::from("first"), create())
        .await
        .expect("the first create succeeds");
    match objects.put_opts(&location, PutPayload::from("second"), create()).await {
        Err(object_store::Error::AlreadyExists { .. }) => {}
        other => panic!("a second create is refused as AlreadyExists, not {other:?}"),
    }
    assert_eq!(
        objects.get(&location).await.unwrap().bytes().await.unwrap(),
        Bytes::from("first")
    );
}

/// Bytes per generated block.
const BLOCK: usize = 1 << 20;
const GIBIBYTE: u64 = 1 << 30;
/// How far the test process's peak RSS may rise while a GiB goes up and comes back down.
const MAX_GROWTH_BYTES: u64 = 200 << 20;

/// Block `index` of the generated object: a fixed pattern with the index in its first bytes, so
/// a reordered, repeated or lost part shows.
fn block(template: &[u8], index: u64) -> Vec<u8> {
    let mut bytes = template.to_vec();
    bytes[..8].copy_from_slice(&index.to_le_bytes());
    bytes
}

/// A value from /proc/self/status, in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|line| line.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("a number in {line:?}"));
    kib * 1024
}

async fn a_gibibyte_streams_in_bounded_memory(opened: Opened) {
    let objects = opened.objects.as_ref();
    let template: Vec<u8> = (0..BLOCK).map(|i| (i % 251) as u8).collect();
    let blocks = GIBIBYTE / BLOCK as u64;
    // "5" resets the peak to the current RSS (Linux); from there on VmHWM is this test's peak
    // (and that of tests running beside it, which stay small).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_bytes("VmRSS:");

    let location = path("large/gibibyte.bin");
    let upload = objects.put_multipart(&location).await.expect("start an upload");
    let mut writer = WriteMultipart::new_with_chunk_size(upload, 8 << 20);
    for index in 0..blocks {
        writer.wait_for_capacity(4).await.expect("capacity");
        writer.write(&block(&template, index));
    }
    writer.finish().await.expect("complete the upload");
    assert_eq!(objects.head(&location).await.expect("head").size, GIBIBYTE);

    let mut stream = objects.get(&location).await.expect("get").into_stream();
    let mut offset: u64 = 0;
    let mut expected = block(&template, 0);
    while let Some(chunk) = stream.next().await {
        let mut chunk = chunk.expect("a chunk");
        while !chunk.is_empty() {
            let index = offset / BLOCK as u64;
            let within = (offset % BLOCK as u64) as usize;
            if within == 0 && index > 0 {
                expected = block(&template, index);
            }
            let take = chunk.len().min(BLOCK - within);
            let piece = chunk.split_to(take);
            assert!(
                piece.as_ref() == &expected[within..within + take],
                "the bytes at offset {offset} differ"
            );
            offset += take as u64;
        }
    }
    assert_eq!(offset, GIBIBYTE, "the whole object came back");
    let peak = status_bytes("VmHWM:");
    let growth = peak.saturating_sub(before);
    eprintln!("peak RSS {} MiB, {} MiB above the start", peak >> 20, growth >> 20);
    assert!(
        growth < MAX_GROWTH_BYTES,
        "a GiB went up and down with the peak RSS {} MiB above the start (limit {} MiB)",
        growth >> 20,
        MAX_GROWTH_BYTES >> 20
    );
    objects.delete(&location).await.expect("delete");
}
