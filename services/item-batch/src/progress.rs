//! What a batch looks like to a client ([`Shared::describe`]): its counters, which add up
//! exactly, and the rate and ETA measured from the finished counter over a window.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use kiln_proto::v1 as pb;

use crate::Shared;
use crate::error::Result;
use crate::spec::Spec;
use crate::store::{self, BatchRecord, Tally};

/// The window of the items-per-second figure.
const RATE_WINDOW: Duration = Duration::from_secs(60);

/// What the scaler saw of a batch lately.
#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
    /// (when, items finished) samples over the rate window.
    samples: VecDeque<(Instant, u64)>,
}

impl Progress {
    fn rate(&self) -> Option<f64> {
        let (first, last) = (self.samples.front()?, self.samples.back()?);
        let seconds = last.0.duration_since(first.0).as_secs_f64();
        (seconds >= 1.0).then(|| last.1.saturating_sub(first.1) as f64 / seconds)
    }
}

impl Shared {
    /// Records a batch's progress for its rate and ETA.
    pub(crate) fn sample(&self, batch_id: &str, finished: u64) {
        let mut progress = self.progress.lock().expect("progress lock");
        let entry = progress.entry(batch_id.to_string()).or_default();
        let now = Instant::now();
        entry.samples.push_back((now, finished));
        while entry
            .samples
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW)
        {
            entry.samples.pop_front();
        }
    }

    pub(crate) fn rate(&self, batch_id: &str) -> Option<f64> {
        self.progress.lock().expect("progress lock").get(batch_id)?.rate()
    }

    pub(crate) fn forget_progress(&self, batch_id: &str) {
        self.progress.lock().expect("progress lock").remove(batch_id);
    }

    /// A batch as the API shows it: its spec, state, counters, rate, ETA and workers.
    pub async fn describe(&self, record: &BatchRecord) -> Result<pb::Batch> {
        let spec = Spec::from_json(&record.spec_json)?;
        let tally = self.batches.tally(&record.id).await?;
        let (cpu_seconds, peak_memory_bytes) = self.usage.figures(&self.batches, record).await?;
        let live = matches!(record.state.as_str(), store::OPEN | store::SEALED);
        let in_flight = if live {
            self.in_flight(&record.id).await.unwrap_or(0)
        } else {
            0
        };
        let workers = if live {
            self.store.live_batch_workers(&record.id).await?.len() as u32
        } else {
            0
        };
        let rate = self.rate(&record.id).unwrap_or(0.0);
        let backlog = tally.backlog();
        let eta_seconds = match (backlog, live) {
            (0, _) => 0,
            (_, true) if rate > 0.0 => (backlog as f64 / rate).ceil() as i64,
            _ => -1,
        };
        Ok(pb::Batch {
            id: record.id.clone(),
            spec: Some(spec.to_proto()),
            state: store::batch_state_proto(&record.state) as i32,
            owner: record.owner_id.clone(),
            counts: Some(counts(&tally, in_flight)),
            items_per_second: rate,
            eta_seconds,
            workers,
            cpu_seconds_per_item: if tally.finished() + tally.failed > 0 {
                cpu_seconds / (tally.finished() + tally.failed) as f64
            } else {
                0.0
            },
            peak_memory_bytes,
            created_at_ms: record.created_at_ms,
            finished_at_ms: record.finished_at_ms.unwrap_or(0),
            stalled_reason: if live {
                record.stalled_reason.clone()
            } else {
                String::new()
            },
            paused_reason: record.paused_reason.clone(),
            usage: None,
        })
    }
}

/// The counters: pending items taken by a worker are running (JetStream's in-flight count, which
/// never exceeds them), so the six add up to the total exactly.
fn counts(tally: &Tally, in_flight: u64) -> pb::BatchCounts {
    let running = in_flight.min(tally.pending);
    pb::BatchCounts {
        total: tally.total,
        pending: tally.pending - running,
        running,
        succeeded: tally.succeeded,
        failed: tally.failed,
        dead: tally.dead,
    }
}
