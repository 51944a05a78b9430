//! [`Changes`]: the ids of records a service changed, gathered and published on KILN_CHANGES
//! for the watchers of its list (see the parent module).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use kiln_proto::v1 as pb;
use prost::Message;
use tokio::sync::Notify;

use crate::publish::{backoff, publish};

/// How long [`Changes`] gathers ids before it publishes them: a batch whose items finish by
/// the thousand a second is named twice a second, not a thousand times.
pub const GATHER: Duration = Duration::from_millis(500);
/// The most ids in one [`pb::ListChanged`].
const IDS_PER_MESSAGE: usize = 1000;

/// The ids of records a service changed, published on its list's subject of KILN_CHANGES
/// after [`GATHER`] (for the watchers of that list). The default publishes nothing (tools and
/// tests that keep records without a NATS connection).
///
/// An id is told after the change is committed; ids gathered when the process stops are lost,
/// so a started `Changes` publishes a reset first, and every watcher lists again.
#[derive(Clone, Default)]
pub struct Changes(Option<Arc<Gathered>>);

#[derive(Default)]
struct Gathered {
    ids: Mutex<HashSet<String>>,
    wake: Notify,
}

impl Changes {
    /// Starts publishing on `subject` (one of `kiln_core::subjects::CHANGES_*`).
    pub fn publish(js: jetstream::Context, subject: &'static str) -> Changes {
        let gathered = Arc::new(Gathered::default());
        tokio::spawn(publisher(js, subject, gathered.clone()));
        Changes(Some(gathered))
    }

    /// Tells that the record `id` changed (its change is committed).
    pub fn touch(&self, id: &str) {
        if let Some(gathered) = &self.0 {
            gathered.ids.lock().expect("ids").insert(id.to_string());
            gathered.wake.notify_one();
        }
    }

    /// Tells that each of `ids` changed.
    pub fn touch_all<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        if let Some(gathered) = &self.0 {
            gathered
                .ids
                .lock()
                .expect("ids")
                .extend(ids.into_iter().map(str::to_string));
            gathered.wake.notify_one();
        }
    }
}

async fn publisher(js: jetstream::Context, subject: &'static str, gathered: Arc<Gathered>) {
    let send = |changed: pb::ListChanged| {
        let js = js.clone();
        async move {
            let id = uuid::Uuid::now_v7().to_string();
            publish(&js, subject.to_string(), &id, changed.encode_to_vec().into()).await
        }
    };
    let mut attempt = 0;
    while let Err(error) = send(pb::ListChanged {
        ids: Vec::new(),
        reset: true,
    })
    .await
    {
        tracing::warn!(subject, error = %error, "cannot tell the list's watchers to list again yet");
        tokio::time::sleep(backoff(attempt)).await;
        attempt += 1;
    }
    loop {
        gathered.wake.notified().await;
        tokio::time::sleep(GATHER).await;
        let ids: Vec<String> = std::mem::take(&mut *gathered.ids.lock().expect("ids"))
            .into_iter()
            .collect();
        for (n, chunk) in ids.chunks(IDS_PER_MESSAGE).enumerate() {
            if let Err(error) = send(pb::ListChanged {
                ids: chunk.to_vec(),
                reset: false,
            })
            .await
            {
                // Told with the next ones: watchers meanwhile show these as they were.
                tracing::warn!(subject, error = %error, "cannot tell the list's watchers what changed");
                gathered
                    .ids
                    .lock()
                    .expect("ids")
                    .extend(ids[n * IDS_PER_MESSAGE..].iter().cloned());
                gathered.wake.notify_one();
                break;
            }
        }
    }
}
