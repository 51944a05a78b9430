//! A job's lines: writing them to `KILN_LOGS`, searching the stored ones, and streaming them
//! (with follow, until the job has ended and its last line is out).
//!
//! Replicas store different batches of `KILN_LOGS` side by side, so a job's later lines may be
//! stored before its earlier ones. A reader therefore sends only lines at or below the shared
//! consumer's ack floor (every message up to it is stored, since writers ack after the write),
//! so it never sends a line before an earlier one that is still on its way, and moves its cursor
//! over them. A line above the floor waits for it, for `read-wait-ms` at most (writers that
//! cannot store, NATS that cannot say): then it is sent as it is and remembered, so a re-read
//! from the cursor sends each line once and a late line is still found, out of order. The end
//! of an attempt counts only once its end record is below the floor too.

use std::collections::BTreeSet;
use std::time::Duration;

use kiln_core::authz::Caller;
use kiln_core::ids::now_ms;
use kiln_proto::v1 as pb;
use prost::Message;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::checks::check_write_logs;
use super::{LineStream, LogsApi};
use crate::error::Error;
use crate::store::Cursor;

/// Lines read from the store per query.
const PAGE: u32 = 1000;
/// A follower re-reads at least this often, in case a wake-up was missed.
const FOLLOW_POLL: Duration = Duration::from_millis(500);
/// How soon a follower reads again while lines it has seen are not yet below the ack floor.
const FLOOR_POLL: Duration = Duration::from_millis(50);
/// How long after a job's end a follower waits for an end marker that may never come (its
/// runner died).
const END_GRACE_MS: i64 = 3_000;

impl LogsApi {
    /// Streams the lines of `log_id` (a job's, or a gang node's: see
    /// [`kiln_core::subjects::node_log_id`]) of job `job_id` after `from`, from a task of their
    /// own.
    /// Where a reader resuming after `after_seq` (the last line it showed) starts: before the
    /// first line, in (attempt, seq) order, whose seq is above it. Stream sequences grow from
    /// one attempt to the next, so these are the lines after the one shown, found with a read of
    /// one line per attempt rather than by reading the log again from its start.
    pub(super) async fn resume_cursor(&self, log_id: &str, after_seq: u64) -> Result<Cursor, Status> {
        let seq = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let mut attempt = 0;
        loop {
            let probe = Cursor { attempt, seq };
            let next = self.logs.read(log_id, probe, 1).await.map_err(Status::from)?;
            match next.first() {
                // Nothing after it yet: a follower waits from here.
                None => return Ok(probe),
                Some(line) if line.attempt == attempt => return Ok(probe),
                // This attempt has no line above `seq`: look in the next one that has lines.
                Some(line) => attempt = line.attempt,
            }
        }
    }

    pub(super) fn spawn_lines(&self, log_id: String, job_id: String, from: Cursor, follow: bool) -> LineStream {
        let (tx, rx) = mpsc::channel(256);
        let api = self.clone();
        let woken = self.written.subscribe();
        tokio::spawn(async move {
            if let Err(status) = api.stream_lines(&log_id, &job_id, from, follow, woken, &tx).await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }

    /// Publishes lines for a job that has not ended, one record each, under message ids made of
    /// the writer's name and line numbers (so a retried request is stored once).
    pub(super) async fn write_logs(&self, caller: &Caller, request: pb::WriteLogsRequest) -> Result<u32, Error> {
        check_write_logs(&request)?;
        let job = self.visible_job(caller, &request.job_id).await?;
        let state = job.state()?;
        if state.is_terminal() {
            return Err(Error::FailedPrecondition(format!(
                "job {} has ended ({state}); its log takes no more lines",
                job.id
            )));
        }
        let subject = kiln_core::subjects::logs(&job.id);
        let now = now_ms();
        let accepted = u32::try_from(request.lines.len()).unwrap_or(u32::MAX);
        let records: Vec<(String, bytes::Bytes)> = request
            .lines
            .into_iter()
            .enumerate()
            .map(|(n, line)| {
                let record = pb::LogRecord {
                    job_id: job.id.clone(),
                    attempt: job.attempt,
                    seq: 0,
                    stream: match line.stream {
                        0 => pb::LogStream::Stdout as i32,
                        stream => stream,
                    },
                    timestamp_ms: if line.timestamp_ms == 0 { now } else { line.timestamp_ms },
                    text: line.text,
                    end: false,
                };
                let msg_id = match request.writer.as_str() {
                    "" => kiln_core::ids::new_id(),
                    writer => format!("{}:w:{writer}:{}", job.id, request.first_index + n as u64),
                };
                (msg_id, record.encode_to_vec().into())
            })
            .collect();
        kiln_core::streams::publish_all(&self.nats.jetstream, &subject, records).await?;
        Ok(accepted)
    }

    pub(super) async fn search_logs(
        &self,
        caller: &Caller,
        request: pb::SearchLogsRequest,
    ) -> Result<pb::SearchLogsResponse, Error> {
        let job = self.visible_job(caller, &request.job_id).await?;
        let matcher = crate::item_lines::Matcher::new(&request.pattern, request.regex)?;
        let limit = match request.limit {
            0 => 1000,
            n => (n as usize).min(100_000),
        };
        let until = if request.until_ms == 0 {
            i64::MAX
        } else {
            request.until_ms
        };
        let mut cursor = Cursor::default();
        let mut lines = Vec::new();
        loop {
            let page = self.logs.read(&job.id, cursor, PAGE).await?;
            let full = page.len() == PAGE as usize;
            for line in page {
                cursor = Cursor {
                    attempt: line.attempt,
                    seq: line.seq,
                };
                let in_time = line.timestamp_ms >= request.since_ms && line.timestamp_ms < until;
                if line.end || !in_time || !matcher.is_match(&line.text) {
                    continue;
                }
                if lines.len() == limit {
                    return Ok(pb::SearchLogsResponse { lines, truncated: true });
                }
                lines.push(pb::LogLine {
                    attempt: line.attempt,
                    seq: u64::try_from(line.seq).unwrap_or(0),
                    stream: line.stream,
                    timestamp_ms: line.timestamp_ms,
                    text: line.text,
                });
            }
            if !full {
                return Ok(pb::SearchLogsResponse {
                    lines,
                    truncated: false,
                });
            }
        }
    }

    /// Sends the stored lines, then (with `follow`) new ones until the job has ended and its
    /// last line is out.
    async fn stream_lines(
        &self,
        log_id: &str,
        job_id: &str,
        from: Cursor,
        follow: bool,
        mut woken: broadcast::Receiver<String>,
        tx: &mpsc::Sender<Result<pb::LogLine, Status>>,
    ) -> Result<(), Status> {
        // Everything up to `cursor` was sent and is below the ack floor; `sent` holds what was
        // sent above it.
        let mut cursor = from;
        let mut sent: BTreeSet<(i32, i64)> = BTreeSet::new();
        let mut ended_attempt = 0;
        // Since when the first line above the floor has waited for it.
        let mut waiting_since: Option<tokio::time::Instant> = None;
        // The job has ended: what is stored goes out, confirmed or not, once more, then the end.
        let mut last_pass = false;
        // The job's state changes wake a follower too: its end comes after its last line.
        let mut job_events = match follow {
            true => self
                .nats
                .client
                .subscribe(kiln_core::subjects::job_event(job_id))
                .await
                .ok(),
            false => None,
        };
        loop {
            // Read before the lines: whatever it covers is stored by the time they are read.
            let floor = self.ack_floor().await;
            let lines = self.logs.read(log_id, cursor, PAGE).await?;
            let full_page = lines.len() == PAGE as usize;
            let stale = last_pass || waiting_since.is_some_and(|since| since.elapsed() >= self.read_wait);
            let mut confirming = true;
            let mut above_floor = false;
            for line in lines {
                let position = (line.attempt, line.seq);
                confirming &= floor.is_some_and(|floor| line.seq <= floor);
                if confirming {
                    cursor = Cursor {
                        attempt: line.attempt,
                        seq: line.seq,
                    };
                    if line.end {
                        ended_attempt = ended_attempt.max(line.attempt);
                    }
                } else {
                    above_floor = true;
                    if !stale {
                        break;
                    }
                }
                if line.end || !sent.insert(position) {
                    continue;
                }
                let out = pb::LogLine {
                    attempt: line.attempt,
                    seq: u64::try_from(line.seq).unwrap_or(0),
                    stream: line.stream,
                    timestamp_ms: line.timestamp_ms,
                    text: line.text,
                };
                if tx.send(Ok(out)).await.is_err() {
                    return Ok(());
                }
            }
            sent = sent.split_off(&(cursor.attempt, cursor.seq.saturating_add(1)));
            waiting_since = match above_floor {
                true => waiting_since.or_else(|| Some(tokio::time::Instant::now())),
                false => None,
            };
            if full_page && !above_floor {
                continue;
            }
            if !follow && (!above_floor || stale) {
                return Ok(());
            }
            let job = self.store.job(job_id).await.map_err(Error::from)?;
            let state = job.state().map_err(Error::from)?;
            if state.is_terminal() && state != kiln_core::JobState::Preempted {
                let never_ran = job.started_at_ms.is_none() || job.instance_id.is_empty();
                let waited = now_ms() - job.finished_at_ms.unwrap_or(0) > END_GRACE_MS;
                if ended_attempt >= job.attempt || never_ran || waited {
                    // Lines stored but not yet confirmed (a writer's acks lagging, or NATS not
                    // saying its floor) go out before the follow ends: one more pass reads them
                    // as stale. Without it a follower of a job that ended read_wait before its
                    // lines were confirmed got none of them.
                    if above_floor && !stale {
                        last_pass = true;
                        continue;
                    }
                    return Ok(());
                }
            }
            let poll = if above_floor { FLOOR_POLL } else { FOLLOW_POLL };
            tokio::select! {
                _ = wait_for(&mut woken, log_id) => {}
                Some(_) = next_event(&mut job_events) => {}
                _ = tokio::time::sleep(poll) => {}
                _ = tx.closed() => return Ok(()),
            }
        }
    }

    /// The stream sequence up to which every `KILN_LOGS` message is stored (acked by a writer),
    /// or `None` when NATS cannot say now.
    async fn ack_floor(&self) -> Option<i64> {
        let stream = self
            .nats
            .jetstream
            .get_stream(kiln_core::subjects::STREAM_LOGS)
            .await
            .ok()?;
        let info = stream
            .consumer_info(kiln_core::subjects::CONSUMER_LOG_INGEST)
            .await
            .ok()?;
        i64::try_from(info.ack_floor.stream_sequence).ok()
    }
}

/// Returns the next job event, or never when there is no subscription.
async fn next_event(events: &mut Option<async_nats::Subscriber>) -> Option<async_nats::Message> {
    use futures::StreamExt;
    match events {
        Some(events) => events.next().await,
        None => std::future::pending().await,
    }
}

/// Returns when lines of `job_id` were written (or wake-ups were lost).
async fn wait_for(woken: &mut broadcast::Receiver<String>, job_id: &str) {
    loop {
        match woken.recv().await {
            Ok(id) if id == job_id => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}
