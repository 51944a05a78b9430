//! Batches run to the end, and their counters checked.

use super::*;

/// Checks that a batch's counters add up to its total.
pub fn assert_adds_up(c: &pb::BatchCounts) {
    assert_eq!(
        c.pending + c.running + c.succeeded + c.failed + c.dead,
        c.total,
        "{c:?}"
    );
}

/// A batch run to its end: its last state, and the most workers seen live at a poll.
pub struct BatchRun {
    pub done: pb::Batch,
    pub most_workers: u32,
}

/// Polls a batch every 500 ms until it is DONE, checking at every poll that its counters add
/// up. Past `deadline` it gives the last state back as the error, for the caller's report.
pub async fn run_batch_to_done(
    client: &mut BatchServiceClient<Authed>,
    batch_id: &str,
    deadline: tokio::time::Instant,
) -> Result<BatchRun, pb::Batch> {
    let mut most_workers = 0;
    loop {
        let now = get_batch(client, batch_id).await;
        most_workers = most_workers.max(now.workers);
        assert_adds_up(&now.counts.unwrap());
        if now.state == pb::BatchState::Done as i32 {
            return Ok(BatchRun {
                done: now,
                most_workers,
            });
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(now);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Reads a batch, asking again while the answer is `Unavailable` (a store too busy to lend a
/// connection, as a thousand in-process runners on one SQLite file make it), as a client
/// should; for up to `PATIENCE` in a row.
pub async fn get_batch(client: &mut BatchServiceClient<Authed>, batch_id: &str) -> pb::Batch {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let request = pb::BatchRef {
            batch_id: batch_id.to_string(),
        };
        match client.get_batch(request).await {
            Ok(batch) => return batch.into_inner(),
            Err(status) if status.code() == tonic::Code::Unavailable && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("GetBatch {batch_id}: {status}"),
        }
    }
}

/// `items` as AddItems messages of `per_message` items each.
pub fn add_requests(batch_id: &str, items: &[pb::Item], per_message: usize) -> Vec<pb::AddItemsRequest> {
    items
        .chunks(per_message)
        .map(|chunk| pb::AddItemsRequest {
            batch_id: batch_id.to_string(),
            items: chunk.to_vec(),
        })
        .collect()
}

/// Long enough for a few hundred items on a loaded 2-core machine.
pub const BATCH_PATIENCE: Duration = Duration::from_secs(180);

pub fn batch_spec(command: &[&str]) -> pb::BatchSpec {
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

pub fn mem_items(keys: impl IntoIterator<Item = String>) -> Vec<pb::Item> {
    keys.into_iter()
        .map(|key| pb::Item {
            uri: format!("mem://{key}"),
            key,
            params: Default::default(),
        })
        .collect()
}

pub async fn create_batch(stack: &Stack, spec: pb::BatchSpec) -> pb::Batch {
    stack
        .batches_client()
        .await
        .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner()
}

pub async fn add_items(
    stack: &Stack,
    batch_id: &str,
    items: Vec<pb::Item>,
) -> Result<pb::AddItemsResponse, tonic::Status> {
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

/// Seals a batch: no more items.
pub async fn seal_batch(stack: &Stack, batch_id: &str) {
    stack
        .batches_client()
        .await
        .seal_batch(pb::BatchRef {
            batch_id: batch_id.into(),
        })
        .await
        .unwrap();
}

pub async fn batch_now(stack: &Stack, batch_id: &str) -> pb::Batch {
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

pub async fn wait_batch(stack: &Stack, batch_id: &str, what: &str, done: impl Fn(&pb::Batch) -> bool) -> pb::Batch {
    let deadline = tokio::time::Instant::now() + BATCH_PATIENCE;
    loop {
        let batch = batch_now(stack, batch_id).await;
        if done(&batch) {
            return batch;
        }
        assert!(tokio::time::Instant::now() < deadline, "batch never {what}: {batch:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn counts_of(batch: &pb::Batch) -> pb::BatchCounts {
    batch.counts.unwrap()
}

pub async fn items_in(stack: &Stack, batch_id: &str, state: pb::ItemState) -> Vec<pb::ItemStatus> {
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
pub async fn live_workers(stack: &Stack, batch_id: &str) -> usize {
    stack.store.live_batch_workers(batch_id).await.unwrap().len()
}

/// SIGKILLs the agent of one of a batch's running process workers (as a runner's death or a
/// reclaim ends it): its items go back to the queue. Waits for one to have started (a live
/// worker may still be queued or starting, with no process yet).
pub async fn kill_a_worker(stack: &Stack, batch_id: &str) {
    let deadline = tokio::time::Instant::now() + BATCH_PATIENCE;
    let agent = loop {
        let workers = stack.store.live_batch_workers(batch_id).await.unwrap();
        if let Some(pid) = workers
            .iter()
            .find_map(|w| w.instance_id.strip_prefix("pid:").and_then(|p| p.parse::<i32>().ok()))
        {
            break pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no worker of batch {batch_id} started a process: {workers:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent), nix::sys::signal::Signal::SIGKILL).unwrap();
}

/// A worker's session with item-batch as kiln-agent opens it (`ItemWorkService.Work`, a hello of
/// `slots`), as the stack's admin: the tasks it is sent, and the sender of its messages (the
/// session ends when that is dropped).
pub async fn work_session(
    stack: &Stack,
    batch_id: &str,
    slots: u32,
) -> (
    tonic::Streaming<pb::AgentTask>,
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
) {
    use kiln_proto::v1::item_work_service_client::ItemWorkServiceClient;
    let addr = stack.batches_addr.expect("item-batch is started");
    let mut client =
        ItemWorkServiceClient::with_interceptor(Stack::channel(addr).await, BearerInterceptor::new(&stack.token));
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(pb::AgentMessage {
        body: Some(pb::agent_message::Body::Hello(pb::AgentHello {
            batch_id: batch_id.into(),
            slots,
        })),
    })
    .await
    .expect("the hello is queued");
    let tasks = client
        .work(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|m| (m, rx))
        }))
        .await
        .expect("item-batch opens the session")
        .into_inner();
    (tasks, tx)
}
