//! The permission table of `kiln_core::nats_auth` on a real nats-server configured with the
//! block it renders (the one `kiln up` writes): each service does what it needs with its own
//! seed; a client without one is refused; a service's seed does not reach what another owns.
//! Each attack runs again, as a control, on a server without authorization, where it works.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use kiln_core::nats_auth::Service;
use kiln_core::streams::{self, Nats};
use kiln_core::subjects;
use kiln_core::testing::{NatsProbe, NatsServer, nats_probe_script};

/// How long a message that should not arrive is waited for.
const QUIET: Duration = Duration::from_millis(800);

async fn connect(server: &NatsServer, service: Service) -> Nats {
    streams::connect_as(&server.service_config(service), service)
        .await
        .unwrap_or_else(|e| panic!("{service} connects with its own seed: {e}"))
}

/// A JetStream context that gives up quickly (a denied request has no answer).
fn impatient(nats: &Nats) -> jetstream::Context {
    let mut context = jetstream::new(nats.client.clone());
    context.set_timeout(Duration::from_secs(1));
    context
}

/// Whether a message published on `subject` by `publisher` reaches a subscriber of `reader`
/// on `filter`.
async fn delivered(reader: &async_nats::Client, filter: &str, publisher: &async_nats::Client, subject: &str) -> bool {
    let mut subscription = reader.subscribe(filter.to_string()).await.unwrap();
    reader.flush().await.unwrap();
    // The server applies a subscription denied by permissions silently; give it a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    publisher.publish(subject.to_string(), "forged".into()).await.unwrap();
    publisher.flush().await.unwrap();
    tokio::time::timeout(QUIET, subscription.next())
        .await
        .is_ok_and(|m| m.is_some())
}

fn port_of(server: &NatsServer) -> u16 {
    server.url.rsplit(':').next().unwrap().parse().unwrap()
}

/// Runs the hostile job's probe (bash over /dev/tcp) against `server`.
fn probe(server: &NatsServer, subject: &str) -> NatsProbe {
    let script = nats_probe_script("127.0.0.1", port_of(server), subject, "stop");
    let output = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    NatsProbe::from_output(&stdout).unwrap_or_else(|| {
        panic!(
            "the probe did not run to its end: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[tokio::test]
async fn a_client_without_credentials_is_refused_and_without_authorization_it_is_not() {
    let server = NatsServer::start_authorized();
    let plain = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(3))
        .connect(server.url.as_str())
        .await;
    assert!(plain.is_err(), "no credentials: refused");
    let stranger = async_nats::ConnectOptions::with_nkey(kiln_core::nats_auth::generate_seed())
        .connection_timeout(Duration::from_secs(3))
        .connect(server.url.as_str())
        .await;
    assert!(stranger.is_err(), "an unknown NKey: refused");
    let attack = probe(&server, &subjects::control("j1"));
    assert!(
        matches!(attack, NatsProbe::Refused(ref why) if why.contains("Authorization")),
        "{attack:?}"
    );

    // Control: the same client and probe on a server without authorization get through.
    let open = NatsServer::start();
    async_nats::connect(open.url.as_str())
        .await
        .expect("no credentials needed");
    assert_eq!(probe(&open, &subjects::control("j1")), NatsProbe::Published);
}

#[tokio::test]
async fn every_service_sets_up_and_uses_what_it_needs() {
    let server = NatsServer::start_authorized();
    // Every service but the runner creates the streams and buckets; the runner finds them.
    for service in Service::ALL.into_iter().filter(|s| *s != Service::Runner) {
        connect(&server, service).await;
    }
    let runner = connect(&server, Service::Runner).await;
    let api = connect(&server, Service::Api).await;
    let log_ingest = connect(&server, Service::LogIngest).await;

    // The runner publishes a job's logs (JetStream, acked to its own inbox); log-ingest reads
    // them through its durable consumer and acks.
    streams::publish(&runner.jetstream, subjects::logs("j1"), "j1:1", "line".into())
        .await
        .expect("the runner publishes logs");
    let stream = log_ingest.jetstream.get_stream(subjects::STREAM_LOGS).await.unwrap();
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            subjects::CONSUMER_LOG_INGEST,
            consumer::pull::Config {
                durable_name: Some(subjects::CONSUMER_LOG_INGEST.into()),
                filter_subject: subjects::LOGS_ALL.into(),
                ..Default::default()
            },
        )
        .await
        .expect("log-ingest makes its consumer");
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    let message = batch.next().await.expect("a message").unwrap();
    assert_eq!(message.payload.as_ref(), b"line");
    message.ack().await.expect("log-ingest acks");

    // Leases: each service its own.
    let mut lease =
        kiln_core::lease::Lease::new(&log_ingest, subjects::LEASE_LOG_INGEST, "li-1", Duration::from_secs(5))
            .await
            .unwrap();
    assert!(lease.tick().await.unwrap(), "log-ingest takes its lease");

    // The runner's capacity report and liveness lease.
    let report = kiln_core::capacity::CapacityReport {
        runner_id: "runner-1".into(),
        pool: "local".into(),
        provider: "process".into(),
        cpu_millis: 1000,
        memory_bytes: 1 << 30,
        gpus: 0,
        disk_bytes: 0,
        address: String::new(),
        updated_at_ms: kiln_core::ids::now_ms(),
        instance: Default::default(),
        on_demand_per_hour: 0.0,
        spot_per_hour: 0.0,
        spot: false,
        instance_id: Some("i-0abc".into()),
        instance_type: Some("c5.large".into()),
        zone: Some("us-east-1b".into()),
        market: Some("spot".into()),
        price_per_hour: None,
        cordoned: true,
    };
    kiln_core::capacity::report(&runner, &report)
        .await
        .expect("the runner reports capacity");

    // Request/reply: the api asks the scheduler's explain subject, the scheduler answers (it
    // may answer the api's inbox only because it received the request).
    let scheduler = connect(&server, Service::Scheduler).await;
    let mut asked = scheduler.client.subscribe(subjects::SCHEDULER_EXPLAIN).await.unwrap();
    scheduler.client.flush().await.unwrap();
    let answering = tokio::spawn(async move {
        let request = asked.next().await.unwrap();
        scheduler
            .client
            .publish(request.reply.unwrap(), "because".into())
            .await
            .unwrap();
        scheduler.client.flush().await.unwrap();
    });
    let answer = streams::request(&api, subjects::SCHEDULER_EXPLAIN, "j1".into(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(answer.as_deref(), Some(&b"because"[..]));
    answering.await.unwrap();
}

#[tokio::test]
async fn a_service_cannot_reach_what_another_owns_and_without_authorization_it_can() {
    let server = NatsServer::start_authorized();
    for service in [Service::Api, Service::Scheduler] {
        connect(&server, service).await;
    }
    let harness = server.config();
    let harness = streams::connect(&harness).await.unwrap();
    let runner = connect(&server, Service::Runner).await;
    let item_batch = connect(&server, Service::ItemBatch).await;

    // The runner (the machine tenants' jobs share) cannot read every job's logs, nor stop a job.
    assert!(
        !delivered(
            &runner.client,
            subjects::LOGS_ALL,
            &harness.client,
            &subjects::logs("j2")
        )
        .await
    );
    assert!(
        !delivered(
            &harness.client,
            subjects::CONTROL_ALL,
            &runner.client,
            &subjects::control("j2")
        )
        .await
    );
    // ... nor read the logs stream through a consumer of its own.
    let logs = impatient(&runner)
        .get_stream(subjects::STREAM_LOGS)
        .await
        .expect("stream info is allowed");
    let stolen = logs
        .create_consumer(consumer::pull::Config {
            filter_subject: subjects::LOGS_ALL.into(),
            ..Default::default()
        })
        .await;
    assert!(stolen.is_err(), "the runner may not make a consumer on KILN_LOGS");
    // ... nor read the replies the api gets (explain answers, JetStream acks).
    assert!(!delivered(&runner.client, "_INBOX.api.>", &harness.client, "_INBOX.api.x.1").await);
    // item-batch cannot take the scheduler's lease.
    let leases = impatient(&item_batch)
        .get_key_value(subjects::BUCKET_LEASES)
        .await
        .unwrap();
    assert!(
        leases
            .put(subjects::LEASE_SCHEDULER, "item-batch".into())
            .await
            .is_err()
    );
    let harness_leases = harness.jetstream.get_key_value(subjects::BUCKET_LEASES).await.unwrap();
    assert_eq!(harness_leases.get(subjects::LEASE_SCHEDULER).await.unwrap(), None);
    // ... while its own lease is its to take (the same call, allowed).
    leases
        .put(subjects::LEASE_ITEM_BATCH_SCALER, "item-batch".into())
        .await
        .expect("item-batch writes its own lease");
    // Only the runners' relays report load to the predictor.
    let predictor = connect(&server, Service::Predictor).await;
    assert!(
        !delivered(
            &predictor.client,
            subjects::SERVE_LOAD_ALL,
            &item_batch.client,
            &subjects::serve_load("p", "svc")
        )
        .await
    );
    assert!(
        delivered(
            &predictor.client,
            subjects::SERVE_LOAD_ALL,
            &runner.client,
            &subjects::serve_load("p", "svc")
        )
        .await
    );

    // Only a runner tells of its instance's spot notices (the provisioner acts on them).
    let notice = subjects::instance_notice("spot-cpu");
    let watchers = subjects::INSTANCE_NOTICE_ALL;
    assert!(!delivered(&harness.client, watchers, &item_batch.client, &notice).await);
    assert!(delivered(&harness.client, watchers, &runner.client, &notice).await);

    // Control: the same attacks from a client with no credentials at all on a server without
    // authorization all work.
    let open = NatsServer::start();
    let anyone = streams::connect(&open.config()).await.unwrap();
    let other = streams::connect(&open.config()).await.unwrap();
    assert!(delivered(&anyone.client, subjects::LOGS_ALL, &other.client, &subjects::logs("j2")).await);
    assert!(
        delivered(
            &other.client,
            subjects::CONTROL_ALL,
            &anyone.client,
            &subjects::control("j2")
        )
        .await
    );
    let logs = anyone.jetstream.get_stream(subjects::STREAM_LOGS).await.unwrap();
    logs.create_consumer(consumer::pull::Config {
        filter_subject: subjects::LOGS_ALL.into(),
        ..Default::default()
    })
    .await
    .expect("anyone makes a consumer on KILN_LOGS");
    let leases = anyone.jetstream.get_key_value(subjects::BUCKET_LEASES).await.unwrap();
    leases
        .put(subjects::LEASE_SCHEDULER, "attacker".into())
        .await
        .expect("anyone takes the scheduler's lease");
    assert!(
        delivered(
            &other.client,
            subjects::SERVE_LOAD_ALL,
            &anyone.client,
            &subjects::serve_load("p", "svc")
        )
        .await
    );
}
