//! Unpacking a gzip-compressed tar from a user (a code bundle, a dataset, the outputs an earlier
//! attempt synced), safely. Every entry is checked before it touches the disk:
//! - paths hold only normal components (no `/`, no `..`), and never pass through a symlink the
//!   archive made, so an entry's place on disk is exactly its path;
//! - symlink targets are relative and may only climb (`../`) as high as the link's own
//!   directory, then descend, so no link points outside the directory;
//! - hard links name an entry of the archive that is not one of its symlinks (a hard link to a
//!   symlink is a copy of it somewhere else, where its target may point outside); devices,
//!   FIFOs, sparse files and other types are refused;
//! - the unpacked size and the number of entries are bounded ([`Limits`]), and so are the
//!   headers before each entry (GNU long names, pax extensions), which the tar reader holds in
//!   memory: the decompressed stream is cut off past [`MAX_HEADER_BYTES`] of them.
//!
//! The archive is streamed: nothing but one entry's headers is ever held in memory.

mod bounded;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use tar::EntryType;

use self::bounded::{Bounded, Cutoff};
use crate::error::{Error, Result, with_sources};

/// Most bytes of headers (the 512-byte header blocks, GNU long names and links, pax
/// extensions) read before one entry; the tar reader keeps long names and pax extensions in
/// memory, so this bounds what one entry can make it allocate.
pub const MAX_HEADER_BYTES: u64 = 1 << 20;

/// What an archive may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Sum of the entries' sizes.
    pub max_bytes: u64,
    /// Number of entries (files, directories and links).
    pub max_entries: u64,
}

/// Unpacks a gzip-compressed tar from `reader` into `dest` (which should be empty), refusing
/// anything that could escape it or pass `limits`. Returns the number of entries.
pub fn unpack(reader: impl Read, dest: &Path, limits: Limits) -> Result<u64> {
    walk(reader, limits, move |entry, path| {
        let unpacked = entry
            .unpack_in(dest)
            .map_err(|e| Error::Archive(format!("cannot unpack {}: {}", path.display(), with_sources(&e))))?;
        if unpacked {
            Ok(())
        } else {
            Err(Error::Archive(format!(
                "entry {} was refused by the unpacker",
                path.display()
            )))
        }
    })
}

/// Checks a gzip-compressed tar as [`unpack`] would, without writing anything, so an archive
/// can be handed to an engine that unpacks it itself. Returns the number of entries.
pub fn check(reader: impl Read, limits: Limits) -> Result<u64> {
    walk(reader, limits, |_, _| Ok(()))
}

type Decoded<R> = Bounded<flate2::read::GzDecoder<R>>;

/// Checks every entry, then hands it to `each`.
fn walk<R: Read>(
    reader: R,
    limits: Limits,
    mut each: impl FnMut(&mut tar::Entry<'_, Decoded<R>>, &Path) -> Result<()>,
) -> Result<u64> {
    let cutoff = Cutoff::new(MAX_HEADER_BYTES);
    let mut archive = tar::Archive::new(Bounded::new(flate2::read::GzDecoder::new(reader), cutoff.clone()));
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let mut symlinks: HashSet<PathBuf> = HashSet::new();
    let mut total: u64 = 0;
    let mut count: u64 = 0;
    let entries = archive
        .entries()
        .map_err(|e| Error::Archive(format!("not a tar.gz archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| Error::Archive(format!("corrupt archive: {e}")))?;
        count += 1;
        if count > limits.max_entries {
            return Err(Error::Archive(format!(
                "the archive has more than {} entries, the limit",
                limits.max_entries
            )));
        }
        let path = entry
            .path()
            .map_err(|e| Error::Archive(format!("entry with an unreadable path: {e}")))?
            .into_owned();
        let relative = normal_path(&path)
            .ok_or_else(|| Error::Archive(format!("entry {} leaves the destination", path.display())))?;
        if through_symlink(&relative, &symlinks) {
            return Err(Error::Archive(format!(
                "entry {} is placed through a symlink",
                path.display()
            )));
        }
        match entry.header().entry_type() {
            EntryType::Regular | EntryType::Continuous | EntryType::Directory => {}
            EntryType::Symlink => {
                let target = link_target(&entry, &path)?;
                if !symlink_stays_inside(&relative, &target) {
                    return Err(Error::Archive(format!(
                        "symlink {} -> {} points outside the destination",
                        path.display(),
                        target.display()
                    )));
                }
                symlinks.insert(relative.clone());
            }
            EntryType::Link => {
                let target = link_target(&entry, &path)?;
                let Some(target) = normal_path(&target).filter(|target| !through_symlink(target, &symlinks)) else {
                    return Err(Error::Archive(format!(
                        "hard link {} -> {} points outside the destination",
                        path.display(),
                        target.display()
                    )));
                };
                if symlinks.contains(&target) {
                    return Err(Error::Archive(format!(
                        "hard link {} -> {} names a symlink; link to the file instead",
                        path.display(),
                        target.display()
                    )));
                }
            }
            other => {
                return Err(Error::Archive(format!(
                    "entry {} has unsupported type {other:?}",
                    path.display()
                )));
            }
        }
        // The size the reader goes by: a pax `size` overrides the header's.
        let size = entry.size();
        total = total.saturating_add(size);
        if total > limits.max_bytes {
            return Err(Error::Archive(format!(
                "the archive unpacks to more than {} bytes, the limit",
                limits.max_bytes
            )));
        }
        // This entry's data and padding may be read, then the headers of the next one.
        let data_end = entry
            .raw_file_position()
            .saturating_add(size.div_ceil(512).saturating_mul(512));
        cutoff.set(data_end.saturating_add(MAX_HEADER_BYTES));
        each(&mut entry, &path)?;
    }
    // Read to the end of the gzip stream, so a truncated or corrupt one is refused (its
    // checksum is checked there) rather than taken for an archive that ends early.
    let end = cutoff.position().saturating_add(MAX_HEADER_BYTES);
    cutoff.set(end);
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink()).map_err(|e| {
        Error::Archive(format!(
            "the archive does not end as a tar.gz should (truncated, or data after it): {e}"
        ))
    })?;
    Ok(count)
}

fn link_target<R: Read>(entry: &tar::Entry<'_, R>, path: &Path) -> Result<PathBuf> {
    entry
        .link_name()
        .map_err(|e| Error::Archive(format!("link {} has an unreadable target: {e}", path.display())))?
        .map(|target| target.into_owned())
        .ok_or_else(|| Error::Archive(format!("link {} has no target", path.display())))
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
