//! Inference services run as kiln jobs: a service made through `ServeService` gets its worker
//! jobs from the predictor's controller, each runner stages the registered model version and
//! relays the worker, and the service rolls to a new revision under load without a failed
//! request, and replaces a worker that died.

use std::time::Duration;

use kiln_e2e::serving::{Rest, python, serve_client, spawn_predictor_with_api};
use kiln_e2e::{PATIENCE, Stack, bundle, spec, upload};
use kiln_proto::v1 as pb;
use serde_json::json;

/// A worker whose model is the factor in its version's `factor.txt`; it writes its pid where
/// the test can find it.
const WORKER: &str = r#"
import os
import kiln

def load(path):
    with open(os.path.join(path, "factor.txt")) as f:
        return float(f.read())

def predict(factor, inputs):
    return {"y": inputs["x"] * factor}

with open(os.path.join(os.environ["PID_DIR"], os.environ["KILN_JOB_ID"]), "w") as f:
    f.write(str(os.getpid()))
kiln.serve(predict, load)
"#;

/// Registers version `n` of model `scale`, whose factor is `factor`, from a job's outputs.
async fn register_factor(stack: &Stack, factor: u32) -> i64 {
    let script = format!("mkdir -p \"$KILN_OUTPUTS/model\" && echo {factor} > \"$KILN_OUTPUTS/model/factor.txt\"");
    let job = stack.submit_spec(spec(&["sh", "-c", &script])).await;
    stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    let request = pb::RegisterModelRequest {
        name: "scale".into(),
        job_id: job.id.clone(),
        path: "model".into(),
        ..Default::default()
    };
    let version = stack
        .models()
        .await
        .register_model(request)
        .await
        .expect("register")
        .into_inner();
    version.version
}

fn definition(model: &str, code_digest: &str, pid_dir: &str) -> pb::ServiceDefinition {
    let mut worker = spec(&[&python(), "worker.py"]);
    worker.code_digest = code_digest.into();
    worker.env = [("PID_DIR".to_string(), pid_dir.to_string())].into_iter().collect();
    pb::ServiceDefinition {
        models: vec![pb::ServiceModel {
            model: model.into(),
            ..Default::default()
        }],
        deadline_ms: 2_000,
        worker: Some(worker),
        ..Default::default()
    }
}

fn x(value: f64) -> serde_json::Value {
    json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [value]}]})
}

fn y(reply: &kiln_e2e::serving::Reply) -> f64 {
    reply.json()["outputs"][0]["data"][0].as_f64().expect("a number")
}

/// Asks until the answer to x = 1 is `factor`.
async fn until_factor(rest: &Rest, factor: f64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
        if reply.status == 200 && y(&reply) == factor {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never answered {factor}: {} {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_of_jobs_rolls_to_a_new_revision_and_replaces_a_dead_worker_without_a_failed_request() {
    let stack = Stack::start().await;
    let first = register_factor(&stack, 3).await;
    let second = register_factor(&stack, 5).await;
    let (code, code_digest) = bundle(&[("worker.py", WORKER)]);
    upload(&mut stack.artifacts().await, &code, &code_digest)
        .await
        .expect("upload");
    let pid_dir = stack.dir.path().join("pids");
    std::fs::create_dir_all(&pid_dir).expect("pid dir");
    let pid_dir = pid_dir.display().to_string();
    let (_predictor, base, api) = spawn_predictor_with_api(&stack).await;
    let mut serve = serve_client(api, &stack.token).await;

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
    let rest = std::sync::Arc::new(Rest::new(&base, &stack.token));
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
        .get_service(pb::GetServiceRequest { name: "scale".into() })
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
        .get_service(pb::GetServiceRequest { name: "scale".into() })
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
        .stop_service(pb::StopServiceRequest { name: "scale".into() })
        .await
        .expect("stop");
    stack
        .wait_for_state(&replacement[0].job_id, pb::JobState::Stopped)
        .await;
    let reply = rest.post_json("/v2/models/scale/infer", &x(1.0)).await;
    assert_eq!(reply.status, 400);
}
