//! One request's fan-out: the member request to one worker of each member (over the direct
//! channel to a relay the [`Directory`] knows, else NATS request/reply on the member's subject,
//! whose queue group picks the worker), gathered until every member answered or the deadline
//! passed, whichever is first (`first`: the first answer).

use std::time::Duration;

use async_nats::RequestErrorKind;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kiln_core::serving::{BUDGET_HEADER, Ensemble, PROBE_HEADER, STATUS_HEADER, ServiceSpec};
use kiln_core::subjects;
use kiln_formats::oip::{HEADER_LENGTH, InferResponse, Limits};
use tokio::time::Instant;

use crate::direct::{Answer, Directory};

/// How the member requests travel: the relays' direct channels where known, NATS otherwise.
#[derive(Clone, Copy)]
pub struct Channel<'a> {
    pub nats: &'a async_nats::Client,
    /// `None`: NATS only (`channel = "nats"`).
    pub directory: Option<&'a Directory>,
}

/// Why a member's answer is missing.
#[derive(Debug, Clone, PartialEq)]
pub enum Miss {
    /// Not in by the deadline.
    Late,
    /// No worker listens for it (none running, or every one out of rotation).
    Unavailable,
    /// Its worker refused the request (a 4xx: the request's fault).
    Refused { status: u16, message: String },
    /// Its worker is gone (the relay could not reach it, and left the rotation), and so were
    /// the ones asked again.
    Gone(String),
    /// Its worker failed (a 5xx, a body that does not parse, a NATS error).
    Failed(String),
}

/// What came back for one request.
#[derive(Debug, Default)]
pub struct Gathered {
    /// (member, answer, how long it took), in the order they arrived.
    pub answers: Vec<(usize, InferResponse, Duration)>,
    pub misses: Vec<(usize, Miss)>,
}

/// Sends `body` (an Open Inference Protocol request in JSON) to one worker of each member of
/// `spec` and gathers the answers until `deadline`.
pub async fn gather(
    channel: Channel<'_>,
    spec: &ServiceSpec,
    body: Bytes,
    deadline: Instant,
    limits: &Limits,
) -> Gathered {
    let started = Instant::now();
    let mut pending: FuturesUnordered<_> = spec
        .members
        .iter()
        .enumerate()
        .map(|(member, definition)| {
            let body = body.clone();
            async move {
                (
                    member,
                    ask(channel, spec, &definition.name, body, deadline, limits).await,
                )
            }
        })
        .collect();
    let mut gathered = Gathered::default();
    loop {
        match tokio::time::timeout_at(deadline, pending.next()).await {
            Ok(Some((member, Ok(answer)))) => {
                gathered.answers.push((member, answer, started.elapsed()));
                if spec.ensemble == Ensemble::First {
                    break;
                }
            }
            Ok(Some((member, Err(miss)))) => gathered.misses.push((member, miss)),
            Ok(None) => break,
            Err(_) => break,
        }
    }
    // What has not come in is late (dropped futures cancel their requests).
    let done: Vec<usize> = gathered
        .answers
        .iter()
        .map(|(member, ..)| *member)
        .chain(gathered.misses.iter().map(|(member, _)| *member))
        .collect();
    if spec.ensemble != Ensemble::First {
        for member in 0..spec.members.len() {
            if !done.contains(&member) {
                gathered.misses.push((member, Miss::Late));
            }
        }
    }
    gathered
}

/// How often a request is sent again to a member whose relay answered 503 (its worker is gone
/// and the relay left the rotation: the next request reaches another worker).
const RETRIES_ON_GONE: usize = 3;

async fn ask(
    channel: Channel<'_>,
    spec: &ServiceSpec,
    member: &str,
    body: Bytes,
    deadline: Instant,
    limits: &Limits,
) -> Result<InferResponse, Miss> {
    let mut refused_by = Vec::new();
    let mut tries = 0;
    loop {
        let relay = channel.directory.and_then(|directory| {
            Some((
                directory,
                directory.pick(&spec.key(), spec.revision, member, &refused_by)?,
            ))
        });
        let outcome = match relay {
            Some((directory, (url, token))) => {
                let outcome = match directory.ask(&url, &token, body.clone(), deadline).await {
                    Answer::Reply(status, header_length, payload) => interpret(status, header_length, &payload, limits),
                    Answer::Late => Err(Miss::Late),
                    Answer::Unreachable(message) => Err(Miss::Gone(message)),
                };
                if matches!(outcome, Err(Miss::Gone(_))) {
                    // Out of rotation or gone: not asked again until it reports again.
                    directory.forget(&url);
                    refused_by.push(url);
                }
                outcome
            }
            None => {
                let subject = subjects::serve(&spec.project, &spec.name, spec.revision, member);
                ask_once(channel.nats, &subject, body.clone(), deadline, limits).await
            }
        };
        match outcome {
            Err(Miss::Gone(_)) if tries < RETRIES_ON_GONE => tries += 1,
            outcome => return outcome,
        }
    }
}

async fn ask_once(
    client: &async_nats::Client,
    subject: &str,
    body: Bytes,
    deadline: Instant,
    limits: &Limits,
) -> Result<InferResponse, Miss> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Miss::Late);
    }
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(BUDGET_HEADER, left.as_micros().to_string().as_str());
    let request = async_nats::Request::new()
        .headers(headers)
        .payload(body)
        .timeout(Some(left));
    let reply = match client.send_request(subject.to_string(), request).await {
        Ok(reply) => reply,
        Err(error) if error.kind() == RequestErrorKind::TimedOut => return Err(Miss::Late),
        Err(error) if error.kind() == RequestErrorKind::NoResponders => return Err(Miss::Unavailable),
        Err(error) => return Err(Miss::Failed(format!("NATS: {error}"))),
    };
    let header = |name: &str| {
        reply
            .headers
            .as_ref()
            .and_then(|headers| headers.get(name))
            .map(|value| value.as_str().to_string())
    };
    let status: u16 = header(STATUS_HEADER)
        .and_then(|value| value.parse().ok())
        .unwrap_or(500);
    interpret(status, header(HEADER_LENGTH), &reply.payload, limits)
}

/// A relay's reply, by its status: the worker's answer parsed, or why it is missing.
fn interpret(
    status: u16,
    header_length: Option<String>,
    payload: &[u8],
    limits: &Limits,
) -> Result<InferResponse, Miss> {
    if status != 200 {
        let message = serde_json::from_slice::<serde_json::Value>(payload)
            .ok()
            .and_then(|body| body.get("error").and_then(|error| error.as_str()).map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(payload).chars().take(200).collect());
        return Err(if (400..500).contains(&status) {
            Miss::Refused { status, message }
        } else if status == 503 {
            Miss::Gone(message)
        } else {
            Miss::Failed(format!("the worker answered {status}: {message}"))
        });
    }
    let header_length = match header_length {
        Some(value) => Some(
            value
                .parse::<usize>()
                .map_err(|_| Miss::Failed(format!("the worker's {HEADER_LENGTH} is `{value}`")))?,
        ),
        None => None,
    };
    InferResponse::parse(payload, header_length, limits)
        .map_err(|error| Miss::Failed(format!("the worker's answer does not parse: {error}")))
}

/// How many members of `spec` have a worker in rotation: each member's subject is probed
/// ([`PROBE_HEADER`]: its relay answers at once, without the worker) and waited on for `wait`.
pub async fn ready_members(client: &async_nats::Client, spec: &ServiceSpec, wait: Duration) -> usize {
    let probes = spec.members.iter().map(|member| {
        let subject = subjects::serve(&spec.project, &spec.name, spec.revision, &member.name);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(PROBE_HEADER, "ready");
        let probe = async_nats::Request::new()
            .headers(headers)
            .payload(Bytes::new())
            .timeout(Some(wait));
        async move { client.send_request(subject, probe).await.is_ok() }
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .filter(|ready| *ready)
        .count()
}
