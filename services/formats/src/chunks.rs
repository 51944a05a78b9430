//! Metric points packed into chunks: one CQL row holds up to [`CHUNK_POINTS`] points of one
//! partition, steps ascending, so the node pays for one row where it paid for a thousand.
//!
//! A chunk's clustering key is (last step, first step, digest of its steps): a redelivered batch
//! makes the same chunks, which overwrite themselves; a batch grouped differently on redelivery
//! makes chunks that overlap others, and the reader merges them, keeping one point per step.
//! Values are stored as their bits, so NaN and the infinities come back as they went.

/// Most points per chunk (24 bytes each).
pub const CHUNK_POINTS: usize = 1024;

/// One chunk, ready to write: first and last steps, digest, steps, values and times.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub first_step: i64,
    pub last_step: i64,
    pub digest: i64,
    pub steps: Vec<u8>,
    pub data: Vec<u8>,
}

/// A point as (step, value, time).
pub type Sample = (i64, f64, i64);

/// Packs the points of one partition (sorted by step; a repeated step keeps its first point)
/// into chunks.
pub fn pack(points: &[Sample]) -> Vec<Chunk> {
    let mut unique: Vec<Sample> = Vec::with_capacity(points.len());
    for &point in points {
        if unique.last().is_none_or(|last| last.0 != point.0) {
            unique.push(point);
        }
    }
    unique
        .chunks(CHUNK_POINTS)
        .map(|part| {
            let mut steps = Vec::with_capacity(part.len() * 8);
            let mut data = Vec::with_capacity(part.len() * 16);
            for &(step, value, ts) in part {
                steps.extend_from_slice(&step.to_le_bytes());
                data.extend_from_slice(&value.to_bits().to_le_bytes());
                data.extend_from_slice(&ts.to_le_bytes());
            }
            Chunk {
                first_step: part[0].0,
                last_step: part[part.len() - 1].0,
                digest: digest(&steps),
                steps,
                data,
            }
        })
        .collect()
}

/// FNV-1a of the steps: chunks with the same first and last steps but other steps between
/// differ in it.
fn digest(steps: &[u8]) -> i64 {
    let hash = steps.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    i64::from_le_bytes(hash.to_le_bytes())
}

fn word(bytes: &[u8], i: usize) -> [u8; 8] {
    bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes")
}

/// The steps of a stored chunk.
pub fn steps(steps: &[u8]) -> impl Iterator<Item = i64> + '_ {
    (0..steps.len() / 8).map(|i| i64::from_le_bytes(word(steps, i)))
}

/// The points of a stored chunk; a chunk whose columns disagree in length gives what they share.
pub fn samples<'a>(steps: &'a [u8], data: &'a [u8]) -> impl Iterator<Item = Sample> + 'a {
    let n = (steps.len() / 8).min(data.len() / 16);
    (0..n).map(|i| {
        (
            i64::from_le_bytes(word(steps, i)),
            f64::from_bits(u64::from_le_bytes(word(data, 2 * i))),
            i64::from_le_bytes(word(data, 2 * i + 1)),
        )
    })
}

/// Sorts points merged from overlapping chunks by step and keeps one point per step.
pub fn merge(points: &mut Vec<Sample>) {
    points.sort_by_key(|p| p.0);
    points.dedup_by_key(|p| p.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_come_back_as_they_went_special_values_included() {
        let points: Vec<Sample> = (0..2500)
            .map(|s| {
                (
                    s * 3,
                    [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.5][s as usize % 4],
                    s,
                )
            })
            .collect();
        let chunks = pack(&points);
        assert_eq!(chunks.len(), 3);
        assert_eq!((chunks[1].first_step, chunks[1].last_step), (1024 * 3, 2047 * 3));
        let back: Vec<Sample> = chunks.iter().flat_map(|c| samples(&c.steps, &c.data)).collect();
        assert_eq!(back.len(), points.len());
        for (a, b) in back.iter().zip(&points) {
            assert_eq!((a.0, a.1.to_bits(), a.2), (b.0, b.1.to_bits(), b.2));
        }
        assert_eq!(steps(&chunks[2].steps).count(), 2500 - 2048);
    }

    #[test]
    fn the_same_points_make_the_same_chunks_and_others_another_digest() {
        let points: Vec<Sample> = vec![(1, 1.0, 0), (2, 2.0, 0), (2, 9.0, 0), (5, 5.0, 0)];
        assert_eq!(pack(&points), pack(&points));
        assert_eq!(pack(&points)[0].steps.len(), 24, "a repeated step is kept once");
        let other = pack(&[(1, 1.0, 0), (3, 3.0, 0), (5, 5.0, 0)]);
        assert_ne!(pack(&points)[0].digest, other[0].digest);
        let mut merged: Vec<Sample> = [pack(&points), other]
            .iter()
            .flatten()
            .flat_map(|c| samples(&c.steps, &c.data).collect::<Vec<_>>())
            .collect();
        merge(&mut merged);
        assert_eq!(merged.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2, 3, 5]);
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// A row read back may hold anything (a corrupt or foreign one): no panic, and no
            /// more points than its shorter column holds.
            #[test]
            fn any_bytes_read_back_without_a_panic(
                step_bytes in prop::collection::vec(any::<u8>(), 0..200),
                data in prop::collection::vec(any::<u8>(), 0..400),
            ) {
                prop_assert_eq!(steps(&step_bytes).count(), step_bytes.len() / 8);
                let n = samples(&step_bytes, &data).count();
                prop_assert_eq!(n, (step_bytes.len() / 8).min(data.len() / 16));
            }

            /// Sorted points pack into chunks of at most CHUNK_POINTS that read back as they
            /// went, one point per step.
            #[test]
            fn sorted_points_come_back_as_packed(mut points in prop::collection::vec((any::<i64>(), any::<f64>(), any::<i64>()), 0..3000)) {
                points.sort_by_key(|p| p.0);
                let chunks = pack(&points);
                let mut back: Vec<Sample> = Vec::new();
                for chunk in &chunks {
                    let part: Vec<Sample> = samples(&chunk.steps, &chunk.data).collect();
                    prop_assert!(!part.is_empty() && part.len() <= CHUNK_POINTS);
                    prop_assert_eq!((chunk.first_step, chunk.last_step), (part[0].0, part[part.len() - 1].0));
                    back.extend(part);
                }
                let mut expected = points.clone();
                expected.dedup_by_key(|p| p.0);
                let bits = |p: &Sample| (p.0, p.1.to_bits(), p.2);
                prop_assert_eq!(back.iter().map(bits).collect::<Vec<_>>(), expected.iter().map(bits).collect::<Vec<_>>());
            }
        }
    }
}
