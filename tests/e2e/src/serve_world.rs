//! What the tests of inference services run as kiln jobs start from: a stack with a Python
//! worker's code uploaded, the directory its workers write their pids and answers to, a
//! predictor with its clients, registered versions of the `scale` model, and the waits.

use std::time::Duration;

use kiln_proto::v1 as pb;
use serde_json::json;

use crate::serving::{Rest, ServeClient, python, serve_client, spawn_predictor_with_api};
use crate::{PATIENCE, ServiceHandle, Stack, bundle, spec, upload};

/// A worker whose model is the factor in its version's `factor.txt`; it writes its pid where
/// the test can find it, and a line for each request it answers (after `SLOW_MS`); loading
/// takes `LOAD_MS`.
pub const WORKER: &str = r#"
import os
import time
import kiln

# Under a root runner each attempt runs as a uid of its own: the files it leaves are open to the
# next attempt's uid (a second attempt of a job appends to the first's).
os.umask(0)
slow = float(os.environ.get("SLOW_MS", "0")) / 1000
answered = os.path.join(os.environ["PID_DIR"], os.environ["KILN_JOB_ID"] + ".answered")

def load(path):
    time.sleep(float(os.environ.get("LOAD_MS", "0")) / 1000)
    with open(os.path.join(path, "factor.txt")) as f:
        return float(f.read())

def predict(factor, inputs):
    time.sleep(slow)
    with open(answered, "a") as f:
        f.write("1\n")
    return {"y": inputs["x"] * factor}

with open(os.path.join(os.environ["PID_DIR"], os.environ["KILN_JOB_ID"]), "w") as f:
    f.write(str(os.getpid()))
kiln.serve(predict, load)
"#;

/// What every test starts from: a stack with the worker's code uploaded, the directory its
/// workers write their pids to, and a predictor with its clients.
pub struct World {
    pub stack: Stack,
    pub code_digest: String,
    pub pid_dir: String,
    pub serve: ServeClient,
    pub rest: Rest,
    pub predictor: ServiceHandle,
}

pub async fn world() -> World {
    let stack = Stack::start().await;
    let (code, code_digest) = bundle(&[("worker.py", WORKER)]);
    upload(&mut stack.artifacts().await, &code, &code_digest)
        .await
        .expect("upload");
    let pid_dir = stack.dir.path().join("pids");
    std::fs::create_dir_all(&pid_dir).expect("pid dir");
    // Workers run as uids of their own when the tests run as root: they write their pids here.
    std::fs::set_permissions(&pid_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("open the pid dir");
    let (predictor, base, api) = spawn_predictor_with_api(&stack).await;
    let serve = serve_client(api, &stack.token).await;
    let rest = Rest::new(&base, &stack.token);
    World {
        code_digest,
        pid_dir: pid_dir.display().to_string(),
        serve,
        rest,
        predictor,
        stack,
    }
}

/// Registers a version of model `scale` whose factor is `factor`, from a job's outputs; its
/// version number.
pub async fn register_factor(stack: &Stack, factor: u32) -> i64 {
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

pub fn definition(model: &str, code_digest: &str, pid_dir: &str) -> pb::ServiceDefinition {
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

pub fn x(value: f64) -> serde_json::Value {
    json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [value]}]})
}

pub fn y(reply: &crate::serving::Reply) -> f64 {
    reply.json()["outputs"][0]["data"][0].as_f64().expect("a number")
}

/// Asks until the answer to x = 1 is `factor`.
pub async fn until_factor(rest: &Rest, factor: f64) {
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

/// How many requests the worker of job `job` answered.
pub fn answered_by(pid_dir: &str, job: &str) -> usize {
    std::fs::read_to_string(std::path::Path::new(pid_dir).join(format!("{job}.answered")))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

/// The live (not ended) worker jobs of `revision` of the service.
pub async fn workers(serve: &mut ServeClient, name: &str, revision: u64) -> Vec<pb::ServiceWorker> {
    let service = serve
        .get_service(pb::GetServiceRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    service
        .members
        .into_iter()
        .filter(|member| member.revision == revision)
        .flat_map(|member| member.workers)
        .collect()
}

/// Polls `check` every 100 ms until it holds, for at most [`PATIENCE`].
pub async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
