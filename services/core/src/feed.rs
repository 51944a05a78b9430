//! Lists kept current without polling: a watch sends a list once, in pages, then each record of
//! it again when it changed, read again from its store. What changed comes from a stream:
//! `JobService/WatchJobs` reads the job events of KILN_JOBS; WatchBatches, WatchSweeps and
//! WatchServices read KILN_CHANGES, where the service that keeps those records publishes the
//! ids it changed ([`Changes`]). A record's store is read only when an event names it, and a
//! record read again but unchanged (as sent last) is not sent.
//!
//! The stream's sequence is the list's version: a client that comes back with the last `seq`
//! it got is sent only the changes after it, or the whole list again (`reset`) when the stream
//! no longer holds them.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::pin::Pin;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::{self};
use futures::{Stream, StreamExt};
use kiln_proto::v1 as pb;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::subjects::{STREAM_CHANGES, STREAM_JOBS};

mod changes;
pub use changes::{Changes, GATHER};

/// Records per answer of a first list (a 10,000-job list is 20 answers, none near gRPC's 4 MiB).
pub const PAGE: usize = 500;
/// Events read before the records they name are read and sent, when that many are waiting.
const EVENTS_PER_ANSWER: usize = 1000;
/// How long one watch lasts: the client comes back with its `seq`, and its access is checked
/// again (a member removed from a project stops seeing its records change within this).
pub const LIFETIME: Duration = Duration::from_secs(300);

/// One answer of a watch: records listed or changed (each whole), the stream sequence the list
/// is current to after it (0 on every page of a first list but its last, so a client gone
/// mid-list lists again), and whether the list starts over.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub seq: u64,
    pub reset: bool,
}

/// The answers of a watch.
pub type Pages<T> = Pin<Box<dyn Stream<Item = Result<Page<T>, Status>> + Send>>;

/// The answers of a watch as its RPC's messages (`JobChanges`, `BatchChanges`, …).
pub type Changed<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// `pages` as the messages of their RPC.
pub fn answers<T: Send + 'static, M: From<Page<T>> + Send + 'static>(pages: Pages<T>) -> Changed<M> {
    Box::pin(pages.map(|page| page.map(M::from)))
}

/// Each list's message of one answer.
macro_rules! changes_of {
    ($item:ty => $changes:ident { $field:ident }) => {
        impl From<Page<$item>> for pb::$changes {
            fn from(page: Page<$item>) -> pb::$changes {
                pb::$changes {
                    $field: page.items,
                    seq: page.seq,
                    reset: page.reset,
                }
            }
        }
    };
}
changes_of!(pb::Job => JobChanges { jobs });
changes_of!(pb::Batch => BatchChanges { batches });
changes_of!(pb::Sweep => SweepChanges { sweeps });
changes_of!(pb::Service => ServiceChanges { services });

/// What one event of the watched stream says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// These records changed.
    Changed(Vec<String>),
    /// Changes may have been missed: the list starts over.
    Reset,
}

/// Where a list's changes are read from.
#[derive(Debug, Clone, Copy)]
pub struct Feed {
    stream: &'static str,
    /// Only this subject of the stream (all of it when `None`).
    subject: Option<&'static str>,
    decode: fn(&[u8]) -> Option<Signal>,
}

impl Feed {
    /// The job events of KILN_JOBS.
    pub const JOBS: Feed = Feed {
        stream: STREAM_JOBS,
        subject: None,
        decode: job_event,
    };

    /// The [`pb::ListChanged`] of KILN_CHANGES on `subject` (`kiln.changes.<list>`).
    pub const fn changes(subject: &'static str) -> Feed {
        Feed {
            stream: STREAM_CHANGES,
            subject: Some(subject),
            decode: list_changed,
        }
    }
}

fn job_event(payload: &[u8]) -> Option<Signal> {
    pb::JobEvent::decode(payload)
        .map_err(|error| tracing::warn!(error = %error, "an undecodable job event"))
        .ok()
        .map(|event| Signal::Changed(vec![event.job_id]))
}

fn list_changed(payload: &[u8]) -> Option<Signal> {
    pb::ListChanged::decode(payload)
        .map_err(|error| tracing::warn!(error = %error, "an undecodable list change"))
        .ok()
        .map(|changed| match changed.reset {
            true => Signal::Reset,
            false => Signal::Changed(changed.ids),
        })
}

/// A list, as one caller may see it.
#[tonic::async_trait]
pub trait Source: Send + Sync + 'static {
    type Item: Message + Send + 'static;
    /// The list (what the list call answers).
    async fn list(&self) -> Result<Vec<Self::Item>, Status>;
    /// Those of `ids` the caller may see and the list's filters take, whatever their state
    /// (ended ones too, so a list of live ones can drop them); others' changes are not told,
    /// not even as a bare sequence.
    async fn changed(&self, ids: Vec<String>) -> Result<Vec<Self::Item>, Status>;
    /// Which row of the list `item` is.
    fn key(item: &Self::Item) -> String;
}

fn unavailable(what: &str, stream: &str, error: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("{what} {stream}: {error}"))
}

/// Watches `source`'s list through `feed`: the list first (unless `after_seq` can be resumed
/// from), then its changes, for [`LIFETIME`] or until the client goes.
pub async fn watch<S: Source>(
    js: &jetstream::Context,
    feed: Feed,
    after_seq: u64,
    source: S,
) -> Result<Pages<S::Item>, Status> {
    let mut stream = js
        .get_stream(feed.stream)
        .await
        .map_err(|e| unavailable("cannot find", feed.stream, e))?;
    let state = stream
        .info()
        .await
        .map_err(|e| unavailable("cannot read", feed.stream, e))?
        .state
        .clone();
    // Changes after `after_seq` can be replayed while the stream still holds the next one;
    // otherwise (too old, or a sequence this stream never had) the list starts over.
    let resumed = after_seq > 0
        && after_seq < u64::MAX
        && after_seq + 1 >= state.first_sequence
        && after_seq <= state.last_sequence;
    let from = if resumed { after_seq } else { state.last_sequence };
    let events = stream
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from + 1,
            },
            filter_subject: feed.subject.unwrap_or_default().to_string(),
            ..Default::default()
        })
        .await
        .map_err(|e| unavailable("cannot read", feed.stream, e))?
        .messages()
        .await
        .map_err(|e| unavailable("cannot read", feed.stream, e))?;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut sent = Sent::default();
        let watched = async {
            if !resumed && !sent.list(&source, from, &tx).await? {
                return Ok(());
            }
            let mut events = events.ready_chunks(EVENTS_PER_ANSWER);
            while let Some(read) = events.next().await {
                let mut seq = 0;
                let mut ids = Vec::new();
                let mut seen = HashSet::new();
                let mut reset = false;
                for message in read {
                    let message = message.map_err(|e| unavailable("reading failed:", feed.stream, e))?;
                    seq = seq.max(message.info().map(|info| info.stream_sequence).unwrap_or(0));
                    match (feed.decode)(&message.payload) {
                        Some(Signal::Changed(changed)) => {
                            ids.extend(changed.into_iter().filter(|id| seen.insert(id.clone())));
                        }
                        Some(Signal::Reset) => reset = true,
                        None => {}
                    }
                }
                if reset {
                    if !sent.list(&source, seq, &tx).await? {
                        return Ok(());
                    }
                    continue;
                }
                let items = sent.fresh::<S>(source.changed(ids).await?);
                if items.is_empty() {
                    continue;
                }
                if tx
                    .send(Ok(Page {
                        items,
                        seq,
                        reset: false,
                    }))
                    .await
                    .is_err()
                {
                    return Ok(());
                }
            }
            Ok::<_, Status>(())
        };
        tokio::select! {
            ended = watched => {
                if let Err(status) = ended {
                    let _ = tx.send(Err(status)).await;
                }
            }
            _ = tokio::time::sleep(LIFETIME) => {}
            _ = tx.closed() => {}
        }
    });
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// What a watch has sent: a digest of each record as sent last, by key.
#[derive(Default)]
struct Sent(HashMap<String, u64>);

impl Sent {
    fn digest<T: Message>(item: &T) -> u64 {
        let mut hasher = DefaultHasher::new();
        item.encode_to_vec().hash(&mut hasher);
        hasher.finish()
    }

    /// Sends the whole list current to `seq`; false when the client went.
    async fn list<S: Source>(
        &mut self,
        source: &S,
        seq: u64,
        tx: &mpsc::Sender<Result<Page<S::Item>, Status>>,
    ) -> Result<bool, Status> {
        let items = source.list().await?;
        self.0 = items.iter().map(|item| (S::key(item), Self::digest(item))).collect();
        for page in first_list(items, seq) {
            if tx.send(Ok(page)).await.is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Those of `items` not sent as they are now.
    fn fresh<S: Source>(&mut self, items: Vec<S::Item>) -> Vec<S::Item> {
        items
            .into_iter()
            .filter(|item| {
                let digest = Self::digest(item);
                self.0.insert(S::key(item), digest) != Some(digest)
            })
            .collect()
    }
}

/// The answers of a first list current to `seq`: pages of [`PAGE`] records, the first a reset,
/// the last (only) carrying `seq`; one empty reset for an empty list.
pub fn first_list<T>(items: Vec<T>, seq: u64) -> Vec<Page<T>> {
    let mut pages: Vec<Vec<T>> = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() || pages.is_empty() {
        pages.push(items.by_ref().take(PAGE).collect());
    }
    let last = pages.len() - 1;
    pages
        .into_iter()
        .enumerate()
        .map(|(n, items)| Page {
            items,
            seq: if n == last { seq } else { 0 },
            reset: n == 0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_list_goes_in_pages_of_which_only_the_last_carries_its_seq() {
        let items = |n: usize| (0..n).map(|i| format!("j{i}")).collect::<Vec<_>>();
        let shape = |pages: Vec<Page<String>>| -> Vec<(usize, u64, bool)> {
            pages.iter().map(|p| (p.items.len(), p.seq, p.reset)).collect()
        };
        let pages = first_list(items(1001), 42);
        assert_eq!(pages[2].items[0], "j1000");
        assert_eq!(shape(pages), [(500, 0, true), (500, 0, false), (1, 42, false)]);
        assert_eq!(
            shape(first_list(items(0), 7)),
            [(0, 7, true)],
            "an empty list is one answer"
        );
        assert_eq!(first_list(items(500), 7).len(), 1);
    }

    struct Named;

    #[tonic::async_trait]
    impl Source for Named {
        type Item = pb::Sweep;
        async fn list(&self) -> Result<Vec<pb::Sweep>, Status> {
            Ok(Vec::new())
        }
        async fn changed(&self, _: Vec<String>) -> Result<Vec<pb::Sweep>, Status> {
            Ok(Vec::new())
        }
        fn key(item: &pb::Sweep) -> String {
            item.id.clone()
        }
    }

    #[test]
    fn a_record_read_again_is_sent_only_when_it_is_not_as_sent_last() {
        let sweep = |id: &str, state: &str| pb::Sweep {
            id: id.to_string(),
            state: state.to_string(),
            ..Default::default()
        };
        let mut sent = Sent::default();
        let ids = |items: Vec<pb::Sweep>| items.into_iter().map(|s| s.id).collect::<Vec<_>>();
        let first = sent.fresh::<Named>(vec![sweep("a", "RUNNING"), sweep("b", "RUNNING")]);
        assert_eq!(ids(first), ["a", "b"]);
        let again = sent.fresh::<Named>(vec![sweep("a", "RUNNING"), sweep("b", "FINISHED")]);
        assert_eq!(ids(again), ["b"], "a is as it was sent");
        assert!(sent.fresh::<Named>(vec![sweep("b", "FINISHED")]).is_empty());
    }

    #[test]
    fn the_events_of_both_feeds_decode_to_what_they_name() {
        let event = pb::JobEvent {
            job_id: "j1".into(),
            ..Default::default()
        };
        assert_eq!(
            (Feed::JOBS.decode)(&event.encode_to_vec()),
            Some(Signal::Changed(vec!["j1".into()]))
        );
        let changes = Feed::changes(crate::subjects::CHANGES_BATCHES);
        let changed = pb::ListChanged {
            ids: vec!["b1".into(), "b2".into()],
            reset: false,
        };
        assert_eq!(
            (changes.decode)(&changed.encode_to_vec()),
            Some(Signal::Changed(vec!["b1".into(), "b2".into()]))
        );
        let reset = pb::ListChanged {
            ids: Vec::new(),
            reset: true,
        };
        assert_eq!((changes.decode)(&reset.encode_to_vec()), Some(Signal::Reset));
        assert_eq!((changes.decode)(b"\xff\xff"), None);
    }
}
