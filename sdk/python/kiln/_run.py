"""Runs, the point buffer and its sender thread."""

from __future__ import annotations

import atexit
import os
import pathlib
import queue
import threading
import time
import tomllib
from typing import Mapping

import grpc

from kiln.v1 import job_pb2, job_pb2_grpc, log_pb2, log_pb2_grpc

_STOP = object()


def _endpoints() -> tuple[str, str, str]:
    """(api, logs, token) from KILN_ADDR/KILN_LOGS_ADDR/KILN_TOKEN or KILN_HOME/credentials.toml."""
    home = pathlib.Path(os.environ.get("KILN_HOME") or pathlib.Path.home() / ".kiln")
    credentials: dict = {}
    path = home / "credentials.toml"
    if path.exists():
        credentials = tomllib.loads(path.read_text())
    api = os.environ.get("KILN_ADDR") or credentials.get("api")
    token = os.environ.get("KILN_TOKEN") or credentials.get("token")
    logs = os.environ.get("KILN_LOGS_ADDR") or credentials.get("logs") or api
    if not api or not token:
        raise RuntimeError(f"no kiln endpoint: start one with `kiln up`, or set KILN_ADDR and KILN_TOKEN (looked for {path})")
    return api, logs, token


def _target(address: str) -> str:
    return address.split("://", 1)[-1]


class Run:
    """A run whose metrics are being logged: a kiln job, or a run created for this process."""

    def __init__(
        self,
        *,
        job_id: str,
        logs_address: str,
        token: str,
        api_address: str | None = None,
        external: bool = False,
        batch_points: int = 5000,
        interval: float = 1.0,
        buffer_points: int = 100_000,
    ):
        self.job_id = job_id
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._channel = grpc.insecure_channel(_target(logs_address))
        self._logs = log_pb2_grpc.LogServiceStub(self._channel)
        self._api_address = api_address
        self._external = external
        self._batch_points = batch_points
        self._interval = interval
        self._buffer: queue.Queue = queue.Queue(maxsize=buffer_points)
        self._step = 0
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._finished = False
        self._sender = threading.Thread(target=self._send_loop, name="kiln-metrics", daemon=True)
        self._sender.start()

    def log(self, data: Mapping[str, float], step: int | None = None) -> None:
        """Queues the values of `data` at `step` (the previous step + 1 when omitted)."""
        if self._error is not None:
            raise RuntimeError("kiln: sending metrics failed") from self._error
        with self._lock:
            if step is None:
                step = self._step
            self._step = max(self._step, step + 1)
        now = int(time.time() * 1000)
        for key, value in data.items():
            point = log_pb2.MetricPoint(key=str(key), step=int(step), value=float(value), timestamp_ms=now)
            self._buffer.put(point)  # blocks while the buffer is full: back-pressure, not loss

    def flush(self) -> None:
        """Waits until every queued point is durable."""
        self._buffer.join()
        if self._error is not None:
            raise RuntimeError("kiln: sending metrics failed") from self._error

    def finish(self, exit_code: int = 0) -> None:
        """Flushes, stops the sender, and ends a run created by `init`."""
        if self._finished:
            return
        self._finished = True
        self.flush()
        self._buffer.put(_STOP)
        self._sender.join()
        if self._external and self._api_address:
            _, _, token = _endpoints()
            with grpc.insecure_channel(_target(self._api_address)) as channel:
                jobs = job_pb2_grpc.JobServiceStub(channel)
                jobs.FinishRun(job_pb2.FinishRunRequest(job_id=self.job_id, exit_code=exit_code), metadata=self._metadata)
        self._channel.close()

    def _send_loop(self) -> None:
        while True:
            batch, stop = self._take_batch()
            if batch:
                try:
                    self._send(batch)
                except BaseException as error:  # reported by the next log/flush
                    self._error = error
                for _ in batch:
                    self._buffer.task_done()
            if stop:
                self._buffer.task_done()
                return

    def _take_batch(self) -> tuple[list, bool]:
        batch: list = []
        deadline = time.monotonic() + self._interval
        while len(batch) < self._batch_points:
            timeout = deadline - time.monotonic()
            try:
                item = self._buffer.get(timeout=max(timeout, 0.0)) if batch else self._buffer.get()
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            batch.append(item)
        return batch, False

    def _send(self, points: list) -> None:
        request = log_pb2.WriteMetricsRequest(job_id=self.job_id, points=points)
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


def init(config: Mapping | None = None, *, name: str = "", project: str = "", **options) -> Run:
    """Starts logging: inside a kiln job, for that job; elsewhere, for a new run."""
    global _current
    import kiln

    kiln.config.clear()
    kiln.config.update(dict(config or {}))
    if _current is not None:
        return _current
    job_id = os.environ.get("KILN_JOB_ID")
    if job_id:
        logs = os.environ.get("KILN_LOGS") or os.environ.get("KILN_LOGS_ADDR") or ""
        token = os.environ.get("KILN_TOKEN", "")
        if not logs or not token:
            raise RuntimeError("kiln: KILN_JOB_ID is set but KILN_LOGS or KILN_TOKEN is not")
        _current = Run(job_id=job_id, logs_address=logs, token=token, **options)
    else:
        api, logs, token = _endpoints()
        with grpc.insecure_channel(_target(api)) as channel:
            jobs = job_pb2_grpc.JobServiceStub(channel)
            run = jobs.CreateRun(
                job_pb2.CreateRunRequest(name=name, project=project),
                metadata=(("authorization", f"Bearer {token}"),),
            )
        _current = Run(job_id=run.id, logs_address=logs, token=token, api_address=api, external=True, **options)
    atexit.register(_finish_at_exit)
    return _current


def log(data: Mapping[str, float], step: int | None = None) -> None:
    """Logs values at a step of the current run (see `init`)."""
    if _current is None:
        raise RuntimeError("kiln.log before kiln.init")
    _current.log(data, step)


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


__all__ = ["Run", "finish", "init", "log"]
