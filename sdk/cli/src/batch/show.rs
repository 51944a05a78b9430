//! Showing batches: `batch status` (once or --watch), `batch ls` and `batch items`, as tables
//! or JSON.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use super::ItemStateArg;
use crate::client::Clients;
use crate::format::{self, Output, out};

/// `batch ls`: one row (or JSON object) per batch.
pub fn list(batches: &[pb::Batch], output: Output) -> Result<()> {
    if output == Output::Json {
        let batches: Vec<_> = batches.iter().map(batch_json).collect();
        return format::print_json(&batches);
    }
    let mut table = tabled::builder::Builder::default();
    table.push_record(["ID", "NAME", "STATE", "ITEMS", "OK/DEAD", "WORKERS", "AGE"]);
    for b in batches {
        let c = b.counts.unwrap_or_default();
        table.push_record([
            b.id.clone(),
            b.spec.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
            state_of(b),
            c.total.to_string(),
            format!("{}/{}", c.succeeded, c.dead),
            b.workers.to_string(),
            format::age(b.created_at_ms),
        ]);
    }
    out!("{}", table.build().with(Style::blank()));
    Ok(())
}

/// The state as `batch ls` and `batch status` show it: `SEALED, STALLED` for a stalled batch,
/// `OPEN, PAUSED` for a paused one.
fn state_of(batch: &pb::Batch) -> String {
    let mut state = batch_state(batch.state);
    if !batch.stalled_reason.is_empty() {
        state.push_str(", STALLED");
    }
    if !batch.paused_reason.is_empty() {
        state.push_str(", PAUSED");
    }
    state
}

fn batch_state(state: i32) -> String {
    pb::BatchState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("BATCH_STATE_").to_string())
        .unwrap_or_else(|_| "UNKNOWN".into())
}

pub async fn status(clients: &mut Clients, batch_id: String, watch: bool, output: Output) -> Result<ExitCode> {
    let get = |clients: &mut Clients| {
        let request = pb::BatchRef {
            batch_id: batch_id.clone(),
        };
        let mut batches = clients.batches.clone();
        async move { batches.get_batch(request).await }
    };
    let batch = get(clients).await?.into_inner();
    if !watch {
        if output == Output::Json {
            format::print_json(&batch_json(&batch))?;
        } else {
            print_status(&batch)?;
        }
        return Ok(exit_of(&batch));
    }
    let total = batch.counts.unwrap_or_default().total;
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"));
    let mut batch = batch;
    loop {
        let c = batch.counts.unwrap_or_default();
        bar.set_length(c.total);
        bar.set_position(c.succeeded + c.dead);
        let eta = match batch.eta_seconds {
            -1 => "?".to_string(),
            s => format!("{s}s"),
        };
        bar.set_message(format!(
            "{} running, {} failed, {} dead, {:.1} items/s, ETA {eta}, {} workers",
            c.running, c.failed, c.dead, batch.items_per_second, batch.workers
        ));
        // A stalled or paused batch does nothing until it is retried: the watch ends with the
        // reason.
        let ended = matches!(
            pb::BatchState::try_from(batch.state),
            Ok(pb::BatchState::Done | pb::BatchState::Cancelled)
        ) || !batch.stalled_reason.is_empty()
            || !batch.paused_reason.is_empty();
        if ended {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        batch = get(clients).await?.into_inner();
    }
    bar.finish_and_clear();
    print_status(&batch)?;
    Ok(exit_of(&batch))
}

/// 0 when every item succeeded, 1 when some are dead, the batch was cancelled, it stalled or
/// it was paused.
fn exit_of(batch: &pb::Batch) -> ExitCode {
    let c = batch.counts.unwrap_or_default();
    if !batch.stalled_reason.is_empty() || !batch.paused_reason.is_empty() {
        return ExitCode::from(1);
    }
    match pb::BatchState::try_from(batch.state) {
        Ok(pb::BatchState::Cancelled) => ExitCode::from(1),
        Ok(pb::BatchState::Done) if c.dead > 0 => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    }
}

pub fn print_status(batch: &pb::Batch) -> Result<()> {
    let c = batch.counts.unwrap_or_default();
    out!("batch     {} ({})", batch.id, state_of(batch));
    if !batch.stalled_reason.is_empty() {
        out!(
            "stalled   {}\n          no more workers are asked for: fix the cause, then `kiln batch retry {}`",
            batch.stalled_reason,
            batch.id
        );
    }
    if !batch.paused_reason.is_empty() {
        out!(
            "paused    {}\n          no workers run: once the owner may run jobs again, `kiln batch retry {}`",
            batch.paused_reason,
            batch.id
        );
    }
    out!(
        "items     {} total: {} pending, {} running, {} succeeded, {} failed, {} dead",
        c.total,
        c.pending,
        c.running,
        c.succeeded,
        c.failed,
        c.dead
    );
    let eta = match batch.eta_seconds {
        -1 => "unknown".to_string(),
        s => format!("{s} s"),
    };
    out!("rate      {:.1} items/s, ETA {eta}", batch.items_per_second);
    out!("workers   {}", batch.workers);
    match &batch.usage {
        Some(usage) if usage.items > 0 => {
            out!("usage     over {} items' last attempts", usage.items);
            let cores = |cores: f64| format!("{cores:.2} cores");
            let memory = |bytes: f64| format::bytes(bytes as u64);
            let wall = |seconds: f64| format!("{seconds:.1} s");
            let lines: [(&str, Option<pb::UsageSpread>, &Shows); 3] = [
                ("cpu", usage.cpu_cores, &cores),
                ("memory", usage.peak_memory_bytes, &memory),
                ("wall", usage.wall_seconds, &wall),
            ];
            for (name, spread, show) in lines {
                let spread = spread.unwrap_or_default();
                out!(
                    "  {name:<7} p50 {}, p95 {}, max {}",
                    show(spread.p50),
                    show(spread.p95),
                    show(spread.max)
                );
            }
            out!("sizing    {}", usage.sizing_hint);
        }
        _ => out!(
            "per item  {:.3} CPU s, peak memory {}",
            batch.cpu_seconds_per_item,
            format::bytes(batch.peak_memory_bytes)
        ),
    }
    Ok(())
}

/// How one figure of a spread reads.
type Shows = dyn Fn(f64) -> String;

fn spread_json(spread: Option<pb::UsageSpread>) -> serde_json::Value {
    let spread = spread.unwrap_or_default();
    serde_json::json!({ "p50": spread.p50, "p95": spread.p95, "max": spread.max })
}

fn batch_json(batch: &pb::Batch) -> serde_json::Value {
    let c = batch.counts.unwrap_or_default();
    serde_json::json!({
        "id": batch.id,
        "name": batch.spec.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
        "state": batch_state(batch.state),
        "stalled": !batch.stalled_reason.is_empty(),
        "stalled_reason": (!batch.stalled_reason.is_empty()).then_some(&batch.stalled_reason),
        "paused": !batch.paused_reason.is_empty(),
        "paused_reason": (!batch.paused_reason.is_empty()).then_some(&batch.paused_reason),
        "total": c.total,
        "pending": c.pending,
        "running": c.running,
        "succeeded": c.succeeded,
        "failed": c.failed,
        "dead": c.dead,
        "items_per_second": batch.items_per_second,
        "eta_seconds": batch.eta_seconds,
        "workers": batch.workers,
        "cpu_seconds_per_item": batch.cpu_seconds_per_item,
        "peak_memory_bytes": batch.peak_memory_bytes,
        "usage": batch.usage.as_ref().map(|usage| serde_json::json!({
            "items": usage.items,
            "cpu_cores": spread_json(usage.cpu_cores),
            "peak_memory_bytes": spread_json(usage.peak_memory_bytes),
            "wall_seconds": spread_json(usage.wall_seconds),
            "sizing_hint": usage.sizing_hint,
        })),
        "created_at_ms": batch.created_at_ms,
    })
}

pub async fn items(
    clients: &mut Clients,
    batch_id: String,
    states: Vec<ItemStateArg>,
    limit: u32,
    output: Output,
) -> Result<()> {
    let mut rows = Vec::new();
    let mut page_token = String::new();
    while rows.len() < limit as usize {
        let page = clients
            .batches
            .list_items(pb::ListItemsRequest {
                batch_id: batch_id.clone(),
                states: states.iter().map(|s| s.proto() as i32).collect(),
                page_token: page_token.clone(),
                limit: (limit as usize - rows.len()).min(1000) as u32,
            })
            .await?
            .into_inner();
        rows.extend(page.items);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let item_state = |state: i32| {
        pb::ItemState::try_from(state)
            .map(|s| s.as_str_name().trim_start_matches("ITEM_STATE_").to_string())
            .unwrap_or_default()
    };
    if output == Output::Json {
        let items: Vec<_> = rows
            .iter()
            .map(|item| {
                serde_json::json!({
                    "key": item.key,
                    "uri": item.uri,
                    "state": item_state(item.state),
                    "attempts": item.attempts,
                    "exit_code": item.exit_code,
                    "reason": item.reason,
                    "cpu_seconds": item.cpu_seconds,
                    "peak_memory_bytes": item.peak_memory_bytes,
                    "duration_ms": item.duration_ms,
                })
            })
            .collect();
        return format::print_json(&items);
    }
    let mut table = tabled::builder::Builder::default();
    table.push_record([
        "KEY", "STATE", "ATTEMPTS", "EXIT", "CPU S", "PEAK MEM", "WALL", "REASON",
    ]);
    for item in rows {
        let state = item_state(item.state);
        let measured = item.attempts > 0;
        table.push_record([
            item.key,
            state,
            item.attempts.to_string(),
            item.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            if measured {
                format!("{:.2}", item.cpu_seconds)
            } else {
                String::new()
            },
            if measured {
                format::bytes(item.peak_memory_bytes)
            } else {
                String::new()
            },
            if measured {
                format!("{:.1}s", item.duration_ms as f64 / 1000.0)
            } else {
                String::new()
            },
            item.reason,
        ]);
    }
    out!("{}", table.build().with(Style::blank()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_batch_reads_as_stalled_with_its_reason() {
        let mut batch = pb::Batch {
            id: "b1".into(),
            state: pb::BatchState::Sealed as i32,
            ..Default::default()
        };
        assert_eq!(state_of(&batch), "SEALED");
        assert_eq!(batch_json(&batch)["stalled"], false);
        batch.stalled_reason = "5 workers in a row failed, the last with: no agent-binary".into();
        assert_eq!(state_of(&batch), "SEALED, STALLED");
        let json = batch_json(&batch);
        assert_eq!(json["stalled"], true);
        assert_eq!(json["stalled_reason"], batch.stalled_reason.as_str());
        assert_eq!(exit_of(&batch), ExitCode::from(1));
    }

    #[test]
    fn a_paused_batch_reads_as_paused_with_its_reason() {
        let mut batch = pb::Batch {
            id: "b1".into(),
            state: pb::BatchState::Open as i32,
            ..Default::default()
        };
        assert_eq!(exit_of(&batch), ExitCode::SUCCESS);
        batch.paused_reason = "paused: owner alice was disabled".into();
        assert_eq!(state_of(&batch), "OPEN, PAUSED");
        let json = batch_json(&batch);
        assert_eq!(json["paused"], true);
        assert_eq!(json["paused_reason"], batch.paused_reason.as_str());
        assert_eq!(exit_of(&batch), ExitCode::from(1));
    }
}
