//! `kiln serve logs`: the logs of a service's workers, read as `kiln logs` reads a job's
//! ([`job_logs::log_lines`]), each line prefixed with its worker: `[member r2 1a2b3c4d] text`
//! (the member, the revision and the end of the worker's job id, its random part). With
//! `--follow` the workers' lines are merged as they come, and workers that start later (a
//! replacement, a scale-up, a roll) are followed too, until the service is stopped and its
//! last worker ended.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use kiln_proto::v1 as pb;
use tokio_stream::StreamMap;

use crate::client::Clients;
use crate::job_logs;

/// How often a follow looks for workers that started since.
const WORKER_POLL: Duration = Duration::from_secs(2);

/// The characters of a job id a prefix shows: its end, since a job id starts with its time.
const SHORT_JOB_ID: usize = 8;

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// NAME or PROJECT/NAME.
    name: String,
    /// The service's project (default: the one project you may read that has it).
    #[arg(long)]
    project: Option<String>,
    /// Only the workers of this member.
    #[arg(long)]
    member: Option<String>,
    /// Only the workers of this revision.
    #[arg(long)]
    revision: Option<u64>,
    /// Follow the lines as they come, and the workers that start later, until the service stops.
    #[arg(short, long)]
    follow: bool,
}

/// A worker whose lines are printed.
struct Worker {
    job_id: String,
    /// What its lines start with: `[member r2 1a2b3c4d] `.
    prefix: String,
}

pub async fn logs(clients: &mut Clients, args: LogsArgs) -> Result<()> {
    let service = get_service(clients, &args).await?;
    let workers = workers_of(&service, &args);
    if workers.is_empty() {
        eprintln!("service {} has no worker{}", service.name, filter_text(&args));
    }
    if args.follow {
        return follow(clients, &args, workers).await;
    }
    for worker in workers {
        let mut lines = job_logs::log_lines(clients, &worker.job_id, false, None, 0).await?;
        while let Some(line) = lines.next().await {
            job_logs::print_line(&line?, &worker.prefix)?;
        }
    }
    Ok(())
}

/// Prints the workers' lines as they come, adding the workers that start, until the service
/// is stopped and no followed worker is left.
async fn follow(clients: &mut Clients, args: &LogsArgs, workers: Vec<Worker>) -> Result<()> {
    let mut followed = HashSet::new();
    // Keyed by prefix: each line is printed after its worker's.
    let mut streams = StreamMap::new();
    let mut poll = tokio::time::interval(WORKER_POLL);
    poll.tick().await;
    let mut pending = workers;
    loop {
        for worker in pending.drain(..) {
            if followed.insert(worker.job_id.clone()) {
                let lines = job_logs::log_lines(clients, &worker.job_id, true, None, 0).await?;
                streams.insert(worker.prefix, lines);
            }
        }
        tokio::select! {
            Some((prefix, line)) = streams.next(), if !streams.is_empty() => {
                job_logs::print_line(&line?, &prefix)?;
            }
            _ = poll.tick() => {
                let service = get_service(clients, args).await?;
                pending = workers_of(&service, args);
                let has_new = pending.iter().any(|worker| !followed.contains(&worker.job_id));
                if service.state == "STOPPED" && streams.is_empty() && !has_new {
                    return Ok(());
                }
            }
        }
    }
}

async fn get_service(clients: &mut Clients, args: &LogsArgs) -> Result<pb::Service> {
    let request = pb::GetServiceRequest {
        name: args.name.clone(),
        project: args.project.clone().unwrap_or_default(),
    };
    Ok(clients.serve.get_service(request).await?.into_inner())
}

/// The service's workers that `args` asks for, in the service's member order.
fn workers_of(service: &pb::Service, args: &LogsArgs) -> Vec<Worker> {
    service
        .members
        .iter()
        .filter(|member| args.member.as_ref().is_none_or(|wanted| &member.member == wanted))
        .filter(|member| args.revision.is_none_or(|wanted| member.revision == wanted))
        .flat_map(|member| {
            member.workers.iter().map(|worker| {
                let start = worker.job_id.len().saturating_sub(SHORT_JOB_ID);
                let short_id = worker.job_id.get(start..).unwrap_or(&worker.job_id);
                Worker {
                    job_id: worker.job_id.clone(),
                    prefix: format!("[{} r{} {short_id}] ", member.member, member.revision),
                }
            })
        })
        .collect()
}

/// ` of member M in revision R`, for a message about the workers `args` asks for.
fn filter_text(args: &LogsArgs) -> String {
    let member = args.member.as_ref().map(|member| format!(" of member {member}"));
    let revision = args.revision.map(|revision| format!(" in revision {revision}"));
    format!("{}{}", member.unwrap_or_default(), revision.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, revision: u64, job_ids: &[&str]) -> pb::ServiceMember {
        pb::ServiceMember {
            member: name.into(),
            revision,
            workers: job_ids
                .iter()
                .map(|job_id| pb::ServiceWorker {
                    job_id: (*job_id).into(),
                    state: pb::JobState::Running as i32,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn args(member: Option<&str>, revision: Option<u64>) -> LogsArgs {
        LogsArgs {
            name: "digits".into(),
            project: None,
            member: member.map(str::to_string),
            revision,
            follow: false,
        }
    }

    #[test]
    fn workers_are_prefixed_with_member_revision_and_job_id_end_and_filtered() {
        let service = pb::Service {
            members: vec![
                member("svm", 1, &["0190a1b2-0000-7000-8000-00000000aaaa"]),
                member("lr", 1, &["0190a1b2-0000-7000-8000-00000000bbbb"]),
                member("svm", 2, &["0190a1b2-0000-7000-8000-00000000cccc", "short"]),
            ],
            ..Default::default()
        };
        let prefixes = |args: &LogsArgs| {
            workers_of(&service, args)
                .into_iter()
                .map(|worker| worker.prefix)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            prefixes(&args(None, None)),
            [
                "[svm r1 0000aaaa] ",
                "[lr r1 0000bbbb] ",
                "[svm r2 0000cccc] ",
                "[svm r2 short] "
            ]
        );
        assert_eq!(prefixes(&args(Some("svm"), None)).len(), 3);
        assert_eq!(prefixes(&args(Some("svm"), Some(1))), ["[svm r1 0000aaaa] "]);
        assert_eq!(
            prefixes(&args(None, Some(2))),
            ["[svm r2 0000cccc] ", "[svm r2 short] "]
        );
        assert!(prefixes(&args(Some("knn"), None)).is_empty());
        assert_eq!(filter_text(&args(Some("svm"), Some(2))), " of member svm in revision 2");
    }
}
