"""Jobs from Python: `kiln.Client().jobs`, what `kiln run`, `ps`, `status`, `logs`, `stop` and
`artifacts ls|get` do.

    client = kiln.Client()
    job = client.jobs.submit(["python", "train.py", "--lr", "3e-4"], cpus=2, memory="4G",
                             env={"EPOCHS": "10"}, workdir=".")      # packed as `kiln run` packs it
    for line in client.jobs.logs(job.id, follow=True):               # until the job ends
        print(line.text)
    final = client.jobs.wait(job.id)                                 # a Job: state, exit_code, ...
    if final.state == "SUCCEEDED":
        client.jobs.download(job.id, "results/")                     # its /kiln/outputs

A call kiln refuses raises `kiln.KilnError`, with the gRPC status code and the server's message.
"""

from __future__ import annotations

import math
import os
import pathlib
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Collection, Iterator, Mapping, Sequence, Union

import grpc

from kiln.v1 import artifact_pb2, job_pb2, log_pb2

from ._address import Metadata
from ._client import RunInfo, _run
from ._errors import from_rpc, retried, translated
from ._pack import upload_code

if TYPE_CHECKING:
    from ._client import Stubs

FINISHED = frozenset({"SUCCEEDED", "FAILED", "STOPPED", "LOST"})
"""The states a job ends in (PREEMPTED is not one: the job is queued again)."""
_ACTIVE = frozenset({"QUEUED", "SCHEDULED", "PROVISIONING", "RUNNING", "SYNCING"})
_MARKETS = {"auto": job_pb2.MARKET_UNSPECIFIED, "spot": job_pb2.MARKET_SPOT, "on-demand": job_pb2.MARKET_ON_DEMAND}
_STREAMS = {log_pb2.LOG_STREAM_STDOUT: "stdout", log_pb2.LOG_STREAM_STDERR: "stderr"}
# The most jobs ListJobs answers with at once.
_LIST_MAX = 10_000
# A follow that lost its log-ingest tries again with doubling waits up to this one.
_FOLLOW_RETRY_LIMIT = 6.4

Size = Union[int, str]
"""Bytes, or a size as the CLI reads it: "512M", "4G", "1.5GiB"."""
Duration = Union[int, str]
"""Seconds, or a duration as the CLI reads it: "90s", "30m", "2h", "1d"."""


@dataclass(frozen=True)
class Job(RunInfo):
    """A job: what RunInfo says of a run (id, name, project, owner, state, sweep_id, config,
    summary, created/started/finished_at_ms, duration_s) and what it ran and how it ended.
    `state` is QUEUED, SCHEDULED, PROVISIONING, RUNNING, SYNCING, SUCCEEDED, FAILED, STOPPED,
    PREEMPTED or LOST; `exit_code` is None until the command exited."""

    exit_code: int | None = None
    reason: str = ""
    command: tuple[str, ...] = ()
    image: str = ""
    code_digest: str = ""
    attempt: int = 0
    stop_requested: bool = False
    pool: str = ""
    market: str = ""
    preemptions: int = 0
    cost: float = 0.0

    @property
    def finished(self) -> bool:
        """Whether the job has ended (SUCCEEDED, FAILED, STOPPED or LOST)."""
        return self.state in FINISHED


@dataclass(frozen=True)
class LogLine:
    """One line a job printed: `stream` is "stdout" or "stderr" ("" when unknown)."""

    text: str
    stream: str
    timestamp_ms: int
    attempt: int

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class OutputFile:
    """A file a job wrote to /kiln/outputs: its `/`-separated path there and its size in bytes."""

    path: str
    size: int


def _job(message: job_pb2.Job) -> Job:
    return Job(
        **vars(_run(message)), exit_code=message.exit_code if message.HasField("exit_code") else None,
        reason=message.reason, command=tuple(message.spec.command), image=message.spec.image,
        code_digest=message.spec.code_digest, attempt=message.attempt, stop_requested=message.stop_requested,
        pool=message.pool, market=message.market, preemptions=message.preemptions, cost=message.cost,
    )


def _round(value: float) -> int:
    """Rounds half away from zero, as Rust's `f64::round` (Python's `round` goes to even)."""
    return math.floor(value + 0.5)


def _parse_size(value: Size, what: str) -> int:
    """Bytes from an int or a size text, as `kiln run --mem` reads it (kiln_formats::units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"kiln: {what} is {value}; it must not be negative")
        return value
    text = str(value).strip()
    split = next((n for n, c in enumerate(text) if c not in "0123456789."), len(text))
    number, unit = text[:split], text[split:].strip().upper()
    for suffix in ("IB", "I", "B"):  # as Rust's trim_end_matches: every repeat
        while unit.endswith(suffix):
            unit = unit[: -len(suffix)]
    shifts = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}
    try:
        amount = float(number)
    except ValueError:
        amount = math.nan
    if unit not in shifts or not math.isfinite(amount):
        raise ValueError(f"kiln: {what} {value!r} is not a size: use a number with K, M, G or T, such as 512M or 4G")
    return _round(amount * (1 << shifts[unit]))


def _parse_duration(value: Duration, what: str = "max_runtime") -> int:
    """Seconds from an int or a duration text, as `kiln run --max-runtime` reads it."""
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    else:
        text = str(value).strip()
        digits = text.rstrip("smhd")
        scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}.get(text[len(digits):])
        if scale is None or not (digits.isascii() and digits.isdigit()):
            raise ValueError(f"kiln: {what} {value!r} is not a duration: use a number with s, m, h or d, such as 30m")
        seconds = int(digits) * scale
    if seconds <= 0:
        raise ValueError(f"kiln: {what} must be more than 0 seconds")
    return seconds


class Jobs:
    """Submits, reads, follows and stops jobs, and fetches their outputs: `kiln.Client().jobs`."""

    def __init__(self, stubs: Callable[[], Stubs], metadata: Metadata):
        self._stubs = stubs  # the client's, opened on first use
        self._metadata = metadata

    def submit(self, command: Sequence[str], *, image: str = "", name: str = "", project: str = "",
               cpus: float = 1.0, memory: Size = "1G", disk: Size | None = None, shm: Size | None = None,
               gpus: int = 0, nodes: int = 1, max_runtime: Duration | None = None,
               env: Mapping[str, str] | None = None, secrets: Sequence[str] = (), datasets: Sequence[str] = (),
               priority: str = "normal", market: str = "auto", pool: str = "",
               workdir: str | os.PathLike[str] | None = ".") -> Job:
        """Submits `command` (argv: ["python", "train.py"]) as `kiln run` does, and returns the
        queued job. `workdir` is packed as the job's code (/kiln/code; see kiln._pack for what
        goes in: .gitignore, .ignore and .kilnignore are honoured) and uploaded unless its
        project has it; None submits no code (`--no-code`). Resources, `datasets` (mounted at
        /kiln/data/NAME), `secrets` (project secrets as environment variables), `priority`
        ("low", "normal", "high"), `market` ("auto", "spot", "on-demand") and `pool` mean what
        the flags of `kiln run` do. A submit is retried while the api is unavailable, with one
        idempotency key, so it never makes two jobs.

            job = client.jobs.submit(["python", "train.py"], image="pytorch/pytorch:2.4", gpus=1,
                                     memory="16G", datasets=["imagenet"], secrets=["WANDB_KEY"])
        """
        if isinstance(command, (str, bytes)):
            raise TypeError("kiln: command is a list of arguments, such as ['python', 'train.py']")
        if market not in _MARKETS:
            raise ValueError(f"kiln: market must be one of {sorted(_MARKETS)}, not {market!r}")
        if not (math.isfinite(cpus) and 0 <= cpus <= 4_000_000):
            raise ValueError(f"kiln: cpus is {cpus}; give a number of cores such as 2 or 0.5")
        resources = job_pb2.Resources(
            cpu_millis=_round(cpus * 1000), memory_bytes=_parse_size(memory, "memory"),
            disk_bytes=0 if disk is None else _parse_size(disk, "disk"),
            shm_bytes=0 if shm is None else _parse_size(shm, "shm"),
        )
        spec = job_pb2.JobSpec(
            name=name, command=list(command), env=dict(env or {}), resources=resources, project=project, image=image,
            gpus=gpus, max_runtime_secs=0 if max_runtime is None else _parse_duration(max_runtime),
            datasets=list(datasets), priority_class=priority, market=_MARKETS[market], pool=pool,
            secrets=list(secrets), nodes=nodes,
        )
        stubs = self._stubs()
        if workdir is not None:
            with translated():
                spec.code_digest = upload_code(stubs.artifacts, self._metadata, workdir, project)
        # One key for this submit and its retries: an answer lost with a dying api replica is
        # retried without making a second job.
        request = job_pb2.SubmitJobRequest(spec=spec, idempotency_key=uuid.uuid4().hex)
        return _job(retried(lambda: stubs.jobs.SubmitJob(request, metadata=self._metadata, timeout=60)).job)

    def get(self, job_id: str) -> Job:
        """The job as it is now.

            job = client.jobs.get("01J...")
            print(job.state, job.exit_code, job.duration_s)
        """
        with translated():
            return _job(self._stubs().jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), metadata=self._metadata,
                                                  timeout=60))

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 1.0) -> Job:
        """Waits until the job has ended (SUCCEEDED, FAILED, STOPPED or LOST) and returns it;
        raises TimeoutError after `timeout` seconds. Asks every `poll` seconds.

            final = client.jobs.wait(job.id, timeout=3600)
            assert final.state == "SUCCEEDED", final.reason
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"kiln: job {job_id} is still {job.state} after {timeout} s")
            time.sleep(poll if deadline is None else max(min(poll, deadline - time.monotonic()), 0))

    def logs(self, job_id: str, follow: bool = False, *, tail: int | None = None, node: int = 0) -> Iterator[LogLine]:
        """The job's lines (its last `tail` lines when given), stdout and stderr in the order
        they came; with `follow`, then new ones until the job ends (as `kiln logs -f`). `node`
        picks a gang job's node. Leaving the loop early ends the stream.

            for line in client.jobs.logs(job.id, follow=True):
                print(line.text)
        """
        logs = self._stubs().logs
        seen = 0  # the seq of the last line given: a follow that lost its server resumes after it
        delay = 0.2
        while True:
            if tail is None or seen:
                request = log_pb2.GetLogsRequest(job_id=job_id, follow=follow, node=node, after_seq=seen)
                call = logs.GetLogs(request, metadata=self._metadata)
            else:
                call = logs.TailLogs(log_pb2.TailLogsRequest(job_id=job_id, lines=tail, follow=follow, node=node),
                                     metadata=self._metadata)
            try:
                for line in call:
                    seen = line.seq
                    delay = 0.2
                    yield LogLine(text=line.text, stream=_STREAMS.get(line.stream, ""),
                                  timestamp_ms=line.timestamp_ms, attempt=line.attempt)
                return
            except grpc.RpcError as error:
                # A follow whose log-ingest went away (a replica lost: the channel moves to the
                # next) goes on after the last line given, for up to about 10 s of retries.
                failure = from_rpc(error)
                if not follow or failure.code != grpc.StatusCode.UNAVAILABLE or delay > _FOLLOW_RETRY_LIMIT:
                    raise failure from error
            finally:
                call.cancel()
            time.sleep(delay)
            delay *= 2

    def stop(self, job_id: str) -> Job:
        """Stops the job: a queued one at once, a running one with SIGTERM, the grace period,
        then SIGKILL. Returns it as it is then (`stop_requested`; `wait` for the end).

            client.jobs.stop(job.id)
            assert client.jobs.wait(job.id).state == "STOPPED"
        """
        with translated():
            return _job(self._stubs().jobs.StopJob(job_pb2.StopJobRequest(job_id=job_id), metadata=self._metadata,
                                                   timeout=60))

    def outputs(self, job_id: str, prefix: str = "") -> list[OutputFile]:
        """The files the job wrote to /kiln/outputs ($KILN_OUTPUTS), as synced when it ended,
        all or those under `prefix` (as `kiln artifacts ls`), by path.

            for file in client.jobs.outputs(job.id):
                print(file.path, file.size)
        """
        request = artifact_pb2.ListOutputsRequest(job_id=job_id, prefix=prefix)
        with translated():
            files = self._stubs().artifacts.ListOutputs(request, metadata=self._metadata, timeout=60).files
        return [OutputFile(path=file.path, size=file.size) for file in files]

    def download(self, job_id: str, dest: str | os.PathLike[str] = ".", prefix: str = "") -> list[pathlib.Path]:
        """Writes the job's outputs (all, or those under `prefix`) under `dest`, at their paths
        there, as `kiln artifacts get` does; returns the files written. Raises
        FileNotFoundError when there is none, and refuses a path that would leave `dest`.

            written = client.jobs.download(job.id, "results/")   # results/model.pt, ...
        """
        files = self.outputs(job_id, prefix)
        if not files:
            raise FileNotFoundError(f"kiln: job {job_id} has no outputs{f' under {prefix}' if prefix else ''}")
        artifacts = self._stubs().artifacts
        written = []
        for file in files:
            target = _safe_join(pathlib.Path(dest), file.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            request = artifact_pb2.GetOutputRequest(job_id=job_id, path=file.path)
            with translated(), open(target, "wb") as out:
                for chunk in artifacts.GetOutput(request, metadata=self._metadata):
                    out.write(chunk.data)
            written.append(target)
        return written

    # Last in the class: below it, `list` in an annotation would name this method.
    def list(self, project: str = "", state: str | Collection[str] | None = None, limit: int = 100, *,
             active: bool = False, everyone: bool = False, sweep: str = "") -> list[Job]:
        """Jobs newest first, at most `limit` (up to 10,000): yours (every user's you may see
        with `everyone`), of a `project` or a `sweep`, in a `state` or one of several states
        ("running", "SUCCEEDED", ...), finished ones too unless `active` (like `kiln ps`).
        The state is filtered here, among the newest 10,000 jobs the api returns.

            failed = client.jobs.list(project="vision", state="failed", limit=20)
        """
        if not 1 <= limit <= _LIST_MAX:
            raise ValueError(f"kiln: limit must be from 1 to {_LIST_MAX:,}, not {limit}")
        states = None if state is None else {state.upper()} if isinstance(state, str) else {s.upper() for s in state}
        known = FINISHED | _ACTIVE | {"PREEMPTED"}
        if states is not None and not states <= known:
            raise ValueError(f"kiln: unknown state {sorted(states - known)}; states are {sorted(known)}")
        request = job_pb2.ListJobsRequest(
            all=not active and not (states is not None and states <= _ACTIVE),
            limit=limit if states is None else _LIST_MAX, project=project, everyone=everyone, sweep_id=sweep,
        )
        with translated():
            listed = self._stubs().jobs.ListJobs(request, metadata=self._metadata, timeout=60).jobs
        jobs = [_job(job) for job in listed]
        return [job for job in jobs if states is None or job.state in states][:limit]


def _safe_join(dest: pathlib.Path, relative: str) -> pathlib.Path:
    """`dest` joined with a server-given relative path, refusing one that would leave it (the
    CLI's safe_join)."""
    path = dest
    for part in relative.split("/"):
        if part == "..":
            raise ValueError(f"kiln: refusing output path {relative!r}")
        if part not in ("", "."):
            path = path / part
    return path


__all__ = ["FINISHED", "Job", "Jobs", "LogLine", "OutputFile"]
