//! Batches on the process provider: items fan out to kiln-agent workers, failures are retried,
//! dead letters keep their logs, counters add up, and cancel and crashes lose nothing.

use std::time::Duration;

use kiln_e2e::{Stack, assert_adds_up};
use kiln_proto::v1 as pb;
use tonic::Code;

/// Long enough for a few hundred items on a loaded 2-core machine.
const BATCH_PATIENCE: Duration = Duration::from_secs(180);

fn spec(command: &[&str]) -> pb::BatchSpec {
    pb::BatchSpec {
        name: "test".into(),
        command: command.iter().map(|s| s.to_string()).collect(),
        cpu_millis: 100,
        memory_mb: 64,
        max_attempts: 3,
        max_workers: 4,
        ..Default::default()
    }
}

fn items(keys: impl IntoIterator<Item = String>) -> Vec<pb::Item> {
    keys.into_iter()
        .map(|key| pb::Item {
            uri: format!("mem://{key}"),
            key,
            params: Default::default(),
        })
        .collect()
}

async fn create(stack: &Stack, spec: pb::BatchSpec) -> pb::Batch {
    stack
        .batches_client()
        .await
        .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner()
}

async fn add(stack: &Stack, batch_id: &str, items: Vec<pb::Item>) -> Result<pb::AddItemsResponse, tonic::Status> {
    let messages: Vec<pb::AddItemsRequest> = items
        .chunks(1000)
        .map(|chunk| pb::AddItemsRequest {
            batch_id: batch_id.into(),
            items: chunk.to_vec(),
        })
        .collect();
    Ok(stack
        .batches_client()
        .await
        .add_items(futures::stream::iter(messages))
        .await?
        .into_inner())
}

async fn get(stack: &Stack, batch_id: &str) -> pb::Batch {
    stack
        .batches_client()
        .await
        .get_batch(pb::BatchRef {
            batch_id: batch_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

async fn wait_batch(stack: &Stack, batch_id: &str, what: &str, done: impl Fn(&pb::Batch) -> bool) -> pb::Batch {
    let deadline = tokio::time::Instant::now() + BATCH_PATIENCE;
    loop {
        let batch = get(stack, batch_id).await;
        if done(&batch) {
            return batch;
        }
        assert!(tokio::time::Instant::now() < deadline, "batch never {what}: {batch:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn counts(batch: &pb::Batch) -> pb::BatchCounts {
    batch.counts.unwrap()
}

async fn list(stack: &Stack, batch_id: &str, state: pb::ItemState) -> Vec<pb::ItemStatus> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = stack
            .batches_client()
            .await
            .list_items(pb::ListItemsRequest {
                batch_id: batch_id.into(),
                states: vec![state as i32],
                page_token: page_token.clone(),
                limit: 50,
            })
            .await
            .unwrap()
            .into_inner();
        out.extend(page.items);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

/// Workers of a batch that have not ended.
async fn live_workers(stack: &Stack, batch_id: &str) -> usize {
    stack.store.live_batch_workers(batch_id).await.unwrap().len()
}

async fn started() -> Stack {
    let mut stack = Stack::start().await;
    stack.start_item_batch(stack.item_batch_config()).await;
    stack
}

/// Fails the first attempt of every item whose key ends in 7; "poison" always fails.
const FLAKY: &[&str] = &[
    "sh",
    "-c",
    "case {item} in poison) echo poisoned {item}; exit 4;; *7) [ {attempt} -gt 1 ] || {{ echo flaky >&2; exit 1; }};; esac; echo done {item} {uri}",
];

#[tokio::test]
async fn items_are_retried_dead_letters_keep_their_logs_and_counters_add_up() {
    let stack = started().await;
    let batch = create(&stack, spec(FLAKY)).await;
    assert_eq!(batch.state, pb::BatchState::Open as i32);
    let keys: Vec<String> = (0..200)
        .map(|n| format!("item-{n:03}"))
        .chain(["poison".to_string()])
        .collect();
    let added = add(&stack, &batch.id, items(keys.clone())).await.unwrap();
    assert_eq!((added.added, added.duplicates, added.total), (201, 0, 201));
    // A retried upload adds nothing.
    let again = add(&stack, &batch.id, items(keys[..50].to_vec())).await.unwrap();
    assert_eq!((again.added, again.duplicates, again.total), (0, 50, 201));
    stack
        .batches_client()
        .await
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();

    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    let c = counts(&done);
    assert_eq!(
        (c.total, c.succeeded, c.dead, c.failed, c.pending, c.running),
        (201, 200, 1, 0, 0, 0)
    );
    assert_adds_up(&c);

    let dead = list(&stack, &batch.id, pb::ItemState::Dead).await;
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

    let succeeded = list(&stack, &batch.id, pb::ItemState::Succeeded).await;
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
    assert_eq!(get(&stack, &batch.id).await.workers, 0);
}

#[tokio::test]
async fn bad_input_is_refused_and_loses_nothing() {
    let stack = started().await;
    let mut client = stack.batches_client().await;
    for (command, message) in [
        (vec![], "empty"),
        (vec!["echo", "{url}"], "unknown placeholder {url}"),
        (vec!["kiln:teleport"], "unknown built-in"),
    ] {
        let status = client
            .create_batch(pb::CreateBatchRequest {
                spec: Some(spec(&command)),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(message), "{status:?}");
    }

    let batch = create(&stack, spec(&["true"])).await;
    add(&stack, &batch.id, items(["a".to_string(), "b".to_string()]))
        .await
        .unwrap();
    let changed = vec![pb::Item {
        key: "a".into(),
        uri: "mem://other".into(),
        params: Default::default(),
    }];
    let status = add(&stack, &batch.id, changed).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    assert!(status.message().contains("\"a\""), "{status:?}");
    let nameless = vec![pb::Item::default()];
    let status = add(&stack, &batch.id, nameless).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    client
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();
    let status = add(&stack, &batch.id, items(["c".to_string()])).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("open batch"), "{status:?}");
    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    assert_eq!(counts(&done).total, 2, "what was accepted is kept");
    assert_eq!(counts(&done).succeeded, 2);

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
    let stack = started().await;
    let mut slow = spec(&["sleep", "30"]);
    slow.max_workers = 2;
    let batch = create(&stack, slow).await;
    add(&stack, &batch.id, items((0..20).map(|n| format!("s{n}"))))
        .await
        .unwrap();
    wait_batch(&stack, &batch.id, "running", |b| counts(b).running >= 1).await;
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
    let first = counts(&get(&stack, &batch.id).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = counts(&get(&stack, &batch.id).await);
    assert_eq!(first, later, "the counters are final");
    assert_eq!((later.total, later.succeeded, later.running), (20, 0, 0));
    assert_adds_up(&later);
}

#[tokio::test]
async fn killing_item_batch_and_a_worker_loses_nothing_and_counts_nothing_twice() {
    let mut stack = started().await;
    let mut work = spec(&["sh", "-c", "sleep 0.05; echo {item}"]);
    work.max_workers = 3;
    let batch = create(&stack, work).await;
    add(&stack, &batch.id, items((0..300).map(|n| format!("k{n:03}"))))
        .await
        .unwrap();
    stack
        .batches_client()
        .await
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();
    wait_batch(&stack, &batch.id, "under way", |b| counts(b).succeeded >= 30).await;

    // SIGKILL one worker's agent: its items go to the others.
    let workers = stack.store.live_batch_workers(&batch.id).await.unwrap();
    let running = workers
        .iter()
        .find_map(|w| w.instance_id.strip_prefix("pid:").and_then(|p| p.parse::<i32>().ok()))
        .expect("a running worker with a pid");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(running), nix::sys::signal::Signal::SIGKILL).unwrap();

    // Crash item-batch mid-run and start it again.
    stack.batches.take().unwrap().crash().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stack.start_item_batch(stack.item_batch_config()).await;

    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    let c = counts(&done);
    assert_eq!((c.total, c.succeeded, c.dead, c.failed), (300, 300, 0, 0), "{c:?}");
    assert_adds_up(&c);
}

#[tokio::test]
async fn items_come_from_object_storage_and_dead_ones_can_be_retried() {
    let stack = started().await;
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
    let batch = create(&stack, spec(&["sh", "-c", "[ {uri} != mem://y ] || exit 9"])).await;
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
    assert_eq!((counts(&done).succeeded, counts(&done).dead), (4, 1));

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
        b.state == pb::BatchState::Done as i32 && counts(b).dead == 1 && list_is_settled(b)
    })
    .await;
    assert_eq!(
        (counts(&again).total, counts(&again).succeeded, counts(&again).dead),
        (5, 4, 1)
    );
    let dead = list(&stack, &batch.id, pb::ItemState::Dead).await;
    assert_eq!((dead[0].key.as_str(), dead[0].attempts), ("mem://y", 6));
}

/// No item is waiting for an attempt.
fn list_is_settled(batch: &pb::Batch) -> bool {
    let c = counts(batch);
    c.pending == 0 && c.running == 0 && c.failed == 0
}
