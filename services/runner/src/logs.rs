//! Shipping a job's stdout and stderr to `KILN_LOGS`, line by line.
//!
//! Each line gets the next sequence number of the attempt and is published on
//! `kiln.logs.<job>` with the message id `<job>:<attempt>:<seq>`, so a retried publish is
//! stored once. Up to [`IN_FLIGHT`] publishes await their acks at a time. The last record of an
//! attempt has `end` set. Every line of the job's output goes through the job's [`Masker`]
//! first, so a secret's value is shipped as `***`.

use futures::StreamExt;
use kiln_core::ids::now_ms;
use kiln_core::secrets::Masker;
use kiln_core::streams::{MAX_LOG_LINE_BYTES, Nats, NatsError, Pipeline};
use kiln_core::subjects;
use kiln_proto::v1::{LogRecord, LogStream};
use prost::Message;

use crate::provider::OutputStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Publishes awaiting their acks at most.
const IN_FLIGHT: usize = 256;

/// Ships lines of one attempt of a job.
pub struct LogShipper {
    tx: mpsc::Sender<(LogStream, String)>,
    publisher: JoinHandle<Result<u64, NatsError>>,
}

impl LogShipper {
    pub fn start(nats: Nats, job_id: String, attempt: i32) -> LogShipper {
        let (tx, rx) = mpsc::channel(1024);
        let publisher = tokio::spawn(publish_lines(nats, job_id, attempt, rx));
        LogShipper { tx, publisher }
    }

    /// Splits an instance's output into lines, per stream, masks the secrets' values in them,
    /// until it ends.
    pub fn ship(&self, mut output: OutputStream, masker: Masker) -> JoinHandle<()> {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut stdout = LineSplitter::default();
            let mut stderr = LineSplitter::default();
            while let Some((stream, chunk)) = output.next().await {
                let splitter = if stream == LogStream::Stderr {
                    &mut stderr
                } else {
                    &mut stdout
                };
                for line in splitter.push(&chunk) {
                    if tx.send((stream, masker.mask(line))).await.is_err() {
                        return;
                    }
                }
            }
            for (stream, splitter) in [(LogStream::Stdout, stdout), (LogStream::Stderr, stderr)] {
                if let Some(line) = splitter.finish() {
                    let _ = tx.send((stream, masker.mask(line))).await;
                }
            }
        })
    }

    /// Sends a line the runner itself writes (for example why a job could not start).
    pub async fn line(&self, stream: LogStream, text: String) {
        let _ = self.tx.send((stream, text)).await;
    }

    /// Publishes the end record after every line, and waits for all acks. Returns the number of
    /// lines shipped.
    pub async fn finish(self) -> Result<u64, NatsError> {
        drop(self.tx);
        self.publisher.await.map_err(|e| NatsError::Other(e.to_string()))?
    }
}

/// Cuts a byte stream into lines; a line longer than [`MAX_LOG_LINE_BYTES`] is cut into pieces.
#[derive(Default)]
struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        for &byte in chunk {
            if byte == b'\n' {
                lines.push(String::from_utf8_lossy(&self.partial).into_owned());
                self.partial.clear();
            } else {
                self.partial.push(byte);
                if self.partial.len() == MAX_LOG_LINE_BYTES {
                    lines.push(String::from_utf8_lossy(&self.partial).into_owned());
                    self.partial.clear();
                }
            }
        }
        lines
    }

    fn finish(self) -> Option<String> {
        (!self.partial.is_empty()).then(|| String::from_utf8_lossy(&self.partial).into_owned())
    }
}

async fn publish_lines(
    nats: Nats,
    job_id: String,
    attempt: i32,
    mut rx: mpsc::Receiver<(LogStream, String)>,
) -> Result<u64, NatsError> {
    // A publish that fails is sent again (with the lines after it) by the pipeline, so a
    // cluster node dying mid-job loses no line.
    let mut pipeline = Pipeline::new(nats.jetstream.clone(), subjects::logs(&job_id), IN_FLIGHT);
    let mut seq: u64 = 0;
    let mut next = rx.recv().await;
    loop {
        let end = next.is_none();
        seq += 1;
        let (stream, text) = next.unwrap_or((LogStream::Unspecified, String::new()));
        let record = LogRecord {
            job_id: job_id.clone(),
            attempt,
            seq,
            stream: stream as i32,
            timestamp_ms: now_ms(),
            text,
            end,
        };
        let msg_id = format!("{job_id}:{attempt}:{seq}");
        pipeline.send(msg_id, record.encode_to_vec().into()).await?;
        if end {
            break;
        }
        if rx.is_empty() {
            // A quiet job: settle rather than hold a share of the runner's ack budget while
            // waiting for its next line (see `Pipeline`).
            pipeline.settle().await?;
        }
        next = rx.recv().await;
    }
    pipeline.flush().await?;
    Ok(seq - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_become_lines() {
        let mut splitter = LineSplitter::default();
        assert_eq!(splitter.push(b"a\nb"), ["a"]);
        assert_eq!(splitter.push(b"c\n\nd"), ["bc", ""]);
        assert_eq!(splitter.finish().as_deref(), Some("d"));
        let mut long = LineSplitter::default();
        let lines = long.push(&vec![b'x'; MAX_LOG_LINE_BYTES + 5]);
        assert_eq!(lines.len(), 1);
        assert_eq!(long.finish().unwrap().len(), 5);
    }
}
