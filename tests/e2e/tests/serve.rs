//! Inference services end to end: Python workers through the SDK's adapter, their relays, a
//! predictor, and real NATS between them. The services' definitions are written to the
//! `kiln_services` bucket as the api writes them.

use std::time::Duration;

use kiln_core::serving::{Ensemble, TensorSpec};
use kiln_e2e::serving::{
    Rest, SCALE_WORKER, Worker, put_service, service_spec, spawn_predictor, spawn_predictor_with_api, spawn_relay,
    spawn_relay_in,
};
use kiln_e2e::{PATIENCE, Stack};
use kiln_formats::oip::{Data, DataType, HEADER_LENGTH, InferRequest, InferResponse, Limits, Tensor};
use kiln_runner::relay::RelayMetrics;
use nix::sys::signal::Signal;
use serde_json::json;

fn x_request(values: &[f64]) -> serde_json::Value {
    json!({"inputs": [{"name": "x", "shape": [values.len()], "datatype": "FP64", "data": values}]})
}

fn y_of(reply: &serde_json::Value) -> Vec<f64> {
    let output = reply["outputs"]
        .as_array()
        .and_then(|outputs| outputs.iter().find(|output| output["name"] == "y"))
        .unwrap_or_else(|| panic!("no output y in {reply}"));
    output["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|value| value.as_f64().expect("a number"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_two_member_mean_is_answered_in_json_binary_and_through_predict() {
    let stack = Stack::start_without_runner().await;
    let dir = stack.dir.path();
    let double = Worker::spawn(dir, "double", SCALE_WORKER, &[("FACTOR", "2")]);
    let quadruple = Worker::spawn(dir, "quadruple", SCALE_WORKER, &[("FACTOR", "4")]);
    let relays = RelayMetrics::default();
    // Three services on the same two workers (a worker may be relayed for several).
    let mut handles = Vec::new();
    for service in ["scale", "weighted", "matrix"] {
        handles.push(spawn_relay(&stack, service, 1, "double", double.addr(), &relays).await);
        handles.push(spawn_relay(&stack, service, 1, "quadruple", quadruple.addr(), &relays).await);
    }
    let members = [("double", 1.0), ("quadruple", 3.0)];
    put_service(&stack, &service_spec("scale", &members, Ensemble::Mean, 5_000)).await;
    put_service(
        &stack,
        &service_spec("weighted", &members, Ensemble::WeightedMean, 5_000),
    )
    .await;
    let mut matrix = service_spec("matrix", &members, Ensemble::Mean, 5_000);
    matrix.inputs = vec![TensorSpec {
        name: "x".into(),
        datatype: "FP64".into(),
        shape: vec![-1, -1],
    }];
    put_service(&stack, &matrix).await;
    let (_predictor, base) = spawn_predictor(&stack).await;
    let rest = Rest::new(&base, &stack.token);

    // Until both workers have loaded, answers are partial or refused.
    let whole = |service: &'static str| {
        let rest = &rest;
        async move {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            loop {
                let reply = rest
                    .post_json(&format!("/v2/models/{service}/infer"), &x_request(&[1.0, 2.5, -3.0]))
                    .await;
                if reply.status == 200 && reply.json()["parameters"]["kiln.partial"] == false {
                    return reply.json();
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{service} never answered by both members"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let answer = whole("scale").await;
    assert_eq!(y_of(&answer), vec![3.0, 7.5, -9.0], "{answer}");
    assert_eq!(answer["model_name"], "scale");
    assert_eq!(answer["model_version"], "1");
    assert_eq!(answer["parameters"]["kiln.members_used"], 2);
    assert_eq!(answer["parameters"]["kiln.members"], 2);

    // The weighted mean weighs quadruple 3 to 1: (1·2 + 3·4)/4 = 3.5 times x.
    let answer = whole("weighted").await;
    assert_eq!(y_of(&answer), vec![3.5, 8.75, -10.5], "{answer}");

    // The binary tensor extension both ways.
    let request = InferRequest {
        id: Some("r-1".into()),
        parameters: [("binary_data_output".to_string(), json!(true))].into_iter().collect(),
        inputs: vec![Tensor {
            name: "x".into(),
            datatype: DataType::Fp64,
            shape: vec![2],
            parameters: Default::default(),
            data: Data::Float(vec![0.5, 4.0]),
        }],
        outputs: Vec::new(),
    };
    let (body, header_length) = request.encode(&|_| true);
    let reply = rest
        .post(
            "/v2/models/scale/infer",
            &[(HEADER_LENGTH, header_length.expect("a binary part").to_string())],
            body,
        )
        .await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    let length: usize = reply.headers[HEADER_LENGTH].to_str().unwrap().parse().unwrap();
    let response = InferResponse::parse(&reply.body, Some(length), &Limits::default()).expect("a binary answer");
    assert_eq!(response.id.as_deref(), Some("r-1"));
    assert_eq!(
        response.outputs[0].data,
        Data::Float(vec![1.5, 12.0]),
        "the mean of 2x and 4x"
    );

    // SINGA-Auto's /predict, for one query and for several: the queries are stacked into the
    // service's declared input, x (FP64 [-1, -1]), and the output split back per query.
    whole_matrix(&rest).await;
    let reply = rest.post_json("/predict/matrix", &json!({"query": [1.0, 2.0]})).await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.json(), json!({"prediction": [3.0, 6.0]}));
    let reply = rest
        .post_json("/predict/matrix", &json!({"queries": [[1.0], [4.0]]}))
        .await;
    assert_eq!(reply.json(), json!({"predictions": [[3.0], [12.0]]}));
    // With three services here, /predict must name one.
    let reply = rest.post_json("/predict", &json!({"query": [1.0]})).await;
    assert_eq!(reply.status, 400);
    assert_eq!(
        reply.error(),
        "3 services you may use are served here: name one, as POST /predict/NAME or /predict/PROJECT/NAME"
    );

    // Metadata and health.
    let metadata = rest.get("/v2/models/scale").await.json();
    assert_eq!(metadata["name"], "scale");
    assert_eq!(metadata["versions"], json!(["1"]));
    assert_eq!(rest.get("/v2/models/scale/ready").await.status, 200);
    assert_eq!(rest.get("/v2/health/ready").await.status, 200);
}

/// Waits until both members of `matrix` answer.
async fn whole_matrix(rest: &Rest) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let body = json!({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP64", "data": [1.0]}]});
    loop {
        let reply = rest.post_json("/v2/models/matrix/infer", &body).await;
        if reply.status == 200 && reply.json()["parameters"]["kiln.partial"] == false {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "matrix never answered by both members"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_are_refused_with_the_problem_named() {
    let stack = Stack::start_without_runner().await;
    let mut typed = service_spec("typed", &[("m", 1.0)], Ensemble::Mean, 1_000);
    typed.inputs = vec![TensorSpec {
        name: "x".into(),
        datatype: "FP32".into(),
        shape: vec![-1, 4],
    }];
    put_service(&stack, &typed).await;
    let (_predictor, base) = spawn_predictor(&stack).await;
    let rest = Rest::new(&base, &stack.token);
    let infer = "/v2/models/typed/infer";
    let refused = |body: serde_json::Value| {
        let rest = &rest;
        async move {
            let reply = rest.post_json(infer, &body).await;
            assert_eq!(reply.status, 400, "{body}: {}", String::from_utf8_lossy(&reply.body));
            reply.error()
        }
    };
    let shape =
        refused(json!({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]}]}))
            .await;
    assert!(
        shape.contains("input `x` is FP32 [2, 3]; model `typed` takes FP32 [-1, 4]"),
        "{shape}"
    );
    let datatype =
        refused(json!({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]}]})).await;
    assert!(datatype.contains("input `x` is INT32 [1, 4]"), "{datatype}");
    let count = refused(json!({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2]}]})).await;
    assert!(count.contains("`x`"), "{count}");
    let unknown_input =
        refused(json!({"inputs": [{"name": "z", "shape": [1], "datatype": "FP32", "data": [1]}]})).await;
    assert!(
        unknown_input.contains("input `z` is not an input of model `typed` (its inputs: x)"),
        "{unknown_input}"
    );
    let timeout = refused(json!({"parameters": {"timeout": -5}, "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})).await;
    assert!(timeout.contains("parameters.timeout is -5"), "{timeout}");

    let reply = rest.post(infer, &[], b"{not json".to_vec()).await;
    assert_eq!(reply.status, 400);
    let reply = rest.post_json("/v2/models/nothing/infer", &x_request(&[1.0])).await;
    assert_eq!(reply.status, 400);
    assert!(
        reply.error().starts_with("unknown model `nothing`"),
        "{}",
        reply.error()
    );
    let big = vec![b' '; 65 * 1024];
    let reply = rest.post(infer, &[], big).await;
    assert_eq!(reply.status, 400);
    assert!(reply.error().contains("larger than 65536 bytes"), "{}", reply.error());

    // No token, a wrong one.
    let anonymous = Rest::new(&base, "");
    assert_eq!(anonymous.post_json(infer, &x_request(&[1.0])).await.status, 401);
    let wrong = Rest::new(&base, "kiln_0000_0000");
    assert_eq!(wrong.get("/v2/models/typed").await.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_without_workers_is_refused_at_once_with_the_reason() {
    let stack = Stack::start_without_runner().await;
    put_service(&stack, &service_spec("lonely", &[("m", 1.0)], Ensemble::Mean, 10_000)).await;
    let (_predictor, base) = spawn_predictor(&stack).await;
    let rest = Rest::new(&base, &stack.token);
    let started = tokio::time::Instant::now();
    let reply = rest.post_json("/v2/models/lonely/infer", &x_request(&[1.0])).await;
    assert_eq!(reply.status, 503);
    assert!(
        reply
            .error()
            .contains("0 of 1 member(s) of `lonely` answered; the quorum is 1: no worker is serving m"),
        "{}",
        reply.error()
    );
    // Refused, not waited out: well inside the 10 s deadline.
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_worker_is_answered_around_ejected_and_taken_back() {
    let stack = Stack::start_without_runner().await;
    let dir = stack.dir.path();
    let steady = Worker::spawn(dir, "steady", SCALE_WORKER, &[("FACTOR", "2")]);
    let flaky = Worker::spawn(dir, "flaky", SCALE_WORKER, &[("FACTOR", "2")]);
    let relays = RelayMetrics::default();
    let _relays = [
        spawn_relay(&stack, "pair", 1, "steady", steady.addr(), &relays).await,
        spawn_relay(&stack, "pair", 1, "flaky", flaky.addr(), &relays).await,
    ];
    put_service(
        &stack,
        &service_spec("pair", &[("steady", 1.0), ("flaky", 1.0)], Ensemble::Mean, 1_000),
    )
    .await;
    let (_predictor, base) = spawn_predictor(&stack).await;
    let rest = Rest::new(&base, &stack.token);
    let infer = "/v2/models/pair/infer";
    let whole =
        |reply: &kiln_e2e::serving::Reply| reply.status == 200 && reply.json()["parameters"]["kiln.partial"] == false;
    let until = |want_whole: bool| {
        let rest = &rest;
        async move {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            loop {
                let reply = rest.post_json(infer, &x_request(&[1.0])).await;
                assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
                assert_eq!(y_of(&reply.json()), vec![2.0]);
                if whole(&reply) == want_whole {
                    return reply;
                }
                assert!(tokio::time::Instant::now() < deadline, "never whole = {want_whole}");
            }
        }
    };
    rest.post_until(infer, &x_request(&[1.0]), 200).await;
    until(true).await;

    flaky.pause();
    // Every request is answered, by steady alone, and flagged.
    let mut late = 0;
    for _ in 0..40 {
        let reply = rest.post_json(infer, &x_request(&[1.0])).await;
        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
        let answer = reply.json();
        assert_eq!(y_of(&answer), vec![2.0]);
        assert_eq!(answer["parameters"]["kiln.partial"], true, "{answer}");
        assert_eq!(answer["parameters"]["kiln.missing"], "flaky");
        assert_eq!(answer["parameters"]["kiln.members_used"], 1);
        late += 1;
    }
    assert_eq!(late, 40);
    // Its relay took it out of rotation once, after missing 3 deadlines in a row: from then on
    // flaky is unavailable at once rather than waited for.
    assert_eq!(relays.ejections("default", "pair", "flaky"), 1);
    assert_eq!(relays.ejections("default", "pair", "steady"), 0);

    flaky.signal(Signal::SIGCONT);
    let back = until(true).await;
    assert_eq!(back.json()["parameters"]["kiln.members_used"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_worker_under_load_fails_no_request() {
    let stack = Stack::start_without_runner().await;
    let dir = stack.dir.path();
    let mut first = Worker::spawn(dir, "first", SCALE_WORKER, &[("FACTOR", "3")]);
    let second = Worker::spawn(dir, "second", SCALE_WORKER, &[("FACTOR", "3")]);
    let relays = [RelayMetrics::default(), RelayMetrics::default()];
    let _relays = [
        spawn_relay(&stack, "solo", 1, "m", first.addr(), &relays[0]).await,
        spawn_relay(&stack, "solo", 1, "m", second.addr(), &relays[1]).await,
    ];
    put_service(&stack, &service_spec("solo", &[("m", 1.0)], Ensemble::Mean, 2_000)).await;
    let (_predictor, base) = spawn_predictor(&stack).await;
    let rest = std::sync::Arc::new(Rest::new(&base, &stack.token));
    // Both workers in rotation, and known to the predictor, before the load starts: each relay
    // has answered over its direct channel. (A request NATS routes to a relay as it leaves the
    // queue group can be lost: the relay's module docs say why.)
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while relays
        .iter()
        .any(|relay| relay.requests("default", "solo", "m", "direct", "answered") == 0)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the predictor never learnt both relays"
        );
        rest.post_until("/v2/models/solo/infer", &x_request(&[1.0]), 200).await;
    }

    let load = |rest: std::sync::Arc<Rest>| async move {
        let mut answered = 0;
        for at in 0..200 {
            let reply = rest
                .post_json("/v2/models/solo/infer", &x_request(&[f64::from(at)]))
                .await;
            assert_eq!(
                reply.status,
                200,
                "request {at}: {}",
                String::from_utf8_lossy(&reply.body)
            );
            assert_eq!(y_of(&reply.json()), vec![3.0 * f64::from(at)]);
            answered += 1;
        }
        answered
    };
    let clients: Vec<_> = (0..4).map(|_| tokio::spawn(load(rest.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.kill();
    let mut answered = 0;
    for client in clients {
        answered += client.await.expect("a client");
    }
    assert_eq!(answered, 800);
}

/// Service names are unique per project: `alpha` and `beta` each serve a `scale` (alpha's
/// doubles, beta's triples). A viewer of one infers by the bare name and reaches its own; a
/// viewer of both must say which (409 naming the two), as `PROJECT/NAME` in the path or with
/// `%2F`, over HTTP and gRPC; a service of a project the caller may not read is answered as an
/// unknown model.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_projects_serve_one_name_and_each_caller_reaches_its_own() {
    use kiln_proto::v1 as pb;
    let stack = Stack::start_without_runner().await;
    for project in ["alpha", "beta"] {
        stack.create_project(project).await;
    }
    let ada = stack.create_user("ada").await;
    stack.add_member("alpha", "ada", pb::Role::Viewer).await;
    let bob = stack.create_user("bob").await;
    stack.add_member("beta", "bob", pb::Role::Viewer).await;
    let carol = stack.create_user("carol").await;
    stack.add_member("alpha", "carol", pb::Role::Viewer).await;
    stack.add_member("beta", "carol", pb::Role::Viewer).await;

    let dir = stack.dir.path();
    let double = Worker::spawn(dir, "double", SCALE_WORKER, &[("FACTOR", "2")]);
    let triple = Worker::spawn(dir, "triple", SCALE_WORKER, &[("FACTOR", "3")]);
    let relays = RelayMetrics::default();
    let _handles = [
        spawn_relay_in(&stack, "alpha", "scale", 1, "m", double.addr(), &relays).await,
        spawn_relay_in(&stack, "beta", "scale", 1, "m", triple.addr(), &relays).await,
    ];
    for project in ["alpha", "beta"] {
        let spec = kiln_core::serving::ServiceSpec {
            project: project.into(),
            ..service_spec("scale", &[("m", 1.0)], Ensemble::Mean, 5_000)
        };
        put_service(&stack, &spec).await;
    }
    let (_predictor, base, grpc) = spawn_predictor_with_api(&stack).await;
    let x = x_request(&[1.0]);

    // Each viewer of one project: the bare name is its own.
    let ada_rest = Rest::new(&base, &ada);
    let bob_rest = Rest::new(&base, &bob);
    let reply = ada_rest.post_until("/v2/models/scale/infer", &x, 200).await;
    assert_eq!(y_of(&reply.json()), [2.0], "alpha's doubles");
    let reply = bob_rest.post_until("/v2/models/scale/infer", &x, 200).await;
    assert_eq!(y_of(&reply.json()), [3.0], "beta's triples");

    // The other project's reads as an unknown model, whatever the form.
    for (theirs, unknown) in [
        ("/v2/models/beta/scale/infer", "/v2/models/beta/nothing/infer"),
        ("/v2/models/beta%2Fscale/infer", "/v2/models/beta%2Fnothing/infer"),
    ] {
        let theirs = ada_rest.post_json(theirs, &x).await;
        let unknown = ada_rest.post_json(unknown, &x).await;
        assert_eq!(theirs.status, 400, "{}", theirs.error());
        assert_eq!(
            (theirs.status, theirs.error().replace("beta/scale", "<ref>")),
            (unknown.status, unknown.error().replace("beta/nothing", "<ref>"))
        );
    }
    assert_eq!(ada_rest.get("/v2/models/beta/scale/ready").await.status, 400);

    // A viewer of both: the bare name is ambiguous, the qualified forms reach each.
    let carol_rest = Rest::new(&base, &carol);
    let ambiguous = carol_rest.post_json("/v2/models/scale/infer", &x).await;
    assert_eq!(ambiguous.status, 409, "{}", ambiguous.error());
    assert!(
        ambiguous.error().contains("(alpha, beta)") && ambiguous.error().contains("PROJECT/scale"),
        "{}",
        ambiguous.error()
    );
    for (path, y, named) in [
        ("/v2/models/alpha/scale/infer", 2.0, "alpha/scale"),
        ("/v2/models/beta/scale/infer", 3.0, "beta/scale"),
        ("/v2/models/beta%2Fscale/infer", 3.0, "beta/scale"),
        ("/v2/models/alpha/scale/versions/1/infer", 2.0, "alpha/scale"),
    ] {
        let reply = carol_rest.post_json(path, &x).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.error());
        assert_eq!(y_of(&reply.json()), [y], "{path}");
        assert_eq!(reply.json()["model_name"], named, "answered as it was named");
    }
    let metadata = carol_rest.get("/v2/models/beta/scale").await;
    assert_eq!(metadata.status, 200);
    assert_eq!(metadata.json()["name"], "beta/scale");
    assert_eq!(carol_rest.get("/v2/models/alpha/scale/ready").await.status, 200);
    assert_eq!(carol_rest.get("/v2/models/scale/ready").await.status, 409);
    // /predict without a name: two services carol may use, one ada may.
    let unnamed = carol_rest.post_json("/predict", &json!({"query": [1.0]})).await;
    assert!(
        unnamed.error().starts_with("2 services you may use"),
        "{}",
        unnamed.error()
    );
    let unnamed = ada_rest.post_json("/predict", &json!({"query": [1.0]})).await;
    let body = String::from_utf8_lossy(&unnamed.body);
    assert!(!body.contains("services you may use"), "{body}");

    // gRPC: the same names.
    let mut client = kiln_e2e::serving::inference_client(grpc, &carol).await;
    let metadata = |name: &str| kiln_proto::inference::ModelMetadataRequest {
        name: name.into(),
        version: String::new(),
    };
    let found = client
        .model_metadata(metadata("alpha/scale"))
        .await
        .expect("alpha/scale");
    assert_eq!(found.into_inner().name, "alpha/scale");
    let refused = client.model_metadata(metadata("scale")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    let mut client = kiln_e2e::serving::inference_client(grpc, &ada).await;
    let theirs = client.model_metadata(metadata("beta/scale")).await.unwrap_err();
    let unknown = client.model_metadata(metadata("beta/nothing")).await.unwrap_err();
    assert_eq!(
        (theirs.code(), theirs.message().replace("beta/scale", "<ref>")),
        (unknown.code(), unknown.message().replace("beta/nothing", "<ref>"))
    );
    assert_eq!(theirs.code(), tonic::Code::InvalidArgument);
}

/// `ServeService` on names per project: alpha and beta each make a service `digits` of their own
/// model `digits`; each member sees and acts on its own by the bare name; another project's
/// service (and model, in a definition) reads as unknown until the caller has a role there, and
/// a viewer of both names one as `PROJECT/NAME` or with `project`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn service_records_and_their_models_are_per_project() {
    use kiln_proto::v1 as pb;
    let stack = Stack::start_without_runner().await;
    for project in ["alpha", "beta"] {
        stack.create_project(project).await;
    }
    let ada = stack.create_user("ada").await;
    stack.add_member("alpha", "ada", pb::Role::Member).await;
    let bob = stack.create_user("bob").await;
    stack.add_member("beta", "bob", pb::Role::Member).await;
    for project in ["alpha", "beta"] {
        stack
            .store
            .insert_model_version(kiln_core::store::NewModelVersion {
                model: "digits".into(),
                project: project.into(),
                created_by: "admin".into(),
                job_id: format!("{project}-job"),
                lineage_json: "{}".into(),
                digest: format!("sha256:{}", "0".repeat(64)),
                ..Default::default()
            })
            .await
            .expect("a model");
    }
    let (_predictor, _, api) = spawn_predictor_with_api(&stack).await;
    let definition = |model: &str| pb::ServiceDefinition {
        models: vec![pb::ServiceModel {
            model: model.into(),
            ..Default::default()
        }],
        scaling: Some(pb::Scaling {
            min_replicas: 0,
            max_replicas: 1,
            ..Default::default()
        }),
        worker: Some(kiln_e2e::spec(&["true"])),
        ..Default::default()
    };
    let create = |name: &str, project: &str, model: &str| pb::CreateServiceRequest {
        name: name.into(),
        project: project.into(),
        definition: Some(definition(model)),
    };
    let mut ada_serve = kiln_e2e::serving::serve_client(api, &ada).await;
    let mut bob_serve = kiln_e2e::serving::serve_client(api, &bob).await;
    let alpha = ada_serve
        .create_service(create("digits", "alpha", "digits"))
        .await
        .expect("alpha's");
    let beta = bob_serve
        .create_service(create("digits", "beta", "digits"))
        .await
        .expect("beta's");
    assert_eq!(alpha.get_ref().members[0].model_version, "digits:1");
    assert_eq!(
        (alpha.get_ref().project.as_str(), beta.get_ref().project.as_str()),
        ("alpha", "beta")
    );
    let again = bob_serve
        .create_service(create("digits", "beta", "digits"))
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists, "{again:?}");
    let reserved = bob_serve
        .create_service(create("ready", "beta", "digits"))
        .await
        .unwrap_err();
    assert_eq!(reserved.code(), tonic::Code::InvalidArgument, "{reserved:?}");

    let get = |name: &str, project: &str| pb::GetServiceRequest {
        name: name.into(),
        project: project.into(),
    };
    // Each by the bare name: its own.
    let own = bob_serve.get_service(get("digits", "")).await.expect("bob's own");
    assert_eq!(own.get_ref().project, "beta");
    let listed = bob_serve
        .list_services(pb::ListServicesRequest::default())
        .await
        .expect("list")
        .into_inner()
        .services;
    assert_eq!(
        listed
            .iter()
            .map(|s| format!("{}/{}", s.project, s.name))
            .collect::<Vec<_>>(),
        ["beta/digits"]
    );
    // alpha's, from bob, in any form: as an unknown service; a model of alpha likewise.
    let shape = |status: tonic::Status, value: &str| (status.code(), status.message().replace(value, "<ref>"));
    for (theirs, unknown) in [
        (get("alpha/digits", ""), get("alpha/nothing", "")),
        (get("digits", "alpha"), get("nothing", "alpha")),
    ] {
        let (theirs_name, unknown_name) = (theirs.name.clone(), unknown.name.clone());
        let theirs = bob_serve.get_service(theirs).await.unwrap_err();
        let unknown = bob_serve.get_service(unknown).await.unwrap_err();
        assert_eq!(theirs.code(), tonic::Code::NotFound);
        assert_eq!(shape(theirs, &theirs_name), shape(unknown, &unknown_name));
    }
    let stop = bob_serve
        .stop_service(pb::StopServiceRequest {
            name: "alpha/digits".into(),
            project: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(stop.code(), tonic::Code::NotFound);
    let borrowed = bob_serve
        .create_service(create("mixed", "beta", "alpha/digits@none"))
        .await
        .unwrap_err();
    let missing = bob_serve
        .create_service(create("mixed", "beta", "alpha/nothing@none"))
        .await
        .unwrap_err();
    assert_eq!(shape(borrowed, "alpha/digits"), shape(missing, "alpha/nothing"));

    // A viewer of alpha too: alpha's by its qualified name or project; the bare one is ambiguous.
    stack.add_member("alpha", "bob", pb::Role::Viewer).await;
    let theirs = bob_serve
        .get_service(get("alpha/digits", ""))
        .await
        .expect("alpha's, named");
    assert_eq!(theirs.get_ref().project, "alpha");
    let theirs = bob_serve
        .get_service(get("digits", "alpha"))
        .await
        .expect("alpha's, by project");
    assert_eq!(theirs.get_ref().project, "alpha");
    let ambiguous = bob_serve.get_service(get("digits", "")).await.unwrap_err();
    assert_eq!(ambiguous.code(), tonic::Code::FailedPrecondition, "{ambiguous:?}");
    assert!(ambiguous.message().contains("(alpha, beta)"), "{ambiguous:?}");
    // A viewer may not stop it; and may serve alpha's model from beta, named as alpha's.
    let stop = bob_serve
        .stop_service(pb::StopServiceRequest {
            name: "alpha/digits".into(),
            project: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(stop.code(), tonic::Code::PermissionDenied, "{stop:?}");
    let mixed = bob_serve
        .create_service(create("mixed", "beta", "alpha/digits"))
        .await
        .expect("mixed");
    let members: Vec<_> = mixed
        .get_ref()
        .members
        .iter()
        .map(|m| (m.member.clone(), m.model_version.clone()))
        .collect();
    assert_eq!(members, [("digits".to_string(), "alpha/digits:1".to_string())]);
}

/// A live definition written before names were per project (keyed by the bare name in
/// `kiln_services`) is not served, and the controller deletes it; those keyed `PROJECT.NAME`
/// stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn definitions_keyed_by_a_global_name_are_deleted() {
    let stack = Stack::start_without_runner().await;
    let old = service_spec("old", &[("m", 1.0)], Ensemble::Mean, 5_000);
    let bucket = async_nats::jetstream::new(stack.nats.client().await)
        .get_key_value(kiln_core::subjects::BUCKET_SERVICES)
        .await
        .expect("the services bucket");
    bucket
        .put("old", serde_json::to_vec(&old).expect("json").into())
        .await
        .expect("a definition of before");
    put_service(&stack, &service_spec("fresh", &[("m", 1.0)], Ensemble::Mean, 5_000)).await;
    let (_predictor, base) = spawn_predictor(&stack).await;
    let rest = Rest::new(&base, &stack.token);
    let reply = rest.get("/v2/models/old").await;
    assert_eq!(reply.status, 400, "{}", String::from_utf8_lossy(&reply.body));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while bucket.get("old").await.expect("read the bucket").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the old key was never deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(bucket.get("default.fresh").await.expect("read the bucket").is_some());
    assert_eq!(rest.get("/v2/models/fresh").await.status, 200);
}
