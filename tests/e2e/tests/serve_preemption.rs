//! A spot preemption of an inference worker: the simulated cloud gives the worker's instance its
//! notice, the runner drains the worker (out of rotation, its requests in flight answered)
//! before stopping it, the member's other worker takes the requests meanwhile, and the worker's
//! job is queued again and comes back as a new attempt. No request fails, and no relay answers
//! one with an error (which is what stopping a worker without the drain does).

use std::sync::Arc;

use kiln_core::metrics::Metrics;
use kiln_e2e::serve_world::{
    World, answered_by, definition, register_factor, until, until_factor, workers, world, x, y,
};
use kiln_e2e::sim::{cloud, cpu_box, sim_runner};
use kiln_proto::v1 as pb;
use kiln_runner::provider::sim::SimConfig;
use tokio_util::sync::CancellationToken;

/// The sum of the relays' `kiln_runner_serve_requests_total` series with this outcome.
fn relay_requests(metrics: &Metrics, outcome: &str) -> f64 {
    let outcome = format!("outcome=\"{outcome}\"");
    metrics
        .encode()
        .lines()
        .filter(|line| line.starts_with("kiln_runner_serve_requests_total{") && line.contains(&outcome))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_preempted_worker_drains_without_a_failed_request_and_comes_back() {
    let World {
        mut stack,
        code_digest,
        pid_dir,
        mut serve,
        rest,
        predictor: _predictor,
    } = world().await;
    let version = register_factor(&stack, 3).await;
    // From here on jobs run on a spot cloud whose instances boot at once and get a 3 s notice;
    // the sim runs an inference worker's process for real.
    stack.runner.take().expect("the stack's runner").stop().await;
    let metrics = Metrics::default();
    let spot = SimConfig {
        notice_ms: 3_000,
        ..cloud(cpu_box(), 4, true)
    };
    let (runner, sim) = stack.spawn_sim_runner(sim_runner(&stack, spot), &metrics).await;
    stack.runner = Some(runner);

    let mut service = definition(&format!("scale:{version}"), &code_digest, &pid_dir);
    service.replicas = 2;
    let worker = service.worker.as_mut().expect("a worker spec");
    worker.market = pb::Market::Spot as i32;
    // Each answer takes 100 ms, so the drain finds requests in flight.
    worker.env.insert("SLOW_MS".into(), "100".into());
    serve
        .create_service(pb::CreateServiceRequest {
            name: "scale".into(),
            project: String::new(),
            definition: Some(service),
        })
        .await
        .expect("create the service");
    until_factor(&rest, 3.0).await;

    let rest = Arc::new(rest);
    let stop = CancellationToken::new();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (rest, stop) = (rest.clone(), stop.clone());
            tokio::spawn(async move {
                let mut answered = 0usize;
                while !stop.is_cancelled() {
                    let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
                    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
                    assert_eq!(y(&reply), 3.0);
                    answered += 1;
                }
                answered
            })
        })
        .collect();

    // Both workers answer; then the cloud takes one of them back.
    let patience = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
    let jobs: Vec<String> = loop {
        let running: Vec<String> = workers(&mut serve, "scale", 1)
            .await
            .into_iter()
            .filter(|worker| worker.state == pb::JobState::Running as i32)
            .map(|worker| worker.job_id)
            .collect();
        if running.len() == 2 {
            break running;
        }
        assert!(
            tokio::time::Instant::now() < patience,
            "never two workers running: {running:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    until("both workers answering", || async {
        jobs.iter().all(|job| answered_by(&pid_dir, job) > 0)
    })
    .await;
    let (victim, other) = (&jobs[0], &jobs[1]);
    let other_before = answered_by(&pid_dir, other);
    let pid_before = std::fs::read_to_string(std::path::Path::new(&pid_dir).join(victim)).expect("the victim's pid");
    assert!(sim.preempt(victim), "no spot instance runs {victim}");

    // Its job is queued again and runs a new attempt, on a new process, which answers too.
    let back = stack
        .wait_for(victim, "a second attempt running", |job| {
            job.attempt == 2 && job.state == pb::JobState::Running as i32
        })
        .await;
    assert_eq!(back.preemptions, 1, "{back:?}");
    assert_eq!(back.market, "spot", "{back:?}");
    until("the new attempt answering", || async {
        std::fs::read_to_string(std::path::Path::new(&pid_dir).join(victim)).is_ok_and(|pid| pid != pid_before)
            && answered_by(&pid_dir, victim) > 0
    })
    .await;
    let victim_answered = answered_by(&pid_dir, victim);
    until("the new attempt taking requests", || async {
        answered_by(&pid_dir, victim) > victim_answered
    })
    .await;
    assert!(
        answered_by(&pid_dir, other) > other_before,
        "the other worker took the requests"
    );

    stop.cancel();
    let mut total = 0;
    for client in clients {
        total += client.await.expect("a client: every request answered");
    }
    assert!(total > 0);
    assert!(relay_requests(&metrics, "answered") > 0.0, "{}", metrics.encode());
    assert_eq!(relay_requests(&metrics, "failed"), 0.0, "{}", metrics.encode());
    assert_eq!(
        relay_requests(&metrics, "dropped") + relay_requests(&metrics, "late"),
        0.0
    );
}
