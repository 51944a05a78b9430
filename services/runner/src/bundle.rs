//! Unpacking a code bundle (tar.gz) into a job's work directory, safely.
//!
//! The archive comes from a user, so every entry is checked before it touches the disk:
//! - paths hold only normal components (no `/`, no `..`), and never pass through a symlink the
//!   archive made, so an entry's place on disk is exactly its path;
//! - symlink targets are relative and may only climb (`../`) as high as the link's own
//!   directory, then descend, so no link points outside the directory;
//! - hard links name an entry of the archive; devices, FIFOs and other types are refused;
//! - the unpacked size is bounded.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use tar::EntryType;

use crate::error::{Error, Result};

/// Largest size a code bundle, a dataset or a resumed attempt's restored outputs may unpack to.
pub const MAX_UNPACKED_BYTES: u64 = 64 << 30;

/// Unpacks a gzip-compressed tar from `reader` into `dest` (which should be empty), refusing
/// anything that could escape it. Returns the number of entries.
pub fn unpack(reader: impl Read, dest: &Path, max_bytes: u64) -> Result<u64> {
    walk(reader, max_bytes, move |entry, path| {
        let unpacked = entry
            .unpack_in(dest)
            .map_err(|e| Error::BadBundle(format!("cannot unpack {}: {e}", path.display())))?;
        if unpacked {
            Ok(())
        } else {
            Err(Error::BadBundle(format!(
                "entry {} was refused by the unpacker",
                path.display()
            )))
        }
    })
}

/// Checks a gzip-compressed tar as [`unpack`] would, without writing anything, so an archive
/// can be handed to an engine that unpacks it itself. Returns the number of entries.
pub fn check(reader: impl Read, max_bytes: u64) -> Result<u64> {
    walk(reader, max_bytes, |_, _| Ok(()))
}

/// Checks every entry, then hands it to `each`.
fn walk<R: Read>(
    reader: R,
    max_bytes: u64,
    mut each: impl FnMut(&mut tar::Entry<'_, flate2::read::GzDecoder<R>>, &Path) -> Result<()>,
) -> Result<u64> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(reader));
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let mut symlinks: HashSet<PathBuf> = HashSet::new();
    let mut total: u64 = 0;
    let mut count: u64 = 0;
    let entries = archive
        .entries()
        .map_err(|e| Error::BadBundle(format!("not a tar.gz archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| Error::BadBundle(format!("corrupt archive: {e}")))?;
        let path = entry
            .path()
            .map_err(|e| Error::BadBundle(format!("entry with an unreadable path: {e}")))?
            .into_owned();
        let relative = normal_path(&path)
            .ok_or_else(|| Error::BadBundle(format!("entry {} leaves the work directory", path.display())))?;
        if through_symlink(&relative, &symlinks) {
            return Err(Error::BadBundle(format!(
                "entry {} is placed through a symlink",
                path.display()
            )));
        }
        match entry.header().entry_type() {
            EntryType::Regular | EntryType::Continuous | EntryType::Directory => {}
            EntryType::Symlink => {
                let target = link_target(&entry, &path)?;
                if !symlink_stays_inside(&relative, &target) {
                    return Err(Error::BadBundle(format!(
                        "symlink {} -> {} points outside the work directory",
                        path.display(),
                        target.display()
                    )));
                }
                symlinks.insert(relative.clone());
            }
            EntryType::Link => {
                let target = link_target(&entry, &path)?;
                let inside = normal_path(&target).is_some_and(|target| !through_symlink(&target, &symlinks));
                if !inside {
                    return Err(Error::BadBundle(format!(
                        "hard link {} -> {} points outside the work directory",
                        path.display(),
                        target.display()
                    )));
                }
            }
            other => {
                return Err(Error::BadBundle(format!(
                    "entry {} has unsupported type {other:?}",
                    path.display()
                )));
            }
        }
        total = total.saturating_add(entry.header().size().unwrap_or(0));
        if total > max_bytes {
            return Err(Error::BadBundle(format!("unpacks to more than {max_bytes} bytes")));
        }
        each(&mut entry, &path)?;
        count += 1;
    }
    Ok(count)
}

fn link_target<R: Read>(entry: &tar::Entry<'_, R>, path: &Path) -> Result<PathBuf> {
    entry
        .link_name()
        .map_err(|e| Error::BadBundle(format!("link {} has an unreadable target: {e}", path.display())))?
        .map(|target| target.into_owned())
        .ok_or_else(|| Error::BadBundle(format!("link {} has no target", path.display())))
}

/// Returns the path without `.` components when it has only normal ones.
fn normal_path(path: &Path) -> Option<PathBuf> {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => normal.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!normal.as_os_str().is_empty()).then_some(normal)
}

/// Tells whether any proper ancestor of `path` is a symlink the archive made.
fn through_symlink(path: &Path, symlinks: &HashSet<PathBuf>) -> bool {
    path.ancestors().skip(1).any(|ancestor| symlinks.contains(ancestor))
}

/// Tells whether a symlink at `link` (relative to the root) pointing at `target` stays inside:
/// the target is relative, climbs at most to the root, and then only descends.
fn symlink_stays_inside(link: &Path, target: &Path) -> bool {
    let depth = link.components().count().saturating_sub(1);
    let mut climbs = 0;
    let mut descending = false;
    for component in target.components() {
        match component {
            Component::ParentDir if !descending => climbs += 1,
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return false,
            Component::CurDir => {}
            Component::Normal(_) => descending = true,
        }
    }
    climbs <= depth
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (path, type, link target, content) of an entry.
    type RawEntry<'a> = (&'a str, EntryType, &'a str, &'a [u8]);

    /// Builds a tar.gz from raw entries, bypassing the builder's own path checks, as an attacker
    /// would.
    fn archive(entries: &[RawEntry<'_>]) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        for (path, kind, link, data) in entries {
            let mut header = tar::Header::new_old();
            {
                let raw = header.as_old_mut();
                raw.name[..path.len()].copy_from_slice(path.as_bytes());
                raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
            }
            header.set_entry_type(*kind);
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append(&header, *data).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    fn try_unpack(entries: &[RawEntry<'_>]) -> (tempfile::TempDir, Result<u64>) {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("code");
        std::fs::create_dir(&dest).unwrap();
        let result = unpack(archive(entries).as_slice(), &dest, 1 << 20);
        (dir, result)
    }

    #[test]
    fn ordinary_bundles_unpack() {
        let (dir, result) = try_unpack(&[
            ("src/", EntryType::Directory, "", b""),
            ("src/train.py", EntryType::Regular, "", b"print('hi')\n"),
            ("latest", EntryType::Symlink, "src/train.py", b""),
            ("src/up", EntryType::Symlink, "../src", b""),
            ("copy.py", EntryType::Link, "src/train.py", b""),
        ]);
        assert_eq!(result.unwrap(), 5);
        let code = dir.path().join("code");
        assert_eq!(std::fs::read_to_string(code.join("latest")).unwrap(), "print('hi')\n");
        assert_eq!(std::fs::read_to_string(code.join("copy.py")).unwrap(), "print('hi')\n");
    }

    #[test]
    fn path_traversal_is_refused() {
        for path in ["../escape.txt", "/etc/kiln-escape", "a/../../escape.txt"] {
            let (dir, result) = try_unpack(&[(path, EntryType::Regular, "", b"x")]);
            let error = result.unwrap_err().to_string();
            assert!(error.contains("leaves the work directory"), "{path}: {error}");
            assert!(!dir.path().join("escape.txt").try_exists().unwrap());
        }
    }

    #[test]
    fn escaping_links_are_refused() {
        let cases: &[&[RawEntry]] = &[
            &[("evil", EntryType::Symlink, "/etc/passwd", b"")],
            &[("evil", EntryType::Symlink, "..", b"")],
            &[("a/evil", EntryType::Symlink, "../..", b"")],
            &[("evil", EntryType::Symlink, "x/../../..", b"")],
            &[("evil", EntryType::Link, "../outside", b"")],
            // A link to "." and then a link through it, which a lexical check alone would pass.
            &[
                ("dot", EntryType::Symlink, ".", b""),
                ("dot/evil", EntryType::Symlink, "../x", b""),
            ],
            &[
                ("dir", EntryType::Symlink, "sub", b""),
                ("dir/file", EntryType::Regular, "", b"x"),
            ],
        ];
        for entries in cases {
            let (_dir, result) = try_unpack(entries);
            assert!(
                matches!(result, Err(Error::BadBundle(_))),
                "{entries:?} gave {result:?}"
            );
        }
    }

    #[test]
    fn devices_and_bombs_are_refused() {
        let (_dir, result) = try_unpack(&[("dev", EntryType::Char, "", b"")]);
        assert!(result.unwrap_err().to_string().contains("unsupported type"));
        let big = vec![0u8; 2 << 20];
        let (_dir, result) = try_unpack(&[("big", EntryType::Regular, "", &big)]);
        assert!(result.unwrap_err().to_string().contains("more than"));
    }

    #[test]
    fn check_agrees_with_unpack() {
        let good = archive(&[("a/b.txt", EntryType::Regular, "", b"x")]);
        assert_eq!(check(good.as_slice(), 1 << 20).unwrap(), 1);
        let bad = archive(&[("../b.txt", EntryType::Regular, "", b"x")]);
        assert!(check(bad.as_slice(), 1 << 20).is_err());
    }

    #[test]
    fn garbage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let result = unpack(&b"not an archive"[..], dir.path(), 1 << 20);
        assert!(matches!(result, Err(Error::BadBundle(_))));
    }
}
