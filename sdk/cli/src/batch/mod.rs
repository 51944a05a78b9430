//! `kiln batch`: batch jobs (a command per item, on workers that scale with the backlog).

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_proto::v1 as pb;

use crate::client::{self, Clients};
use crate::format::{self, Output, out};

mod logs;
mod show;

use show::{items, print_status, status};

/// Items per AddItems message.
const CHUNK: usize = 5000;

#[derive(Debug, clap::Subcommand)]
pub enum BatchCommand {
    /// Create a batch; the command after -- runs once per item, with {uri}, {output}, {item}
    /// and {attempt} filled in ({{ and }} for literal braces), or is a built-in (kiln:noop).
    Create(Box<CreateArgs>),
    /// Add items: one URI per line (the URI is the key), or JSON lines
    /// {"key": ..., "uri": ..., "params": {...}}; from a file or - for stdin.
    Add {
        batch: String,
        #[arg(long, required_unless_present_any = ["prefix", "manifest"])]
        from: Option<PathBuf>,
        /// Every object under this prefix of the object store is an item.
        #[arg(long, conflicts_with_all = ["from", "manifest"])]
        prefix: Option<String>,
        /// An object of the object store with one URI per line.
        #[arg(long, conflicts_with_all = ["from", "prefix"])]
        manifest: Option<String>,
    },
    /// No more items: the batch is done when its last item is.
    Seal { batch: String },
    /// Stop dispatch and the workers; the counters stay as they are.
    Cancel { batch: String },
    /// Give the dead items of a batch new attempts.
    Retry { batch: String },
    /// Counters, rate and ETA; --watch follows them until the batch ends.
    Status {
        batch: String,
        #[arg(short, long)]
        watch: bool,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// A batch's items, in key order (all, or those in the given states).
    Items {
        batch: String,
        #[arg(long, value_enum)]
        state: Vec<ItemStateArg>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The output lines of an item's attempts, or with --grep the matching lines of every item
    /// (each after its item key and attempt).
    Logs {
        batch: String,
        /// The item whose lines to print.
        #[arg(required_unless_present = "grep", conflicts_with = "grep")]
        item: Option<String>,
        /// Search the kept lines of every item of the batch for PATTERN (exit 1 when none match).
        #[arg(long, value_name = "PATTERN")]
        grep: Option<String>,
        /// Read --grep as a regular expression.
        #[arg(long, requires = "grep")]
        regex: bool,
        /// Only attempts that ended so: succeeded, failed (retried after) or dead (the attempt
        /// that made its item a dead letter).
        #[arg(long, requires = "grep", value_enum)]
        state: Option<logs::AttemptEndArg>,
        /// At most this many lines.
        #[arg(long, requires = "grep", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        limit: u32,
    },
    /// List batches (live ones; --all for every one).
    Ls {
        #[arg(long)]
        all: bool,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ItemStateArg {
    Pending,
    Succeeded,
    Failed,
    Dead,
}

impl ItemStateArg {
    fn proto(self) -> pb::ItemState {
        match self {
            ItemStateArg::Pending => pb::ItemState::Pending,
            ItemStateArg::Succeeded => pb::ItemState::Succeeded,
            ItemStateArg::Failed => pb::ItemState::Failed,
            ItemStateArg::Dead => pb::ItemState::Dead,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[arg(long)]
    name: Option<String>,
    #[arg(long)]
    project: Option<String>,
    /// Image of the workers; without one, workers are local processes.
    #[arg(long)]
    image: Option<String>,
    /// CPU cores per item.
    #[arg(long, default_value = "1", value_parser = format::parse_cpu)]
    cpu: u32,
    /// Memory per item, such as 512M or 4G.
    #[arg(long, default_value = "1G", value_parser = format::parse_size)]
    mem: u64,
    #[arg(long = "env", short = 'e', value_parser = format::parse_env)]
    env: Vec<(String, String)>,
    /// Where outputs go: {output} is this prefix and the item key.
    #[arg(long)]
    output_prefix: Option<String>,
    /// Attempts per item before it is a dead letter.
    #[arg(long, default_value_t = 3)]
    max_attempts: u32,
    /// Per-item timeout, such as 90s or 30m.
    #[arg(long, default_value = "1h", value_parser = format::parse_duration_secs)]
    timeout: u64,
    #[arg(long, default_value_t = 4)]
    max_workers: u32,
    /// Run the workers on spot instances.
    #[arg(long, conflicts_with = "on_demand")]
    spot: bool,
    /// Run the workers on on-demand instances.
    #[arg(long)]
    on_demand: bool,
    /// Run the workers only on this pool (default: any pool that fits).
    #[arg(long)]
    pool: Option<String>,
    /// Project secret every worker gets as the environment variable of its name (repeatable).
    #[arg(long = "secret")]
    secrets: Vec<String>,
    /// GPUs per worker (its items share them).
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// Items a worker runs at once; it asks for --cpu and --mem times this.
    #[arg(long, default_value_t = 1)]
    slots: u32,
    /// Each worker's own disk, such as 20G: a volume of that size holding /kiln/outputs and
    /// /tmp, where writing past it fails (needs --image; counted in placement).
    #[arg(long, value_parser = format::parse_size)]
    disk: Option<u64>,
    /// Size of each worker's /dev/shm, such as 1G (Docker's default is 64M); counts against the
    /// worker's memory (--mem times --slots).
    #[arg(long, value_parser = format::parse_size)]
    shm: Option<u64>,
    /// Retry only items exiting with these codes (such as 1,75); other exit codes end an item
    /// at once (a dead letter). Timeouts and out-of-memory kills are still retried.
    #[arg(long, value_delimiter = ',', value_name = "CODES")]
    retry_on_exit: Vec<i32>,
    /// Items exiting with these codes are dead letters at once, without another attempt.
    #[arg(long, value_delimiter = ',', value_name = "CODES")]
    fail_on_exit: Vec<i32>,
    /// Items failing this way are dead letters at once (repeatable).
    #[arg(long, value_enum, value_name = "FAILURE")]
    fail_on: Vec<FailureArg>,
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailureArg {
    /// The item ran past --timeout.
    Timeout,
    /// The kernel's OOM killer ended it.
    Oom,
    /// Its command could not be started.
    NotStarted,
}

/// The batch's retry rules from the flags, in the order they are tried: --fail-on-exit,
/// --fail-on, then --retry-on-exit followed by a rule that fails every other exit code.
fn retry_rules(retry_on_exit: &[i32], fail_on_exit: &[i32], fail_on: &[FailureArg]) -> Result<Vec<pb::RetryRule>> {
    if let Some(code) = retry_on_exit.iter().find(|code| fail_on_exit.contains(code)) {
        bail!("exit code {code} is in both --retry-on-exit and --fail-on-exit");
    }
    let rule = |on: pb::ItemFailure, exit_codes: &[i32], action: pb::RetryAction| pb::RetryRule {
        on: on as i32,
        exit_codes: exit_codes.to_vec(),
        action: action as i32,
    };
    let mut rules = Vec::new();
    if !fail_on_exit.is_empty() {
        rules.push(rule(pb::ItemFailure::Exit, fail_on_exit, pb::RetryAction::Fail));
    }
    for failure in fail_on {
        let on = match failure {
            FailureArg::Timeout => pb::ItemFailure::Timeout,
            FailureArg::Oom => pb::ItemFailure::OutOfMemory,
            FailureArg::NotStarted => pb::ItemFailure::NotStarted,
        };
        rules.push(rule(on, &[], pb::RetryAction::Fail));
    }
    if !retry_on_exit.is_empty() {
        rules.push(rule(pb::ItemFailure::Exit, retry_on_exit, pb::RetryAction::Retry));
        rules.push(rule(pb::ItemFailure::Exit, &[], pb::RetryAction::Fail));
    }
    Ok(rules)
}

pub async fn batch(command: BatchCommand) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    match command {
        BatchCommand::Create(args) => {
            let args = *args;
            let retry_rules = retry_rules(&args.retry_on_exit, &args.fail_on_exit, &args.fail_on)?;
            let spec = pb::BatchSpec {
                name: args.name.unwrap_or_default(),
                project: args.project.unwrap_or_default(),
                image: args.image.unwrap_or_default(),
                command: args.command,
                env: args.env.into_iter().collect(),
                cpu_millis: args.cpu,
                memory_mb: args.mem.div_ceil(1 << 20),
                output_prefix: args.output_prefix.unwrap_or_default(),
                max_attempts: args.max_attempts,
                item_timeout_secs: args.timeout,
                max_workers: args.max_workers,
                market: if args.spot {
                    pb::Market::Spot as i32
                } else if args.on_demand {
                    pb::Market::OnDemand as i32
                } else {
                    pb::Market::Unspecified as i32
                },
                pool: args.pool.unwrap_or_default(),
                secrets: args.secrets,
                retry_rules,
                gpus: args.gpus,
                slots: args.slots,
                disk_bytes: args.disk.unwrap_or(0),
                shm_bytes: args.shm.unwrap_or(0),
            };
            let batch = clients
                .batches
                .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
                .await?
                .into_inner();
            out!("{}", batch.id);
        }
        BatchCommand::Add {
            batch,
            from,
            prefix,
            manifest,
        } => {
            let response = match (from, prefix, manifest) {
                (Some(path), _, _) => add_from(&mut clients, batch, path).await?,
                (None, prefix, manifest) => {
                    let source = match (prefix, manifest) {
                        (Some(prefix), _) => pb::add_items_from_objects_request::Source::Prefix(prefix),
                        (None, Some(manifest)) => pb::add_items_from_objects_request::Source::Manifest(manifest),
                        (None, None) => bail!("give --from, --prefix or --manifest"),
                    };
                    let request = pb::AddItemsFromObjectsRequest {
                        batch_id: batch,
                        source: Some(source),
                    };
                    clients.batches.add_items_from_objects(request).await?.into_inner()
                }
            };
            out!(
                "added {}, {} already there; {} items in the batch",
                response.added,
                response.duplicates,
                response.total
            );
        }
        BatchCommand::Seal { batch } => {
            let batch = clients
                .batches
                .seal_batch(pb::BatchRef { batch_id: batch })
                .await?
                .into_inner();
            out!("{} sealed: {} items", batch.id, batch.counts.unwrap_or_default().total);
        }
        BatchCommand::Cancel { batch } => {
            let batch = clients
                .batches
                .cancel_batch(pb::BatchRef { batch_id: batch })
                .await?
                .into_inner();
            print_status(&batch)?;
        }
        BatchCommand::Retry { batch } => {
            let answer = clients
                .batches
                .retry_failed(pb::BatchRef { batch_id: batch })
                .await?
                .into_inner();
            if answer.resumed {
                out!("the batch was stalled: it asks for workers again");
            }
            out!("{} dead items queued again", answer.retried);
        }
        BatchCommand::Status { batch, watch, output } => {
            return status(&mut clients, batch, watch, output).await;
        }
        BatchCommand::Items {
            batch,
            state,
            limit,
            output,
        } => items(&mut clients, batch, state, limit, output).await?,
        BatchCommand::Logs {
            batch,
            item,
            grep,
            regex,
            state,
            limit,
        } => {
            return logs::print(&mut clients, batch, item, grep, regex, state, limit).await;
        }
        BatchCommand::Ls { all, output } => {
            let batches = clients
                .batches
                .list_batches(pb::ListBatchesRequest {
                    all,
                    ..Default::default()
                })
                .await?
                .into_inner()
                .batches;
            show::list(&batches, output)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads items from a file (or stdin) and sends them in chunks, with a progress bar.
async fn add_from(clients: &mut Clients, batch_id: String, path: PathBuf) -> Result<pb::AddItemsResponse> {
    let reader: Box<dyn BufRead + Send> = if path.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        let file = std::fs::File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
        Box::new(std::io::BufReader::new(file))
    };
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new_spinner();
        bar.set_style(ProgressStyle::with_template("adding {pos} items {per_sec}").expect("valid template"));
        bar
    } else {
        ProgressBar::hidden()
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::AddItemsRequest>(4);
    let reading = {
        let bar = bar.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut chunk = Vec::with_capacity(CHUNK);
            for (n, line) in reader.lines().enumerate() {
                let line = line.context("cannot read the items")?;
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                chunk.push(parse_item(line).with_context(|| format!("line {}", n + 1))?);
                if chunk.len() == CHUNK {
                    bar.inc(CHUNK as u64);
                    let items = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                    let message = pb::AddItemsRequest {
                        batch_id: batch_id.clone(),
                        items,
                    };
                    if tx.blocking_send(message).is_err() {
                        return Ok(());
                    }
                }
            }
            bar.inc(chunk.len() as u64);
            if !chunk.is_empty() {
                let _ = tx.blocking_send(pb::AddItemsRequest { batch_id, items: chunk });
            }
            Ok(())
        })
    };
    let response = clients
        .batches
        .add_items(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    reading.await.context("the reader panicked")??;
    bar.finish_and_clear();
    Ok(response?.into_inner())
}

/// A URI, or a JSON object with key, uri and params.
fn parse_item(line: &str) -> Result<pb::Item> {
    if !line.starts_with('{') {
        return Ok(pb::Item {
            key: String::new(),
            uri: line.to_string(),
            params: Default::default(),
        });
    }
    #[derive(serde::Deserialize)]
    struct Json {
        #[serde(default)]
        key: String,
        #[serde(default)]
        uri: String,
        #[serde(default)]
        params: std::collections::HashMap<String, String>,
    }
    let item: Json = serde_json::from_str(line).context("not a JSON item {\"key\", \"uri\", \"params\"}")?;
    Ok(pb::Item {
        key: item.key,
        uri: item.uri,
        params: item.params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_flags_become_rules_tried_in_order() {
        assert!(
            retry_rules(&[], &[], &[]).unwrap().is_empty(),
            "no flags: every failure is retried"
        );
        let rules = retry_rules(&[1], &[2, 3], &[FailureArg::Timeout]).unwrap();
        let summary: Vec<(i32, Vec<i32>, i32)> = rules.iter().map(|r| (r.on, r.exit_codes.clone(), r.action)).collect();
        let (exit, timeout) = (pb::ItemFailure::Exit as i32, pb::ItemFailure::Timeout as i32);
        let (retry, fail) = (pb::RetryAction::Retry as i32, pb::RetryAction::Fail as i32);
        assert_eq!(
            summary,
            [
                (exit, vec![2, 3], fail),
                (timeout, vec![], fail),
                (exit, vec![1], retry),
                (exit, vec![], fail),
            ]
        );
        let both = retry_rules(&[2], &[2], &[]).unwrap_err().to_string();
        assert!(both.contains("exit code 2"), "{both}");
    }
}
