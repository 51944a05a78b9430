//! Archives as an attacker writes them (raw headers, bypassing the builder's checks), and
//! properties over generated ones: nothing is written outside the destination, every refusal
//! says why, limits are named, and valid archives unpack as they were packed (properties in
//! `properties`).

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tar::EntryType;

use super::*;

const LIMITS: Limits = Limits {
    max_bytes: 1 << 20,
    max_entries: 1000,
};

/// One entry as written into the archive, raw.
#[derive(Clone)]
struct Raw {
    path: String,
    kind: EntryType,
    link: String,
    data: Vec<u8>,
}

/// Shows an entry with the size of its data, not the data (some are megabytes).
impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path: String = self.path.chars().take(120).collect();
        write!(
            f,
            "{path:?} {:?} -> {:?} ({} bytes)",
            self.kind,
            self.link,
            self.data.len()
        )
    }
}

fn raw(path: &str, kind: EntryType, link: &str, data: &[u8]) -> Raw {
    Raw {
        path: path.into(),
        kind,
        link: link.into(),
        data: data.to_vec(),
    }
}

/// A GNU header with the path and link name written as they are (up to 100 bytes each).
fn header_of(entry: &Raw) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    {
        let old = header.as_old_mut();
        let path = &entry.path.as_bytes()[..entry.path.len().min(100)];
        let link = &entry.link.as_bytes()[..entry.link.len().min(100)];
        old.name[..path.len()].copy_from_slice(path);
        old.linkname[..link.len()].copy_from_slice(link);
    }
    header.set_entry_type(entry.kind);
    header.set_size(entry.data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    header
}

/// The tar (uncompressed) of raw entries.
fn tar_of(entries: &[Raw]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        builder.append(&header_of(entry), entry.data.as_slice()).unwrap();
    }
    builder.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn archive(entries: &[Raw]) -> Vec<u8> {
    gzip(&tar_of(entries))
}

/// A root holding `dest` (where archives unpack) and `secret` (which they must not reach).
struct Root {
    dir: tempfile::TempDir,
}

impl Root {
    fn new() -> Root {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("dest")).unwrap();
        std::fs::write(dir.path().join("secret"), b"secret").unwrap();
        Root { dir }
    }

    fn dest(&self) -> std::path::PathBuf {
        self.dir.path().join("dest")
    }

    fn unpack(&self, bytes: &[u8], limits: Limits) -> Result<u64> {
        unpack(bytes, &self.dest(), limits)
    }

    /// Fails when anything was written outside `dest`, the secret changed or gained a link,
    /// or a symlink under `dest` resolves outside it.
    fn assert_contained(&self) {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["dest", "secret"], "something was written next to dest");
        let secret = self.dir.path().join("secret");
        assert_eq!(std::fs::read(&secret).unwrap(), b"secret");
        assert_eq!(
            std::fs::metadata(&secret).unwrap().nlink(),
            1,
            "the secret was hard-linked"
        );
        let dest = self.dest().canonicalize().unwrap();
        let mut pending = vec![dest.clone()];
        while let Some(dir) = pending.pop() {
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
    }
}

fn refusal(entries: &[Raw]) -> String {
    let root = Root::new();
    let result = root.unpack(&archive(entries), LIMITS);
    root.assert_contained();
    let checked = check(archive(entries).as_slice(), LIMITS);
    assert!(checked.is_err(), "check passed what unpack refuses: {entries:?}");
    match result {
        Err(Error::Archive(message)) => message,
        other => panic!("{entries:?} gave {other:?}"),
    }
}

#[test]
fn ordinary_archives_unpack() {
    let root = Root::new();
    let entries = [
        raw("src/", EntryType::Directory, "", b""),
        raw("src/train.py", EntryType::Regular, "", b"print('hi')\n"),
        raw("latest", EntryType::Symlink, "src/train.py", b""),
        raw("src/up", EntryType::Symlink, "../src", b""),
        raw("copy.py", EntryType::Link, "src/train.py", b""),
    ];
    assert_eq!(root.unpack(&archive(&entries), LIMITS).unwrap(), 5);
    let dest = root.dest();
    assert_eq!(std::fs::read_to_string(dest.join("latest")).unwrap(), "print('hi')\n");
    assert_eq!(std::fs::read_to_string(dest.join("copy.py")).unwrap(), "print('hi')\n");
    assert_eq!(check(archive(&entries).as_slice(), LIMITS).unwrap(), 5);
    root.assert_contained();
}

#[test]
fn path_traversal_is_refused() {
    for path in ["../secret", "/etc/kiln-escape", "a/../../secret", "./../secret"] {
        let message = refusal(&[raw(path, EntryType::Regular, "", b"x")]);
        assert!(message.contains("leaves the destination"), "{path}: {message}");
    }
}

#[test]
fn escaping_links_are_refused() {
    let cases: &[&[Raw]] = &[
        &[raw("evil", EntryType::Symlink, "/etc/passwd", b"")],
        &[raw("evil", EntryType::Symlink, "..", b"")],
        &[raw("a/evil", EntryType::Symlink, "../..", b"")],
        &[raw("evil", EntryType::Symlink, "x/../../..", b"")],
        &[raw("evil", EntryType::Link, "../secret", b"")],
        &[raw("evil", EntryType::Link, "/etc/passwd", b"")],
        // A link to "." and then a link through it, which a lexical check alone would pass.
        &[
            raw("dot", EntryType::Symlink, ".", b""),
            raw("dot/evil", EntryType::Symlink, "../x", b""),
        ],
        &[
            raw("dir", EntryType::Symlink, "sub", b""),
            raw("dir/file", EntryType::Regular, "", b"x"),
        ],
        // A hard link to a symlink is the symlink again elsewhere, where `..` climbs out.
        &[
            raw("a/b/up", EntryType::Symlink, "../secret", b""),
            raw("up", EntryType::Link, "a/b/up", b""),
        ],
    ];
    for entries in cases {
        let message = refusal(entries);
        assert!(
            message.contains("outside") || message.contains("through a symlink") || message.contains("names a symlink"),
            "{entries:?}: {message}"
        );
    }
}

#[test]
fn devices_fifos_and_sparse_files_are_refused() {
    for kind in [EntryType::Char, EntryType::Block, EntryType::Fifo, EntryType::GNUSparse] {
        let message = refusal(&[raw("dev", kind, "", b"")]);
        assert!(
            message.contains("unsupported type") || message.contains("corrupt archive"),
            "{kind:?}: {message}"
        );
    }
}

#[test]
fn garbage_and_truncated_archives_are_refused() {
    let root = Root::new();
    assert!(root.unpack(b"not an archive", LIMITS).is_err());
    let whole = archive(&[raw("a.txt", EntryType::Regular, "", &[7u8; 4096])]);
    for cut in [10, whole.len() / 2, whole.len() - 9] {
        assert!(root.unpack(&whole[..cut], LIMITS).is_err(), "cut at {cut}");
    }
    // A gzip of a tar whose header checksum is wrong.
    let mut tar = tar_of(&[raw("a.txt", EntryType::Regular, "", b"x")]);
    tar[0] ^= 1;
    let message = root.unpack(&gzip(&tar), LIMITS).unwrap_err().to_string();
    assert!(message.contains("corrupt archive"), "{message}");
    root.assert_contained();
}

/// Reads through `inner`, counting the bytes.
struct Counting<'a, R> {
    inner: R,
    count: &'a mut u64,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        *self.count += n as u64;
        Ok(n)
    }
}

#[test]
fn a_bomb_is_refused_with_the_limit_named_before_it_is_read() {
    // 64 MiB of zeros is about 64 KiB gzipped; the limit is 1 MiB.
    let bomb = archive(&[raw("big", EntryType::Regular, "", &vec![0u8; 64 << 20])]);
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    let root = Root::new();
    let mut read = 0;
    let reader = Counting {
        inner: bomb.as_slice(),
        count: &mut read,
    };
    let message = unpack(reader, &root.dest(), LIMITS).unwrap_err().to_string();
    assert!(
        message.contains(&format!("more than {} bytes, the limit", LIMITS.max_bytes)),
        "{message}"
    );
    // Refused from its header: the compressed data behind it was (mostly) never read.
    assert!(read < 64 << 10, "read {read} compressed bytes");
    root.assert_contained();
    assert_eq!(std::fs::read_dir(root.dest()).unwrap().count(), 0);
}

/// A pax extended header (`x`) holding `records`, then the entry it describes.
fn with_pax(records: &[(&str, &str)], entry: Raw) -> Vec<Raw> {
    let mut data = Vec::new();
    for (key, value) in records {
        let body = format!(" {key}={value}\n");
        // The length counts its own digits.
        let mut len = body.len() + 1;
        while format!("{len}{body}").len() != len {
            len += 1;
        }
        data.extend_from_slice(format!("{len}{body}").as_bytes());
    }
    vec![raw("pax", EntryType::XHeader, "", &data), entry]
}

#[test]
fn a_pax_size_is_the_size_counted() {
    // The header says 0 bytes, pax says 2 MiB: the reader goes by pax, so must the limit.
    let entries = with_pax(&[("size", "2097152")], raw("big", EntryType::Regular, "", b""));
    let mut tar = tar_of(&entries);
    tar.truncate(tar.len() - 1024);
    tar.extend(std::iter::repeat_n(0u8, 2 << 20));
    tar.extend([0u8; 1024]);
    let root = Root::new();
    let message = root.unpack(&gzip(&tar), LIMITS).unwrap_err().to_string();
    assert!(message.contains("the limit"), "{message}");
    root.assert_contained();
}

#[test]
fn huge_long_names_and_pax_headers_are_refused_unread() {
    let long_name = vec![b'a'; 8 << 20];
    let gnu = vec![
        raw("././@LongLink", EntryType::GNULongName, "", &long_name),
        raw("short", EntryType::Regular, "", b"x"),
    ];
    let value = String::from_utf8(vec![b'b'; 8 << 20]).unwrap();
    let pax = with_pax(&[("path", &value)], raw("short", EntryType::Regular, "", b"x"));
    for entries in [gnu, pax] {
        let message = refusal(&entries);
        assert!(
            message.contains(&format!("pass {MAX_HEADER_BYTES} bytes, the limit")),
            "{message}"
        );
    }
    // A long name within the limit is fine (and too long for the file system: a clear error).
    let name = format!("{}/x", "d".repeat(200));
    let entries = [
        raw(
            "././@LongLink",
            EntryType::GNULongName,
            "",
            format!("{name}\0").as_bytes(),
        ),
        raw("short", EntryType::Regular, "", b"x"),
    ];
    let root = Root::new();
    assert_eq!(root.unpack(&archive(&entries), LIMITS).unwrap(), 1);
    assert!(root.dest().join(&name).is_file());
    let name = "n".repeat(5000);
    let entries = [
        raw("././@LongLink", EntryType::GNULongName, "", name.as_bytes()),
        raw("short", EntryType::Regular, "", b"x"),
    ];
    let message = root.unpack(&archive(&entries), LIMITS).unwrap_err().to_string();
    assert!(message.contains("cannot unpack"), "{message}");
    root.assert_contained();
}

#[test]
fn too_many_entries_are_refused_with_the_limit_named() {
    let entries: Vec<Raw> = (0..=LIMITS.max_entries)
        .map(|i| raw(&format!("f{i}"), EntryType::Regular, "", b""))
        .collect();
    let message = refusal(&entries);
    assert!(message.contains("more than 1000 entries, the limit"), "{message}");
}

mod properties;

/// The seeds of the archive fuzz targets (fuzz/corpus, written by fuzz/make_corpus.py) are
/// what their names say: `valid*` passes, every other one is refused, with the fuzz limits.
#[test]
fn the_fuzz_seeds_are_what_their_names_say() {
    let limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 256,
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/archive_check");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let result = check(std::fs::read(&path).unwrap().as_slice(), limits);
        if name.starts_with("valid") {
            assert!(result.is_ok(), "{name}: {result:?}");
        } else {
            assert!(result.is_err(), "{name} passed");
        }
        seen += 1;
    }
    assert!(seen >= 10, "{seen} seeds in {}", dir.display());
}
