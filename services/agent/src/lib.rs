//! kiln-agent, the worker loop of a batch. It holds a session with item-batch
//! (`ItemWorkService.Work`): says how many items it runs at once, runs each item it is sent
//! (its command, or a built-in such as `kiln:noop`) with the item's timeout, and reports the
//! outcome (built-ins `kiln:noop` and `kiln:sleep MS` run in the agent itself) with the item's
//! last output lines, CPU time and peak memory. Every few seconds it
//! sends a heartbeat naming the items still running, so a slow item is not given to another
//! worker. When the session breaks (item-batch restarted) it keeps running its items and
//! reconnects; outcomes not yet sent go on the new session. It exits when item-batch says stop:
//! after its running items when the work is done, at once (killing them) when the batch is
//! cancelled.
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kiln_proto::v1 as pb;
use kiln_proto::v1::item_work_service_client::ItemWorkServiceClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Request;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

mod settings;

use settings::endpoints;
pub use settings::{Settings, TlsSettings};

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
    let mut next = 0;
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
        tokio::spawn(async move {
            let Ok(_permit) = slots.acquire_owned().await else {
                return;
            };
            let key = item.key.clone();
            let outcome = run_item(item, runner, &kill).await;
            running.lock().expect("running lock").remove(&key);
            if let Some(outcome) = outcome {
                let _ = outcomes.send(outcome);
            }
        });
    }
}

/// Runs one item; None when it was killed (cancelled batch, termination).
async fn run_item(item: pb::ItemToRun, runner: Runner, kill: &CancellationToken) -> Option<pb::ItemOutcome> {
    let started = Instant::now();
    let mut outcome = pb::ItemOutcome {
        key: item.key.clone(),
        attempt: item.attempt,
        round: item.round,
        ..Default::default()
    };
    let program = item.command.first().cloned().unwrap_or_default();
    if program == "kiln:noop" {
        outcome.exit_code = Some(0);
    } else if program == "kiln:sleep" {
        let ms = item.command.get(1).and_then(|ms| ms.parse::<u64>().ok()).unwrap_or(0);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => outcome.exit_code = Some(0),
            _ = kill.cancelled() => return None,
        }
    } else if program.starts_with("kiln:") {
        outcome.reason = format!("unknown built-in {program}");
    } else if runner == Runner::BuiltinsOnly {
        outcome.reason = "this worker runs built-ins only (simulated machine)".into();
    } else {
        run_process(&item, &mut outcome, kill).await?;
    }
    outcome.duration_ms = started.elapsed().as_millis() as u64;
    Some(outcome)
}

/// The last lines of an attempt's output, within [`KEPT_LINES`] and [`KEPT_BYTES`].
#[derive(Default)]
struct Tail {
    lines: VecDeque<pb::LogEntry>,
    bytes: usize,
}

impl Tail {
    fn push(&mut self, stream: pb::LogStream, text: String) {
        let text: String = text.chars().take(KEPT_BYTES).collect();
        self.bytes += text.len();
        self.lines.push_back(pb::LogEntry {
            stream: stream as i32,
            timestamp_ms: now_ms(),
            text,
        });
        while self.lines.len() > KEPT_LINES || (self.bytes > KEPT_BYTES && self.lines.len() > 1) {
            if let Some(old) = self.lines.pop_front() {
                self.bytes -= old.text.len();
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn children_usage() -> (f64, u64) {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(usage) => {
            let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            let cpu = seconds(usage.user_time()) + seconds(usage.system_time());
            // Linux reports the largest child's peak, in KiB.
            (cpu, u64::try_from(usage.max_rss()).unwrap_or(0) * 1024)
        }
        Err(_) => (0.0, 0),
    }
}

async fn run_process(item: &pb::ItemToRun, outcome: &mut pb::ItemOutcome, kill: &CancellationToken) -> Option<()> {
    let (cpu_before, _) = children_usage();
    let mut command = tokio::process::Command::new(&item.command[0]);
    command
        .args(&item.command[1..])
        .envs(&item.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            outcome.reason = format!("cannot start {}: {error}", item.command[0]);
            outcome.exit_code = Some(127);
            return Some(());
        }
    };
    let pid = child.id();
    let tail = Arc::new(Mutex::new(Tail::default()));
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(read_lines(out, pb::LogStream::Stdout, tail.clone())));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(tokio::spawn(read_lines(err, pb::LogStream::Stderr, tail.clone())));
    }
    let timeout = Duration::from_secs(item.timeout_secs.max(1));
    let status = tokio::select! {
        status = child.wait() => status.ok(),
        _ = tokio::time::sleep(timeout) => {
            kill_group(pid);
            let _ = child.wait().await;
            outcome.reason = format!("timed out after {} s", timeout.as_secs());
            None
        }
        _ = kill.cancelled() => {
            kill_group(pid);
            let _ = child.wait().await;
            return None;
        }
    };
    for reader in readers {
        let _ = reader.await;
    }
    if let Some(status) = status {
        use std::os::unix::process::ExitStatusExt;
        outcome.exit_code = status.code().or_else(|| status.signal().map(|s| 128 + s));
        if outcome.exit_code != Some(0) {
            outcome.reason = match status.signal() {
                Some(signal) => format!("killed by signal {signal}"),
                None => format!("exited with code {}", status.code().unwrap_or(-1)),
            };
        }
    }
    let (cpu_after, peak) = children_usage();
    outcome.cpu_seconds = (cpu_after - cpu_before).max(0.0);
    outcome.peak_memory_bytes = peak;
    outcome.lines = std::mem::take(&mut tail.lock().expect("tail lock").lines).into();
    Some(())
}

fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

async fn read_lines(pipe: impl tokio::io::AsyncRead + Unpin, stream: pb::LogStream, tail: Arc<Mutex<Tail>>) {
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tail.lock().expect("tail lock").push(stream, line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_lines_within_bounds() {
        let mut tail = Tail::default();
        for n in 0..500 {
            tail.push(pb::LogStream::Stdout, format!("line {n}"));
        }
        assert_eq!(tail.lines.len(), KEPT_LINES);
        assert_eq!(tail.lines.back().unwrap().text, "line 499");
        tail.push(pb::LogStream::Stderr, "x".repeat(40_000));
        assert_eq!(
            tail.lines.len(),
            1,
            "one huge line is kept alone, cut to the byte budget"
        );
        assert!(tail.bytes <= KEPT_BYTES);
    }

    #[tokio::test]
    async fn items_run_with_their_timeout_and_keep_their_output() {
        let kill = CancellationToken::new();
        let item = |command: &[&str], timeout_secs| pb::ItemToRun {
            key: "k".into(),
            attempt: 2,
            command: command.iter().map(|s| s.to_string()).collect(),
            env: HashMap::from([("KILN_ITEM".to_string(), "k".to_string())]),
            timeout_secs,
            round: 0,
        };
        let ok = run_item(
            item(&["sh", "-c", "echo out $KILN_ITEM; echo err >&2"], 10),
            Runner::Process,
            &kill,
        )
        .await
        .unwrap();
        assert_eq!(ok.exit_code, Some(0));
        let texts: Vec<&str> = ok.lines.iter().map(|l| l.text.as_str()).collect();
        assert!(texts.contains(&"out k") && texts.contains(&"err"), "{texts:?}");
        let failed = run_item(item(&["sh", "-c", "exit 3"], 10), Runner::Process, &kill)
            .await
            .unwrap();
        assert_eq!(
            (failed.exit_code, failed.reason.as_str()),
            (Some(3), "exited with code 3")
        );
        let slow = run_item(item(&["sleep", "30"], 1), Runner::Process, &kill)
            .await
            .unwrap();
        assert_eq!(slow.exit_code, None);
        assert!(slow.reason.contains("timed out"), "{}", slow.reason);
        let missing = run_item(item(&["/no/such/program"], 1), Runner::Process, &kill)
            .await
            .unwrap();
        assert_eq!(missing.exit_code, Some(127));
        let noop = run_item(item(&["kiln:noop"], 1), Runner::BuiltinsOnly, &kill)
            .await
            .unwrap();
        assert_eq!(noop.exit_code, Some(0));
        let refused = run_item(item(&["true"], 1), Runner::BuiltinsOnly, &kill).await.unwrap();
        assert_eq!(refused.exit_code, None);
    }
}
