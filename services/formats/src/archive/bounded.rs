//! A reader cut off at a position the caller moves: the tar reader reads an entry's headers
//! (and holds GNU long names and pax extensions in memory) before the entry is handed over, so
//! the walk lets it read only so far past the end of the last entry's data.

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

/// The position reached in the decompressed stream, and the one past which reading fails.
#[derive(Debug, Clone, Default)]
pub(super) struct Cutoff(Rc<Positions>);

#[derive(Debug, Default)]
struct Positions {
    at: Cell<u64>,
    read: Cell<u64>,
}

impl Cutoff {
    pub(super) fn new(at: u64) -> Cutoff {
        let cutoff = Cutoff::default();
        cutoff.set(at);
        cutoff
    }

    pub(super) fn set(&self, at: u64) {
        self.0.at.set(at);
    }

    /// Bytes read so far.
    pub(super) fn position(&self) -> u64 {
        self.0.read.get()
    }
}

/// Reads `inner` up to the cut-off, then fails with a message that names the limit.
pub(super) struct Bounded<R> {
    inner: R,
    cutoff: Cutoff,
}

impl<R> Bounded<R> {
    pub(super) fn new(inner: R, cutoff: Cutoff) -> Bounded<R> {
        Bounded { inner, cutoff }
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.cutoff.position();
        let left = self.cutoff.0.at.get().saturating_sub(read);
        if left == 0 && !buf.is_empty() {
            return Err(io::Error::other(format!(
                "an entry's headers (long names, pax extensions) pass {} bytes, the limit",
                super::MAX_HEADER_BYTES
            )));
        }
        let len = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..len])?;
        self.cutoff.0.read.set(read + n as u64);
        Ok(n)
    }
}
