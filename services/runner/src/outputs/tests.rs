//! The incremental sync, on directories and engine archives.

use futures::TryStreamExt;
use object_store::PutPayload;
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

fn store() -> (tempfile::TempDir, Arc<dyn ObjectStore>) {
    let dir = tempfile::tempdir().unwrap();
    let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    (dir, objects)
}

/// `dir` as an engine's archive: everything under "outputs/".
fn archive(dir: &Path, tar_path: &Path) {
    let mut builder = tar::Builder::new(std::fs::File::create(tar_path).unwrap());
    builder.follow_symlinks(false);
    builder.append_dir_all("outputs", dir).unwrap();
    builder.finish().unwrap();
}

#[tokio::test]
async fn directories_and_archives_sync_the_same() {
    let (_store_dir, objects) = store();
    let outputs = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(outputs.path().join("ckpt")).unwrap();
    std::fs::write(outputs.path().join("model.txt"), "weights").unwrap();
    std::fs::write(outputs.path().join("ckpt/big.bin"), vec![7u8; PART + 10]).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", outputs.path().join("link")).unwrap();

    let dir = Outputs::Dir(outputs.path().to_path_buf());
    let (report, _) = sync(objects.clone(), "j1", dir, Manifest::default()).await.unwrap();
    let all = Synced {
        files: 2,
        bytes: 7 + PART as u64 + 10,
    };
    assert_eq!(
        report,
        SyncReport {
            written: all,
            total: all,
            deleted: 0
        }
    );
    let expected = vec![
        ("outputs/j1/ckpt/big.bin".to_string(), PART as u64 + 10),
        ("outputs/j1/model.txt".to_string(), 7),
    ];
    assert_eq!(listed(objects.as_ref()).await, expected);

    let work = tempfile::tempdir().unwrap();
    let tar_path = work.path().join("outputs-j2.tar");
    archive(outputs.path(), &tar_path);
    let (report, _) = sync(objects.clone(), "j2", Outputs::Tar(tar_path), Manifest::default())
        .await
        .unwrap();
    assert_eq!(report.written, all);
}

/// A second sync sends only what changed and deletes what is gone, from a directory and
/// from an engine's archive alike; a fresh manifest learns from the store what to delete.
#[tokio::test]
async fn a_sync_sends_only_what_changed_and_deletes_what_is_gone() {
    for as_archive in [false, true] {
        let (_store_dir, objects) = store();
        let outputs = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let tar_path = work.path().join("outputs.tar");
        let take = || match as_archive {
            false => Outputs::Dir(outputs.path().to_path_buf()),
            true => {
                archive(outputs.path(), &tar_path);
                Outputs::Tar(tar_path.clone())
            }
        };
        std::fs::create_dir_all(outputs.path().join("ckpt")).unwrap();
        std::fs::write(outputs.path().join("ckpt/1.bin"), vec![1u8; 1000]).unwrap();
        std::fs::write(outputs.path().join("ckpt/2.bin"), vec![2u8; 1000]).unwrap();
        std::fs::write(outputs.path().join("log.txt"), "a").unwrap();
        let (first, manifest) = sync(objects.clone(), "j", take(), Manifest::default()).await.unwrap();
        assert_eq!(first.written.files, 3, "archive: {as_archive}");

        // Unchanged: nothing sent (the times may be too recent to trust: then each file is
        // hashed, and still not sent).
        let (again, manifest) = sync(objects.clone(), "j", take(), manifest).await.unwrap();
        assert_eq!(again.written, Synced::default(), "archive: {as_archive}");
        assert_eq!(again.total, first.total);

        // One file rewritten with the same size, within the same second; one deleted; one new.
        std::fs::write(outputs.path().join("ckpt/2.bin"), vec![3u8; 1000]).unwrap();
        std::fs::remove_file(outputs.path().join("ckpt/1.bin")).unwrap();
        std::fs::write(outputs.path().join("ckpt/3.bin"), vec![4u8; 10]).unwrap();
        let (changed, manifest) = sync(objects.clone(), "j", take(), manifest).await.unwrap();
        assert_eq!(
            changed,
            SyncReport {
                written: Synced { files: 2, bytes: 1010 },
                total: Synced { files: 3, bytes: 1011 },
                deleted: 1
            },
            "archive: {as_archive}"
        );
        let stored = objects.get(&ObjectPath::from("outputs/j/ckpt/2.bin")).await.unwrap();
        assert_eq!(stored.bytes().await.unwrap().as_ref(), vec![3u8; 1000]);
        drop(manifest);

        // A runner restarted (a fresh manifest): everything is sent again, and nothing it did not
        // store itself is deleted (the store keeps log.txt, and what others put there).
        std::fs::remove_file(outputs.path().join("log.txt")).unwrap();
        objects
            .put(
                &ObjectPath::from("outputs/j/in/item.txt"),
                PutPayload::from("put by another"),
            )
            .await
            .unwrap();
        let (fresh, manifest) = sync(objects.clone(), "j", take(), Manifest::default()).await.unwrap();
        assert_eq!((fresh.written.files, fresh.deleted), (2, 0), "archive: {as_archive}");
        std::fs::remove_file(outputs.path().join("ckpt/3.bin")).unwrap();
        let (after, _) = sync(objects.clone(), "j", take(), manifest).await.unwrap();
        assert_eq!(after.deleted, 1, "archive: {as_archive}");
        assert_eq!(
            listed(objects.as_ref()).await,
            [
                ("outputs/j/ckpt/2.bin".to_string(), 1000),
                ("outputs/j/in/item.txt".to_string(), 14),
                ("outputs/j/log.txt".to_string(), 1)
            ]
        );
    }
}

/// A settled file whose size and time are unchanged is not read again (content changed
/// behind a restored time goes unseen, as with rsync and git); once its time moves, it is
/// hashed and sent.
#[tokio::test]
async fn settled_files_are_skipped_unread_and_a_moved_time_is_hashed() {
    let (_store_dir, objects) = store();
    let outputs = tempfile::tempdir().unwrap();
    let file = outputs.path().join("weights.bin");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    let write = |byte: u8, time: Option<std::time::SystemTime>| {
        std::fs::write(&file, vec![byte; 100]).unwrap();
        if let Some(time) = time {
            std::fs::File::options()
                .write(true)
                .open(&file)
                .unwrap()
                .set_modified(time)
                .unwrap();
        }
    };
    let stored = || async {
        let got = objects.get(&ObjectPath::from("outputs/j/weights.bin")).await.unwrap();
        got.bytes().await.unwrap()[0]
    };
    write(1, Some(old));
    let dir = || Outputs::Dir(outputs.path().to_path_buf());
    let (_, manifest) = sync(objects.clone(), "j", dir(), Manifest::default()).await.unwrap();
    assert!(manifest.files["weights.bin"].settled);
    write(2, Some(old));
    let (same, manifest) = sync(objects.clone(), "j", dir(), manifest).await.unwrap();
    assert_eq!(same.written, Synced::default());
    assert_eq!(stored().await, 1, "skipped unread");
    write(3, None);
    let (changed, _) = sync(objects.clone(), "j", dir(), manifest).await.unwrap();
    assert_eq!(changed.written, Synced { files: 1, bytes: 100 });
    assert_eq!(stored().await, 3);
}
