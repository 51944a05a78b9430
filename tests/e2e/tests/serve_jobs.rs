//! Inference services run as kiln jobs: a service made through `ServeService` gets its worker
//! jobs from the predictor's controller, each runner stages the registered model version and
//! relays the worker, and the service rolls to a new revision under load without a failed
//! request, and replaces a worker that died; tries a revision with a share of the traffic and
//! in shadow; and scales on its load, to zero when idle and back on the first request.

use std::time::Duration;

use kiln_e2e::PATIENCE;
use kiln_e2e::serve_world::{
    World, answered_by, definition, register_factor, until, until_factor, workers, world, x, y,
};
use kiln_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_of_jobs_rolls_to_a_new_revision_and_replaces_a_dead_worker_without_a_failed_request() {
    let World {
        stack,
        code_digest,
        pid_dir,
        mut serve,
        rest: rest_client,
        predictor: _predictor,
    } = world().await;
    let first = register_factor(&stack, 3).await;
    let second = register_factor(&stack, 5).await;

    let created = serve
        .create_service(pb::CreateServiceRequest {
            name: "scale".into(),
            project: String::new(),
            definition: Some(definition(&format!("scale:{first}"), &code_digest, &pid_dir)),
        })
        .await
        .expect("create the service")
        .into_inner();
    assert_eq!(created.revision, 1);
    assert_eq!(created.members[0].model_version, format!("scale:{first}"));
    let rest = std::sync::Arc::new(rest_client);
    until_factor(&rest, 3.0).await;

    // Load from here on: every request must be answered, by one revision or the other.
    let stop = tokio_util::sync::CancellationToken::new();
    let load = {
        let rest = rest.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut answered = Vec::new();
            while !stop.is_cancelled() {
                let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
                assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
                answered.push(y(&reply));
            }
            answered
        })
    };
    let updated = serve
        .update_service(pb::UpdateServiceRequest {
            name: "scale".into(),
            definition: Some(definition(&format!("scale:{second}"), &code_digest, &pid_dir)),
            ..Default::default()
        })
        .await
        .expect("update")
        .into_inner();
    assert_eq!(updated.latest_revision, 2);
    until_factor(&rest, 5.0).await;

    // The new revision's one worker dies: the controller asks for another, and the requests
    // meanwhile are answered or, with no worker at all for a moment, none is lost to a crash of
    // the predictor.
    let service = serve
        .get_service(pb::GetServiceRequest {
            project: Default::default(),
            name: "scale".into(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(service.revision, 2, "{service:?}");
    let worker = service
        .members
        .iter()
        .find(|member| member.revision == 2)
        .and_then(|member| member.workers.first())
        .expect("a worker of revision 2")
        .job_id
        .clone();
    stop.cancel();
    let answered = load.await.expect("the load");
    assert!(
        answered.iter().all(|&value| value == 3.0 || value == 5.0),
        "{answered:?}"
    );
    assert!(answered.contains(&5.0));
    // The predictor counted every one of them, answered, with their latency.
    let recent = serve
        .get_service(pb::GetServiceRequest {
            project: Default::default(),
            name: "scale".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .recent
        .expect("recent traffic");
    assert!(
        recent.answered >= answered.len() as u64,
        "{recent:?} for {} requests",
        answered.len()
    );
    assert_eq!(
        recent.requests,
        recent.answered + recent.partial + recent.invalid + recent.failed,
        "{recent:?}"
    );
    assert!(
        recent.p50_ms > 0.0 && recent.p50_ms <= recent.p95_ms && recent.p95_ms <= recent.p99_ms,
        "{recent:?}"
    );

    let pid: i32 = std::fs::read_to_string(std::path::Path::new(&pid_dir).join(&worker))
        .expect("the worker's pid")
        .trim()
        .parse()
        .expect("a pid");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .expect("kill the worker");
    stack.wait_for_state(&worker, pb::JobState::Failed).await;
    until_factor(&rest, 5.0).await;
    let service = serve
        .get_service(pb::GetServiceRequest {
            project: Default::default(),
            name: "scale".into(),
        })
        .await
        .expect("get")
        .into_inner();
    let replacement = &service
        .members
        .iter()
        .find(|member| member.revision == 2)
        .expect("revision 2")
        .workers;
    assert_eq!(replacement.len(), 1, "{service:?}");
    assert_ne!(replacement[0].job_id, worker, "a new worker job");

    // Stopped: the predictor forgets it, its workers stop.
    serve
        .stop_service(pb::StopServiceRequest {
            project: Default::default(),
            name: "scale".into(),
        })
        .await
        .expect("stop");
    stack
        .wait_for_state(&replacement[0].job_id, pb::JobState::Stopped)
        .await;
    let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
    assert_eq!(reply.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tried_revision_gets_its_share_of_the_traffic_then_copies_in_shadow_then_all_of_it() {
    let World {
        stack,
        code_digest,
        pid_dir,
        mut serve,
        rest,
        predictor: _predictor,
    } = world().await;
    let first = register_factor(&stack, 3).await;
    let second = register_factor(&stack, 5).await;
    serve
        .create_service(pb::CreateServiceRequest {
            name: "scale".into(),
            project: String::new(),
            definition: Some(definition(&format!("scale:{first}"), &code_digest, &pid_dir)),
        })
        .await
        .expect("create the service");
    until_factor(&rest, 3.0).await;

    // 30%: once revision 2 is ready, exactly 30 of every 100 requests are its.
    let updated = serve
        .update_service(pb::UpdateServiceRequest {
            project: Default::default(),
            name: "scale".into(),
            definition: Some(definition(&format!("scale:{second}"), &code_digest, &pid_dir)),
            traffic: 30,
            shadow: false,
        })
        .await
        .expect("update")
        .into_inner();
    assert_eq!((updated.revision, updated.latest_revision, updated.traffic), (1, 2, 30));
    until_factor(&rest, 5.0).await;
    let mut fives = 0;
    for _ in 0..100 {
        let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
        let value = y(&reply);
        assert!(value == 3.0 || value == 5.0, "{value}");
        if value == 5.0 {
            fives += 1;
            assert_eq!(reply.json()["model_version"], "2");
        }
    }
    assert_eq!(fives, 30, "revision 2 answers exactly its share");
    // A version named in the path is answered by that revision alone.
    let pinned = rest.post_json("/v2/models/scale/versions/2/infer", &x(2.0)).await;
    assert_eq!(y(&pinned), 10.0, "{}", String::from_utf8_lossy(&pinned.body));
    let missing = rest.post_json("/v2/models/scale/versions/7/infer", &x(2.0)).await;
    assert_eq!(missing.status, 400);
    assert!(missing.error().contains("tries revision 2"), "{}", missing.error());

    // Shadow: every answer is revision 1's, and revision 2's worker gets a copy of each.
    serve
        .update_service(pb::UpdateServiceRequest {
            project: Default::default(),
            name: "scale".into(),
            definition: None,
            traffic: 0,
            shadow: true,
        })
        .await
        .expect("to shadow");
    let tried = workers(&mut serve, "scale", 2).await;
    assert_eq!(tried.len(), 1, "{tried:?}");
    // The predictor reads the change within a pass or two; from then, none is revision 2's.
    until("the split is replaced by the shadow", || async {
        let before = answered_by(&pid_dir, &tried[0].job_id);
        let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
        let after = answered_by(&pid_dir, &tried[0].job_id);
        reply.status == 200 && y(&reply) == 3.0 && after > before
    })
    .await;
    let before = answered_by(&pid_dir, &tried[0].job_id);
    for _ in 0..20 {
        let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
        assert_eq!(y(&reply), 3.0, "a shadow's answer is never returned");
        assert_eq!(reply.json()["model_version"], "1");
    }
    until("revision 2 got a copy of each request", || async {
        answered_by(&pid_dir, &tried[0].job_id) >= before + 20
    })
    .await;

    // All of it: a roll; revision 1's worker is stopped after the grace.
    let rolled = serve
        .update_service(pb::UpdateServiceRequest {
            project: Default::default(),
            name: "scale".into(),
            definition: None,
            traffic: 100,
            shadow: false,
        })
        .await
        .expect("promote")
        .into_inner();
    assert_eq!(rolled.latest_revision, 2);
    until_factor(&rest, 5.0).await;
    until("revision 1 has no worker left", || async {
        workers(&mut serve.clone(), "scale", 1).await.is_empty()
    })
    .await;
    let service = serve
        .get_service(pb::GetServiceRequest {
            project: Default::default(),
            name: "scale".into(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!((service.revision, service.latest_revision), (2, 2));
    // Nothing is being tried now.
    let refused = serve
        .update_service(pb::UpdateServiceRequest {
            project: Default::default(),
            name: "scale".into(),
            definition: None,
            traffic: 50,
            shadow: false,
        })
        .await
        .expect_err("no revision is being tried");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_scales_up_on_load_down_to_zero_when_idle_and_back_on_the_first_request() {
    let World {
        stack,
        code_digest,
        pid_dir,
        mut serve,
        rest,
        predictor: _predictor,
    } = world().await;
    let first = register_factor(&stack, 3).await;
    let mut definition = definition(&format!("scale:{first}"), &code_digest, &pid_dir);
    if let Some(worker) = definition.worker.as_mut() {
        worker.env.insert("SLOW_MS".into(), "40".into());
        // A worker starting on this machine can be ready in under 300 ms: loading its model
        // takes longer here, so the short cold-start wait below is always missed.
        worker.env.insert("LOAD_MS".into(), "1500".into());
    }
    let scaling = pb::Scaling {
        min_replicas: 0,
        max_replicas: 2,
        target_in_flight: 1.0,
        scale_down_delay_ms: 2_000,
        cold_wait_ms: PATIENCE.as_millis() as u64,
        ..Default::default()
    };
    definition.scaling = Some(scaling);
    serve
        .create_service(pb::CreateServiceRequest {
            name: "scale".into(),
            project: String::new(),
            definition: Some(definition),
        })
        .await
        .expect("create the service");
    // Nothing asks for it: no worker.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(workers(&mut serve, "scale", 1).await.is_empty());

    // The first request waits for a worker and is answered.
    let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(y(&reply), 3.0);
    assert_eq!(workers(&mut serve, "scale", 1).await.len(), 1);

    // Four clients at once on a worker that takes 40 ms a request: a second worker.
    let stop = tokio_util::sync::CancellationToken::new();
    let mut load = Vec::new();
    for _ in 0..4 {
        let (rest, stop) = (rest.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
                assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
            }
        }));
    }
    until("a second worker is asked for under load", || async {
        workers(&mut serve.clone(), "scale", 1).await.len() == 2
    })
    .await;
    stop.cancel();
    for client in load {
        client.await.expect("a load client");
    }

    // Idle: after the delay, no worker at all.
    until("the idle service has no worker", || async {
        workers(&mut serve.clone(), "scale", 1).await.is_empty()
    })
    .await;

    // With a cold-start wait shorter than a worker's start, the first request is refused with
    // the reason, in about that wait; a worker was asked for, and a later request is answered.
    serve
        .scale_service(pb::ScaleServiceRequest {
            project: Default::default(),
            name: "scale".into(),
            replicas: 0,
            scaling: Some(pb::Scaling {
                cold_wait_ms: 300,
                ..scaling
            }),
        })
        .await
        .expect("scale");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = tokio::time::Instant::now();
    let refused = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
    let waited = asked.elapsed();
    assert_eq!(refused.status, 503, "{}", String::from_utf8_lossy(&refused.body));
    assert!(
        refused.error().contains("300 ms cold-start wait"),
        "{}",
        refused.error()
    );
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    until_factor(&rest, 3.0).await;
}
