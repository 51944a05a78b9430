"""Reading runs back: `kiln.Client().runs(...)` and `.metrics(...)`.

    client = kiln.Client()
    runs = client.runs(project="vision", sweep=sweep_id, where=["lr<0.01", "val/loss<=0.5"])
    best = min(runs, key=lambda run: run.summary.get("val/loss", float("inf")))
    series = client.metrics([run.id for run in runs], keys=["val/loss"])
    frame = client.metrics([run.id for run in runs], keys=["val/loss"], frame=True)  # pandas

Results are plain dataclasses; with `frame=True` they are pandas DataFrames (pandas must be
installed). A `where` condition is `KEY OP VALUE` with OP one of =, !=, <, <=, >, >=; KEY is a
config key, else a summary key, else a metric key: its best value (the lowest, or the highest
for keys naming a score: acc, auc, f1, precision, recall, score, reward, iou, map, bleu, rouge;
`goal="min"`/`"max"` decides for every key), or its latest with `KEY@last`. This is how
`kiln runs ls --where` reads conditions too.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, NamedTuple, overload

import grpc

from kiln.v1 import artifact_pb2_grpc, job_pb2, job_pb2_grpc, log_pb2, log_pb2_grpc

from ._address import Metadata
from ._track import from_proto

if TYPE_CHECKING:
    import pandas

_STATE_PREFIX = "JOB_STATE_"
_CONDITION = re.compile(r"^\s*(?P<key>[^<>=!]+?)\s*(?P<op><=|>=|!=|==|=|<|>)\s*(?P<value>.*?)\s*$")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


@dataclass(frozen=True)
class RunInfo:
    """One run: its job's identity and state, config and summary values."""

    id: str
    name: str
    project: str
    owner: str
    state: str
    sweep_id: str
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    created_at_ms: int = 0
    started_at_ms: int = 0
    finished_at_ms: int = 0

    @property
    def duration_s(self) -> float | None:
        """Seconds it ran (so far, while it runs); None before it started."""
        if not self.started_at_ms:
            return None
        end = self.finished_at_ms or time.time_ns() // 1_000_000
        return max(end - self.started_at_ms, 0) / 1000


@dataclass(frozen=True)
class Series:
    """The points of one key of one run (downsampled: each bucket keeps its lowest and highest)."""

    job_id: str
    key: str
    steps: list[int]
    values: list[float]
    timestamps_ms: list[int]
    total_points: int


@dataclass(frozen=True)
class Condition:
    key: str
    op: str
    value: object

    def holds(self, actual: object) -> bool:
        if actual is None:
            return False
        if isinstance(self.value, float) and not isinstance(actual, bool) and isinstance(actual, (int, float)):
            return _OPS[self.op](float(actual), self.value)
        if self.op in ("=", "==", "!="):
            return _OPS[self.op](str(actual) if not isinstance(actual, bool) else str(actual).lower(), str(self.value))
        return False


def parse_condition(text: str) -> Condition:
    """`lr<0.01`, `optimizer=adam`, `val/loss>=0.5`: a clear ValueError for anything else."""
    match = _CONDITION.match(text)
    if not match or not match["key"].strip():
        raise ValueError(f"kiln: condition {text!r} is not KEY OP VALUE with OP one of =, !=, <, <=, >, >=")
    key, op, raw = match["key"].strip(), match["op"], match["value"]
    if raw[:1] in ("<", ">", "=", "!") or not raw:
        raise ValueError(f"kiln: condition {text!r}: unknown operator or no value; use one of =, !=, <, <=, >, >=")
    try:
        number = float(raw)
    except ValueError:
        number = None
    if number is not None:
        if not math.isfinite(number):
            raise ValueError(f"kiln: condition {text!r}: {raw} is not a finite number")
        return Condition(key, op, number)
    if op not in ("=", "==", "!="):
        raise ValueError(f"kiln: condition {text!r}: {op} needs a number, {raw!r} is not one")
    return Condition(key, op, raw)


def _run(job: job_pb2.Job) -> RunInfo:
    return RunInfo(
        id=job.id, name=job.spec.name, project=job.spec.project, owner=job.owner,
        state=job_pb2.JobState.Name(job.state).removeprefix(_STATE_PREFIX), sweep_id=job.sweep_id,
        config=from_proto(job.config), summary=from_proto(job.summary), created_at_ms=job.created_at_ms,
        started_at_ms=job.started_at_ms, finished_at_ms=job.finished_at_ms,
    )


def _data_frame(rows: list[Any], columns: list[str] | None = None) -> pandas.DataFrame:
    try:
        from pandas import DataFrame
    except ImportError as error:
        raise ImportError("kiln: frame=True needs pandas (pip install pandas)") from error
    return DataFrame(rows, columns=columns)


class Stubs(NamedTuple):
    """The api's JobService and ArtifactService, and log-ingest's LogService."""

    jobs: job_pb2_grpc.JobServiceStub
    logs: log_pb2_grpc.LogServiceStub
    artifacts: artifact_pb2_grpc.ArtifactServiceStub


class RunReads:
    """The read half of `kiln.Client` (mixed into it): needs `_api_address`, `_logs_address`
    and `_metadata`."""

    # Set by the class it is mixed into.
    _api_address: str
    _logs_address: str
    _metadata: Metadata
    # The channels and stubs of the reads, made on first use.
    _read_channels: tuple[grpc.Channel, ...] = ()
    _read_stubs: Stubs | None = None

    def _stubs(self) -> Stubs:
        """The stubs the reads and `Client.jobs` use, on channels opened on first use."""
        from ._run import _channel

        if self._read_stubs is None:
            api = _channel(self._api_address)
            logs = _channel(self._logs_address) if self._logs_address != self._api_address else api
            self._read_channels = tuple({api, logs})
            self._read_stubs = Stubs(job_pb2_grpc.JobServiceStub(api), log_pb2_grpc.LogServiceStub(logs),
                                     artifact_pb2_grpc.ArtifactServiceStub(api))
        return self._read_stubs

    def _close_reads(self) -> None:
        for channel in self._read_channels:
            channel.close()
        self._read_stubs = None

    @overload
    def runs(self, project: str = "", sweep: str = "", where: str | Iterable[str] | None = None,
             *, everyone: bool = False, limit: int = 1000, goal: str = "auto",
             frame: Literal[False] = False) -> list[RunInfo]: ...

    @overload
    def runs(self, project: str = "", sweep: str = "", where: str | Iterable[str] | None = None,
             *, everyone: bool = False, limit: int = 1000, goal: str = "auto",
             frame: Literal[True]) -> pandas.DataFrame: ...

    @overload
    def runs(self, project: str = "", sweep: str = "", where: str | Iterable[str] | None = None,
             *, everyone: bool = False, limit: int = 1000, goal: str = "auto",
             frame: bool) -> list[RunInfo] | pandas.DataFrame: ...

    def runs(self, project: str = "", sweep: str = "", where: str | Iterable[str] | None = None,
             *, everyone: bool = False, limit: int = 1000, goal: str = "auto",
             frame: bool = False) -> list[RunInfo] | pandas.DataFrame:
        """Runs newest first (ended ones too): of a project, of a sweep, matching every `where`
        condition. A list of RunInfo, or a DataFrame (one row a run, config keys as columns
        prefixed `config.`, summary keys `summary.`) with `frame=True`."""
        conditions = [parse_condition(where)] if isinstance(where, str) else [parse_condition(w) for w in where or ()]
        jobs = self._stubs().jobs
        listed = jobs.ListJobs(
            job_pb2.ListJobsRequest(all=True, limit=limit, project=project, everyone=everyone, sweep_id=sweep),
            metadata=self._metadata,
        )
        runs = [_run(job) for job in listed.jobs]
        if goal not in ("auto", "min", "max"):
            raise ValueError(f"kiln: goal {goal!r} is not auto, min or max")
        if conditions:
            values = self._metric_values(runs, conditions, goal)
            runs = [run for run in runs if all(c.holds(_lookup(run, c.key, values)) for c in conditions)]
        if not frame:
            return runs
        rows: list[dict[str, Any]] = []
        for run in runs:
            row = {"id": run.id, "name": run.name, "project": run.project, "state": run.state, "sweep_id": run.sweep_id,
                   "duration_s": run.duration_s}
            row.update({f"config.{k}": v for k, v in run.config.items()})
            row.update({f"summary.{k}": v for k, v in run.summary.items()})
            rows.append(row)
        return _data_frame(rows)

    def _metric_values(self, runs: list[RunInfo], conditions: list[Condition],
                       goal: str) -> dict[tuple[str, str], float]:
        """{(job, key): value} for the metric keys the conditions name (no run's config or
        summary key): the best value, and the latest under `KEY@last`."""
        named = {c.key.removesuffix("@last") for c in conditions}
        keys = sorted(k for k in named if not any(k in r.config or k in r.summary for r in runs))
        if not keys or not runs:
            return {}
        logs = self._stubs().logs
        found: dict[tuple[str, str], float] = {}
        for start in range(0, len(runs), 50):
            ids = [run.id for run in runs[start:start + 50]]
            response = logs.LatestMetrics(log_pb2.LatestMetricsRequest(job_ids=ids, keys=keys), metadata=self._metadata)
            for s in response.series:
                if s.points:
                    found[(s.job_id, f"{s.key}@last")] = s.points[-1].value
            query = log_pb2.QueryMetricsRequest(job_ids=ids, keys=keys, max_points=1000)
            for s in logs.QueryMetrics(query, metadata=self._metadata).series:
                # Each bucket keeps its lowest and highest point: the extremes survive downsampling.
                values = [p.value for p in s.points if not math.isnan(p.value)]
                if values:
                    found[(s.job_id, s.key)] = max(values) if maximizes(s.key, goal) else min(values)
        return found

    @overload
    def metrics(self, job_ids: str | Iterable[str], keys: Iterable[str] | None = None, *, max_points: int = 1000,
                latest: bool = False, frame: Literal[False] = False) -> list[Series]: ...

    @overload
    def metrics(self, job_ids: str | Iterable[str], keys: Iterable[str] | None = None, *, max_points: int = 1000,
                latest: bool = False, frame: Literal[True]) -> pandas.DataFrame: ...

    @overload
    def metrics(self, job_ids: str | Iterable[str], keys: Iterable[str] | None = None, *, max_points: int = 1000,
                latest: bool = False, frame: bool) -> list[Series] | pandas.DataFrame: ...

    def metrics(self, job_ids: str | Iterable[str], keys: Iterable[str] | None = None, *, max_points: int = 1000,
                latest: bool = False, frame: bool = False) -> list[Series] | pandas.DataFrame:
        """Series of several runs: a list of Series (every key when `keys` is None), the last
        point of each with `latest=True`; with `frame=True` a long DataFrame (job_id, key, step,
        value, timestamp_ms)."""
        ids = [job_ids] if isinstance(job_ids, str) else list(job_ids)
        logs = self._stubs().logs
        wanted = list(keys or [])
        # Both answers carry MetricSeries (LatestMetrics one point each).
        response: log_pb2.LatestMetricsResponse | log_pb2.QueryMetricsResponse
        if latest:
            response = logs.LatestMetrics(log_pb2.LatestMetricsRequest(job_ids=ids, keys=wanted), metadata=self._metadata)
        else:
            response = logs.QueryMetrics(
                log_pb2.QueryMetricsRequest(job_ids=ids, keys=wanted, max_points=max_points), metadata=self._metadata
            )
        series = [
            Series(job_id=s.job_id, key=s.key, steps=[p.step for p in s.points], values=[p.value for p in s.points],
                   timestamps_ms=[p.timestamp_ms for p in s.points], total_points=s.total_points)
            for s in response.series
        ]
        if not frame:
            return series
        rows = [(s.job_id, s.key, step, value, at) for s in series for step, value, at in zip(s.steps, s.values, s.timestamps_ms)]
        return _data_frame(rows, columns=["job_id", "key", "step", "value", "timestamp_ms"])


_SCORES = ("acc", "auc", "f1", "precision", "recall", "score", "reward", "iou", "map", "bleu", "rouge")


def maximizes(key: str, goal: str = "auto") -> bool:
    """Whether the best value of `key` is its highest (as `kiln runs ls --goal` decides)."""
    if goal != "auto":
        return goal == "max"
    name = key.rsplit("/", 1)[-1].lower()
    return any(score in name for score in _SCORES)


def _lookup(run: RunInfo, key: str, metrics: dict[tuple[str, str], float]) -> Any:
    if key in run.config:
        return run.config[key]
    if key in run.summary:
        return run.summary[key]
    return metrics.get((run.id, key))


__all__ = ["Condition", "RunInfo", "RunReads", "Series", "Stubs", "maximizes", "parse_condition"]
