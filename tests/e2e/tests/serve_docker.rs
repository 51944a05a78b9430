//! An inference worker in a container (the docker provider, on the engine's bridge network):
//! it listens on every address of its container (`KILN_SERVE_HOST`), its port is published on
//! the host's loopback, where its relay calls it, and the service answers through the
//! predictor. No registry is reachable, so the worker is the busybox test image's `nc` running a
//! shell handler per connection: y = factor * x, the factor read from the model version's files
//! (staged read-only under /kiln/data).

use kiln_e2e::serve_world::{World, register_factor, until_factor, world};
use kiln_e2e::{PATIENCE, bundle, docker, labelled, spec, test_image, upload};
use kiln_proto::v1 as pb;
use kiln_runner::provider::docker::LABEL_RUNNER;
use serde_json::json;

/// The worker's handler: one HTTP/1.1 exchange on stdin and stdout.
const HANDLER: &str = include_str!("serve_docker_handler.sh");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_in_a_container_is_reached_through_its_published_port() {
    let World {
        mut stack,
        mut serve,
        rest,
        predictor: _predictor,
        ..
    } = world().await;
    let version = register_factor(&stack, 3).await;
    // From here on jobs run in containers.
    stack.runner.take().expect("the stack's runner").stop().await;
    let runner_id = stack.docker_runner_id();
    let mut config = stack.docker_runner_config(&runner_id);
    config.docker.network = "bridge".into();
    // The engine's bridge, unconfined: the isolated network has its own tests (docker_isolation.rs).
    config.docker.isolate_jobs = false;
    stack.runner = Some(stack.spawn_runner(config).await);

    let (code, code_digest) = bundle(&[("handler.sh", HANDLER)]);
    upload(&mut stack.artifacts().await, &code, &code_digest)
        .await
        .expect("upload");
    let mut worker = spec(&["sh", "-c", "exec nc -ll -p \"$KILN_SERVE_PORT\" -e sh handler.sh"]);
    worker.image = test_image();
    worker.code_digest = code_digest;
    // Its own disk and /dev/shm, as a job's `--disk` and `--shm` (`kiln serve create --disk --shm`).
    worker.resources = Some(pb::Resources {
        cpu_millis: 500,
        memory_bytes: 64 << 20,
        disk_bytes: 32 << 20,
        shm_bytes: 32 << 20,
    });
    serve
        .create_service(pb::CreateServiceRequest {
            name: "scale".into(),
            project: String::new(),
            definition: Some(pb::ServiceDefinition {
                models: vec![pb::ServiceModel {
                    model: format!("scale:{version}"),
                    ..Default::default()
                }],
                deadline_ms: 5_000,
                worker: Some(worker),
                ..Default::default()
            }),
        })
        .await
        .expect("create the service");
    until_factor(&rest, 3.0).await;
    let reply = rest
        .post_json(
            "/v2/models/scale/infer",
            &json!({"inputs": [{"name": "x", "shape": [2], "datatype": "FP64", "data": [1.0, 2.5]}]}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(
        reply.json()["outputs"][0]["data"],
        json!([3.0, 7.5]),
        "{}",
        reply.json()
    );

    // The worker is a container of this runner's; stopping the service removes it.
    let engine = docker().await;
    let (containers, _) = labelled(&engine, LABEL_RUNNER, &runner_id).await;
    assert_eq!(containers.len(), 1, "one worker container: {containers:?}");
    let inspected = engine.inspect_container(&containers[0], None).await.unwrap();
    assert_eq!(inspected.host_config.and_then(|h| h.shm_size), Some(32 << 20));
    let outputs = inspected
        .mounts
        .unwrap_or_default()
        .into_iter()
        .find(|mount| mount.destination.as_deref() == Some("/kiln/outputs"))
        .and_then(|mount| mount.source);
    assert!(
        outputs.as_deref().is_some_and(|source| source.contains("/disks/")),
        "/kiln/outputs is not on the worker's own disk: {outputs:?}"
    );
    let service = serve
        .get_service(pb::GetServiceRequest {
            project: Default::default(),
            name: "scale".into(),
        })
        .await
        .expect("get")
        .into_inner();
    let job = service.members[0].workers[0].job_id.clone();
    serve
        .stop_service(pb::StopServiceRequest {
            project: Default::default(),
            name: "scale".into(),
        })
        .await
        .expect("stop");
    stack.wait_for_state(&job, pb::JobState::Stopped).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (containers, volumes) = labelled(&engine, LABEL_RUNNER, &runner_id).await;
        if containers.is_empty() && volumes.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left on the engine: {containers:?} {volumes:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
