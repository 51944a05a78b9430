//! An archive checked without writing (what a Docker runner does before the engine unpacks
//! it, and what a restore of outputs is checked with): no panic, and an error that says why.

#![no_main]

use kiln_formats::archive::{self, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 256,
    };
    if let Err(error) = archive::check(data, limits) {
        assert!(!error.to_string().is_empty());
    }
});
