//! Downsampling a series in one pass: [`Sampler`].

use std::sync::Arc;

use super::Point;

/// A downsampled series and how many points it had in the range.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub points: Vec<Point>,
    pub total: u64,
    /// Per non-empty bucket, in step order: what a chart draws at one pixel.
    pub bands: Vec<Band>,
}

impl Series {
    /// The series of a range that holds no point.
    pub fn empty() -> Series {
        Series {
            points: Vec::new(),
            total: 0,
            bands: Vec::new(),
        }
    }
}

/// One bucket of a series: its lowest, highest and last value (the last point's step and
/// time place it). The lowest and highest are NaN only when the bucket holds nothing else.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Band {
    pub step: i64,
    pub timestamp_ms: i64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
}

/// Downsamples a series in one pass over its points (in any order; each store reads them in
/// step order): every point while there are at most `max_points`, else buckets of equal step
/// width between `lo` and `hi`, each giving its lowest and its highest value, so spikes
/// survive (NaN only where a bucket holds nothing else: a run that diverged shows it). The
/// same buckets give the series' [`Band`]s.
pub struct Sampler {
    lo: i64,
    /// Steps per bucket; a u128, as the span of `i64::MIN..=i64::MAX` (plus one) fits neither
    /// an i64 nor a u64.
    width: u128,
    max_points: usize,
    total: u64,
    all: Vec<Sample>,
    buckets: Vec<Option<Bucket>>,
}

/// A point of the series being sampled: (step, value, time).
type Sample = (i64, f64, i64);

/// The lowest, the highest and the last (highest step) point of a bucket seen so far.
#[derive(Clone, Copy)]
struct Bucket {
    low: Sample,
    high: Sample,
    last: Sample,
}

impl Sampler {
    pub fn new(lo: i64, hi: i64, max_points: usize) -> Sampler {
        let buckets = (max_points / 2).max(1);
        let width = u128::from(hi.abs_diff(lo)) / buckets as u128 + 1;
        Sampler {
            lo,
            width,
            max_points,
            total: 0,
            all: Vec::new(),
            buckets: vec![None; buckets],
        }
    }

    /// Adds a point of the range.
    pub fn add(&mut self, step: i64, value: f64, timestamp_ms: i64) {
        let point = (step, value, timestamp_ms);
        self.total += 1;
        if self.all.len() <= self.max_points {
            self.all.push(point);
        }
        let bucket = if step < self.lo {
            0
        } else {
            usize::try_from(u128::from(step.abs_diff(self.lo)) / self.width).unwrap_or(usize::MAX)
        };
        let Some(slot) = self.buckets.get_mut(bucket) else {
            return;
        };
        match slot {
            None => {
                *slot = Some(Bucket {
                    low: point,
                    high: point,
                    last: point,
                })
            }
            Some(bucket) => {
                if value < bucket.low.1 || bucket.low.1.is_nan() {
                    bucket.low = point;
                }
                if value > bucket.high.1 || bucket.high.1.is_nan() {
                    bucket.high = point;
                }
                if step >= bucket.last.0 {
                    bucket.last = point;
                }
            }
        }
    }

    /// The series of `key` of `job_id`: its points in step order, how many there were, and
    /// its bands.
    pub fn finish(self, job_id: &str, key: &str) -> Series {
        let (job_id, key): (Arc<str>, Arc<str>) = (job_id.into(), key.into());
        let bands = self
            .buckets
            .iter()
            .flatten()
            .map(|bucket| Band {
                step: bucket.last.0,
                timestamp_ms: bucket.last.2,
                min: bucket.low.1,
                max: bucket.high.1,
                last: bucket.last.1,
            })
            .collect();
        let mut points = if self.all.len() <= self.max_points {
            self.all
        } else {
            let keep_low = self.max_points >= 2;
            self.buckets
                .into_iter()
                .flatten()
                .flat_map(|bucket| [keep_low.then_some(bucket.low), Some(bucket.high)])
                .flatten()
                .collect()
        };
        points.sort_by_key(|point| point.0);
        points.dedup_by_key(|point| point.0);
        let points = points
            .into_iter()
            .map(|(step, value, timestamp_ms)| Point {
                job_id: job_id.clone(),
                key: key.clone(),
                step,
                value,
                timestamp_ms,
            })
            .collect();
        Series {
            points,
            total: self.total,
            bands,
        }
    }
}
