//! kiln-agent, the worker loop of a batch. It holds a session with item-batch
//! (`ItemWorkService.Work`): says how many items it runs at once, runs each item it is sent
//! (its command, or a built-in such as `kiln:noop`) with the item's timeout, and reports the
//! outcome (built-ins `kiln:noop` and `kiln:sleep MS` run in the agent itself) with the item's
//! last output lines, CPU time and peak memory. Every few seconds it
//! sends a heartbeat naming the items still running, so a slow item is not given to another
//! worker. When the session breaks (item-batch restarted) it keeps running its items and
//! reconnects; outcomes not yet sent go on the new session. It exits when item-batch says stop:
//! after its running items when the work is done, at once (killing them) when the batch is
//! cancelled. [`item`] runs one item; the values of the job's secrets are masked in the lines
//! it keeps ([`kiln_formats::mask`]).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kiln_proto::v1 as pb;
use kiln_proto::v1::item_work_service_client::ItemWorkServiceClient;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Request;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

mod settings;

use settings::endpoints;
pub use settings::{Settings, TlsSettings};

mod item;
pub mod measure;

pub use kiln_formats::mask::Masker;

/// How often running items are reported alive.
pub const HEARTBEAT: Duration = Duration::from_secs(3);
/// Output lines kept per attempt, and their bytes at most.
pub const KEPT_LINES: usize = 100;
pub const KEPT_BYTES: usize = 16 * 1024;
/// Wait between reconnects, at most.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How items run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// Commands as child processes; built-ins in the agent.
    Process,
    /// Built-ins only (a simulated worker has no machine to run a process on).
    BuiltinsOnly,
}

/// How the agent ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// item-batch said stop, for this reason.
    Stopped(String),
    /// The agent was told to terminate (the worker is stopped or preempted); its items were
    /// killed and go to other workers.
    Terminated,
}

/// Items running here: key → (attempt, round).
type Running = Arc<Mutex<HashMap<String, (u32, u32)>>>;

/// Works for a batch until told to stop or `shutdown` is cancelled.
pub async fn run(settings: Settings, runner: Runner, shutdown: CancellationToken) -> Result<Ended, String> {
    let endpoints = endpoints(&settings.addr, &settings.tls)?;
    let bearer: MetadataValue<_> = format!("Bearer {}", settings.token)
        .parse()
        .map_err(|_| "KILN_TOKEN is not a valid header value".to_string())?;
    let (outcomes_tx, outcomes_rx) = mpsc::unbounded_channel::<pb::ItemOutcome>();
    let outcomes = Arc::new(tokio::sync::Mutex::new(outcomes_rx));
    let running: Running = Arc::default();
    let slots = Arc::new(Semaphore::new(settings.slots as usize));
    // Cancelled to kill running items (a cancelled batch, or termination).
    let kill = CancellationToken::new();
    let mut backoff = Duration::from_millis(100);
    // Which replica to try next: a failed connect or a broken session moves on to the next one.
    // Each agent starts at a replica of its own choosing, so a batch's workers spread their
    // sessions (and the dispatch and outcomes they carry) over the replicas.
    let mut next = first_replica(endpoints.len());
    loop {
        if shutdown.is_cancelled() {
            kill.cancel();
            return Ok(Ended::Terminated);
        }
        let (addr, endpoint) = &endpoints[next % endpoints.len()];
        next += 1;
        let channel = match endpoint.connect().await {
            Ok(channel) => channel,
            Err(error) => {
                eprintln!("kiln-agent: cannot reach item-batch at {addr}: {error}; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        let session = Session {
            settings: &settings,
            runner,
            channel,
            bearer: bearer.clone(),
            outcomes_tx: outcomes_tx.clone(),
            outcomes: outcomes.clone(),
            running: running.clone(),
            slots: slots.clone(),
            kill: kill.clone(),
            shutdown: shutdown.clone(),
        };
        match session.work().await {
            Ok(ended) => return Ok(ended),
            Err(SessionError::Refused(message)) => return Err(message),
            Err(SessionError::Broken(message)) => {
                eprintln!("kiln-agent: session with item-batch broke ({message}); reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(RECONNECT_MAX);
            }
        }
    }
}

/// A random replica index below `replicas` (std's per-process random hash keys; no extra crate).
fn first_replica(replicas: usize) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    usize::try_from(random % replicas.max(1) as u64).unwrap_or(0)
}

enum SessionError {
    /// item-batch refused the session (bad token, no such batch): retrying will not help.
    Refused(String),
    Broken(String),
}

struct Session<'a> {
    settings: &'a Settings,
    runner: Runner,
    channel: Channel,
    bearer: MetadataValue<tonic::metadata::Ascii>,
    outcomes_tx: mpsc::UnboundedSender<pb::ItemOutcome>,
    outcomes: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<pb::ItemOutcome>>>,
    running: Running,
    slots: Arc<Semaphore>,
    kill: CancellationToken,
    shutdown: CancellationToken,
}

impl Session<'_> {
    async fn work(&self) -> Result<Ended, SessionError> {
        let (tx, rx) = mpsc::channel::<pb::AgentMessage>(1024);
        let hello = pb::AgentMessage {
            body: Some(pb::agent_message::Body::Hello(pb::AgentHello {
                batch_id: self.settings.batch_id.clone(),
                slots: self.settings.slots,
            })),
        };
        tx.send(hello)
            .await
            .map_err(|_| SessionError::Broken("closed".into()))?;
        let mut request = Request::new(ReceiverStream::new(rx));
        request.metadata_mut().insert("authorization", self.bearer.clone());
        let mut client = ItemWorkServiceClient::new(self.channel.clone());
        let mut tasks = match client.work(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                return Err(match status.code() {
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal => {
                        SessionError::Broken(status.message().to_string())
                    }
                    _ => SessionError::Refused(format!("item-batch refused: {}", status.message())),
                });
            }
        };
        // Outcomes (also those left from a broken session) and heartbeats go out from here.
        let pump_stop = CancellationToken::new();
        let mut pump = {
            let tx = tx.clone();
            let outcomes = self.outcomes.clone();
            let running = self.running.clone();
            let stop = pump_stop.clone();
            tokio::spawn(async move {
                let mut outcomes = outcomes.lock().await;
                let mut beat = tokio::time::interval(HEARTBEAT);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        outcome = outcomes.recv() => {
                            let Some(outcome) = outcome else { return };
                            let message = pb::AgentMessage { body: Some(pb::agent_message::Body::Outcome(outcome)) };
                            if tx.send(message).await.is_err() { return }
                        }
                        _ = beat.tick() => {
                            let keys: Vec<String> = running.lock().expect("running lock").keys().cloned().collect();
                            if !keys.is_empty() {
                                let message = pb::AgentMessage { body: Some(pb::agent_message::Body::Heartbeat(pb::Heartbeat { keys })) };
                                if tx.send(message).await.is_err() { return }
                            }
                        }
                    }
                }
            })
        };
        let result = loop {
            let task = tokio::select! {
                _ = self.shutdown.cancelled() => {
                    self.kill.cancel();
                    break Ok(Ended::Terminated);
                }
                task = tasks.next() => task,
            };
            match task {
                Some(Ok(pb::AgentTask {
                    body: Some(pb::agent_task::Body::Item(item)),
                })) => self.start(item),
                Some(Ok(pb::AgentTask {
                    body: Some(pb::agent_task::Body::Stop(stop)),
                })) => {
                    if stop.reason.contains("cancelled") {
                        self.kill.cancel();
                    }
                    self.wait_idle().await;
                    pump_stop.cancel();
                    let _ = (&mut pump).await;
                    self.send_outcomes(&tx).await;
                    break Ok(Ended::Stopped(stop.reason));
                }
                Some(Ok(_)) => {}
                Some(Err(status)) => break Err(SessionError::Broken(status.message().to_string())),
                None => break Err(SessionError::Broken("item-batch ended the session".into())),
            }
        };
        pump_stop.cancel();
        if !pump.is_finished() {
            let _ = pump.await;
        }
        result
    }

    /// Waits until no item runs (killed ones end at once).
    async fn wait_idle(&self) {
        let _ = self.slots.acquire_many(self.settings.slots).await;
        while !self.running.lock().expect("running lock").is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends the outcomes not sent yet (the pump has stopped).
    async fn send_outcomes(&self, tx: &mpsc::Sender<pb::AgentMessage>) {
        let mut outcomes = self.outcomes.lock().await;
        while let Ok(outcome) = outcomes.try_recv() {
            let message = pb::AgentMessage {
                body: Some(pb::agent_message::Body::Outcome(outcome)),
            };
            if tx.send(message).await.is_err() {
                return;
            }
        }
        // Give the last outcomes a moment to leave before the stream closes.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    /// Runs an item when a slot is free; its outcome goes to the outcome channel.
    fn start(&self, item: pb::ItemToRun) {
        self.running
            .lock()
            .expect("running lock")
            .insert(item.key.clone(), (item.attempt, item.round));
        let slots = self.slots.clone();
        let running = self.running.clone();
        let outcomes = self.outcomes_tx.clone();
        let kill = self.kill.clone();
        let runner = self.runner;
        let masker = self.settings.masker.clone();
        let measure_with = self.settings.measure_with.clone();
        tokio::spawn(async move {
            let Ok(_permit) = slots.acquire_owned().await else {
                return;
            };
            let key = item.key.clone();
            let outcome = item::run_item(item, runner, &kill, masker, measure_with.as_ref()).await;
            running.lock().expect("running lock").remove(&key);
            if let Some(outcome) = outcome {
                let _ = outcomes.send(outcome);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::first_replica;

    #[test]
    fn agents_start_at_replicas_spread_over_all_of_them() {
        let picks: Vec<usize> = (0..200).map(|_| first_replica(2)).collect();
        assert!(picks.iter().all(|&pick| pick < 2));
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
        assert_eq!(first_replica(1), 0);
        assert_eq!(first_replica(0), 0);
    }
}
