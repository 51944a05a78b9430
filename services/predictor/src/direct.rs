//! The direct channel to the relays: each relay's URL and token as its load reports give them
//! (in rotation, reported within the last 3 s), and a member request sent to one of a member's
//! relays over HTTP/1.1 keep-alive, without the hop through nats-server. serve-bench measured
//! both channels (the README's Performance section), and this one is the default
//! (`channel = "direct"`); NATS request/reply carries a request when no relay of the member is
//! known here (a worker's first second, a relay without a direct channel, `channel = "nats"`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kiln_core::serving::{BUDGET_HEADER, DIRECT_TOKEN_HEADER, LoadReport};
use kiln_formats::oip::HEADER_LENGTH;
use tokio::time::Instant;

/// How long a relay's report keeps it in the directory.
const FRESH: Duration = Duration::from_secs(3);

type Key = (String, u64, String);

struct Entry {
    url: String,
    token: String,
    seen: Instant,
}

/// The relays' direct channels, by service, revision and member.
pub struct Directory {
    entries: Mutex<HashMap<Key, Vec<Entry>>>,
    turn: AtomicUsize,
    http: reqwest::Client,
}

/// A relay's answer on the direct channel.
pub enum Answer {
    /// Status, the binary header's length, body.
    Reply(u16, Option<String>, Bytes),
    /// Not in by the deadline (or dropped by the relay: 504).
    Late,
    /// The relay could not be reached, or refused the token: ask another.
    Unreachable(String),
}

impl Default for Directory {
    fn default() -> Self {
        Directory {
            entries: Mutex::default(),
            turn: AtomicUsize::new(0),
            http: reqwest::Client::builder()
                .no_proxy()
                .tcp_nodelay(true)
                .pool_max_idle_per_host(256)
                .build()
                .expect("a plain HTTP client builds"),
        }
    }
}

impl Directory {
    /// Takes in a relay's report: in rotation with a direct URL, it is there; else it is not.
    pub fn report(&self, report: &LoadReport) {
        let key = (report.service_key(), report.revision, report.member.clone());
        let mut entries = self.entries.lock().expect("directory lock");
        let relays = entries.entry(key).or_default();
        relays.retain(|entry| entry.url != report.direct_url && entry.seen.elapsed() < FRESH);
        if report.in_rotation && !report.direct_url.is_empty() {
            relays.push(Entry {
                url: report.direct_url.clone(),
                token: report.direct_token.clone(),
                seen: Instant::now(),
            });
        }
    }

    /// A fresh relay of the member (taking turns), other than those in `not`: its URL and token.
    pub fn pick(&self, service: &str, revision: u64, member: &str, not: &[String]) -> Option<(String, String)> {
        let entries = self.entries.lock().expect("directory lock");
        let relays = entries.get(&(service.to_string(), revision, member.to_string()))?;
        let live: Vec<&Entry> = relays
            .iter()
            .filter(|entry| entry.seen.elapsed() < FRESH && !not.contains(&entry.url))
            .collect();
        if live.is_empty() {
            return None;
        }
        let entry = live[self.turn.fetch_add(1, Ordering::Relaxed) % live.len()];
        Some((entry.url.clone(), entry.token.clone()))
    }

    /// Forgets the relay at `url` until it reports again.
    pub fn forget(&self, url: &str) {
        for relays in self.entries.lock().expect("directory lock").values_mut() {
            relays.retain(|entry| entry.url != url);
        }
    }

    /// Sends `body` to the relay at `url` with the time left until `deadline`.
    pub async fn ask(&self, url: &str, token: &str, body: Bytes, deadline: Instant) -> Answer {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Answer::Late;
        }
        let sent = self
            .http
            .post(format!("{url}/infer"))
            .header(BUDGET_HEADER, left.as_micros().to_string())
            .header(DIRECT_TOKEN_HEADER, token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .timeout(left)
            .send()
            .await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(error) if error.is_timeout() => return Answer::Late,
            Err(error) => return Answer::Unreachable(format!("the relay cannot be reached: {error}")),
        };
        let status = answer.status().as_u16();
        match status {
            504 => return Answer::Late,
            401 => return Answer::Unreachable("the relay refused its token (restarted?)".into()),
            _ => {}
        }
        let header_length = answer
            .headers()
            .get(HEADER_LENGTH)
            .and_then(|value| value.to_str().ok())
            .map(str::to_string);
        match tokio::time::timeout_at(deadline, answer.bytes()).await {
            Ok(Ok(body)) => Answer::Reply(status, header_length, body),
            Ok(Err(error)) => Answer::Unreachable(format!("the relay's answer broke off: {error}")),
            Err(_) => Answer::Late,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(job: &str, in_rotation: bool) -> LoadReport {
        LoadReport {
            job_id: job.into(),
            project: "p".into(),
            service: "s".into(),
            revision: 1,
            member: "m".into(),
            in_flight: 0.0,
            answered: 0,
            mean_ms: 0.0,
            in_rotation,
            direct_url: format!("http://{job}"),
            direct_token: format!("token-{job}"),
        }
    }

    fn pick(directory: &Directory, not: &[String]) -> Option<String> {
        directory.pick("p.s", 1, "m", not).map(|(url, _)| url)
    }

    #[tokio::test(start_paused = true)]
    async fn relays_in_rotation_take_turns_until_they_leave_it_or_go_quiet() {
        let directory = Directory::default();
        assert_eq!(pick(&directory, &[]), None, "no report yet: NATS");
        directory.report(&report("a", true));
        directory.report(&report("b", true));
        let turns: Vec<_> = (0..4).map(|_| pick(&directory, &[]).unwrap()).collect();
        assert_eq!(turns.iter().filter(|url| *url == "http://a").count(), 2, "{turns:?}");
        assert_eq!(directory.pick("p.s", 1, "m", &[]).unwrap().1.len(), "token-a".len());
        // One that refused is not asked again by that request, nor by any after forget.
        assert_eq!(pick(&directory, &["http://a".into()]).as_deref(), Some("http://b"));
        directory.forget("http://b");
        assert_eq!(pick(&directory, &[]).as_deref(), Some("http://a"));
        // Out of rotation: gone from the directory.
        directory.report(&report("a", false));
        assert_eq!(pick(&directory, &[]), None);
        // Back, then quiet for longer than FRESH.
        directory.report(&report("a", true));
        assert_eq!(pick(&directory, &[]).as_deref(), Some("http://a"));
        tokio::time::advance(FRESH).await;
        assert_eq!(
            pick(&directory, &[]),
            None,
            "a relay that stopped reporting is not asked"
        );
        assert_eq!(
            directory.pick("p.s", 2, "m", &[]),
            None,
            "another revision's relays are its own"
        );
        let mut elsewhere = report("c", true);
        elsewhere.project = "q".into();
        directory.report(&elsewhere);
        assert_eq!(
            pick(&directory, &[]),
            None,
            "another project's service of the same name has relays of its own"
        );
        assert_eq!(
            directory.pick("q.s", 1, "m", &[]).map(|(url, _)| url).as_deref(),
            Some("http://c")
        );
    }
}
