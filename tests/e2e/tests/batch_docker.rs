//! A batch on the Docker Engine: 10,000 items, 4 worker containers running kiln-agent (the
//! static build, copied into each container), a shell command that fails 10% of the items on
//! their first attempt, and one item that always fails (printing the size of its worker's own
//! disk and /dev/shm, `disk_bytes` and `shm_bytes`).

use std::net::SocketAddr;
use std::time::Duration;

use kiln_e2e::{BatchRun, Stack, docker, labelled, run_batch_to_done, static_agent_binary, test_image};
use kiln_proto::v1 as pb;

const ITEMS: usize = 10_000;

#[tokio::test]
async fn ten_thousand_items_on_four_containers_with_retries_and_a_dead_letter() {
    let mut stack = Stack::start_without_runner().await;
    // Containers reach item-batch through the bridge's gateway, so it listens beyond loopback.
    let mut config = stack.item_batch_config();
    config.grpc.listen = SocketAddr::from(([0, 0, 0, 0], 0));
    stack.start_item_batch(config).await;
    let mut runner = stack.docker_runner_config(&stack.docker_runner_id());
    runner.docker.network = "bridge".into();
    // The engine's bridge, unconfined: the isolated network has its own tests (docker_isolation.rs).
    runner.docker.isolate_jobs = false;
    runner.agent_binary = static_agent_binary();
    runner.cpu_millis = 4000;
    stack.runner = Some(stack.spawn_runner(runner).await);

    let spec = pb::BatchSpec {
        name: "docker".into(),
        image: test_image(),
        command: [
            "sh",
            "-c",
            "case {item} in poison) df -k /dev/shm /kiln/outputs | tail -n 2; echo poisoned; exit 4;; *3) [ {attempt} -gt 1 ] || exit 1;; esac",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        cpu_millis: 500,
        memory_mb: 64,
        max_attempts: 3,
        max_workers: 4,
        // Each worker's own disk and /dev/shm, as a job's `--disk` and `--shm`.
        disk_bytes: 32 << 20,
        shm_bytes: 32 << 20,
        ..Default::default()
    };
    let mut client = stack.batches_client().await;
    let batch = client
        .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner();
    let keys: Vec<String> = (0..ITEMS - 1)
        .map(|n| format!("{n:05}"))
        .chain(["poison".into()])
        .collect();
    let all: Vec<pb::Item> = keys
        .iter()
        .map(|key| pb::Item {
            key: key.clone(),
            uri: format!("s3://bucket/{key}"),
            params: Default::default(),
        })
        .collect();
    let messages = kiln_e2e::add_requests(&batch.id, &all, 2500);
    let added = client
        .add_items(futures::stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.total, ITEMS as u64);
    client
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();

    // Four workers at most, in containers labelled with their jobs.
    let deadline = tokio::time::Instant::now()
        + Duration::from_secs(
            std::env::var("KILN_TEST_BATCH_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(600),
        );
    let BatchRun { done, most_workers } = match run_batch_to_done(&mut client, &batch.id, deadline).await {
        Ok(run) => run,
        Err(now) => {
            let mut report = String::new();
            for worker in stack
                .store
                .list_jobs(None, &kiln_core::authz::Visible::All, true, 100)
                .await
                .unwrap()
            {
                let lines = stack.log_lines(&worker.id, false).await;
                let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
                report += &format!("\n{} {} {:?} {:?}", worker.id, worker.state, worker.reason, texts);
            }
            panic!("the batch did not finish: {now:?}{report}");
        }
    };
    assert!((1..=4).contains(&most_workers), "{most_workers} workers");
    let c = done.counts.unwrap();
    assert_eq!(
        (c.total, c.succeeded, c.dead, c.failed, c.pending, c.running),
        (ITEMS as u64, ITEMS as u64 - 1, 1, 0, 0, 0)
    );
    let dead = client
        .list_items(pb::ListItemsRequest {
            batch_id: batch.id.clone(),
            states: vec![pb::ItemState::Dead as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].key.as_str(), dead[0].exit_code, dead[0].attempts),
        ("poison", Some(4), 3)
    );
    let logs = client
        .get_item_logs(pb::GetItemLogsRequest {
            batch_id: batch.id.clone(),
            key: "poison".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .lines;
    assert_eq!(logs.iter().filter(|l| l.text == "poisoned").count(), 3, "{logs:?}");
    // `df -k`: /dev/shm is the 32 MiB asked (32768 KiB blocks; Docker's default is 64 MiB), and
    // /kiln/outputs is on the worker's own 32 MiB disk, a loop device (busybox's df names one
    // of its mount points: the disk holds /kiln/outputs and /tmp), not the runner's file system.
    let blocks = |device: fn(&str) -> bool| -> Vec<u64> {
        logs.iter()
            .filter_map(|l| {
                let fields: Vec<&str> = l.text.split_whitespace().collect();
                device(fields.first()?).then(|| fields.get(1)?.parse().ok()).flatten()
            })
            .collect()
    };
    let shm = blocks(|device| device == "shm");
    assert!(shm.len() == 3 && shm.iter().all(|&b| b == 32768), "{logs:?}");
    let disk = blocks(|device| device.starts_with("/dev/loop"));
    assert!(disk.len() == 3 && disk.iter().all(|&b| b <= 32768), "{logs:?}");
    let retried = client
        .list_items(pb::ListItemsRequest {
            batch_id: batch.id.clone(),
            states: vec![pb::ItemState::Succeeded as i32],
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(retried.len(), ITEMS - 1);
    // Which items took another attempt than their command calls for, if any (seen once in a full
    // run under nextest, 2026-12-06, not diagnosed): their keys and attempts say whether a worker's
    // session was lost or an item's lease ran out.
    let odd: Vec<(&str, u32)> = retried
        .iter()
        .filter(|i| i.attempts != if i.key.ends_with('3') { 2 } else { 1 })
        .map(|i| (i.key.as_str(), i.attempts))
        .collect();
    assert!(odd.is_empty(), "items with unexpected attempts: {odd:?}");

    // The workers leave, and the engine keeps none of their containers.
    let docker = docker().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let live = stack.store.live_batch_workers(&batch.id).await.unwrap().len();
        let (containers, _) = labelled(&docker, "kiln.runner", &stack.docker_runner_id()).await;
        if live == 0 && containers.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{live} workers, containers {containers:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
