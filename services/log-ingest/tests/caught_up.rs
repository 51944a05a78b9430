//! Read-your-writes (`kiln_log_ingest::caught_up`): a metric read waits until the writers have
//! stored every message `KILN_METRICS` held when it arrived. A real nats-server and the real
//! intake, with a writer the test holds back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kiln_core::intake::{self, BatchWriter, Received, WriteError};
use kiln_core::streams;
use kiln_core::subjects::{CONSUMER_METRICS, STREAM_METRICS};
use kiln_core::testing::NatsServer;
use kiln_log_ingest::caught_up::CaughtUp;
use kiln_log_ingest::writer::METRICS;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Longer than anything here should take.
const PATIENCE: Duration = Duration::from_secs(30);

/// Writes (counts) a batch once the gate is open.
struct Gated {
    open: watch::Receiver<bool>,
    written: AtomicUsize,
}

#[async_trait::async_trait]
impl BatchWriter for Gated {
    async fn write(&self, messages: &[Received]) -> Result<(), WriteError> {
        self.open.clone().wait_for(|open| *open).await?;
        self.written.fetch_add(messages.len(), Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test]
async fn a_read_waits_until_the_writers_stored_what_came_before_it() {
    let server = NatsServer::start();
    let nats = streams::connect(&server.config()).await.unwrap();
    let (gate, open) = watch::channel(false);
    let writer = Arc::new(Gated {
        open,
        written: AtomicUsize::new(0),
    });
    let shutdown = CancellationToken::new();
    let intake = tokio::spawn(intake::run(
        nats.clone(),
        METRICS,
        100,
        writer.clone(),
        shutdown.clone(),
    ));
    let caught_up = CaughtUp::new(nats.clone(), STREAM_METRICS, CONSUMER_METRICS);
    let marks = tokio::spawn(caught_up.clone().run(shutdown.clone()));

    assert!(
        caught_up.wait(PATIENCE).await,
        "nothing was written: nothing to wait for"
    );
    for n in 0u8..3 {
        let subject = kiln_core::subjects::metrics("job-1");
        streams::publish(&nats.jetstream, subject, &format!("m{n}"), vec![n].into())
            .await
            .unwrap();
    }
    // Held back: a wait gives up, and the read would answer what is stored.
    assert!(!caught_up.wait(Duration::from_millis(300)).await);
    assert_eq!(writer.written.load(Ordering::SeqCst), 0);
    // Zero does not wait.
    assert!(caught_up.wait(Duration::ZERO).await);

    let reads: Vec<_> = (0..8)
        .map(|_| {
            let caught_up = caught_up.clone();
            tokio::spawn(async move { caught_up.wait(PATIENCE).await })
        })
        .collect();
    gate.send(true).unwrap();
    for read in reads {
        assert!(read.await.unwrap(), "the writers caught up");
        // A read that has waited sees every message published before it.
        assert_eq!(writer.written.load(Ordering::SeqCst), 3);
    }
    shutdown.cancel();
    intake.await.unwrap();
    marks.await.unwrap();
}

#[tokio::test]
async fn before_the_writers_consumer_exists_a_read_gives_up() {
    let server = NatsServer::start();
    let nats = streams::connect(&server.config()).await.unwrap();
    let shutdown = CancellationToken::new();
    let caught_up = CaughtUp::new(nats.clone(), STREAM_METRICS, CONSUMER_METRICS);
    let marks = tokio::spawn(caught_up.clone().run(shutdown.clone()));
    // No intake ever made the writers' consumer: no round succeeds.
    assert!(!caught_up.wait(Duration::from_millis(500)).await);
    shutdown.cancel();
    marks.await.unwrap();
}
