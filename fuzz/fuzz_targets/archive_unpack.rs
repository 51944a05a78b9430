//! A code bundle, a dataset or restored outputs unpacked into a directory: whatever the bytes,
//! no panic, nothing written outside the destination, and an error that says why.
//!
//! The first byte chooses whether the rest is gzipped by the harness (so the fuzzer can shape
//! the tar itself) or taken as the compressed archive.

#![no_main]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use kiln_formats::archive::{self, Limits};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_bytes: 1 << 20,
    max_entries: 256,
};

/// A root of its own for one run, on tmpfs when there is one (several times faster than a
/// disk), removed when dropped.
fn root() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Removes a tree whatever modes the archive gave its directories.
fn remove(path: &Path) {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return;
    };
    if metadata.is_dir() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
        for entry in std::fs::read_dir(path).unwrap() {
            remove(&entry.unwrap().path());
        }
        std::fs::remove_dir(path).unwrap();
    } else {
        std::fs::remove_file(path).unwrap();
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let input = if mode & 1 == 0 {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(rest).unwrap();
        encoder.finish().unwrap()
    } else {
        rest.to_vec()
    };
    let root_dir = root();
    let root = root_dir.path();
    let dest = root.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let unpacked = archive::unpack(input.as_slice(), &dest, LIMITS);
    if let Err(error) = &unpacked {
        assert!(!error.to_string().is_empty());
    }
    // Only `dest` in the root, and no symlink under it resolves outside.
    let names: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["dest"], "written outside the destination");
    let dest = dest.canonicalize().unwrap();
    let mut pending = vec![dest.clone()];
    while let Some(dir) = pending.pop() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let metadata = std::fs::symlink_metadata(&path).unwrap();
            if metadata.file_type().is_symlink() {
                if let Ok(resolved) = path.canonicalize() {
                    assert!(
                        resolved.starts_with(&dest),
                        "{} -> {}",
                        path.display(),
                        resolved.display()
                    );
                }
            } else if metadata.is_dir() {
                pending.push(path);
            }
        }
    }
    remove(&dest);
    // What check refuses, unpack refuses.
    if archive::check(input.as_slice(), LIMITS).is_err() {
        assert!(unpacked.is_err(), "check refused an archive unpack took");
    }
});
