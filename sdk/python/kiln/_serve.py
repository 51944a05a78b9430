"""An inference worker: `kiln.serve(predict_fn, load_fn)` answers kiln's relay over the Open
Inference Protocol (KServe v2) REST API, JSON only.

    def load(path):                      # KILN_MODEL_DIR: the model version's files
        return torch.load(f"{path}/model.pt")

    def predict(model, inputs):          # input name -> numpy array shaped and typed as sent
        return {"scores": model(inputs["pixels"])}

    kiln.serve(predict, load)            # on 127.0.0.1:$KILN_SERVE_PORT until SIGTERM

The worker listens at once (`/v2/health/live`), loads the model, then turns ready
(`/v2/health/ready`) and answers `POST /v2/models/{name}[/versions/{v}]/infer`. Each keep-alive
connection has a thread of its own; calls to `predict_fn` are serialised by a lock, so it need
not be thread-safe. Without numpy, inputs are nested lists and outputs may be too.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, ModuleType
from typing import Any, Callable, NoReturn, Optional
from urllib.parse import unquote

# Seconds a stopping worker waits for the requests it is answering.
_GRACE = 30.0

# Datatype -> (numpy dtype, inclusive int range or None).
_DATATYPES: dict[str, tuple[str, Optional[tuple[int, int]]]] = {
    "BOOL": ("bool", None),
    "UINT8": ("uint8", (0, (1 << 8) - 1)),
    "UINT16": ("uint16", (0, (1 << 16) - 1)),
    "UINT32": ("uint32", (0, (1 << 32) - 1)),
    "UINT64": ("uint64", (0, (1 << 64) - 1)),
    "INT8": ("int8", (-(1 << 7), (1 << 7) - 1)),
    "INT16": ("int16", (-(1 << 15), (1 << 15) - 1)),
    "INT32": ("int32", (-(1 << 31), (1 << 31) - 1)),
    "INT64": ("int64", (-(1 << 63), (1 << 63) - 1)),
    "FP16": ("float16", None),
    "FP32": ("float32", None),
    "FP64": ("float64", None),
    "BYTES": ("object", None),
}
_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_MAX_LINE = 65536
_MAX_HEADERS = 100
_ROUTES = "GET /v2/health/live, GET /v2/health/ready, POST /v2/models/{name}/infer"

# numpy is optional: the functions below take the module, or None without it, and its arrays pass
# through them as Any (the worker works on nested lists too). JSON values are Any as well.
_Numpy = Optional[ModuleType]
# A route's answer: (HTTP status, JSON object).
_Answer = tuple[int, dict[str, Any]]
# predict_fn(model, inputs by name) -> outputs by name, and load_fn(model directory) -> model.
PredictFn = Callable[[Any, dict[str, Any]], dict[str, Any]]
LoadFn = Callable[[str], Any]


class _Refused(Exception):
    """A request kiln cannot answer: its HTTP status and a message naming the problem."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Stop(BaseException):
    """Raised by the SIGTERM handler while the model loads, so loading ends early."""


def _numpy() -> _Numpy:
    """The numpy module, or None when it is not importable."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


# === requests ===


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


# Built once: json.loads and json.dumps with options build a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def decode_request(body: bytes, np: _Numpy) -> tuple[dict[str, Any], list[str] | None, str | None]:
    """(inputs by name, requested output names or None, id) from an infer body; a bad body
    raises `_Refused` (400) naming the tensor."""
    try:
        request = _DECODER.decode(body.decode())
    except (ValueError, RecursionError) as error:
        raise _Refused(400, f"the body is not JSON: {error}") from None
    if not isinstance(request, dict):
        raise _Refused(400, "the body must be a JSON object")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _Refused(400, "the request's id must be a string")
    tensors = request.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise _Refused(400, "the request has no inputs")
    inputs: dict[str, Any] = {}
    for at, tensor in enumerate(tensors):
        name = tensor.get("name") if isinstance(tensor, dict) else None
        if not isinstance(name, str):
            raise _Refused(400, f"input {at} has no name")
        if name in inputs:
            raise _Refused(400, f"input {name!r} is given twice")
        inputs[name] = _input_value(f"input {name!r}", tensor, np)
    wanted = request.get("outputs")
    if wanted is None:
        return inputs, None, request_id
    if not isinstance(wanted, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in wanted):
        raise _Refused(400, "the request's outputs must be a list of {\"name\": ...}")
    return inputs, [output["name"] for output in wanted], request_id


def _input_value(what: str, tensor: dict[str, Any], np: _Numpy) -> Any:
    """One input tensor as a numpy array (or nested list without numpy), checked against its
    datatype and shape."""
    datatype, shape, data = tensor.get("datatype"), tensor.get("shape"), tensor.get("data")
    if datatype not in _DATATYPES:
        raise _Refused(400, f"{what}: unknown datatype {datatype!r}; known are {', '.join(_DATATYPES)}")
    if not isinstance(shape, list) or not all(type(dim) is int and dim >= 0 for dim in shape):
        raise _Refused(400, f"{what}: shape must be a list of non-negative integers, not {shape!r}")
    if not isinstance(data, list):
        raise _Refused(400, f"{what}: data must be a list")
    count = math.prod(shape)
    if np is not None and datatype != "BYTES":
        return _input_array(what, datatype, shape, count, data, np)
    flat = _flatten(data, [])
    if len(flat) != count:
        raise _Refused(400, f"{what}: shape {shape} holds {count} elements but the data has {len(flat)}")
    values = _checked(what, datatype, flat)
    if np is None:
        return _nest(values, shape)
    array = np.empty(count, dtype=object)
    array[:] = values
    return array.reshape(shape)


def _input_array(what: str, datatype: str, shape: list[int], count: int, data: list[Any], np: ModuleType) -> Any:
    try:
        array = np.array(data)
    except ValueError:  # nested unevenly: take the leaves in order
        array = np.array(_flatten(data, []))
    if array.size != count:
        raise _Refused(400, f"{what}: shape {shape} holds {count} elements but the data has {array.size}")
    dtype, int_range = _DATATYPES[datatype]
    kind = array.dtype.kind
    if count == 0:
        return np.zeros(shape, dtype=dtype)
    if kind == "O":  # ints beyond 64 bits, or a mixture: check them one by one
        return np.array(_checked(what, datatype, array.ravel().tolist()), dtype=dtype).reshape(shape)
    wanted = {"BOOL": "b"}.get(datatype, "iu" if int_range else "iuf")
    if kind not in wanted:
        raise _Refused(400, f"{what}: the data are not {datatype} values")
    if int_range and (int(array.min()) < int_range[0] or int(array.max()) > int_range[1]):
        raise _Refused(400, f"{what}: values outside {datatype}")
    return array.astype(dtype, copy=False).reshape(shape)


def _flatten(data: list[Any], into: list[Any]) -> list[Any]:
    """The leaves of nested lists in row-major order."""
    for item in data:
        if isinstance(item, list):
            _flatten(item, into)
        else:
            into.append(item)
    return into


def _checked(what: str, datatype: str, flat: list[Any]) -> list[Any]:
    """The JSON values as Python values of `datatype` (BYTES as bytes); raises `_Refused`
    naming the first element that is not one."""
    int_range = _DATATYPES[datatype][1]
    for at, value in enumerate(flat):
        if datatype == "BOOL":
            fits = type(value) is bool
        elif datatype == "BYTES":
            fits = type(value) is str
        elif int_range:
            fits = type(value) is int and int_range[0] <= value <= int_range[1]
        else:
            fits = type(value) in (int, float)
        if not fits:
            raise _Refused(400, f"{what}: element {at} ({value!r}) is not a {datatype} value")
    if datatype == "BYTES":
        return [value.encode() for value in flat]
    return flat


def _nest(flat: list[Any], shape: list[int]) -> Any:
    """Row-major `flat` as nested lists of `shape` (a scalar for shape [])."""
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return flat
    step = math.prod(shape[1:])
    return [_nest(flat[row * step:(row + 1) * step], shape[1:]) for row in range(shape[0])]


# === responses ===


def encode_output(name: str, value: Any, np: _Numpy) -> dict[str, Any]:
    """One of predict_fn's outputs as an OIP tensor; what JSON cannot carry raises `_Refused` (500)."""
    what = f"output {name!r}"
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        shape, kind, bits = list(array.shape), array.dtype.kind, array.dtype.itemsize * 8
        if kind == "b":
            datatype = "BOOL"
        elif kind in "iu" and bits <= 64:
            datatype = f"{'U' if kind == 'u' else ''}INT{bits}"
        elif kind == "f" and bits in (16, 32, 64):
            if not np.isfinite(array).all():
                raise _Refused(500, f"{what} holds NaN or infinity, which JSON cannot carry")
            datatype = f"FP{bits}"
        elif kind in "SUO":
            datatype, data = _inferred(what, array.ravel().tolist(), np)
            return {"name": name, "datatype": datatype, "shape": shape, "data": data}
        else:
            raise _Refused(500, f"{what} has dtype {array.dtype}, which OIP cannot carry")
        return {"name": name, "datatype": datatype, "shape": shape, "data": array.ravel().tolist()}
    shape = _dims(value)
    flat: list[Any] = []
    _flatten_shaped(what, value, shape, 0, flat)
    datatype, data = _inferred(what, flat, np)
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def _dims(value: Any) -> list[int]:
    """The shape of nested lists, read along their first elements."""
    dims: list[int] = []
    while isinstance(value, (list, tuple)):
        dims.append(len(value))
        if not value:
            break
        value = value[0]
    return dims


def _flatten_shaped(what: str, value: Any, dims: list[int], depth: int, into: list[Any]) -> None:
    if depth == len(dims):
        if isinstance(value, (list, tuple)):
            raise _Refused(500, f"{what} is ragged: its nested lists do not all have the shape {dims}")
        into.append(value)
        return
    if not isinstance(value, (list, tuple)) or len(value) != dims[depth]:
        raise _Refused(500, f"{what} is ragged: its nested lists do not all have the shape {dims}")
    for item in value:
        _flatten_shaped(what, item, dims, depth + 1, into)


def _inferred(what: str, flat: list[Any], np: _Numpy) -> tuple[str, list[Any]]:
    """(datatype, JSON data) of Python values: all bool BOOL, all int INT64, any float FP64,
    str or bytes BYTES (as UTF-8 text)."""
    if np is not None:
        flat = [value.item() if isinstance(value, np.generic) else value for value in flat]
    types = {type(value) for value in flat}
    if types and types <= {bool}:
        return "BOOL", flat
    if types and types <= {bool, int}:
        if not all(-(1 << 63) <= value < (1 << 63) for value in flat):
            raise _Refused(500, f"{what} holds an integer beyond INT64")
        return "INT64", [int(value) for value in flat]
    if types <= {bool, int, float}:
        if not all(math.isfinite(value) for value in flat):
            raise _Refused(500, f"{what} holds NaN or infinity, which JSON cannot carry")
        return "FP64", [float(value) for value in flat]
    if types <= {str, bytes}:
        try:
            return "BYTES", [value.decode() if type(value) is bytes else value for value in flat]
        except UnicodeDecodeError:
            raise _Refused(500, f"{what} holds bytes that are not UTF-8, which JSON cannot carry") from None
    names = ", ".join(sorted(t.__name__ for t in types))
    raise _Refused(500, f"{what} holds {names}; outputs are numbers, bools, str or bytes (or arrays of them)")


# === the server ===


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True
    server: _HTTPServer
    raw_requestline: bytes  # set by BaseHTTPRequestHandler.handle_one_request
    # The request's headers by lower-case name (parse_request; http.server's own `headers`, an
    # email.message.Message, is not made).
    header_values: dict[str, str]

    def do_GET(self) -> None:
        self._answer(self.server.worker.get)

    def do_POST(self) -> None:
        self._answer(self.server.worker.post)

    def parse_request(self) -> bool:
        """Reads the request line and headers (into a dict by lower-case name): http.server's
        email parser costs more than all the rest of a small request."""
        self.close_connection = True
        self.requestline = self.raw_requestline.decode("latin-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            self.send_error(400, f"bad request line {self.requestline!r}")
            return False
        self.command, self.path, self.request_version = words
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS):
            line = self.rfile.readline(_MAX_LINE + 1)
            if len(line) > _MAX_LINE:
                self.send_error(431, "a header line is too long")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                self.send_error(400, f"bad header line {line[:80]!r}")
                return False
            headers[name.strip().lower()] = value.strip()
        else:
            self.send_error(431, f"more than {_MAX_HEADERS} headers")
            return False
        self.header_values = headers
        connection = headers.get("connection", "").lower()
        self.close_connection = "close" in connection or (self.request_version == "HTTP/1.0" and "keep-alive" not in connection)
        if headers.get("expect", "").lower() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    def _answer(self, route: Callable[[str, bytes], _Answer]) -> None:
        length = self.header_values.get("content-length")
        if (length is None and self.command == "POST") or "transfer-encoding" in self.header_values:
            self.close_connection = True  # the body's end is unknown: the connection cannot go on
            self._reply(411, {"error": "the request needs a Content-Length (chunked bodies are not read)"})
            return
        size = int(length) if length and length.isdigit() else -1
        if length and size < 0:
            self.close_connection = True
            self._reply(400, {"error": f"bad Content-Length {length!r}"})
            return
        body = self.rfile.read(size) if size > 0 else b""
        status, answer = route(self.path.split("?", 1)[0], body)
        self._reply(status, answer)

    def _reply(self, status: int, answer: dict[str, Any]) -> None:
        """Sends a JSON answer in one write."""
        try:
            body = _ENCODER.encode(answer).encode()
        except ValueError as error:  # a backstop: encode_output refuses NaN first
            status, body = 500, json.dumps({"error": str(error)}).encode()
        if self.server.worker.stopping:
            self.close_connection = True
        reason = self.responses.get(status, ("",))[0]
        connection = "Connection: close\r\n" if self.close_connection else ""
        head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{connection}\r\n"
        self.wfile.write(head.encode() + body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a bad request line, an unknown method), in JSON."""
        self.close_connection = True
        self._reply(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per request would cost more than the request


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections do not hold the process at exit
    request_queue_size = 128
    worker: _Server


class _Server:
    """A worker bound to host:port (port 0 picks one): `load()` the model, `serve_forever()`
    in some thread, `shutdown()` from another. `serve` does all three."""

    def __init__(self, predict_fn: PredictFn, load_fn: LoadFn | None = None, *, port: int = 0,
                 model_dir: str | os.PathLike[str] | None = None, host: str = "127.0.0.1"):
        self.predict_fn = predict_fn
        self.load_fn = load_fn
        self.model_dir = str(model_dir or os.environ.get("KILN_MODEL_DIR") or os.getcwd())
        self.model: Any = None
        self.ready = False
        self.stopping = False
        self._np = _numpy()
        self._predict_lock = threading.Lock()  # predict_fn need not be thread-safe
        self._state = threading.Condition()  # guards _serving, stopping and _in_flight
        self._serving = False
        self._in_flight = 0
        self._http = _HTTPServer((host, port), _Handler)
        self._http.worker = self
        self.host = host
        self.port = self._http.server_address[1]

    def load(self) -> float:
        """Calls load_fn with the model directory (once), turns ready, and returns the seconds it took."""
        started = time.monotonic()
        if self.load_fn is not None and not self.ready:
            self.model = self.load_fn(self.model_dir)
        self.ready = True
        return time.monotonic() - started

    def serve_forever(self) -> None:
        with self._state:
            if self.stopping:
                return
            self._serving = True
        self._http.serve_forever(poll_interval=0.1)

    def shutdown(self, grace: float = _GRACE) -> None:
        """Stops accepting, waits (at most `grace` seconds) for the requests being answered,
        and closes the listening socket. Later requests on open connections are refused."""
        with self._state:
            self.stopping = True
            serving = self._serving
        if serving:
            self._http.shutdown()
        with self._state:
            self._state.wait_for(lambda: self._in_flight == 0, timeout=grace)
        self._http.server_close()

    # === routes ===

    def get(self, path: str, body: bytes) -> _Answer:
        if path == "/v2/health/live":
            return 200, {"live": True}
        if path == "/v2/health/ready":
            if self.stopping:
                return 503, {"ready": False, "error": "the worker is shutting down"}
            return (200, {"ready": True}) if self.ready else (503, {"ready": False, "error": "the model is loading"})
        return 404, {"error": f"no such endpoint: GET {path} (the worker serves {_ROUTES})"}

    def post(self, path: str, body: bytes) -> _Answer:
        route = _INFER_PATH.fullmatch(path)
        if route is None:
            return 404, {"error": f"no such endpoint: POST {path} (the worker serves {_ROUTES})"}
        with self._state:
            if self.stopping:
                return 503, {"error": "the worker is shutting down"}
            self._in_flight += 1
        try:
            return self._infer(unquote(route[1]), route[2] and unquote(route[2]), body)
        finally:
            with self._state:
                self._in_flight -= 1
                self._state.notify_all()

    def _infer(self, model_name: str, version: str | None, body: bytes) -> _Answer:
        if not self.ready:
            return 503, {"error": "the model is loading"}
        try:
            inputs, wanted, request_id = decode_request(body, self._np)
            try:
                with self._predict_lock:
                    outputs = self.predict_fn(self.model, inputs)
            except Exception as error:
                print(f"kiln.serve: predict_fn raised on request {request_id or '(no id)'}:", file=sys.stderr)
                traceback.print_exc()
                raise _Refused(500, f"{type(error).__name__}: {error}") from None
            if not isinstance(outputs, dict):
                raise _Refused(500, f"predict_fn returned a {type(outputs).__name__}, not a dict of output name -> value")
            missing = [name for name in wanted or () if name not in outputs]
            if missing:
                produced = ", ".join(map(repr, outputs)) or "none"
                raise _Refused(400, f"requested output {missing[0]!r} is not one predict_fn produced ({produced})")
            names = outputs if wanted is None else wanted
            answer: dict[str, Any] = {"model_name": model_name}
            if version:
                answer["model_version"] = version
            if request_id is not None:
                answer["id"] = request_id
            answer["outputs"] = [encode_output(str(name), outputs[name], self._np) for name in names]
            return 200, answer
        except _Refused as refused:
            return refused.status, {"error": str(refused)}
        except Exception as error:  # a bug of ours or an odd output: still a JSON answer
            traceback.print_exc()
            return 500, {"error": f"{type(error).__name__}: {error}"}


def _port(port: int | None) -> int:
    text: str | int | None = os.environ.get("KILN_SERVE_PORT") if port is None else port
    if text is None or text == "":
        raise ValueError("kiln.serve: no port: set KILN_SERVE_PORT or pass port=")
    try:
        number = int(text)
    except (TypeError, ValueError):
        number = -1
    if not 0 <= number <= 65535:
        raise ValueError(f"kiln.serve: port {text!r} is not a TCP port (0-65535)")
    return number


def serve(predict_fn: PredictFn, load_fn: LoadFn | None = None, *, port: int | None = None,
          model_dir: str | os.PathLike[str] | None = None, host: str | None = None) -> None:
    """Serves `predict_fn(model, inputs) -> outputs` as an inference worker until SIGTERM or
    Ctrl-C, then returns once the requests being answered are done (at most 30s; a second
    SIGTERM ends the process at once).

    `load_fn(path)` is called once with `model_dir` (else KILN_MODEL_DIR, else the current
    directory) and returns the model; without it the model is None. `port` defaults to
    KILN_SERVE_PORT, `host` to KILN_SERVE_HOST, else 127.0.0.1 (kiln sets 0.0.0.0 in a container,
    whose port it publishes on the host's loopback). Inputs are numpy arrays shaped and typed as
    sent (BYTES: object arrays of bytes), nested lists without numpy; outputs are arrays, numpy
    scalars, lists or scalars."""
    host = host or os.environ.get("KILN_SERVE_HOST") or "127.0.0.1"
    server = _Server(predict_fn, load_fn, port=_port(port), model_dir=model_dir, host=host)
    stop = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop.set()
        if not server.ready:
            raise _Stop  # ends a long load early

    in_main_thread = threading.current_thread() is threading.main_thread()
    serving = threading.Thread(target=server.serve_forever, name="kiln-serve", daemon=True)
    serving.start()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        if in_main_thread:  # signal handlers can only be set from the main thread
            signal.signal(signal.SIGTERM, on_sigterm)
        seconds = server.load()
        print(f"kiln.serve: model loaded in {seconds:.2f}s; serving on http://{host}:{server.port}", file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            pass
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        if in_main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)  # so a second SIGTERM ends the process at once
        server.shutdown()
        serving.join()


__all__ = ["serve"]
