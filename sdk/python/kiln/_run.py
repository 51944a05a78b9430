"""Runs, the point buffer and its sender thread."""

from __future__ import annotations

import atexit
import os
import pathlib
import threading
import sys
import time
from itertools import repeat
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import grpc

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, from PyPI (a dependency below 3.11)
    import tomli as tomllib

from kiln.v1 import job_pb2, job_pb2_grpc, log_pb2, log_pb2_grpc

from ._address import ChannelOptions, _host, _is_loopback, _replica_target, _replicas, _target, _url
from ._sweep import trial_knobs

if TYPE_CHECKING:
    from kiln.v1 import tenancy_pb2

_STOP = object()

# A buffered point: (key, step, value, timestamp_ms).
_Row = tuple[str, int, float, int]


def _credentials_path() -> pathlib.Path:
    home = pathlib.Path(os.environ.get("KILN_HOME") or pathlib.Path.home() / ".kiln")
    return home / "credentials.toml"


def _home_credentials() -> dict[str, Any]:
    """What `kiln up` wrote to KILN_HOME/credentials.toml (empty when there is none)."""
    path = _credentials_path()
    return tomllib.loads(path.read_text()) if path.exists() else {}


def _endpoints() -> tuple[str, str, str]:
    """(api, logs, token) from KILN_ADDR/KILN_TOKEN or KILN_HOME/credentials.toml; log-ingest's
    address from KILN_LOGS_ADDR, the file, else the api's DiscoveryService."""
    path = _credentials_path()
    credentials = _home_credentials()
    api = os.environ.get("KILN_ADDR") or str(credentials.get("api") or "")
    token = os.environ.get("KILN_TOKEN") or str(credentials.get("token") or "")
    if not api or not token:
        raise RuntimeError(f"no kiln endpoint: start one with `kiln up`, or set KILN_ADDR and KILN_TOKEN (looked for {path})")
    return api, _service_address("logs", api, token), token


_VARIABLES = {"logs": "KILN_LOGS_ADDR", "batches": "KILN_BATCH_ADDR", "advisor": "KILN_ADVISOR_ADDR",
              "predictor": "KILN_PREDICTOR_ADDR", "ui": "KILN_UI_ADDR"}
_discovered: dict[str, tenancy_pb2.DiscoverResponse] = {}


def _service_address(service: str, api: str, token: str) -> str:
    """Where `service` (logs, batches, advisor, predictor, ui) is: its KILN_*_ADDR variable, the
    credentials file's entry (when the file is of the same api), else what the api's
    DiscoveryService says (asked once per api), else the api's own address (the UI: none). A
    loopback host in the api's answer means the api's own host."""
    explicit = os.environ.get(_VARIABLES[service])
    if explicit:
        return explicit
    credentials = _home_credentials()
    if credentials.get(service) and _url(str(credentials.get("api", ""))) == _url(api):
        return str(credentials[service])
    if api not in _discovered:
        from kiln.v1 import tenancy_pb2, tenancy_pb2_grpc

        with _channel(api) as channel:
            stub = tenancy_pb2_grpc.DiscoveryServiceStub(channel)
            try:
                _discovered[api] = stub.Discover(tenancy_pb2.DiscoverRequest(),
                                                 metadata=(("authorization", f"Bearer {token}"),), timeout=10)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNIMPLEMENTED:  # an older api: the api's address
                    from ._errors import from_rpc

                    raise from_rpc(error) from error
                _discovered[api] = tenancy_pb2.DiscoverResponse()
    found: str = getattr(_discovered[api], service)
    if not found:
        return "" if service == "ui" else api
    api_host = _host(_replicas(api)[0])

    def reachable(one: str) -> str:
        host = _host(one)
        return one.replace(host, api_host, 1) if _is_loopback(host) and not _is_loopback(api_host) else one

    return ",".join(reachable(one) for one in found.split(","))


def _pem(text_variable: str, file_variable: str, credentials_key: str) -> bytes | None:
    """PEM bytes from an environment variable holding the text (what the runner gives jobs),
    one naming a file, or a file named in credentials.toml; None when none is set."""
    text = os.environ.get(text_variable)
    if text:
        return text.encode()
    path = os.environ.get(file_variable) or _home_credentials().get(credentials_key)
    return pathlib.Path(path).read_bytes() if path else None


def _channel(address: str, options: ChannelOptions | None = None) -> grpc.Channel:
    """A channel to `address` (several replicas when it lists them, comma-separated: see
    `_replica_target`): TLS for `https://` (trusting KILN_CA_PEM, KILN_CA_FILE or the
    credentials file's ca-file, else the system roots; presenting KILN_CLIENT_CERT_PEM and
    KILN_CLIENT_KEY_PEM, or the files KILN_CLIENT_CERT and KILN_CLIENT_KEY, when a server requires
    a client certificate), plain text otherwise."""
    urls = _replicas(address)
    if not urls:
        raise RuntimeError("kiln: an empty address (KILN_ADDR or a service's address)")
    if len({url.split("://", 1)[0] for url in urls}) > 1:
        raise RuntimeError(f"kiln: the replicas {address} mix http:// and https://")
    options = list(options or [])
    target = _replica_target(urls, options) if len(urls) > 1 else _target(urls[0])
    if not urls[0].startswith("https://"):
        return grpc.insecure_channel(target, options=options)
    cert = _pem("KILN_CLIENT_CERT_PEM", "KILN_CLIENT_CERT", "cert-file")
    key = _pem("KILN_CLIENT_KEY_PEM", "KILN_CLIENT_KEY", "key-file")
    if (cert is None) != (key is None):
        raise RuntimeError("kiln: a client certificate needs both its certificate and its key (KILN_CLIENT_CERT, KILN_CLIENT_KEY)")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_pem("KILN_CA_PEM", "KILN_CA_FILE", "ca-file"),
        private_key=key,
        certificate_chain=cert,
    )
    return grpc.secure_channel(target, credentials, options=options)


class Run:
    """A run whose metrics are being logged: a kiln job, or a run created for this process.

    `log` appends (key, step, value, time) rows to a list under a lock and returns; `senders`
    threads each take up to `batch_points` rows at a time, turn them into columns and send them
    in one WriteMetrics request, which log-ingest answers once they are durable (several
    requests in flight hide that round trip; the order of points does not matter, they are keyed
    by step). A sender takes rows at once when no request is in flight, so a point logged by an
    idle run leaves at once; while requests are in flight, rows pile up into full batches, and
    what is not a full batch leaves when the requests in flight are answered (or after
    `interval` seconds, whichever comes first). At most `buffer_points` points wait: beyond that
    `log` blocks until the senders catch up (back-pressure, never a silent drop)."""

    def __init__(
        self,
        *,
        job_id: str,
        logs_address: str,
        token: str,
        api_address: str | None = None,
        external: bool = False,
        batch_points: int = 5000,
        interval: float = 0.1,
        buffer_points: int = 100_000,
        senders: int = 4,
    ):
        if senders < 1:
            raise ValueError("senders must be at least 1")
        if batch_points < 1 or buffer_points < batch_points:
            raise ValueError("batch_points must be at least 1 and buffer_points at least batch_points")
        self.job_id = job_id
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._channel = _channel(logs_address)
        self._logs = log_pb2_grpc.LogServiceStub(self._channel)
        self._api_address = api_address
        self._external = external
        self._batch_points = batch_points
        self._interval = interval
        self._capacity = buffer_points
        # `log` takes the plain lock (entered in C); waits and wake-ups go through the condition
        # over the same lock.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._rows: list[_Row] = []  # oldest first
        self._logged = 0  # points taken by `log`
        self._settled = 0  # points sent (durable) or given up on
        self._flushing = 0
        self._in_flight = 0  # requests sent and not answered yet
        self._stopping = False
        self._step = 0
        self._error: BaseException | None = None
        self._finished = False
        self._senders = [
            threading.Thread(target=self._send_loop, name=f"kiln-metrics-{n}", daemon=True) for n in range(senders)
        ]
        for sender in self._senders:
            sender.start()

    def log(self, data: Mapping[str, float], step: int | None = None) -> None:
        """Queues the values of `data` at `step` (the previous step + 1 when omitted)."""
        now = time.time_ns() // 1_000_000
        if step is not None:
            # The rows are built before taking the lock: the common case costs one append.
            step = int(step)
            self._buffer([(str(key), step, float(value), now) for key, value in data.items()], step)
        else:
            values = [(str(key), float(value)) for key, value in data.items()]
            self._buffer(lambda step: ([(key, step, value, now) for key, value in values], step))

    def log_series(self, key: str, values: Iterable[float], steps: Iterable[int] | None = None) -> None:
        """Queues many values of one key at once: at `steps`, or at consecutive steps from the
        previous step + 1. Costs a fraction of a `log` call per value (the rows are built in C):
        for histories, per-sample values, or anything already in a list."""
        now = time.time_ns() // 1_000_000
        key, values = str(key), list(map(float, values))
        if steps is not None:
            steps = list(map(int, steps))
            if len(steps) != len(values):
                raise ValueError(f"{len(steps)} steps for {len(values)} values: give one step per value")
        # A series larger than the buffer goes in parts, each waiting for room.
        for start in range(0, len(values), self._capacity):
            part = values[start : start + self._capacity]
            at = None if steps is None else steps[start : start + self._capacity]

            def rows(first: int, part: list[float] = part, at: list[int] | None = at) -> tuple[list[_Row], int]:
                part_steps = range(first, first + len(part)) if at is None else at
                return list(zip(repeat(key), part_steps, part, repeat(now))), max(part_steps)

            self._buffer(rows)

    def _buffer(self, rows: list[_Row] | Callable[[int], tuple[list[_Row], int]], last_step: int = 0) -> None:
        """Adds rows to the buffer, waiting while it is full (back-pressure, not loss). `rows` is
        a list (with the largest step among them), or for values logged without a step a
        function of the run's next step giving both, called under the lock."""
        with self._lock:
            if self._error is not None:
                raise RuntimeError("kiln: sending metrics failed") from self._error
            if self._stopping:
                raise RuntimeError("kiln: the run is finished")
            taken, last = rows(self._step) if callable(rows) else (rows, last_step)
            if last >= self._step:
                self._step = last + 1
            # Room for these rows; rows that could never fit wait for an empty buffer.
            room = max(self._capacity - len(taken), 0)
            while self._logged - self._settled > room and self._error is None:
                self._cond.wait()
            buffered = self._rows
            first = not buffered
            buffered += taken
            self._logged += len(taken)
            if first or len(buffered) >= self._batch_points:
                self._cond.notify_all()

    def flush(self) -> None:
        """Waits until every point logged so far is durable."""
        with self._cond:
            target = self._logged
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._settled < target and self._error is None:
                    self._cond.wait()
            finally:
                self._flushing -= 1
            if self._error is not None:
                raise RuntimeError("kiln: sending metrics failed") from self._error

    def finish(self, exit_code: int = 0) -> None:
        """Flushes, stops the sender, and ends a run created by `init`."""
        if self._finished:
            return
        self._finished = True
        try:
            self.flush()
        finally:
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            for sender in self._senders:
                sender.join()
        if self._external and self._api_address:
            with _channel(self._api_address) as channel:
                jobs = job_pb2_grpc.JobServiceStub(channel)
                jobs.FinishRun(job_pb2.FinishRunRequest(job_id=self.job_id, exit_code=exit_code), metadata=self._metadata)
        self._channel.close()

    def _send_loop(self) -> None:
        while True:
            rows = self._take_rows()
            if rows is None:
                return
            try:
                self._send(rows)
            except BaseException as error:  # reported by the next log/flush
                with self._cond:
                    self._error = error
            with self._cond:
                self._settled += len(rows)
                self._in_flight -= 1
                self._cond.notify_all()

    def _take_rows(self) -> list[_Row] | None:
        """The next rows to send: what there is when no request is in flight or someone flushes,
        else a full batch, or what came within `interval` of its first row; None to stop."""
        with self._cond:
            deadline: float | None = None
            while not self._stopping:
                if self._rows and (
                    self._in_flight == 0 or self._flushing or len(self._rows) >= self._batch_points
                ):
                    break
                if not self._rows:
                    deadline = None
                    self._cond.wait()
                    continue
                if deadline is None:
                    deadline = time.monotonic() + self._interval
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if not self._rows or self._error is not None:
                return None
            rows = self._rows[: self._batch_points]
            del self._rows[: self._batch_points]
            self._in_flight += 1
            return rows

    def _send(self, rows: list[_Row]) -> None:
        keys, steps, values, times = zip(*rows)
        index = {key: n for n, key in enumerate(dict.fromkeys(keys))}
        columns = log_pb2.MetricColumns(
            keys=list(index), key_index=list(map(index.__getitem__, keys)), steps=steps, values=values,
            timestamps_ms=times,
        )
        request = log_pb2.WriteMetricsRequest(job_id=self.job_id, columns=columns)
        delay = 0.1
        for attempt in range(8):
            try:
                self._logs.WriteMetrics(request, metadata=self._metadata, timeout=30)
                return
            except grpc.RpcError as error:
                retryable = error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if not retryable or attempt == 7:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)


_current: Run | None = None


def init(config: Mapping[str, Any] | None = None, *, name: str = "", project: str = "", **options: Any) -> Run:
    """Starts logging: inside a kiln job, for that job; elsewhere, for a new run. `config` (nested
    dicts of bool/int/float/str) is stored with the run as flat `a.b` keys, merged into what it
    has (a sweep trial's knobs); `kiln.config` keeps the dict as given."""
    global _current
    import kiln

    from . import _track

    # A value of an unsupported type is refused before any run exists.
    _track.flatten(config or {})
    kiln.config.clear()
    kiln.config.update(dict(config or {}))
    # In a sweep's trial, the advisor's knobs (they win over defaults given here).
    kiln.config.update(trial_knobs())
    if _current is not None:
        if config:
            _track.update_run(config=config, what="init")
        return _current
    job_id = os.environ.get("KILN_JOB_ID")
    if job_id:
        logs = os.environ.get("KILN_LOGS") or os.environ.get("KILN_LOGS_ADDR") or ""
        token = os.environ.get("KILN_TOKEN", "")
        if not logs or not token:
            raise RuntimeError("kiln: KILN_JOB_ID is set but KILN_LOGS or KILN_TOKEN is not")
        _track.bind(job_id, os.environ.get("KILN_API") or os.environ.get("KILN_ADDR") or "", token)
        knobs = trial_knobs()
        if config and knobs:
            # What the trial adds is stored; its knobs (stored by the advisor) keep their values.
            _track.update_run(config={**config, **knobs}, what="init")
        elif config:
            _track.update_run(config=config, what="init")
        _current = Run(job_id=job_id, logs_address=logs, token=token, **options)
    else:
        api, logs, token = _endpoints()
        with _channel(api) as channel:
            jobs = job_pb2_grpc.JobServiceStub(channel)
            run = jobs.CreateRun(
                job_pb2.CreateRunRequest(name=name, project=project),
                metadata=(("authorization", f"Bearer {token}"),),
            )
        _track.bind(run.id, api, token, project)
        if config:
            _track.update_run(config=config, what="init")
        _current = Run(job_id=run.id, logs_address=logs, token=token, api_address=api, external=True, **options)
    atexit.register(_finish_at_exit)
    return _current


def log(data: Mapping[str, float], step: int | None = None) -> None:
    """Logs values at a step of the current run (see `init`)."""
    if _current is None:
        raise RuntimeError("kiln.log before kiln.init")
    _current.log(data, step)


def log_series(key: str, values: Iterable[float], steps: Iterable[int] | None = None) -> None:
    """Logs many values of one key of the current run at once (see `Run.log_series`)."""
    if _current is None:
        raise RuntimeError("kiln.log_series before kiln.init")
    _current.log_series(key, values, steps)


def finish(exit_code: int = 0) -> None:
    """Sends what is buffered and ends the current run."""
    global _current
    if _current is not None:
        run, _current = _current, None
        run.finish(exit_code)


def _finish_at_exit() -> None:
    try:
        finish()
    except Exception as error:  # at exit there is nobody left to raise to
        print(f"kiln: {error}")


__all__ = ["Run", "finish", "init", "log", "log_series"]
