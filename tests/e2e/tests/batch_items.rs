//! What happens to an item's attempts: retry rules end deterministic failures at once, an
//! attempt lost with its worker is not charged, and each attempt's own CPU, memory and wall
//! time are measured, apart from the items beside it on its worker.

use std::collections::HashMap;
use std::time::Duration;

use kiln_e2e::{
    BATCH_PATIENCE, Stack, add_items, batch_spec, counts_of, create_batch, items_in, job_writable_dir, kill_a_worker,
    mem_items, seal_batch, wait_batch,
};
use kiln_proto::v1 as pb;
use tonic::Code;

/// Exit 2 is bad input: a rule ends the item at once. Exit 1 is retried to max_attempts, and a
/// timeout ends as its rule says.
#[tokio::test]
async fn retry_rules_end_deterministic_failures_at_once() {
    let stack = Stack::start_with_item_batch().await;
    let mut rules = batch_spec(&[
        "sh",
        "-c",
        "case {item} in bad) exit 2;; flaky) exit 1;; slow) sleep 30;; esac; echo ok",
    ]);
    rules.item_timeout_secs = 1;
    let rule = |on: pb::ItemFailure, exit_codes: &[i32], action: pb::RetryAction| pb::RetryRule {
        on: on as i32,
        exit_codes: exit_codes.to_vec(),
        action: action as i32,
    };
    rules.retry_rules = vec![
        rule(pb::ItemFailure::Exit, &[2], pb::RetryAction::Fail),
        rule(pb::ItemFailure::Timeout, &[], pb::RetryAction::Fail),
    ];
    let batch = create_batch(&stack, rules).await;
    let keys = ["bad", "flaky", "slow", "fine"].map(String::from);
    add_items(&stack, &batch.id, mem_items(keys)).await.unwrap();
    seal_batch(&stack, &batch.id).await;
    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    let c = counts_of(&done);
    assert_eq!((c.succeeded, c.dead, c.failed), (1, 3, 0), "{c:?}");

    let dead = items_in(&stack, &batch.id, pb::ItemState::Dead).await;
    let by_key = |key: &str| dead.iter().find(|item| item.key == key).unwrap().clone();
    let bad = by_key("bad");
    assert_eq!((bad.exit_code, bad.attempts), (Some(2), 1), "{bad:?}");
    assert!(
        bad.reason.contains("not retried by retry rule 1 (fail on exit 2)"),
        "the rule that decided is in the record: {bad:?}"
    );
    let flaky = by_key("flaky");
    assert_eq!(
        (flaky.exit_code, flaky.attempts),
        (Some(1), 3),
        "no rule matched: retried: {flaky:?}"
    );
    let slow = by_key("slow");
    assert_eq!((slow.exit_code, slow.attempts), (None, 1), "{slow:?}");
    assert!(
        slow.reason.contains("timed out") && slow.reason.contains("retry rule 2"),
        "{slow:?}"
    );

    // A rule that can never match is refused, naming it.
    let mut never = batch_spec(&["true"]);
    never.retry_rules = vec![rule(pb::ItemFailure::Timeout, &[1], pb::RetryAction::Fail)];
    let refused = stack
        .batches_client()
        .await
        .create_batch(pb::CreateBatchRequest { spec: Some(never) })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("retry rule 1"), "{refused:?}");
}

/// An attempt lost with its worker (SIGKILLed here, as a runner's death or a reclaim ends it)
/// is not charged: with max_attempts 2, the item's one real failure after the loss leaves it
/// an attempt, which succeeds. (Charged, the failure would have been its second and last.)
#[tokio::test]
async fn an_attempt_lost_with_its_worker_is_not_charged() {
    let stack = Stack::start_with_item_batch().await;
    let marks = job_writable_dir();
    let (started_mark, failed_mark) = (marks.path().join("started"), marks.path().join("failed"));
    // Its first run is lost with its worker; its next fails once; then it succeeds.
    let script = format!(
        "if [ ! -e {0} ]; then touch {0}; sleep 120; elif [ ! -e {1} ]; then touch {1}; exit 1; fi; echo ok",
        started_mark.display(),
        failed_mark.display()
    );
    let mut work = batch_spec(&["sh", "-c", &script]);
    work.max_attempts = 2;
    work.max_workers = 1;
    let batch = create_batch(&stack, work).await;
    add_items(&stack, &batch.id, mem_items(["only".to_string()]))
        .await
        .unwrap();
    seal_batch(&stack, &batch.id).await;
    let deadline = tokio::time::Instant::now() + BATCH_PATIENCE;
    while !started_mark.try_exists().unwrap() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first attempt never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kill_a_worker(&stack, &batch.id).await;

    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    let c = counts_of(&done);
    assert_eq!(
        (c.succeeded, c.dead),
        (1, 0),
        "the loss was charged as a failure: {c:?}"
    );
    let item = &items_in(&stack, &batch.id, pb::ItemState::Succeeded).await[0];
    assert_eq!(
        item.attempts, 2,
        "one failure and the success have outcomes; the loss has none: {item:?}"
    );
}

/// Burns `KILN_PARAM_CPU` seconds of CPU (counted from the interpreter's start) holding
/// `KILN_PARAM_MIB` MiB written to.
const BURN: &str = "import os, time\nblock = b'x' * (int(os.environ['KILN_PARAM_MIB']) << 20)\nwhile time.process_time() < float(os.environ['KILN_PARAM_CPU']):\n    pass\n";

/// Two items at a time on one worker, of different sizes: each item's figures are its own.
#[tokio::test]
async fn each_items_cpu_memory_and_wall_time_are_its_own() {
    let stack = Stack::start_with_item_batch().await;
    let mut work = batch_spec(&["python3", "-c", BURN]);
    work.slots = 2;
    work.max_workers = 1;
    work.memory_mb = 512;
    let batch = create_batch(&stack, work).await;
    let sizes: [(&str, f64, u64); 4] = [
        ("big-1", 1.2, 300),
        ("small-1", 0.4, 100),
        ("big-2", 1.2, 300),
        ("small-2", 0.4, 100),
    ];
    let items = sizes
        .iter()
        .map(|(key, cpu, mib)| pb::Item {
            key: key.to_string(),
            uri: format!("mem://{key}"),
            params: HashMap::from([
                ("CPU".to_string(), cpu.to_string()),
                ("MIB".to_string(), mib.to_string()),
            ]),
        })
        .collect();
    add_items(&stack, &batch.id, items).await.unwrap();
    seal_batch(&stack, &batch.id).await;
    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    assert_eq!(counts_of(&done).succeeded, 4, "{done:?}");

    let measured = items_in(&stack, &batch.id, pb::ItemState::Succeeded).await;
    for (key, cpu, mib) in sizes {
        let item = measured.iter().find(|item| item.key == key).unwrap();
        let within = |got: f64, want: f64| (got - want).abs() <= 0.2 * want;
        assert!(
            within(item.cpu_seconds, cpu),
            "{key}: {} CPU s, not about {cpu}",
            item.cpu_seconds
        );
        let peak_mib = item.peak_memory_bytes as f64 / f64::from(1 << 20);
        assert!(
            within(peak_mib, mib as f64),
            "{key}: a peak of {peak_mib:.0} MiB, not about {mib}"
        );
        assert!(
            item.duration_ms as f64 >= 0.8 * cpu * 1000.0,
            "{key}: {} ms of wall time for {cpu} s of CPU",
            item.duration_ms
        );
    }
    // The spreads are read again at most every few seconds.
    let done = wait_batch(&stack, &batch.id, "measured", |b| {
        b.usage.as_ref().is_some_and(|u| u.items == 4)
    })
    .await;
    let usage = done.usage.unwrap();
    let memory = usage.peak_memory_bytes.unwrap();
    assert!(memory.max >= 0.8 * f64::from(300 << 20), "{usage:?}");
    assert!(usage.sizing_hint.starts_with("items used p95"), "{usage:?}");
}
