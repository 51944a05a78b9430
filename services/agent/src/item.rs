//! Running one item: a built-in in the agent itself, or its command as a child process with
//! the item's timeout, keeping the last lines of its output (secrets masked) for the outcome.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::measure::{self, Measurer};
use crate::{KEPT_BYTES, KEPT_LINES, Masker, Runner};

/// Runs one item; None when it was killed (cancelled batch, termination).
pub(crate) async fn run_item(
    item: pb::ItemToRun,
    runner: Runner,
    kill: &CancellationToken,
    masker: Arc<Masker>,
    measure_with: Option<&Measurer>,
) -> Option<pb::ItemOutcome> {
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
    } else if program == "kiln:echo" {
        let mut tail = Tail::new(item.keep_lines);
        tail.push(pb::LogStream::Stdout, masker.mask(item.command[1..].join(" ")));
        outcome.lines = tail.lines.into();
        outcome.exit_code = Some(0);
    } else if program.starts_with("kiln:") {
        outcome.reason = format!("unknown built-in {program}");
        outcome.failure = pb::ItemFailure::NotStarted as i32;
    } else if runner == Runner::BuiltinsOnly {
        outcome.reason = "this worker runs built-ins only (simulated machine)".into();
        outcome.failure = pb::ItemFailure::NotStarted as i32;
    } else {
        run_process(&item, &mut outcome, kill, masker, measure_with).await?;
    }
    outcome.duration_ms = started.elapsed().as_millis() as u64;
    Some(outcome)
}

/// The last lines of an attempt's output: as many as item-batch asks to keep (by default
/// [`KEPT_LINES`]) within [`KEPT_BYTES`] per [`KEPT_LINES`] lines; the earlier ones are counted.
struct Tail {
    lines: VecDeque<pb::LogEntry>,
    bytes: usize,
    keep_lines: usize,
    keep_bytes: usize,
    dropped: u64,
}

impl Tail {
    /// A tail keeping `keep_lines` lines (0: the default).
    fn new(keep_lines: u32) -> Tail {
        let keep_lines = match keep_lines {
            0 => KEPT_LINES,
            n => n as usize,
        };
        Tail {
            lines: VecDeque::new(),
            bytes: 0,
            keep_lines,
            keep_bytes: KEPT_BYTES.max(keep_lines * (KEPT_BYTES / KEPT_LINES)),
            dropped: 0,
        }
    }

    fn push(&mut self, stream: pb::LogStream, text: String) {
        let text: String = text.chars().take(KEPT_BYTES).collect();
        self.bytes += text.len();
        self.lines.push_back(pb::LogEntry {
            stream: stream as i32,
            timestamp_ms: now_ms(),
            text,
        });
        while self.lines.len() > self.keep_lines || (self.bytes > self.keep_bytes && self.lines.len() > 1) {
            if let Some(old) = self.lines.pop_front() {
                self.bytes -= old.text.len();
                self.dropped += 1;
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

async fn run_process(
    item: &pb::ItemToRun,
    outcome: &mut pb::ItemOutcome,
    kill: &CancellationToken,
    masker: Arc<Masker>,
    measure_with: Option<&Measurer>,
) -> Option<()> {
    let before = measure::children();
    let oom_kills_before = oom_kills();
    let (mut command, usage_file) = match measure_with {
        Some(measurer) => {
            let (program, args, file) = measurer.wrap(&item.command);
            let mut command = tokio::process::Command::new(program);
            command.args(args);
            (command, Some(file))
        }
        None => {
            let mut command = tokio::process::Command::new(&item.command[0]);
            command.args(&item.command[1..]);
            (command, None)
        }
    };
    command
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
            outcome.failure = pb::ItemFailure::NotStarted as i32;
            return Some(());
        }
    };
    let pid = child.id();
    let tail = Arc::new(Mutex::new(Tail::new(item.keep_lines)));
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(read_lines(
            out,
            pb::LogStream::Stdout,
            tail.clone(),
            masker.clone(),
        )));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(tokio::spawn(read_lines(
            err,
            pb::LogStream::Stderr,
            tail.clone(),
            masker,
        )));
    }
    let timeout = Duration::from_secs(item.timeout_secs.max(1));
    let status = tokio::select! {
        status = child.wait() => status.ok(),
        _ = tokio::time::sleep(timeout) => {
            kill_group(pid);
            let _ = child.wait().await;
            outcome.reason = format!("timed out after {} s", timeout.as_secs());
            outcome.failure = pb::ItemFailure::Timeout as i32;
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
            let oom =
                status.signal() == Some(nix::sys::signal::Signal::SIGKILL as i32) && oom_kills() > oom_kills_before;
            outcome.failure = if oom {
                pb::ItemFailure::OutOfMemory
            } else if measure_with.is_some() && status.code() == Some(127) {
                // The measuring process could not start the command (it says why in the lines).
                pb::ItemFailure::NotStarted
            } else {
                pb::ItemFailure::Exit
            } as i32;
            outcome.reason = match status.signal() {
                Some(_) if oom => "killed by the kernel's OOM killer (out of memory)".to_string(),
                Some(signal) => format!("killed by signal {signal}"),
                None => format!("exited with code {}", status.code().unwrap_or(-1)),
            };
        }
    }
    let usage = match &usage_file {
        // The item's own use, measured apart from its neighbours'.
        Some(file) => {
            let usage = measure::Usage::read(file).unwrap_or_default();
            let _ = std::fs::remove_file(file);
            usage
        }
        // Every child of the worker since the item started: exact only one item at a time.
        None => {
            let after = measure::children();
            measure::Usage {
                cpu_seconds: (after.cpu_seconds - before.cpu_seconds).max(0.0),
                peak_memory_bytes: after.peak_memory_bytes,
            }
        }
    };
    outcome.cpu_seconds = usage.cpu_seconds;
    outcome.peak_memory_bytes = usage.peak_memory_bytes;
    let mut tail = tail.lock().expect("tail lock");
    outcome.lines = std::mem::take(&mut tail.lines).into();
    outcome.lines_dropped = tail.dropped;
    Some(())
}

fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// OOM kills so far in this worker's cgroup (cgroup v2 `memory.events`); 0 where it cannot be
/// read. A SIGKILLed item is out of memory when the count grew while it ran (a neighbour killed
/// by the OOM killer at the same instant could be taken for it).
fn oom_kills() -> u64 {
    let Ok(membership) = std::fs::read_to_string("/proc/self/cgroup") else {
        return 0;
    };
    let Some(path) = membership.lines().find_map(|line| line.strip_prefix("0::")) else {
        return 0;
    };
    let events = std::path::Path::new("/sys/fs/cgroup")
        .join(path.trim_start_matches('/'))
        .join("memory.events");
    std::fs::read_to_string(events)
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("oom_kill ").and_then(|n| n.trim().parse().ok()))
        })
        .unwrap_or(0)
}

async fn read_lines(
    pipe: impl tokio::io::AsyncRead + Unpin,
    stream: pb::LogStream,
    tail: Arc<Mutex<Tail>>,
    masker: Arc<Masker>,
) {
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = masker.mask(line);
        tail.lock().expect("tail lock").push(stream, line);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn the_tail_keeps_the_last_lines_within_bounds() {
        let mut tail = Tail::new(0);
        for n in 0..500 {
            tail.push(pb::LogStream::Stdout, format!("line {n}"));
        }
        assert_eq!(tail.lines.len(), KEPT_LINES);
        assert_eq!(tail.lines.back().unwrap().text, "line 499");
        assert_eq!(tail.dropped, 400, "the lines not kept are counted");
        let mut asked = Tail::new(250);
        for n in 0..500 {
            asked.push(pb::LogStream::Stdout, format!("line {n}"));
        }
        assert_eq!(
            (asked.lines.len(), asked.dropped),
            (250, 250),
            "item-batch's number is kept"
        );
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
            keep_lines: 0,
        };
        let secrets = HashMap::from([(kiln_formats::mask::NAMES_VAR, "TOKEN"), ("TOKEN", "s3cr3t")]);
        let masker = Masker::from_env(|name| secrets.get(name).map(|v| v.to_string()));
        let ok = run_item(
            item(&["sh", "-c", "echo out $KILN_ITEM; echo err s3cr3t >&2"], 10),
            Runner::Process,
            &kill,
            Arc::new(masker),
            None,
        )
        .await
        .unwrap();
        assert_eq!(ok.exit_code, Some(0));
        let texts: Vec<&str> = ok.lines.iter().map(|l| l.text.as_str()).collect();
        assert!(texts.contains(&"out k") && texts.contains(&"err ***"), "{texts:?}");
        let failed = run_item(
            item(&["sh", "-c", "exit 3"], 10),
            Runner::Process,
            &kill,
            Arc::default(),
            None,
        )
        .await
        .unwrap();
        assert_eq!(
            (failed.exit_code, failed.reason.as_str(), failed.failure()),
            (Some(3), "exited with code 3", pb::ItemFailure::Exit)
        );
        let slow = run_item(item(&["sleep", "30"], 1), Runner::Process, &kill, Arc::default(), None)
            .await
            .unwrap();
        assert_eq!(slow.exit_code, None);
        assert!(slow.reason.contains("timed out"), "{}", slow.reason);
        assert_eq!(slow.failure(), pb::ItemFailure::Timeout);
        let missing = run_item(
            item(&["/no/such/program"], 1),
            Runner::Process,
            &kill,
            Arc::default(),
            None,
        )
        .await
        .unwrap();
        assert_eq!(
            (missing.exit_code, missing.failure()),
            (Some(127), pb::ItemFailure::NotStarted)
        );
        let noop = run_item(
            item(&["kiln:noop"], 1),
            Runner::BuiltinsOnly,
            &kill,
            Arc::default(),
            None,
        )
        .await
        .unwrap();
        assert_eq!(
            (noop.exit_code, noop.failure()),
            (Some(0), pb::ItemFailure::Unspecified)
        );
        let echo = run_item(
            item(&["kiln:echo", "saw", "s3cr3t"], 1),
            Runner::BuiltinsOnly,
            &kill,
            Arc::new(Masker::from_env(|name| secrets.get(name).map(|v| v.to_string()))),
            None,
        )
        .await
        .unwrap();
        let texts: Vec<&str> = echo.lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(
            (echo.exit_code, texts),
            (Some(0), vec!["saw ***"]),
            "masked, on any worker"
        );
        let refused = run_item(item(&["true"], 1), Runner::BuiltinsOnly, &kill, Arc::default(), None)
            .await
            .unwrap();
        assert_eq!(refused.exit_code, None);
    }
}
