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
