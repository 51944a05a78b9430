//! Properties over generated archives: hostile ones (traversal, links, devices, extension
//! headers) never write outside the destination, valid ones unpack as packed, and past a
//! limit the limit is named.

use proptest::prelude::*;
use tar::EntryType;

use super::*;

/// Path components an attacker would pick, traversal included.
fn component() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a", "b", "secret", "..", ".", "", "dest"])
}

fn hostile_path() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(component(), 1..4))
        .prop_map(|(absolute, parts)| format!("{}{}", if absolute { "/" } else { "" }, parts.join("/")))
}

fn hostile_entry() -> impl Strategy<Value = Raw> {
    let kind = prop::sample::select(vec![
        EntryType::Regular,
        EntryType::Directory,
        EntryType::Symlink,
        EntryType::Link,
        EntryType::Char,
        EntryType::Fifo,
        EntryType::GNULongName,
        EntryType::XHeader,
        EntryType::new(b'Z'),
    ]);
    (
        hostile_path(),
        kind,
        hostile_path(),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(path, kind, link, data)| Raw { path, kind, link, data })
}

/// A valid archive: files under a few directories, symlinks that climb no higher than their
/// own directory, hard links to earlier files. Each entry's name is unique, so none is placed
/// under another's file.
fn valid_entries() -> impl Strategy<Value = Vec<Raw>> {
    let dirs = prop::collection::vec(prop::sample::select(vec!["d1", "d2", "d3"]), 0..3);
    prop::collection::vec(
        (
            dirs,
            0u8..3,
            prop::collection::vec(any::<u8>(), 0..256),
            any::<prop::sample::Index>(),
        ),
        1..24,
    )
    .prop_map(|specs| {
        let mut entries: Vec<Raw> = Vec::new();
        let mut files: Vec<String> = Vec::new();
        for (i, (dirs, kind, data, pick)) in specs.into_iter().enumerate() {
            let dir: String = dirs.iter().map(|d| format!("{d}/")).collect();
            match kind {
                1 if !files.is_empty() => {
                    let target = pick.get(&files).clone();
                    let climb = "../".repeat(dirs.len());
                    entries.push(raw(
                        &format!("{dir}l{i}"),
                        EntryType::Symlink,
                        &format!("{climb}{target}"),
                        b"",
                    ));
                }
                2 if !files.is_empty() => {
                    let target = pick.get(&files).clone();
                    entries.push(raw(&format!("{dir}h{i}"), EntryType::Link, &target, b""));
                }
                _ => {
                    let path = format!("{dir}f{i}");
                    files.push(path.clone());
                    entries.push(raw(&path, EntryType::Regular, "", &data));
                }
            }
        }
        entries
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_nor_escape(bytes in prop::collection::vec(any::<u8>(), 0..4096), zip in any::<bool>()) {
        let root = Root::new();
        let input = if zip { gzip(&bytes) } else { bytes };
        let unpacked = root.unpack(&input, LIMITS);
        let checked = check(input.as_slice(), LIMITS);
        if checked.is_err() {
            prop_assert!(unpacked.is_err());
        }
        root.assert_contained();
    }

    #[test]
    fn hostile_archives_never_escape(entries in prop::collection::vec(hostile_entry(), 1..8)) {
        let root = Root::new();
        let bytes = archive(&entries);
        let unpacked = root.unpack(&bytes, LIMITS);
        root.assert_contained();
        if check(bytes.as_slice(), LIMITS).is_err() {
            prop_assert!(unpacked.is_err(), "check refused what unpack took: {entries:?}");
        }
        if let Err(error) = unpacked {
            prop_assert!(!error.to_string().is_empty());
        }
    }

    #[test]
    fn valid_archives_unpack_as_packed(entries in valid_entries()) {
        let root = Root::new();
        let count = root.unpack(&archive(&entries), LIMITS).map_err(|e| TestCaseError::fail(format!("{e}: {entries:?}")))?;
        prop_assert_eq!(count, entries.len() as u64);
        prop_assert_eq!(check(archive(&entries).as_slice(), LIMITS).unwrap(), count);
        for entry in &entries {
            if entry.kind == EntryType::Regular {
                prop_assert_eq!(std::fs::read(root.dest().join(&entry.path)).unwrap(), entry.data.clone());
            } else {
                // Links read as their target file.
                prop_assert!(std::fs::metadata(root.dest().join(&entry.path)).unwrap().is_file());
            }
        }
        root.assert_contained();
    }

    #[test]
    fn past_a_limit_is_refused_with_the_limit_named(entries in valid_entries(), cut in 0u64..4) {
        let size: u64 = entries.iter().map(|e| e.data.len() as u64).sum();
        prop_assume!(size > 0);
        let limits = Limits { max_bytes: size.saturating_sub(cut + 1), max_entries: u64::MAX };
        let root = Root::new();
        let message = root.unpack(&archive(&entries), limits).unwrap_err().to_string();
        prop_assert!(message.contains(&format!("more than {} bytes, the limit", limits.max_bytes)), "{}", message);
        let limits = Limits { max_bytes: u64::MAX, max_entries: entries.len() as u64 - 1 };
        let message = check(archive(&entries).as_slice(), limits).unwrap_err().to_string();
        prop_assert!(message.contains("entries, the limit"), "{}", message);
        root.assert_contained();
    }
}
