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
import os
import re
import signal
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, Callable
from urllib.parse import unquote

from ._tensors import _ENCODER, _Refused, _numpy, decode_request, encode_output

# Seconds a stopping worker waits for the requests it is answering.
_GRACE = 30.0

_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_MAX_LINE = 65536
_MAX_HEADERS = 100
_ROUTES = "GET /v2/health/live, GET /v2/health/ready, POST /v2/models/{name}/infer"

# A route's answer: (HTTP status, JSON object).
_Answer = tuple[int, dict[str, Any]]
# predict_fn(model, inputs by name) -> outputs by name, and load_fn(model directory) -> model.
PredictFn = Callable[[Any, dict[str, Any]], dict[str, Any]]
LoadFn = Callable[[str], Any]


class _Stop(BaseException):
    """Raised by the SIGTERM handler while the model loads, so loading ends early."""


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
