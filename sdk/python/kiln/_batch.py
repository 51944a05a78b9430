"""Batches from Python: `kiln.Client().batches`, for data pipelines.

    client = kiln.Client()
    batch = client.batches.create(["python", "resize.py", "{uri}", "{output}"], image="me/resize:1", max_workers=50)
    batch.add(f"s3://photos/{n}.jpg" for n in range(1_000_000))   # any iterable; sent in chunks
    batch.seal()
    print(batch.progress())                                        # counters, rate, ETA
    final = batch.wait()                                           # until done (or cancelled)
    found = batch.search_logs("out of memory", state="dead")       # kept lines of dead attempts, by log-ingest
    for match in found.lines:
        print(match.key, match.attempt, match.text)
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import grpc

from kiln.v1 import batch_pb2, batch_pb2_grpc, item_log_pb2, item_log_pb2_grpc

from ._address import Metadata
from ._client import RunReads
from ._jobs import _MARKETS, _STREAMS, Jobs
from ._manage import ManageChannels
from ._registry import Models
from ._run import _channel, _endpoints, _service_address
from ._services import Services
from ._sweeps import Sweeps
from ._tokens import Tokens

_STATES = {"pending": batch_pb2.ITEM_STATE_PENDING, "succeeded": batch_pb2.ITEM_STATE_SUCCEEDED,
           "failed": batch_pb2.ITEM_STATE_FAILED, "dead": batch_pb2.ITEM_STATE_DEAD}
# How an attempt can end: what search_logs filters on.
_ENDED = {name: _STATES[name] for name in ("succeeded", "failed", "dead")}
_STATE_NAMES = {value: name for name, value in _STATES.items()}
_SEARCH_LIMIT = 100_000


_FAILURES = {"any": batch_pb2.ITEM_FAILURE_UNSPECIFIED, "exit": batch_pb2.ITEM_FAILURE_EXIT,
             "timeout": batch_pb2.ITEM_FAILURE_TIMEOUT, "oom": batch_pb2.ITEM_FAILURE_OUT_OF_MEMORY,
             "not-started": batch_pb2.ITEM_FAILURE_NOT_STARTED}
_ACTIONS = {"retry": batch_pb2.RETRY_ACTION_RETRY, "fail": batch_pb2.RETRY_ACTION_FAIL}


@dataclass(frozen=True)
class RetryRule:
    """What a failed attempt leads to: `action` "retry" (while max_attempts allows) or "fail" (a
    dead letter at once), for attempts that failed `on` this way ("any", "exit", "timeout",
    "oom", "not-started") with one of `exit_codes` (empty: any). A batch's rules are tried in
    order; the first that matches decides; none matching retries.

        RetryRule("fail", on="exit", exit_codes=(2,))   # bad input: no second attempt
        RetryRule("fail", on="timeout")
    """

    action: str
    on: str = "any"
    exit_codes: Sequence[int] = ()

    def _proto(self) -> batch_pb2.RetryRule:
        if self.action not in _ACTIONS:
            raise ValueError(f"action must be one of {sorted(_ACTIONS)}")
        if self.on not in _FAILURES:
            raise ValueError(f"on must be one of {sorted(_FAILURES)}")
        return batch_pb2.RetryRule(on=_FAILURES[self.on], exit_codes=list(self.exit_codes), action=_ACTIONS[self.action])


@dataclass(frozen=True)
class Progress:
    """A batch's counters (they always add up to `total`), rate and ETA."""

    state: str  # OPEN, SEALED, DONE or CANCELLED
    total: int
    pending: int
    running: int
    succeeded: int
    failed: int
    dead: int
    items_per_second: float
    eta_seconds: int  # -1 when unknown
    workers: int

    @property
    def finished(self) -> bool:
        return self.state in ("DONE", "CANCELLED")


@dataclass(frozen=True)
class Spread:
    p50: float
    p95: float
    max: float


@dataclass(frozen=True)
class Usage:
    """What a batch's items used (their last attempts): cores kept busy, peak memory in bytes
    and wall seconds, each as p50/p95/max, and what to ask for."""

    items: int
    cpu_cores: Spread
    peak_memory_bytes: Spread
    wall_seconds: Spread
    sizing_hint: str  # "items used p95 0.70 CPU, 380 MiB: `--cpu 1 --mem 512M` fits with headroom"


@dataclass(frozen=True)
class LogMatch:
    """One kept output line of an item's attempt that a search matched."""

    key: str
    attempt: int
    line: int  # its place among the attempt's kept lines (1, 2, ...)
    stream: str  # "stdout" or "stderr" ("" when unknown)
    text: str
    state: str  # how the attempt ended: "succeeded", "failed" (retried after) or "dead"
    timestamp_ms: int


@dataclass(frozen=True)
class LogSearch:
    """What `Batch.search_logs` found: lines in (key, attempt, line) order; `truncated` when
    more lines matched than the limit."""

    lines: list[LogMatch]
    truncated: bool


@dataclass(frozen=True)
class Added:
    added: int
    duplicates: int
    total: int


class Batch:
    """One batch: add items, seal, watch, wait."""

    def __init__(self, stub: batch_pb2_grpc.BatchServiceStub, metadata: Metadata, batch_id: str,
                 logs: Callable[[], item_log_pb2_grpc.BatchLogServiceStub] | None = None):
        self._stub = stub
        self._metadata = metadata
        self._logs = logs  # log-ingest's BatchLogService (search_logs), made when first needed
        self.id = batch_id

    def __repr__(self) -> str:
        return f"Batch({self.id!r})"

    def add(self, items: Iterable[str | Mapping[str, Any]], chunk: int = 5000) -> Added:
        """Adds items: URIs (the URI is the key), or mappings with "uri", "key" and "params".
        Adding an item again with the same content is harmless; under a key the batch has with
        other content, it raises (and nothing of that chunk is added)."""

        def requests() -> Iterator[batch_pb2.AddItemsRequest]:
            source = iter(items)
            while True:
                part = list(itertools.islice(source, chunk))
                if not part:
                    return
                yield batch_pb2.AddItemsRequest(batch_id=self.id, items=[_item(i) for i in part])

        response = self._stub.AddItems(requests(), metadata=self._metadata)
        return Added(added=response.added, duplicates=response.duplicates, total=response.total)

    def seal(self) -> Progress:
        """No more items: the batch is done when its last item is."""
        return _progress(self._stub.SealBatch(batch_pb2.BatchRef(batch_id=self.id), metadata=self._metadata))

    def cancel(self) -> Progress:
        return _progress(self._stub.CancelBatch(batch_pb2.BatchRef(batch_id=self.id), metadata=self._metadata))

    def retry_failed(self) -> int:
        """Gives the dead items new attempts; returns how many."""
        return self._stub.RetryFailed(batch_pb2.BatchRef(batch_id=self.id), metadata=self._metadata).retried

    def progress(self) -> Progress:
        return _progress(self._stub.GetBatch(batch_pb2.BatchRef(batch_id=self.id), metadata=self._metadata))

    def usage(self) -> Usage:
        """What the items used so far; each item's own figures are on `items()` (cpu_seconds,
        peak_memory_bytes, duration_ms)."""
        usage = self._stub.GetBatch(batch_pb2.BatchRef(batch_id=self.id), metadata=self._metadata).usage

        def spread(s: batch_pb2.UsageSpread) -> Spread:
            return Spread(p50=s.p50, p95=s.p95, max=s.max)

        return Usage(items=usage.items, cpu_cores=spread(usage.cpu_cores),
                     peak_memory_bytes=spread(usage.peak_memory_bytes), wall_seconds=spread(usage.wall_seconds),
                     sizing_hint=usage.sizing_hint)

    def wait(self, poll: float = 1.0, timeout: float | None = None) -> Progress:
        """Waits until the batch is done or cancelled; returns its final progress."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            progress = self.progress()
            if progress.finished:
                return progress
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"batch {self.id} is not done after {timeout} s: {progress}")
            time.sleep(poll)

    def items(self, state: str | None = None) -> Iterator[batch_pb2.ItemStatus]:
        """The batch's items in key order, all or those in one state (pending, succeeded,
        failed, dead)."""
        states = [] if state is None else [_STATES[state]]
        token = ""
        while True:
            page = self._stub.ListItems(
                batch_pb2.ListItemsRequest(batch_id=self.id, states=states, page_token=token, limit=1000),
                metadata=self._metadata,
            )
            yield from page.items
            if not page.next_page_token:
                return
            token = page.next_page_token

    def logs(self, key: str) -> list[str]:
        """The output lines an item's attempts printed (the last ones of each attempt)."""
        response = self._stub.GetItemLogs(batch_pb2.GetItemLogsRequest(batch_id=self.id, key=key), metadata=self._metadata)
        return [line.text for line in response.lines]

    def search_logs(self, pattern: str, *, regex: bool = False, state: str | None = None,
                    limit: int = 1000) -> LogSearch:
        """The kept output lines of the batch's items that contain `pattern` (case-sensitive),
        or match it as a regular expression (Rust regex syntax) with `regex=True`; of every
        attempt, or only of attempts that ended `state` ("succeeded", "failed": retried after,
        "dead": the attempt that made the item a dead letter). At most `limit` lines (up to
        100,000); `truncated` says more matched. Asks log-ingest (BatchLogService)."""
        if state is not None and state not in _ENDED:
            raise ValueError(f"state must be one of {sorted(_ENDED)} (or None for every attempt), not {state!r}")
        if not 1 <= limit <= _SEARCH_LIMIT:
            raise ValueError(f"limit must be from 1 to {_SEARCH_LIMIT:,}, not {limit}")
        if self._logs is None:
            raise RuntimeError("kiln: this Batch does not know log-ingest's address: get it from kiln.Client().batches")
        request = item_log_pb2.SearchBatchLogsRequest(
            batch_id=self.id, pattern=pattern, regex=regex,
            state=batch_pb2.ITEM_STATE_UNSPECIFIED if state is None else _ENDED[state], limit=limit,
        )
        response = self._logs().SearchBatchLogs(request, metadata=self._metadata)
        return LogSearch(
            lines=[LogMatch(key=m.key, attempt=m.attempt, line=m.line, stream=_STREAMS.get(m.stream, ""), text=m.text,
                            state=_STATE_NAMES.get(m.state, ""), timestamp_ms=m.timestamp_ms)
                   for m in response.lines],
            truncated=response.truncated,
        )


class Batches:
    def __init__(self, stub: batch_pb2_grpc.BatchServiceStub, metadata: Metadata,
                 logs: Callable[[], item_log_pb2_grpc.BatchLogServiceStub] | None = None):
        self._stub = stub
        self._metadata = metadata
        self._logs = logs

    def create(self, command: list[str], *, image: str = "", name: str = "", project: str = "",
               env: Mapping[str, str] | None = None, cpu: float = 1.0, memory_mb: int = 1024,
               output_prefix: str = "", max_attempts: int = 3, timeout_secs: int = 3600,
               max_workers: int = 4, market: str = "auto", gpus: int = 0, slots: int = 1,
               retry_rules: Sequence[RetryRule] = (), disk: int | str | None = None,
               shm: int | str | None = None) -> Batch:
        """Creates a batch whose `command` runs once per item ({uri}, {output}, {item} and
        {attempt} are filled in), or a built-in (["kiln:noop"]). `gpus` are per worker, which
        runs `slots` items at once (asking for `cpu` and `memory_mb` times that); `retry_rules`
        say which failures are retried (see RetryRule). `disk` and `shm` (bytes, or "20G" as the
        CLI reads it) are each worker's own disk (needs `image`) and /dev/shm, as `--disk` and
        `--shm` of `kiln batch create`."""
        if market not in _MARKETS:
            raise ValueError(f"market must be one of {sorted(_MARKETS)}")
        from ._jobs import _parse_size

        spec = batch_pb2.BatchSpec(
            name=name, project=project, image=image, command=list(command), env=dict(env or {}),
            cpu_millis=int(round(cpu * 1000)), memory_mb=memory_mb, output_prefix=output_prefix,
            max_attempts=max_attempts, item_timeout_secs=timeout_secs, max_workers=max_workers,
            market=_MARKETS[market], gpus=gpus, slots=slots, retry_rules=[rule._proto() for rule in retry_rules],
            disk_bytes=0 if disk is None else _parse_size(disk, "disk"),
            shm_bytes=0 if shm is None else _parse_size(shm, "shm"),
        )
        created = self._stub.CreateBatch(batch_pb2.CreateBatchRequest(spec=spec), metadata=self._metadata)
        return Batch(self._stub, self._metadata, created.id, self._logs)

    def get(self, batch_id: str) -> Batch:
        self._stub.GetBatch(batch_pb2.BatchRef(batch_id=batch_id), metadata=self._metadata)
        return Batch(self._stub, self._metadata, batch_id, self._logs)

    def list(self, all: bool = False) -> list[Batch]:
        response = self._stub.ListBatches(batch_pb2.ListBatchesRequest(all=all), metadata=self._metadata)
        return [Batch(self._stub, self._metadata, b.id, self._logs) for b in response.batches]


class Client(RunReads):
    """A client of a kiln endpoint: `kiln up`'s credentials (KILN_HOME), or KILN_ADDR and
    KILN_TOKEN (the other services' addresses come from the api, or KILN_LOGS_ADDR,
    KILN_BATCH_ADDR, KILN_ADVISOR_ADDR, KILN_PREDICTOR_ADDR). `jobs` submits and follows jobs
    (see kiln._jobs); `batches` drives batches; `sweeps` runs sweeps (kiln._sweeps); `models`
    is the model registry (kiln._registry); `services` serves models and asks them for
    predictions (kiln._services); `tokens` makes tokens for automation (kiln._tokens); `runs`
    and `metrics` read runs back (see kiln._client). The channels of jobs, sweeps, models,
    services and tokens open on first use."""

    def __init__(self) -> None:
        api, logs, token = _endpoints()
        address = _service_address("batches", api, token)
        self._channel = _channel(address, options=[("grpc.max_send_message_length", 16 << 20)])
        metadata: Metadata = (("authorization", f"Bearer {token}"),)
        self._api_address, self._logs_address, self._metadata = api, logs, metadata
        self._search_channel: grpc.Channel | None = None
        self._search_stub: item_log_pb2_grpc.BatchLogServiceStub | None = None
        self.batches = Batches(batch_pb2_grpc.BatchServiceStub(self._channel), metadata, self._batch_logs)
        self.jobs = Jobs(self._stubs, metadata)
        self._manage = ManageChannels(api, token)
        self.sweeps = Sweeps(self._manage.stubs, metadata)
        self.models = Models(self._manage.stubs, metadata)
        self.services = Services(self._manage.stubs, metadata)
        self.tokens = Tokens(self._manage.stubs, metadata)

    def _batch_logs(self) -> item_log_pb2_grpc.BatchLogServiceStub:
        """log-ingest's BatchLogService, on a channel opened by the first search. Its answers
        (up to 100,000 lines) may exceed gRPC's default 4 MiB: the request's limit bounds them."""
        if self._search_stub is None:
            self._search_channel = _channel(self._logs_address, options=[("grpc.max_receive_message_length", -1)])
            self._search_stub = item_log_pb2_grpc.BatchLogServiceStub(self._search_channel)
        return self._search_stub

    def close(self) -> None:
        self._channel.close()
        if self._search_channel is not None:
            self._search_channel.close()
            self._search_channel = self._search_stub = None
        self._close_reads()
        self._manage.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _item(item: str | Mapping[str, Any]) -> batch_pb2.Item:
    if isinstance(item, str):
        return batch_pb2.Item(uri=item)
    return batch_pb2.Item(key=str(item.get("key", "")), uri=str(item.get("uri", "")),
                          params={str(k): str(v) for k, v in dict(item.get("params", {})).items()})


def _progress(batch: batch_pb2.Batch) -> Progress:
    c = batch.counts
    return Progress(
        state=batch_pb2.BatchState.Name(batch.state).removeprefix("BATCH_STATE_"),
        total=c.total, pending=c.pending, running=c.running, succeeded=c.succeeded, failed=c.failed,
        dead=c.dead, items_per_second=batch.items_per_second, eta_seconds=batch.eta_seconds,
        workers=batch.workers,
    )


__all__ = ["Added", "Batch", "Batches", "Client", "LogMatch", "LogSearch", "Progress", "RetryRule", "Spread", "Usage"]
