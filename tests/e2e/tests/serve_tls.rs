//! The predictor's REST API over TLS: with `grpc.tls` set, the Open Inference Protocol's HTTP side
//! speaks HTTPS (HTTP/1.1) with the same certificate as its gRPC side. A client trusting the CA
//! infers, one that does not is refused in the handshake, and plain HTTP gets no answer. The
//! client is Python's standard library (the SDK's venv), as an application's would be.

use kiln_core::testing::TestCa;
use kiln_e2e::serving::{run_python, serve_double, spawn_predictor_configured};
use kiln_e2e::{PATIENCE, Stack};
use kiln_runner::relay::RelayMetrics;

const CLIENT: &str = r#"
import http.client, json, os, ssl, time

host, port = os.environ["KILN_PREDICTOR"].rsplit(":", 1)
body = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP64", "data": [1.0, 2.5]}]})
headers = {"Authorization": "Bearer " + os.environ["KILN_TOKEN"], "Content-Type": "application/json"}

def infer(context):
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    connection.request("POST", "/v2/models/scale/infer", body, headers)
    answer = connection.getresponse()
    return answer.status, answer.read()

trusting = ssl.create_default_context(cafile=os.environ["KILN_CA"])
deadline = time.monotonic() + 60
while True:  # until the worker is in rotation
    status, answer = infer(trusting)
    if status == 200 or time.monotonic() > deadline:
        break
    time.sleep(0.1)
assert status == 200, (status, answer)
assert json.loads(answer)["outputs"][0]["data"] == [2.0, 5.0], answer
print("https ok")

try:
    infer(ssl.create_default_context())
except ssl.SSLCertVerificationError:
    print("untrusted refused")

plain = http.client.HTTPConnection(host, int(port), timeout=10)
try:
    plain.request("POST", "/v2/models/scale/infer", body, headers)
    answer = plain.getresponse()
    print("plain answered", answer.status)
except (ConnectionError, http.client.HTTPException) as error:
    print("plain refused", type(error).__name__)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rest_api_speaks_tls_with_the_grpc_side_s_certificate() {
    let stack = Stack::start_without_runner().await;
    let certs = tempfile::tempdir().expect("a temp dir");
    let ca = TestCa::new(certs.path(), "kiln");
    let relays = RelayMetrics::default();
    let _double = serve_double(&stack, &relays).await;
    let tls = ca.server_tls("predictor", false);
    let (_predictor, base, _) = spawn_predictor_configured(&stack, |config| config.grpc.tls = tls).await;
    let addr = base
        .strip_prefix("https://")
        .unwrap_or_else(|| panic!("an https:// base URL: {base}"))
        .to_string();
    let ca_file = ca.ca_file.display().to_string();
    let env = [
        ("KILN_PREDICTOR", addr.as_str()),
        ("KILN_TOKEN", stack.token.as_str()),
        ("KILN_CA", ca_file.as_str()),
        ("NO_PROXY", "*"),
    ];
    let out = run_python(stack.dir.path(), "https_client", CLIENT, &env, PATIENCE * 2).await;
    assert!(out.contains("https ok"), "{out}");
    assert!(out.contains("untrusted refused"), "{out}");
    assert!(
        out.contains("plain refused"),
        "a plain HTTP request was answered: {out}"
    );
}
