//! A job's lines: `kiln logs` (a gang job's from every node, or one node's), `kiln grep`, and the
//! readers `kiln run -f` and `kiln serve logs` share.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use futures::StreamExt;
use kiln_proto::v1 as pb;

use crate::client::{self, Clients};

/// Prints a job's lines (its last `tail` lines when given), following it with `follow`.
pub(crate) async fn print_logs(clients: &mut Clients, job_id: &str, follow: bool, tail: Option<u32>) -> Result<()> {
    let mut lines = log_lines(clients, job_id, follow, tail, 0).await?;
    while let Some(line) = lines.next().await {
        print_line(&line?, "")?;
    }
    Ok(())
}

/// A gang job's lines, every node's (`[node K] ` before each) or one node's: stored lines in
/// time order across nodes, then (with `follow`) new ones as they come.
async fn print_gang_logs(
    clients: &mut Clients,
    job_id: &str,
    nodes: u32,
    only: Option<u32>,
    follow: bool,
    tail: Option<u32>,
) -> Result<()> {
    let ranks: Vec<u32> = match only {
        Some(rank) => vec![rank],
        None => (0..nodes).collect(),
    };
    let mut streams = Vec::new();
    for &rank in &ranks {
        let lines = log_lines(clients, job_id, follow, tail, rank).await?;
        streams.push(lines.map(move |line| line.map(|line| (rank, line))));
    }
    let prefix = |rank: u32| {
        if only.is_some() {
            String::new()
        } else {
            format!("[node {rank}] ")
        }
    };
    if follow {
        let mut merged = futures::stream::select_all(streams);
        while let Some(line) = merged.next().await {
            let (rank, line) = line?;
            print_line(&line, &prefix(rank))?;
        }
        return Ok(());
    }
    let mut all = Vec::new();
    for mut stream in streams {
        while let Some(line) = stream.next().await {
            all.push(line?);
        }
    }
    all.sort_by_key(|(rank, line)| (line.timestamp_ms, *rank));
    for (rank, line) in &all {
        print_line(line, &prefix(*rank))?;
    }
    Ok(())
}

/// Opens a job's lines (its last `tail` lines when given), following it with `follow`: how
/// `kiln logs` and `kiln serve logs` read a job's logs.
pub async fn log_lines(
    clients: &mut Clients,
    job_id: &str,
    follow: bool,
    tail: Option<u32>,
    node: u32,
) -> Result<tonic::Streaming<pb::LogLine>> {
    let job_id = job_id.to_string();
    let lines = match tail {
        None => {
            clients
                .logs
                .get_logs(pb::GetLogsRequest {
                    job_id,
                    follow,
                    node,
                    after_seq: 0,
                })
                .await?
        }
        Some(lines) => {
            clients
                .logs
                .tail_logs(pb::TailLogsRequest {
                    job_id,
                    lines,
                    follow,
                    node,
                })
                .await?
        }
    };
    Ok(lines.into_inner())
}

/// Prints a job's line after `prefix`: a stdout line to stdout, a stderr line to stderr.
pub fn print_line(line: &pb::LogLine, prefix: &str) -> Result<()> {
    if line.stream == pb::LogStream::Stderr as i32 {
        writeln!(std::io::stderr().lock(), "{prefix}{}", line.text)?;
    } else {
        writeln!(std::io::stdout().lock(), "{prefix}{}", line.text)?;
    }
    Ok(())
}

/// `kiln logs`: a job's lines; a gang job's from every node with `[node K] ` before each, or
/// one node's with `node`.
pub async fn logs(job_id: String, follow: bool, tail: Option<u32>, node: Option<u32>) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let job = clients
        .jobs
        .get_job(pb::GetJobRequest { job_id: job_id.clone() })
        .await?
        .into_inner();
    let nodes = job.spec.as_ref().map_or(1, |spec| spec.nodes.max(1));
    if let Some(rank) = node.filter(|rank| *rank >= nodes) {
        anyhow::bail!(
            "job {job_id} has {nodes} node(s): --node {rank} is not one of them (0 to {})",
            nodes - 1
        );
    }
    if nodes > 1 {
        print_gang_logs(&mut clients, &job.id, nodes, node, follow, tail).await?;
    } else {
        print_logs(&mut clients, &job.id, follow, tail).await?;
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn grep(job_id: String, pattern: String, regex: bool) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let request = pb::SearchLogsRequest {
        job_id,
        pattern,
        regex,
        ..Default::default()
    };
    let found = clients.logs.search_logs(request).await?.into_inner();
    let stdout = std::io::stdout();
    for line in &found.lines {
        writeln!(stdout.lock(), "{}", line.text)?;
    }
    if found.truncated {
        eprintln!("(more lines match; showing the first {})", found.lines.len());
    }
    Ok(if found.lines.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
