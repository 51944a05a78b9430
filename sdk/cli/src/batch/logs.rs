//! `kiln batch logs`: one item's lines from item-batch, or with --grep the matching lines of
//! every item from log-ingest's search.

use std::process::ExitCode;

use anyhow::Result;
use kiln_proto::v1 as pb;

use crate::client::Clients;
use crate::format::out;

/// How an attempt ended (what `kiln batch logs --grep --state` keeps to).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum AttemptEndArg {
    Succeeded,
    Failed,
    Dead,
}

impl AttemptEndArg {
    fn proto(self) -> pb::ItemState {
        match self {
            AttemptEndArg::Succeeded => pb::ItemState::Succeeded,
            AttemptEndArg::Failed => pb::ItemState::Failed,
            AttemptEndArg::Dead => pb::ItemState::Dead,
        }
    }
}

/// Prints an item's lines (every attempt), or the lines of the batch matching `grep`; exit 1
/// when a search matched nothing.
pub(super) async fn print(
    clients: &mut Clients,
    batch: String,
    item: Option<String>,
    grep: Option<String>,
    regex: bool,
    state: Option<AttemptEndArg>,
    limit: u32,
) -> Result<ExitCode> {
    let Some(pattern) = grep else {
        let request = pb::GetItemLogsRequest {
            batch_id: batch,
            key: item.unwrap_or_default(),
        };
        for line in clients.batches.get_item_logs(request).await?.into_inner().lines {
            out!("[attempt {}] {}", line.attempt, line.text);
        }
        return Ok(ExitCode::SUCCESS);
    };
    let request = pb::SearchBatchLogsRequest {
        batch_id: batch,
        pattern,
        regex,
        state: state.map_or(pb::ItemState::Unspecified, AttemptEndArg::proto) as i32,
        limit,
    };
    let found = clients.batch_logs.search_batch_logs(request).await?.into_inner();
    for line in &found.lines {
        out!("{} [attempt {}] {}", line.key, line.attempt, line.text);
    }
    if found.truncated {
        eprintln!("more lines matched than the {limit} shown; raise --limit (at most 100000) or narrow the pattern");
    }
    Ok(if found.lines.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
