//! What a batch's items used, as spreads (p50, p95, max) of their last attempts' figures, and a
//! sizing hint: the p95 with a quarter's headroom, rounded to what `kiln batch create` takes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kiln_proto::v1 as pb;

use crate::error::Result;
use crate::spec::Spec;
use crate::store::{BatchRecord, BatchStore};

/// Items whose figures make the spreads, at most (a sample of bigger batches); the max and the
/// count are over every item.
pub const SAMPLE: u64 = 50_000;
/// How long a batch's usage is served from memory.
const USAGE_TTL: Duration = Duration::from_secs(5);

/// Headroom over the p95 in the hint.
const HEADROOM: f64 = 1.25;
/// The hint's steps: a quarter core, 64 MiB.
const CPU_STEP: f64 = 0.25;
const MEMORY_STEP: u64 = 64 << 20;

/// Batches' usage, read from the database at most every [`USAGE_TTL`] each (`kiln batch status
/// --watch` and the web UI ask every second or two), and again when the batch's state changes
/// (a batch seen DONE gets figures over every item, which a page reads last).
/// The same holds for a batch's totals (CPU seconds summed, largest peak memory), which every
/// description of a batch carries and which, unlike its counters, need every row.
#[derive(Default)]
pub struct UsageCache {
    usage: Mutex<HashMap<String, Cached<pb::BatchUsage>>>,
    figures: Mutex<HashMap<String, Cached<(f64, u64)>>>,
}

struct Cached<T> {
    at: Instant,
    state: String,
    value: T,
}

/// The value cached for `record` while it is fresh and of the batch's current state.
fn fresh<T: Clone>(cache: &Mutex<HashMap<String, Cached<T>>>, record: &BatchRecord) -> Option<T> {
    let cache = cache.lock().expect("usage lock");
    let cached = cache.get(&record.id)?;
    (cached.at.elapsed() < USAGE_TTL && cached.state == record.state).then(|| cached.value.clone())
}

fn keep<T>(cache: &Mutex<HashMap<String, Cached<T>>>, record: &BatchRecord, value: T) {
    let mut cache = cache.lock().expect("usage lock");
    cache.retain(|_, cached| cached.at.elapsed() < USAGE_TTL);
    cache.insert(
        record.id.clone(),
        Cached {
            at: Instant::now(),
            state: record.state.clone(),
            value,
        },
    );
}

impl UsageCache {
    pub async fn of(&self, batches: &BatchStore, record: &BatchRecord) -> Result<pb::BatchUsage> {
        if let Some(usage) = fresh(&self.usage, record) {
            return Ok(usage);
        }
        let spec = Spec::from_json(&record.spec_json)?;
        let (sample, items, max) = batches.usage(&record.id, SAMPLE).await?;
        let usage = summarize(&sample, items, max, spec.cpu_millis, spec.memory_mb);
        keep(&self.usage, record, usage.clone());
        Ok(usage)
    }

    /// The CPU seconds of the batch's items summed, and their largest peak memory.
    pub async fn figures(&self, batches: &BatchStore, record: &BatchRecord) -> Result<(f64, u64)> {
        if let Some(figures) = fresh(&self.figures, record) {
            return Ok(figures);
        }
        let figures = batches.figures(&record.id).await?;
        keep(&self.figures, record, figures);
        Ok(figures)
    }
}

/// One item's last attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub cpu_seconds: f64,
    pub peak_memory_bytes: u64,
    pub duration_ms: u64,
}

impl Measured {
    /// Cores it kept busy on average.
    fn cores(&self) -> f64 {
        if self.duration_ms == 0 {
            0.0
        } else {
            self.cpu_seconds / (self.duration_ms as f64 / 1000.0)
        }
    }
}

/// The spreads over `sample` (up to [`SAMPLE`] items), each max raised to `max`'s figure over
/// every measured item (the store has none for CPU), and the hint for a batch asking
/// `cpu_millis` and `memory_mb` per item.
pub fn summarize(sample: &[Measured], items: u64, max: Measured, cpu_millis: u32, memory_mb: u64) -> pb::BatchUsage {
    if sample.is_empty() {
        return pb::BatchUsage::default();
    }
    let cores = spread(sample.iter().map(Measured::cores).collect(), max.cores());
    let memory = spread(
        sample.iter().map(|m| m.peak_memory_bytes as f64).collect(),
        max.peak_memory_bytes as f64,
    );
    let wall = spread(
        sample.iter().map(|m| m.duration_ms as f64 / 1000.0).collect(),
        max.duration_ms as f64 / 1000.0,
    );
    let sizing_hint = hint(&cores, &memory, cpu_millis, memory_mb);
    pb::BatchUsage {
        items,
        cpu_cores: Some(cores),
        peak_memory_bytes: Some(memory),
        wall_seconds: Some(wall),
        sizing_hint,
    }
}

/// p50 and p95 of `values` (nearest rank), and the larger of their max and `max`.
fn spread(mut values: Vec<f64>, max: f64) -> pb::UsageSpread {
    values.sort_by(f64::total_cmp);
    let rank = |p: f64| values[((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
    pb::UsageSpread {
        p50: rank(0.50),
        p95: rank(0.95),
        max: values.last().copied().unwrap_or(0.0).max(max),
    }
}

fn hint(cores: &pb::UsageSpread, memory: &pb::UsageSpread, cpu_millis: u32, memory_mb: u64) -> String {
    let cpu = ((cores.p95 * HEADROOM / CPU_STEP).ceil() * CPU_STEP).max(CPU_STEP);
    let memory_bytes = memory.p95 as u64;
    let mem = (((memory_bytes as f64 * HEADROOM) as u64).div_ceil(MEMORY_STEP) * MEMORY_STEP).max(MEMORY_STEP);
    let mut hint = format!(
        "items used p95 {:.2} CPU, {}: `--cpu {} --mem {}M` fits with headroom",
        cores.p95,
        mebibytes(memory_bytes),
        trim(cpu),
        mem >> 20
    );
    let asked = memory_mb.saturating_mul(1 << 20);
    if memory.max as u64 > asked {
        hint.push_str(&format!(
            "; the largest used {}, more than the {} MiB asked",
            mebibytes(memory.max as u64),
            memory_mb
        ));
    }
    if cores.p95 > f64::from(cpu_millis) / 1000.0 {
        hint.push_str(&format!(
            "; items kept more cores busy than the {} asked",
            trim(f64::from(cpu_millis) / 1000.0)
        ));
    }
    hint
}

fn mebibytes(bytes: u64) -> String {
    format!("{} MiB", bytes.div_ceil(1 << 20))
}

/// 1 for 1.0, 0.25 for 0.25.
fn trim(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(cpu_seconds: f64, mib: u64, duration_ms: u64) -> Measured {
        Measured {
            cpu_seconds,
            peak_memory_bytes: mib << 20,
            duration_ms,
        }
    }

    #[test]
    fn spreads_are_nearest_rank_and_the_hint_has_headroom() {
        // 100 items: item n used n% of a core for a second and n * 4 MiB.
        let sample: Vec<Measured> = (1..=100).map(|n| measured(n as f64 / 100.0, n * 4, 1000)).collect();
        let usage = summarize(&sample, 100, measured(1.0, 400, 1000), 1000, 1024);
        let cores = usage.cpu_cores.unwrap();
        assert_eq!((cores.p50, cores.p95, cores.max), (0.5, 0.95, 1.0));
        let memory = usage.peak_memory_bytes.unwrap();
        assert_eq!(memory.p95 as u64, 380 << 20);
        // 0.95 × 1.25 = 1.19 → 1.25 cores; 380 MiB × 1.25 = 475 → 512 MiB.
        assert_eq!(
            usage.sizing_hint,
            "items used p95 0.95 CPU, 380 MiB: `--cpu 1.25 --mem 512M` fits with headroom"
        );
        assert_eq!(usage.wall_seconds.unwrap().p50, 1.0);
    }

    #[test]
    fn the_hint_says_when_items_used_more_than_asked() {
        let sample = [measured(2.0, 900, 1000)];
        let usage = summarize(&sample, 1, sample[0], 1000, 512);
        assert!(
            usage
                .sizing_hint
                .contains("the largest used 900 MiB, more than the 512 MiB asked"),
            "{}",
            usage.sizing_hint
        );
        assert!(
            usage.sizing_hint.contains("more cores busy than the 1 asked"),
            "{}",
            usage.sizing_hint
        );
        assert_eq!(summarize(&[], 0, sample[0], 1000, 512), pb::BatchUsage::default());
    }
}
