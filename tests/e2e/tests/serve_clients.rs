//! Real Open Inference Protocol clients against a predictor: Triton's Python clients
//! (`tritonclient.http` with JSON and binary tensors, `tritonclient.grpc`) run by the SDK's
//! venv Python, the `kserve` client (REST v2 and gRPC) run by a venv of its own,
//! `perf_analyzer`, and a tonic client of `inference.GRPCInferenceService` from `kiln_proto`. The
//! stack is the serve test's: two Python workers through `kiln.serve`, their relays, a
//! mean-ensemble service and a predictor on real NATS.

use std::net::SocketAddr;
use std::time::Duration;

use kiln_core::serving::{Ensemble, ServiceSpec, TensorSpec};
use kiln_e2e::serving::{
    Rest, SCALE_WORKER, Worker, inference_client, put_service, run_python, run_python_with, service_spec,
    spawn_predictor_with_api, spawn_relay,
};
use kiln_e2e::{PATIENCE, ServiceHandle, Stack};
use kiln_formats::oip::{Data, DataType, Limits, Tensor};
use kiln_proto::inference as oip;
use kiln_proto::inference::infer_parameter::ParameterChoice;
use kiln_runner::relay::RelayMetrics;
use serde_json::json;

/// The client script; it asserts and exits non-zero on the first failure.
const CLIENTS: &str = include_str!("serve_clients.py");

/// The kserve client's script, likewise.
const KSERVE: &str = include_str!("serve_kserve.py");

/// A service stack: `scale`, the mean of a worker doubling `x` and one quadrupling it, so
/// `y = 3x`; its input `x` is FP64 of any length.
struct Scale {
    stack: Stack,
    rest: String,
    grpc: SocketAddr,
    _workers: Vec<Worker>,
    _handles: Vec<ServiceHandle>,
}

impl Scale {
    async fn start() -> Scale {
        let stack = Stack::start_without_runner().await;
        let dir = stack.dir.path();
        let double = Worker::spawn(dir, "double", SCALE_WORKER, &[("FACTOR", "2")]);
        let quadruple = Worker::spawn(dir, "quadruple", SCALE_WORKER, &[("FACTOR", "4")]);
        let relays = RelayMetrics::default();
        let mut handles = vec![
            spawn_relay(&stack, "scale", 1, "double", double.addr(), &relays).await,
            spawn_relay(&stack, "scale", 1, "quadruple", quadruple.addr(), &relays).await,
        ];
        let fp64 = |name: &str| TensorSpec {
            name: name.into(),
            datatype: "FP64".into(),
            shape: vec![-1],
        };
        put_service(
            &stack,
            &ServiceSpec {
                inputs: vec![fp64("x")],
                outputs: vec![fp64("y")],
                ..service_spec("scale", &[("double", 1.0), ("quadruple", 1.0)], Ensemble::Mean, 5_000)
            },
        )
        .await;
        let (predictor, rest, grpc) = spawn_predictor_with_api(&stack).await;
        handles.push(predictor);
        let scale = Scale {
            stack,
            rest,
            grpc,
            _workers: vec![double, quadruple],
            _handles: handles,
        };
        scale.wait_whole().await;
        scale
    }

    /// Waits until both members answer (their workers loaded and in rotation).
    async fn wait_whole(&self) {
        let rest = Rest::new(&self.rest, &self.stack.token);
        let body = json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1.0]}]});
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let reply = rest.post_json("/v2/models/scale/infer", &body).await;
            if reply.status == 200 && reply.json()["parameters"]["kiln.partial"] == false {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "scale never answered by both members"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Triton's clients name the model by its bare name and as `PROJECT/NAME` (service names are
/// unique per project; the URLs they build then have the project as a segment of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn triton_s_python_clients_infer_over_rest_and_grpc() {
    let scale = Scale::start().await;
    let http = scale.rest.trim_start_matches("http://").to_string();
    let grpc = scale.grpc.to_string();
    for model in ["scale", "default/scale"] {
        let out = run_python(
            scale.stack.dir.path(),
            "clients",
            CLIENTS,
            &[
                ("KILN_PREDICTOR_HTTP", &http),
                ("KILN_PREDICTOR_GRPC", &grpc),
                ("KILN_TOKEN", &scale.stack.token),
                ("KILN_MODEL", model),
                ("NO_PROXY", "*"),
            ],
            PATIENCE * 2,
        )
        .await;
        assert!(
            out.contains("tritonclient.http ok") && out.contains("tritonclient.grpc ok"),
            "{model}: {out}"
        );
    }
}

/// The Python of the kserve client's venv (its pins clash with the SDK's).
fn kserve_python() -> String {
    std::env::var("KILN_TEST_KSERVE_PYTHON").expect(
        "KILN_TEST_KSERVE_PYTHON is not set: run the tests through scripts/test.sh, which makes the kserve venv",
    )
}

/// The kserve client, by the bare name and as `PROJECT/NAME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_kserve_client_infers_over_rest_and_grpc() {
    let python = kserve_python();
    let scale = Scale::start().await;
    let http = scale.rest.trim_start_matches("http://").to_string();
    let grpc = scale.grpc.to_string();
    for model in ["scale", "default/scale"] {
        let env = [
            ("KILN_PREDICTOR_HTTP", http.as_str()),
            ("KILN_PREDICTOR_GRPC", grpc.as_str()),
            ("KILN_TOKEN", scale.stack.token.as_str()),
            ("KILN_MODEL", model),
            ("NO_PROXY", "*"),
        ];
        let out = run_python_with(
            &python,
            scale.stack.dir.path(),
            "kserve_clients",
            KSERVE,
            &env,
            PATIENCE * 2,
        )
        .await;
        assert!(
            out.contains("kserve rest ok") && out.contains("kserve grpc ok"),
            "{model}: {out}"
        );
    }
}

fn x_input(shape: &[i64]) -> oip::model_infer_request::InferInputTensor {
    oip::model_infer_request::InferInputTensor {
        name: "x".into(),
        datatype: "FP64".into(),
        shape: shape.to_vec(),
        ..Default::default()
    }
}

fn raw_f64(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|value| value.to_le_bytes()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tonic_client_infers_with_raw_contents_and_bad_requests_name_the_tensor() {
    let scale = Scale::start().await;
    let mut client = inference_client(scale.grpc, &scale.stack.token).await;

    let live = client.server_live(oip::ServerLiveRequest {}).await.expect("live");
    assert!(live.into_inner().live);
    let metadata = client
        .model_metadata(oip::ModelMetadataRequest {
            name: "scale".into(),
            version: String::new(),
        })
        .await
        .expect("metadata")
        .into_inner();
    assert_eq!(
        (metadata.name.as_str(), metadata.versions.as_slice()),
        ("scale", &["1".to_string()][..])
    );
    assert_eq!(metadata.platform, "kiln-ensemble-mean");

    // Raw contents in and out.
    let reply = client
        .model_infer(oip::ModelInferRequest {
            model_name: "scale".into(),
            model_version: "1".into(),
            id: "t-1".into(),
            inputs: vec![x_input(&[3])],
            raw_input_contents: vec![raw_f64(&[0.5, 4.0, -1.0])],
            ..Default::default()
        })
        .await
        .expect("an answer")
        .into_inner();
    assert_eq!(reply.id, "t-1");
    assert_eq!(reply.outputs.len(), 1);
    assert_eq!(reply.raw_output_contents.len(), 1);
    let output = &reply.outputs[0];
    assert_eq!(
        (output.name.as_str(), output.datatype.as_str(), output.shape.as_slice()),
        ("y", "FP64", &[3][..])
    );
    let y = Tensor::from_raw(
        output.name.clone(),
        DataType::Fp64,
        vec![3],
        &reply.raw_output_contents[0],
        "output",
        &Limits::default(),
    )
    .expect("raw FP64");
    assert_eq!(y.data, Data::Float(vec![1.5, 12.0, -3.0]), "the mean of 2x and 4x");
    let parameter = |name: &str| {
        reply
            .parameters
            .get(name)
            .and_then(|parameter| parameter.parameter_choice.clone())
    };
    assert_eq!(parameter("kiln.partial"), Some(ParameterChoice::BoolParam(false)));
    assert_eq!(parameter("kiln.members_used"), Some(ParameterChoice::Int64Param(2)));

    // Typed contents in, raw out.
    let reply = client
        .model_infer(oip::ModelInferRequest {
            model_name: "scale".into(),
            inputs: vec![oip::model_infer_request::InferInputTensor {
                contents: Some(oip::InferTensorContents {
                    fp64_contents: vec![2.0],
                    ..Default::default()
                }),
                ..x_input(&[1])
            }],
            ..Default::default()
        })
        .await
        .expect("an answer")
        .into_inner();
    assert_eq!(reply.raw_output_contents, vec![raw_f64(&[6.0])]);

    // Bad requests: INVALID_ARGUMENT, the tensor named.
    let refused = |request: oip::ModelInferRequest| {
        let mut client = client.clone();
        async move {
            let status = client.model_infer(request).await.expect_err("refused");
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
            status.message().to_string()
        }
    };
    let short = refused(oip::ModelInferRequest {
        model_name: "scale".into(),
        inputs: vec![x_input(&[3])],
        raw_input_contents: vec![raw_f64(&[1.0, 2.0])],
        ..Default::default()
    })
    .await;
    assert_eq!(
        short,
        "input `x`: its raw contents are 16 bytes, but 3 FP64 elements take 24"
    );
    let wrong_type = refused(oip::ModelInferRequest {
        model_name: "scale".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            datatype: "INT32".into(),
            ..x_input(&[2])
        }],
        raw_input_contents: vec![vec![0; 8]],
        ..Default::default()
    })
    .await;
    assert!(
        wrong_type.contains("input `x` is INT32 [2]; model `scale` takes FP64 [-1]"),
        "{wrong_type}"
    );
    let unknown = refused(oip::ModelInferRequest {
        model_name: "nothing".into(),
        inputs: vec![x_input(&[1])],
        raw_input_contents: vec![raw_f64(&[1.0])],
        ..Default::default()
    })
    .await;
    assert!(unknown.starts_with("unknown model `nothing`"), "{unknown}");
    let version = refused(oip::ModelInferRequest {
        model_name: "scale".into(),
        model_version: "7".into(),
        inputs: vec![x_input(&[1])],
        raw_input_contents: vec![raw_f64(&[1.0])],
        ..Default::default()
    })
    .await;
    assert_eq!(version, "model `scale` has no version 7; it serves revision 1");

    // No token: only liveness and readiness answer.
    let mut anonymous = inference_client(scale.grpc, "").await;
    assert!(
        anonymous
            .server_ready(oip::ServerReadyRequest {})
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    let status = anonymous
        .model_ready(oip::ModelReadyRequest {
            name: "scale".into(),
            version: String::new(),
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

    // kiln's own services on the same port still go through its AuthLayer.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", scale.grpc))
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect");
    let node = |token: &str| {
        kiln_proto::v1::node_service_client::NodeServiceClient::with_interceptor(
            channel.clone(),
            kiln_core::auth::BearerInterceptor::new(token),
        )
    };
    let status = node("")
        .who_am_i(kiln_proto::v1::WhoAmIRequest {})
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    node(&scale.stack.token)
        .who_am_i(kiln_proto::v1::WhoAmIRequest {})
        .await
        .expect("kiln's NodeService answers a token");
}

/// Where `perf_analyzer` is: tritonclient 2.50.0's manylinux wheel ships it (the last release
/// before it left the wheel whose build runs on glibc 2.36), installed with `pip install
/// --no-deps tritonclient==2.50.0 nvidia-cuda-runtime-cu12` into a venv of its own (its
/// `tritonclient` cannot share the SDK's venv), plus the system's `libb64-0d`.
fn perf_analyzer() -> std::path::PathBuf {
    std::env::var_os("KILN_TEST_PERF_ANALYZER")
        .map(std::path::PathBuf::from)
        .expect(
            "KILN_TEST_PERF_ANALYZER is not set: run the tests through scripts/test.sh, which installs perf_analyzer",
        )
}

/// The directory of `libcudart.so.12` (which perf_analyzer links, GPU or not) in the venv of
/// `binary`, from the `nvidia-cuda-runtime-cu12` wheel.
fn cuda_runtime_dir(binary: &std::path::Path) -> Option<std::path::PathBuf> {
    let lib = binary.parent()?.parent()?.join("lib");
    std::fs::read_dir(lib).ok()?.flatten().find_map(|python| {
        let dir = python.path().join("site-packages/nvidia/cuda_runtime/lib");
        dir.join("libcudart.so.12").try_exists().ok()?.then_some(dir)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn perf_analyzer_holds_a_load_on_the_grpc_endpoint() {
    let binary = perf_analyzer();
    let scale = Scale::start().await;
    let mut command = tokio::process::Command::new(&binary);
    if let Some(dir) = cuda_runtime_dir(&binary) {
        let mut path = std::ffi::OsString::from(dir);
        if let Some(existing) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(existing);
        }
        command.env("LD_LIBRARY_PATH", path);
    }
    let grpc = scale.grpc.to_string();
    let auth = format!("authorization:Bearer {}", scale.stack.token);
    // Three 1 s windows at concurrency 2, any spread accepted as stable: a few seconds of load
    // through the model metadata and configuration it reads first.
    command
        .args(["-m", "scale", "-i", "grpc", "-u", &grpc, "-H", &auth, "--shape", "x:16"])
        .args([
            "--concurrency-range",
            "2:2",
            "--measurement-mode",
            "time_windows",
            "-p",
            "1000",
        ])
        .args(["-s", "1000", "--max-trials", "5"])
        .kill_on_drop(true);
    let output = tokio::time::timeout(PATIENCE, command.output())
        .await
        .expect("perf_analyzer ran too long")
        .expect("run perf_analyzer");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "perf_analyzer failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let throughput: f64 = stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("Throughput: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no throughput in:\n{stdout}"));
    assert!(throughput > 10.0, "{throughput} infer/s:\n{stdout}");
}
