//! Batches on the process provider: items fan out to kiln-agent workers, failures are retried,
//! dead letters keep their logs, counters add up, a cancel stops its workers, and an idle worker
//! leaves only when no items wait (crashes: batch_crash.rs; a done batch's workers not started:
//! batch_done.rs).

use std::time::Duration;

use kiln_e2e::{
    BATCH_PATIENCE, Stack, add_items, assert_adds_up, batch_now, batch_spec, counts_of, create_batch, items_in,
    live_workers, mem_items, seal_batch, wait_batch, work_session,
};
use kiln_proto::v1 as pb;
use tonic::Code;

/// Fails the first attempt of every item whose key ends in 7; "poison" always fails.
const FLAKY: &[&str] = &[
    "sh",
    "-c",
    "case {item} in poison) echo poisoned {item}; exit 4;; *7) [ {attempt} -gt 1 ] || {{ echo flaky >&2; exit 1; }};; esac; echo done {item} {uri}",
];

#[tokio::test]
async fn items_are_retried_dead_letters_keep_their_logs_and_counters_add_up() {
    let stack = Stack::start_with_item_batch().await;
    let batch = create_batch(&stack, batch_spec(FLAKY)).await;
    assert_eq!(batch.state, pb::BatchState::Open as i32);
    let keys: Vec<String> = (0..200)
        .map(|n| format!("item-{n:03}"))
        .chain(["poison".to_string()])
        .collect();
    let added = add_items(&stack, &batch.id, mem_items(keys.clone())).await.unwrap();
    assert_eq!((added.added, added.duplicates, added.total), (201, 0, 201));
    // A retried upload adds nothing.
    let again = add_items(&stack, &batch.id, mem_items(keys[..50].to_vec()))
        .await
        .unwrap();
    assert_eq!((again.added, again.duplicates, again.total), (0, 50, 201));
    seal_batch(&stack, &batch.id).await;

    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    let c = counts_of(&done);
    assert_eq!(
        (c.total, c.succeeded, c.dead, c.failed, c.pending, c.running),
        (201, 200, 1, 0, 0, 0)
    );
    assert_adds_up(&c);

    let dead = items_in(&stack, &batch.id, pb::ItemState::Dead).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].key.as_str(), dead[0].exit_code, dead[0].attempts),
        ("poison", Some(4), 3)
    );
    let logs = stack
        .batches_client()
        .await
        .get_item_logs(pb::GetItemLogsRequest {
            batch_id: batch.id.clone(),
            key: "poison".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .lines;
    let attempts: Vec<i32> = logs.iter().map(|l| l.attempt).collect();
    assert_eq!(attempts, [1, 2, 3], "{logs:?}");
    assert!(logs.iter().all(|l| l.text == "poisoned poison"));

    let succeeded = items_in(&stack, &batch.id, pb::ItemState::Succeeded).await;
    assert_eq!(succeeded.len(), 200, "pages of 50 cover every item once");
    for item in &succeeded {
        let expected = if item.key.ends_with('7') { 2 } else { 1 };
        assert_eq!(item.attempts, expected, "{item:?}");
    }
    // The workers leave once the batch is done.
    let deadline = tokio::time::Instant::now() + BATCH_PATIENCE;
    while live_workers(&stack, &batch.id).await > 0 {
        let live = stack.store.live_batch_workers(&batch.id).await.unwrap();
        let states: Vec<(&str, &str)> = live.iter().map(|w| (w.state.as_str(), w.reason.as_str())).collect();
        assert!(tokio::time::Instant::now() < deadline, "workers stayed: {states:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(batch_now(&stack, &batch.id).await.workers, 0);
}

#[tokio::test]
async fn bad_input_is_refused_and_loses_nothing() {
    let stack = Stack::start_with_item_batch().await;
    let mut client = stack.batches_client().await;
    for (command, message) in [
        (vec![], "empty"),
        (vec!["echo", "{url}"], "unknown placeholder {url}"),
        (vec!["kiln:teleport"], "unknown built-in"),
    ] {
        let status = client
            .create_batch(pb::CreateBatchRequest {
                spec: Some(batch_spec(&command)),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(message), "{status:?}");
    }

    let batch = create_batch(&stack, batch_spec(&["true"])).await;
    add_items(&stack, &batch.id, mem_items(["a".to_string(), "b".to_string()]))
        .await
        .unwrap();
    let changed = vec![pb::Item {
        key: "a".into(),
        uri: "mem://other".into(),
        params: Default::default(),
    }];
    let status = add_items(&stack, &batch.id, changed).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    assert!(status.message().contains("\"a\""), "{status:?}");
    let nameless = vec![pb::Item::default()];
    let status = add_items(&stack, &batch.id, nameless).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    client
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();
    let status = add_items(&stack, &batch.id, mem_items(["c".to_string()]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("open batch"), "{status:?}");
    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    assert_eq!(counts_of(&done).total, 2, "what was accepted is kept");
    assert_eq!(counts_of(&done).succeeded, 2);

    let status = client
        .get_batch(pb::BatchRef {
            batch_id: kiln_core::ids::new_id(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn a_cancelled_batch_stops_dispatch_and_its_workers() {
    let stack = Stack::start_with_item_batch().await;
    let mut slow = batch_spec(&["sleep", "30"]);
    slow.max_workers = 2;
    let batch = create_batch(&stack, slow).await;
    add_items(&stack, &batch.id, mem_items((0..20).map(|n| format!("s{n}"))))
        .await
        .unwrap();
    wait_batch(&stack, &batch.id, "running", |b| counts_of(b).running >= 1).await;
    let cancelled = stack
        .batches_client()
        .await
        .cancel_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.state, pb::BatchState::Cancelled as i32);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while live_workers(&stack, &batch.id).await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "workers outlived the cancel");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = counts_of(&batch_now(&stack, &batch.id).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = counts_of(&batch_now(&stack, &batch.id).await);
    assert_eq!(first, later, "the counters are final");
    assert_eq!((later.total, later.succeeded, later.running), (20, 0, 0));
    assert_adds_up(&later);
}

#[tokio::test]
async fn items_come_from_object_storage_and_dead_ones_can_be_retried() {
    let stack = Stack::start_with_item_batch().await;
    // Objects under a prefix of a job's outputs in the batch's project, and a manifest there.
    let job = stack.submit(&["true"]).await;
    let outputs = format!("outputs/{}", job.id);
    let inbox = format!("{outputs}/inbox");
    for name in ["a", "b", "c"] {
        let path = stack.objects_dir().join(&inbox).join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, name).unwrap();
    }
    std::fs::write(
        stack.objects_dir().join(&outputs).join("manifest.txt"),
        format!("# uris\nmem://x\n\nmem://y\n{inbox}/a\n"),
    )
    .unwrap();
    let batch = create_batch(&stack, batch_spec(&["sh", "-c", "[ {uri} != mem://y ] || exit 9"])).await;
    let mut client = stack.batches_client().await;
    let from_objects = |source| pb::AddItemsFromObjectsRequest {
        batch_id: batch.id.clone(),
        source: Some(source),
    };
    let added = client
        .add_items_from_objects(from_objects(pb::add_items_from_objects_request::Source::Prefix(
            inbox.clone(),
        )))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((added.added, added.total), (3, 3));
    let added = client
        .add_items_from_objects(from_objects(pb::add_items_from_objects_request::Source::Manifest(
            format!("{outputs}/manifest.txt"),
        )))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (added.added, added.duplicates, added.total),
        (2, 1, 5),
        "inbox/a was there already"
    );
    let missing = client
        .add_items_from_objects(from_objects(pb::add_items_from_objects_request::Source::Manifest(
            format!("{outputs}/nope.txt"),
        )))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    let escaping = client
        .add_items_from_objects(from_objects(pb::add_items_from_objects_request::Source::Prefix(
            "../etc".into(),
        )))
        .await
        .unwrap_err();
    assert_eq!(escaping.code(), Code::InvalidArgument);
    // Nothing of kiln's store outside the project's jobs' outputs: code blobs, other places.
    for outside in ["artifacts", "outputs", "manifest.txt"] {
        let refused = client
            .add_items_from_objects(from_objects(pb::add_items_from_objects_request::Source::Prefix(
                outside.into(),
            )))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{outside}: {refused:?}");
    }
    client
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();
    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    assert_eq!((counts_of(&done).succeeded, counts_of(&done).dead), (4, 1));

    // A new round for the dead item: it fails again, with three more attempts.
    let retried = client
        .retry_failed(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .retried;
    assert_eq!(retried, 1);
    let again = wait_batch(&stack, &batch.id, "done again", |b| {
        b.state == pb::BatchState::Done as i32 && counts_of(b).dead == 1 && list_is_settled(b)
    })
    .await;
    assert_eq!(
        (
            counts_of(&again).total,
            counts_of(&again).succeeded,
            counts_of(&again).dead
        ),
        (5, 4, 1)
    );
    let dead = items_in(&stack, &batch.id, pb::ItemState::Dead).await;
    assert_eq!((dead[0].key.as_str(), dead[0].attempts), ("mem://y", 6));
}

/// No item is waiting for an attempt.
fn list_is_settled(batch: &pb::Batch) -> bool {
    let c = counts_of(batch);
    c.pending == 0 && c.running == 0 && c.failed == 0
}

#[tokio::test]
async fn a_busy_batch_shows_its_rate_while_outcomes_stream_in() {
    // Outcomes every few milliseconds wake the scaler; its full passes (which sample the rate
    // and scale) must still come every interval.
    let stack = Stack::start_with_item_batch().await;
    let mut work = batch_spec(&["sh", "-c", "sleep 0.01"]);
    work.max_workers = 2;
    let batch = create_batch(&stack, work).await;
    add_items(&stack, &batch.id, mem_items((0..1000).map(|n| format!("k{n:04}"))))
        .await
        .unwrap();
    seal_batch(&stack, &batch.id).await;
    let seen = wait_batch(&stack, &batch.id, "a rate or the end", |b| {
        b.items_per_second > 0.0 || b.state == pb::BatchState::Done as i32
    })
    .await;
    assert!(
        seen.items_per_second > 0.0 && seen.state == pb::BatchState::Sealed as i32,
        "the batch ran without a rate: {:?} at {} items/s",
        counts_of(&seen),
        seen.items_per_second
    );
    assert!(
        seen.eta_seconds >= 0,
        "an ETA comes with the rate: {}",
        seen.eta_seconds
    );
    wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
}

/// A worker whose fetches come back empty while items of its batch wait stays (the million-item
/// run on a loaded machine saw hundreds leave at once with 370,000 items waiting; here the batch's
/// consumer is paused); the control: a worker whose batch has nothing waiting is told to stop.
#[tokio::test]
async fn a_worker_stays_while_items_wait_and_leaves_when_none_do() {
    use kiln_core::subjects;
    use pb::agent_task::Body;
    let mut stack = Stack::start_without_runner().await;
    let config = stack.item_batch_config();
    let idle_stop = Duration::from_millis(config.idle_stop_ms);
    stack.start_item_batch(config).await;
    let batch = create_batch(&stack, batch_spec(&["true"])).await;

    // Nothing waits: the worker is stopped after the idle time.
    let (mut first, _agent) = work_session(&stack, &batch.id, 1).await;
    let told = tokio::time::timeout(idle_stop * 5, first.message())
        .await
        .expect("an idle worker is told to stop")
        .unwrap()
        .expect("a task");
    assert!(
        matches!(&told.body, Some(Body::Stop(stop)) if stop.reason == "no items for a while"),
        "{told:?}"
    );

    // The batch's consumer (the first session made it) paused, then three items: they wait, and
    // a worker's fetches come back empty.
    let jetstream = async_nats::jetstream::new(stack.nats.client().await);
    let stream = jetstream.get_stream(subjects::STREAM_ITEMS).await.unwrap();
    let consumer = subjects::consumer_items(&batch.id);
    let until = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    stream.pause_consumer(&consumer, until).await.unwrap();
    add_items(&stack, &batch.id, mem_items((0..3).map(|n| format!("w{n}"))))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + BATCH_PATIENCE;
    loop {
        let mut paused: async_nats::jetstream::consumer::PullConsumer = stream.get_consumer(&consumer).await.unwrap();
        if paused.info().await.unwrap().num_pending == 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the items never reached the consumer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut second, _agent) = work_session(&stack, &batch.id, 1).await;
    let quiet = tokio::time::timeout(idle_stop * 3, second.message()).await;
    assert!(quiet.is_err(), "the worker was sent {quiet:?} while three items waited");

    // Resumed: the worker that stayed gets an item.
    stream.resume_consumer(&consumer).await.unwrap();
    let task = tokio::time::timeout(BATCH_PATIENCE, second.message())
        .await
        .expect("an item after the resume")
        .unwrap()
        .expect("a task");
    assert!(matches!(&task.body, Some(Body::Item(_))), "{task:?}");
}
