"""The inference worker over real HTTP: `_Server` on port 0 in a thread, and `kiln.serve` as a
spawned program, talked to with http.client."""

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from kiln import _serve


@contextlib.contextmanager
def running(predict_fn, load_fn=None, *, load=True, **options):
    server = _serve._Server(predict_fn, load_fn, port=0, **options)
    if load:
        server.load()
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield server
    finally:
        server.shutdown(grace=5)
        serving.join(5)


def call(target, method, path, body=None):
    """(status, JSON answer, headers) of one request; `target` is a server or an open connection."""
    connection = target
    if not isinstance(target, http.client.HTTPConnection):
        connection = http.client.HTTPConnection("127.0.0.1", target.port, timeout=10)
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    connection.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
    response = connection.getresponse()
    raw = response.read()
    assert response.getheader("Content-Type") == "application/json"
    assert int(response.getheader("Content-Length")) == len(raw)
    return response.status, json.loads(raw), response


def infer(target, inputs, model="m", **fields):
    return call(target, "POST", f"/v2/models/{model}/infer", {"inputs": inputs, **fields})


def tensor(name, datatype, shape, data):
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def by_name(answer):
    return {output["name"]: output for output in answer["outputs"]}


def sums_and_argmax(model, inputs):
    x = inputs["x"]
    assert x.dtype == np.float32 and x.shape == (2, 3), (x.dtype, x.shape)
    return {"sum": x.sum(axis=1), "argmax": x.argmax(axis=1).astype(np.int64)}


def test_a_numpy_model_gets_fp32_arrays_nested_or_flat_and_answers_typed_outputs():
    with running(sums_and_argmax) as server:
        for data in ([[1.5, 2, 3], [4, 9, 6]], [1.5, 2, 3, 4, 9, 6]):
            status, answer, _ = infer(server, [tensor("x", "FP32", [2, 3], data)], model="resnet", id="r-1")
            assert status == 200, answer
            assert (answer["model_name"], answer["id"]) == ("resnet", "r-1")
            outputs = by_name(answer)
            assert outputs["sum"] == {"name": "sum", "datatype": "FP32", "shape": [2], "data": [6.5, 19.0]}
            assert outputs["argmax"] == {"name": "argmax", "datatype": "INT64", "shape": [2], "data": [2, 1]}
        status, answer, _ = call(server, "POST", "/v2/models/resnet/versions/3/infer", {"inputs": [tensor("x", "FP32", [2, 3], [0] * 6)]})
        assert status == 200 and answer["model_version"] == "3" and "id" not in answer


def test_numpy_outputs_keep_their_dtype_shape_and_scalars():
    def predict(model, inputs):
        return {
            "half": np.array([[0.5, 1.25]], dtype=np.float16),
            "u8": np.array([255, 0], dtype=np.uint8),
            "scalar": np.float64(2.5),
            "i32": np.int32(-7),
        }

    with running(predict) as server:
        status, answer, _ = infer(server, [tensor("x", "INT8", [1], [-128])])
        assert status == 200, answer
        outputs = by_name(answer)
        assert (outputs["half"]["datatype"], outputs["half"]["shape"], outputs["half"]["data"]) == ("FP16", [1, 2], [0.5, 1.25])
        assert (outputs["u8"]["datatype"], outputs["u8"]["data"]) == ("UINT8", [255, 0])
        assert (outputs["scalar"]["datatype"], outputs["scalar"]["shape"], outputs["scalar"]["data"]) == ("FP64", [], [2.5])
        assert (outputs["i32"]["datatype"], outputs["i32"]["shape"], outputs["i32"]["data"]) == ("INT32", [], [-7])


def test_without_numpy_inputs_are_nested_lists_and_list_outputs_are_typed(monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` now raises ImportError
    seen = {}

    def predict(model, inputs):
        seen.update(inputs)
        x = inputs["x"]
        return {
            "rows": [sum(row) for row in x],  # ints
            "scaled": [[value / 2 for value in row] for row in x],
            "flags": inputs["flags"],
            "count": len(x),
            "words": [word + b"!" for word in inputs["words"]],
        }

    with running(predict) as server:
        assert server._np is None
        status, answer, _ = infer(server, [
            tensor("x", "INT32", [2, 2], [1, 2, 3, 4]),
            tensor("flags", "BOOL", [3], [True, False, True]),
            tensor("words", "BYTES", [2], ["ab", "ç"]),
        ])
    assert status == 200, answer
    assert seen == {"x": [[1, 2], [3, 4]], "flags": [True, False, True], "words": [b"ab", "ç".encode()]}
    outputs = by_name(answer)
    assert outputs["rows"] == {"name": "rows", "datatype": "INT64", "shape": [2], "data": [3, 7]}
    assert outputs["scaled"] == {"name": "scaled", "datatype": "FP64", "shape": [2, 2], "data": [0.5, 1.0, 1.5, 2.0]}
    assert outputs["flags"] == {"name": "flags", "datatype": "BOOL", "shape": [3], "data": [True, False, True]}
    assert outputs["count"] == {"name": "count", "datatype": "INT64", "shape": [], "data": [2]}
    assert outputs["words"] == {"name": "words", "datatype": "BYTES", "shape": [2], "data": ["ab!", "ç!"]}


def test_the_list_conversions_without_numpy():
    assert _serve.decode_request(json.dumps({"inputs": [tensor("x", "FP32", [], [7])]}).encode(), None)[0] == {"x": 7}
    assert _serve.decode_request(json.dumps({"inputs": [tensor("x", "FP64", [3, 0], [])]}).encode(), None)[0] == {"x": [[], [], []]}
    with pytest.raises(_serve._Refused, match=r"input 'x': element 1 \(300\) is not a UINT8 value"):
        _serve.decode_request(json.dumps({"inputs": [tensor("x", "UINT8", [2], [1, 300])]}).encode(), None)
    with pytest.raises(_serve._Refused, match="output 'y' is ragged"):
        _serve.encode_output("y", [[1, 2], [3]], None)
    with pytest.raises(_serve._Refused, match="output 'y' holds NoneType"):
        _serve.encode_output("y", [None], None)


def test_bytes_and_bool_in_and_out():
    seen = {}

    def predict(model, inputs):
        seen.update(inputs)
        return {
            "upper": np.array([word.upper() for word in inputs["words"].ravel()], dtype=object).reshape(inputs["words"].shape),
            "text": np.array(["x", "yz"]),
            "not": np.logical_not(inputs["mask"]),
        }

    with running(predict) as server:
        status, answer, _ = infer(server, [
            tensor("words", "BYTES", [1, 2], [["héllo", "b"]]),
            tensor("mask", "BOOL", [2], [True, False]),
        ])
    assert status == 200, answer
    words = seen["words"]
    assert words.dtype == object and words.shape == (1, 2) and words.tolist() == [["héllo".encode(), b"b"]]
    assert seen["mask"].dtype == np.bool_ and seen["mask"].tolist() == [True, False]
    outputs = by_name(answer)
    assert outputs["upper"] == {"name": "upper", "datatype": "BYTES", "shape": [1, 2], "data": ["HéLLO", "B"]}
    assert outputs["text"] == {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["x", "yz"]}
    assert outputs["not"] == {"name": "not", "datatype": "BOOL", "shape": [2], "data": [False, True]}


def test_requested_outputs_come_in_their_order_and_an_unknown_one_is_a_400():
    with running(sums_and_argmax) as server:
        x = [tensor("x", "FP32", [2, 3], [1, 2, 3, 4, 5, 6])]
        status, answer, _ = infer(server, x, outputs=[{"name": "argmax"}])
        assert status == 200 and [o["name"] for o in answer["outputs"]] == ["argmax"]
        status, answer, _ = infer(server, x, outputs=[{"name": "argmax"}, {"name": "sum"}])
        assert [o["name"] for o in answer["outputs"]] == ["argmax", "sum"]
        status, answer, _ = infer(server, x, outputs=[{"name": "sum"}, {"name": "logits"}])
        assert status == 400 and "'logits'" in answer["error"] and "'sum'" in answer["error"], answer


@pytest.mark.parametrize("body, status, wanted", [
    (b"{not json", 400, "the body is not JSON"),
    (b"[1, 2]", 400, "JSON object"),
    ({"inputs": []}, 400, "no inputs"),
    ({"id": "a"}, 400, "no inputs"),
    (
        {"inputs": [tensor("pixels", "FP32", [2, 3], [1, 2, 3, 4, 5])]}, 400,
        "input 'pixels': shape [2, 3] holds 6 elements but the data has 5",
    ),
    ({"inputs": [tensor("pixels", "FP32", [2, 3], [[1, 2], [3, 4, 5, 6, 7]])]}, 400, "holds 6 elements but the data has 7"),
    ({"inputs": [tensor("pixels", "FP8", [1], [1])]}, 400, "input 'pixels': unknown datatype 'FP8'"),
    ({"inputs": [tensor("pixels", "FP32", [2], ["a", "b"])]}, 400, "input 'pixels': the data are not FP32 values"),
    ({"inputs": [tensor("pixels", "INT8", [2], [1, 128])]}, 400, "input 'pixels': values outside INT8"),
    ({"inputs": [tensor("pixels", "INT64", [1], [1.5])]}, 400, "input 'pixels': the data are not INT64 values"),
    ({"inputs": [tensor("pixels", "FP32", [-1], [])]}, 400, "input 'pixels': shape must be a list of non-negative integers"),
    ({"inputs": [tensor("pixels", "BYTES", [1], [3])]}, 400, "input 'pixels': element 0 (3) is not a BYTES value"),
    ({"id": 7, "inputs": [tensor("pixels", "FP32", [1], [1])]}, 400, "id must be a string"),
    (b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [NaN]}]}', 400, "NaN is not JSON"),
])
def test_bad_bodies_are_400_naming_the_problem(body, status, wanted):
    called = []
    with running(lambda model, inputs: called.append(inputs) or {"y": 1}) as server:
        got, answer, _ = call(server, "POST", "/v2/models/m/infer", body)
    assert (got, called) == (status, []), answer
    assert wanted in answer["error"], answer


def test_a_raising_predict_fn_is_a_500_with_its_message_and_the_traceback_goes_to_stderr(capsys):
    def predict(model, inputs):
        raise ValueError("bad pixel at 3")

    with running(predict) as server:
        status, answer, _ = infer(server, [tensor("x", "FP32", [1], [1])], id="req-9")
        again, _, _ = infer(server, [tensor("x", "FP32", [1], [1])])
    assert (status, again) == (500, 500)
    assert answer == {"error": "ValueError: bad pixel at 3"}
    logged = capsys.readouterr().err
    assert "Traceback" in logged and "req-9" in logged and "bad pixel at 3" in logged


def test_nan_or_infinity_in_an_output_is_a_500_naming_it():
    outputs = {"ok": np.zeros(2), "probs": np.array([0.5, np.nan], dtype=np.float32), "listed": [1.0, float("inf")]}
    with running(lambda model, inputs: outputs) as server:
        x = [tensor("x", "FP32", [1], [1])]
        status, answer, _ = infer(server, x, outputs=[{"name": "ok"}, {"name": "probs"}])
        assert status == 500 and "output 'probs'" in answer["error"] and "NaN" in answer["error"], answer
        status, answer, _ = infer(server, x, outputs=[{"name": "listed"}])
        assert status == 500 and "output 'listed'" in answer["error"], answer
        status, answer, _ = infer(server, x, outputs=[{"name": "ok"}])
        assert status == 200 and answer["outputs"][0]["data"] == [0.0, 0.0]


def test_live_at_once_ready_once_loaded_and_unknown_paths_are_404():
    with running(lambda model, inputs: {"y": inputs["x"]}, lambda path: "model", load=False) as server:
        assert call(server, "GET", "/v2/health/live")[0] == 200
        assert call(server, "GET", "/v2/health/ready")[0] == 503
        status, answer, _ = infer(server, [tensor("x", "FP32", [1], [1])])
        assert status == 503 and "loading" in answer["error"]
        server.load()
        assert call(server, "GET", "/v2/health/ready")[0] == 200
        assert infer(server, [tensor("x", "FP32", [1], [1])])[0] == 200
        unknown = (("GET", "/v2/models"), ("POST", "/v2/health/live"), ("GET", "/v2/models/m/infer"), ("POST", "/v1/models/m:predict"))
        for method, path in unknown:
            status, answer, _ = call(server, method, path, None if method == "GET" else b"{}")
            assert status == 404 and path in answer["error"], (method, path, answer)


def test_http_servers_own_refusals_are_json_too():
    with running(lambda model, inputs: {}) as server:
        assert call(server, "PUT", "/v2/health/live", b"")[0] == 501
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            raw.sendall(b"garbage\r\n\r\n")
            head, _, body = raw.makefile("rb").read().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"Content-Type: application/json" in head
    assert "bad request line" in json.loads(body)["error"]


def test_load_fn_is_called_once_with_kiln_model_dir_and_its_model_reaches_predict(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_MODEL_DIR", str(tmp_path))
    (tmp_path / "scale.txt").write_text("3")
    loads = []

    def load(path):
        loads.append(path)
        return float(open(os.path.join(path, "scale.txt")).read())

    with running(lambda scale, inputs: {"y": inputs["x"] * scale}, load) as server:
        for _ in range(3):
            status, answer, _ = infer(server, [tensor("x", "FP64", [2], [1, 2])])
            assert status == 200 and answer["outputs"][0]["data"] == [3.0, 6.0]
        server.load()  # a second call does not load again
    assert loads == [str(tmp_path)]
    with running(lambda model, inputs: {}, loads.append, model_dir="/models/explicit"):
        pass
    assert loads[-1] == "/models/explicit", "model_dir= wins over KILN_MODEL_DIR"


def test_keep_alive_answers_several_requests_over_one_connection():
    threads = []

    def predict(model, inputs):
        threads.append(threading.current_thread().ident)  # one handler thread per connection
        return {"y": inputs["x"] + 1}

    with running(predict) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        for value in range(5):
            status, answer, response = infer(connection, [tensor("x", "INT64", [1], [value])])
            assert status == 200 and answer["outputs"][0]["data"] == [value + 1]
            assert response.getheader("Connection") is None
        sock = connection.sock
        assert call(connection, "POST", "/v2/nowhere", b'{"a": 1}')[0] == 404  # its body is read, not left in the stream
        assert call(connection, "GET", "/v2/health/live")[0] == 200
        assert connection.sock is sock, "the connection was not reopened"
    assert len(threads) == 5 and len(set(threads)) == 1


def test_port_comes_from_kiln_serve_port_and_a_bad_one_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("KILN_SERVE_PORT", raising=False)
    with pytest.raises(ValueError, match="KILN_SERVE_PORT"):
        _serve.serve(lambda model, inputs: {})
    monkeypatch.setenv("KILN_SERVE_PORT", "http")
    with pytest.raises(ValueError, match="'http' is not a TCP port"):
        _serve.serve(lambda model, inputs: {})
    monkeypatch.setenv("KILN_SERVE_PORT", "8080")
    assert (_serve._port(None), _serve._port(9000)) == (8080, 9000), "an argument wins over the env"
    with pytest.raises(ValueError, match="not a TCP port"):
        _serve._port(70000)


# === the spawned program ===


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spawn(code: str):
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, "KILN_SERVE_PORT": str(port)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 30
    while True:
        assert worker.poll() is None, worker.communicate()
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            if call(connection, "GET", "/v2/health/ready")[0] == 200:
                return worker, connection
        except OSError:
            pass
        assert time.monotonic() < deadline, "the worker did not turn ready"
        time.sleep(0.05)


def test_kiln_serve_as_a_program_answers_and_exits_0_on_sigterm():
    worker, connection = spawn("import kiln; kiln.serve(lambda m, x: {'y': x['x'] * 2})")
    try:
        status, answer, _ = infer(connection, [tensor("x", "FP32", [2], [1.5, -2])])
        assert status == 200 and answer["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2], "data": [3.0, -4.0]}]
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=5)
    finally:
        worker.kill()
    assert worker.returncode == 0, stderr
    assert "kiln.serve: model loaded in 0.0" in stderr and "; serving on http://127.0.0.1:" in stderr


def test_sigterm_lets_the_request_in_flight_finish():
    # predict_fn says on stdout when it holds the request, so the signal comes while it does.
    worker, connection = spawn(
        "import sys, time, kiln; kiln.serve(lambda m, x: print('inside', flush=True) or time.sleep(1) or {'y': x['x']})"
    )
    answers = []
    try:
        asking = threading.Thread(target=lambda: answers.append(infer(connection, [tensor("x", "INT64", [1], [5])])))
        asking.start()
        assert worker.stdout.readline().strip() == "inside"
        worker.send_signal(signal.SIGTERM)
        asking.join(10)
        _, stderr = worker.communicate(timeout=10)
    finally:
        worker.kill()
    assert worker.returncode == 0, stderr
    status, answer, response = answers[0]
    assert status == 200 and answer["outputs"][0]["data"] == [5]
    assert response.getheader("Connection") == "close", "a stopping worker closes the connection after its answer"
