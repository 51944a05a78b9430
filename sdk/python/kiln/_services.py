"""Inference services from Python: `kiln.Client().services`, what `kiln serve create|ls|status|
update|scale|stop` do, and `predict`, a request over the Open Inference Protocol.

    client = kiln.Client()
    service = client.services.create(
        "digits", models=["digits-net@production"], command=["python", "serve.py"],   # kiln.serve(...)
        inputs=["x:FP32:-1,64"], outputs=["probabilities:FP32:-1,10"], cpus=1, memory="1G",
        workdir=".")                                              # packed as `kiln serve create` packs it
    answer = client.services.predict("digits", {"x": batch}, wait=120)   # numpy arrays by name
    client.services.update("digits", models=["digits-net:4"], command=["python", "serve.py"],
                           traffic=10)                            # 10% to the new revision
    client.services.update("digits", traffic=100)                 # and now all of it
    client.services.scale("digits", 3)                            # or scaling=kiln.Scaling(...)
    client.services.stop("digits")

A service is named `NAME` (in `project`, or the one project you may read that has one) or
`PROJECT/NAME`, as the CLI names it; a model as `NAME@ALIAS`, `NAME:VERSION` or `NAME`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import grpc

from kiln.v1 import job_pb2, serve_pb2

from . import _predict
from ._address import Metadata
from ._errors import KilnError, translated
from ._jobs import _MARKETS, Size, _parse_size, _round
from ._manage import ManageStubs
from ._pack import upload_code

_ENSEMBLES = ("mean", "weighted-mean", "vote", "first")
# How often `predict(wait=...)` asks again while no worker is in rotation.
_WAIT_POLL = 0.2


@dataclass(frozen=True)
class TensorSpec:
    """A tensor a service takes or gives: its name, OIP datatype (FP32, INT64, BYTES, ...) and
    shape, -1 for any size. `TensorSpec.parse("x:FP32:-1,64")` reads the CLI's form."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> TensorSpec:
        """`NAME:DATATYPE:D1,D2,...` (the datatype is checked by the predictor)."""
        parts = text.split(":", 2)
        if len(parts) != 3:
            raise ValueError(f"kiln: {text!r} is not NAME:DATATYPE:SHAPE (such as x:FP32:-1,64)")
        shape = []
        for dim in (d for d in parts[2].split(",") if d):
            try:
                shape.append(int(dim.strip()))
            except ValueError:
                raise ValueError(f"kiln: {dim!r} in {text!r} is not a size or -1") from None
        return cls(parts[0], parts[1].upper(), tuple(shape))


@dataclass(frozen=True)
class Scaling:
    """Workers per member between `min_replicas` and `max_replicas` (0: `min_replicas`, no
    autoscaling), set from their load: `target_in_flight` requests per worker, one more worker
    while their mean time is above `target_latency_ms` (0: off), fewer only after
    `scale_down_delay_ms` of lower load. With `min_replicas=0` an idle member has no worker and
    a request waits up to `cold_wait_ms` (0: 60000) for one. The defaults are the CLI's."""

    min_replicas: int = 1
    max_replicas: int = 0
    target_in_flight: float = 2.0
    target_latency_ms: int = 0
    scale_down_delay_ms: int = 30_000
    cold_wait_ms: int = 0


@dataclass(frozen=True)
class ServiceWorker:
    """A worker job of a member and its state (RUNNING, QUEUED, ...)."""

    job_id: str
    state: str


@dataclass(frozen=True)
class ServiceMember:
    """One member of a revision as it runs: the registry version it serves (`name:version`),
    its weight, the workers the controller wants and the ones it has."""

    member: str
    model_version: str
    weight: float
    revision: int
    wanted: int
    workers: tuple[ServiceWorker, ...] = ()


@dataclass(frozen=True)
class ServiceTraffic:
    """The service's requests over the last five minutes, as the answering predictor took them."""

    window_seconds: float = 0.0
    requests: int = 0
    answered: int = 0
    partial: int = 0
    invalid: int = 0
    failed: int = 0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0


@dataclass(frozen=True)
class Service:
    """A service. `state` is RUNNING or STOPPED; `revision` is the one the predictors answer
    with, `latest_revision` is ahead while a new one is rolled to or tried (`traffic` percent,
    or in `shadow`). `models`, `ensemble`, ... are the latest revision's, as asked; `members`
    are the serving revision's (and the latest's, during a roll). `url` is the predictor's HTTP
    base: infer at `{url}/v2/models/{project}/{name}/infer`."""

    name: str
    project: str
    owner: str
    state: str
    url: str
    revision: int
    latest_revision: int
    models: tuple[str, ...] = ()
    ensemble: str = ""
    deadline_ms: int = 0
    quorum: int = 0
    replicas: int = 0
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    members: tuple[ServiceMember, ...] = ()
    traffic: int = 0
    shadow: bool = False
    scaling: Optional[Scaling] = None
    recent: ServiceTraffic = ServiceTraffic()
    reason: str = ""
    paused_reason: str = ""
    created_at_ms: int = 0
    updated_at_ms: int = 0


def _tensors(messages: Sequence[serve_pb2.TensorMetadata]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in messages)


def _service(message: serve_pb2.Service) -> Service:
    definition = message.definition
    scaling = message.scaling
    return Service(
        name=message.name, project=message.project, owner=message.owner, state=message.state, url=message.url,
        revision=message.revision, latest_revision=message.latest_revision,
        models=tuple(model.model for model in definition.models), ensemble=definition.ensemble,
        deadline_ms=definition.deadline_ms, quorum=definition.quorum, replicas=definition.replicas,
        inputs=_tensors(definition.inputs), outputs=_tensors(definition.outputs),
        members=tuple(
            ServiceMember(member=m.member, model_version=m.model_version, weight=m.weight, revision=m.revision,
                          wanted=m.wanted, workers=tuple(
                              ServiceWorker(w.job_id, job_pb2.JobState.Name(w.state).removeprefix("JOB_STATE_"))
                              for w in m.workers))
            for m in message.members
        ),
        traffic=message.traffic, shadow=message.shadow,
        scaling=Scaling(**{f.name: getattr(scaling, f.name) for f in dataclasses.fields(Scaling)})
        if message.HasField("scaling") else None,
        recent=ServiceTraffic(**{f.name: getattr(message.recent, f.name) for f in dataclasses.fields(ServiceTraffic)}),
        reason=message.reason, paused_reason=message.paused_reason, created_at_ms=message.created_at_ms,
        updated_at_ms=message.updated_at_ms,
    )


def _scaling(scaling: Scaling | None) -> serve_pb2.Scaling | None:
    if scaling is None:
        return None
    return serve_pb2.Scaling(**dataclasses.asdict(scaling))


def _tensor_list(tensors: Sequence[Union[TensorSpec, str]], what: str) -> list[serve_pb2.TensorMetadata]:
    if isinstance(tensors, str):
        raise TypeError(f"kiln: {what} is a list, such as [{tensors!r}]")
    specs = [TensorSpec.parse(t) if isinstance(t, str) else t for t in tensors]
    return [serve_pb2.TensorMetadata(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in specs]


class Services:
    """Creates, reads, updates, scales and stops inference services, and asks them for
    predictions: `kiln.Client().services`."""

    def __init__(self, stubs: Callable[[], ManageStubs], metadata: Metadata):
        self._stubs = stubs  # the client's, opened on first use
        self._metadata = metadata
        # A service's predictor URL by (name, project), asked once (`predict`).
        self._urls: dict[tuple[str, str], str] = {}

    def create(self, name: str, models: Sequence[str], command: Sequence[str], *, project: str = "",
               ensemble: str = "mean", weights: Sequence[float] = (), deadline_ms: int = 100, quorum: int = 1,
               replicas: int = 1, scaling: Scaling | None = None, inputs: Sequence[Union[TensorSpec, str]] = (),
               outputs: Sequence[Union[TensorSpec, str]] = (), cpus: float = 1.0, memory: Size = "1G",
               gpus: int = 0, image: str = "", env: Mapping[str, str] | None = None, market: str = "auto",
               disk: Size | None = None, shm: Size | None = None,
               workdir: str | os.PathLike[str] | None = ".") -> Service:
        """Makes service `name` serving `models` (`NAME@ALIAS`, `NAME:VERSION`, `NAME`; several
        make an ensemble, combined by `ensemble`: "mean", "weighted-mean", "vote" or "first",
        with `weights` in `models` order) on workers running `command` (which calls
        `kiln.serve(predict, load)`); its workers are asked for at once. `workdir` is packed
        and uploaded as the workers' code (None: none). `inputs`/`outputs` declare tensors
        ("x:FP32:-1,64" or TensorSpec) the predictor checks requests against. The other
        arguments mean what `kiln serve create`'s flags do, with the same defaults.

            service = client.services.create("digits", ["digits-net@production"], ["python", "serve.py"],
                                             replicas=2, inputs=["x:FP64:-1,64"])
            print(service.url)
        """
        definition = self._definition(project, models, command, ensemble, weights, deadline_ms, quorum, replicas,
                                      scaling, inputs, outputs, cpus, memory, gpus, image, env, market, workdir,
                                      disk, shm)
        request = serve_pb2.CreateServiceRequest(name=name, project=project, definition=definition)
        with translated():
            return _service(self._stubs().serve.CreateService(request, metadata=self._metadata, timeout=60))

    def get(self, name: str, *, project: str = "") -> Service:
        """The service as it is now: revisions, members, workers, recent traffic (`kiln serve status`)."""
        request = serve_pb2.GetServiceRequest(name=name, project=project)
        with translated():
            return _service(self._stubs().serve.GetService(request, metadata=self._metadata, timeout=60))

    def update(self, name: str, models: Sequence[str] = (), command: Sequence[str] = (), *, project: str = "",
               traffic: int | None = None, shadow: bool = False, ensemble: str = "mean",
               weights: Sequence[float] = (), deadline_ms: int = 100, quorum: int = 1, replicas: int = 1,
               scaling: Scaling | None = None, inputs: Sequence[Union[TensorSpec, str]] = (),
               outputs: Sequence[Union[TensorSpec, str]] = (), cpus: float = 1.0, memory: Size = "1G",
               gpus: int = 0, image: str = "", env: Mapping[str, str] | None = None, market: str = "auto",
               disk: Size | None = None, shm: Size | None = None,
               workdir: str | os.PathLike[str] | None = ".") -> Service:
        """With `models` and `command`: a new revision (made as `create` makes the first), rolled
        to once its workers are ready, or tried beside the serving one: `traffic` percent of
        requests (1 to 100; 100 is a roll), or copies of every request with `shadow` (answers
        compared, never returned). Without them, only how the revision being tried is tried
        changes: `update(name, traffic=100)` rolls to it (`kiln serve update`).

            client.services.update("digits", ["digits-net:4"], ["python", "serve.py"], traffic=10)
            client.services.update("digits", traffic=100)
        """
        if traffic is not None and not 1 <= traffic <= 100:
            raise ValueError(f"kiln: traffic is the percent of requests the new revision answers, 1 to 100, not {traffic}")
        if traffic is not None and shadow:
            raise ValueError("kiln: give traffic or shadow, not both")
        definition = None
        if models or command:
            # The code goes to the service's project.
            home = self.get(name, project=project).project
            definition = self._definition(home, models, command, ensemble, weights, deadline_ms, quorum, replicas,
                                          scaling, inputs, outputs, cpus, memory, gpus, image, env, market, workdir,
                                          disk, shm)
        elif traffic is None and not shadow:
            raise ValueError("kiln: give the new revision (models and command), or traffic / shadow for the one "
                             "being tried")
        request = serve_pb2.UpdateServiceRequest(name=name, definition=definition, traffic=traffic or 0,
                                                 shadow=shadow, project=project)
        with translated():
            return _service(self._stubs().serve.UpdateService(request, metadata=self._metadata, timeout=60))

    def scale(self, name: str, replicas: int | None = None, *, scaling: Scaling | None = None,
              project: str = "") -> Service:
        """Sets the workers per member: a fixed number, or `scaling` bounds to autoscale within,
        without a new revision (`kiln serve scale`).

            client.services.scale("digits", 4)
            client.services.scale("digits", scaling=kiln.Scaling(min_replicas=0, max_replicas=8))
        """
        if (replicas is None) == (scaling is None):
            raise ValueError("kiln: scale takes replicas or scaling (one of them)")
        if replicas is not None and replicas < 1:
            raise ValueError(f"kiln: replicas is {replicas}; give 1 or more (scaling=kiln.Scaling(min_replicas=0, "
                             "max_replicas=N) scales to zero)")
        request = serve_pb2.ScaleServiceRequest(name=name, replicas=replicas or 0, scaling=_scaling(scaling),
                                                project=project)
        with translated():
            return _service(self._stubs().serve.ScaleService(request, metadata=self._metadata, timeout=60))

    def stop(self, name: str, *, project: str = "") -> Service:
        """Stops the service: the predictors forget it, and its workers are stopped."""
        request = serve_pb2.StopServiceRequest(name=name, project=project)
        with translated():
            return _service(self._stubs().serve.StopService(request, metadata=self._metadata, timeout=60))

    def predict(self, name: str, inputs: Mapping[str, Any], *, project: str = "", deadline_ms: int | None = None,
                timeout: float = 60.0, wait: float = 0.0) -> dict[str, Any]:
        """Asks the service for a prediction over the Open Inference Protocol: `inputs` are
        numpy arrays (or what `numpy.asarray` takes) by input name, and the answer is the
        outputs, numpy arrays by name (BYTES as arrays of bytes objects). `deadline_ms` is the
        request's deadline (default: the service's). A refusal is a KilnError with the gRPC
        code of the predictor's HTTP status (INVALID_ARGUMENT for a bad input, UNAVAILABLE
        while no worker is in rotation, DEADLINE_EXCEEDED, ...) and its message; `wait`
        seconds of UNAVAILABLE are waited out, for a service whose workers are starting.
        Needs numpy.

            outputs = client.services.predict("digits", {"x": np.zeros((1, 64))}, wait=120)
            print(outputs["probabilities"].argmax(axis=1))
        """
        body, header_length = _predict.encode(inputs, deadline_ms)
        key = (name, project)
        if key not in self._urls:
            self._urls[key] = self.get(name, project=project).url
        model = f"{project}/{name}" if project and "/" not in name else name
        url = f"{self._urls[key]}/v2/models/{urllib.parse.quote(model, safe='/')}/infer"
        token = dict(self._metadata)["authorization"].removeprefix("Bearer ")
        deadline = time.monotonic() + wait
        while True:
            try:
                return _predict.post(url, body, header_length, token, timeout)
            except KilnError as error:
                if error.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                    raise
            time.sleep(_WAIT_POLL)

    def _definition(self, project: str, models: Sequence[str], command: Sequence[str], ensemble: str,
                    weights: Sequence[float], deadline_ms: int, quorum: int, replicas: int,
                    scaling: Scaling | None, inputs: Sequence[Union[TensorSpec, str]],
                    outputs: Sequence[Union[TensorSpec, str]], cpus: float, memory: Size, gpus: int, image: str,
                    env: Mapping[str, str] | None, market: str,
                    workdir: str | os.PathLike[str] | None, disk: Size | None = None,
                    shm: Size | None = None) -> serve_pb2.ServiceDefinition:
        """A revision's definition, checked as `kiln serve create` checks its flags; the code
        uploaded to `project`."""
        if isinstance(models, str):
            raise TypeError(f"kiln: models is a list, such as [{models!r}]")
        if isinstance(command, (str, bytes)):
            raise TypeError("kiln: command is a list of arguments, such as ['python', 'serve.py']")
        if not models:
            raise ValueError("kiln: give the service's model(s): NAME@ALIAS, NAME:VERSION or NAME (several for an "
                             "ensemble)")
        if not command:
            raise ValueError("kiln: give the worker's command (it calls kiln.serve(predict, load))")
        if weights and len(weights) != len(models):
            raise ValueError(f"kiln: weights gives {len(weights)} weight(s) for {len(models)} model(s); give one per "
                             "model, in order")
        if ensemble not in _ENSEMBLES:
            raise ValueError(f"kiln: ensemble must be one of {', '.join(_ENSEMBLES)}, not {ensemble!r}")
        if market not in _MARKETS:
            raise ValueError(f"kiln: market must be one of {sorted(_MARKETS)}, not {market!r}")
        if not (math.isfinite(cpus) and 0 <= cpus <= 4_000_000):
            raise ValueError(f"kiln: cpus is {cpus}; give a number of cores such as 2 or 0.5")
        worker = job_pb2.JobSpec(
            command=list(command), env=dict(env or {}), image=image, gpus=gpus, market=_MARKETS[market],
            resources=job_pb2.Resources(
                cpu_millis=_round(cpus * 1000), memory_bytes=_parse_size(memory, "memory"),
                disk_bytes=0 if disk is None else _parse_size(disk, "disk"),
                shm_bytes=0 if shm is None else _parse_size(shm, "shm"),
            ),
        )
        if workdir is not None:
            with translated():
                worker.code_digest = upload_code(self._stubs().artifacts, self._metadata, workdir, project)
        return serve_pb2.ServiceDefinition(
            models=[serve_pb2.ServiceModel(model=model, weight=weights[at] if weights else 0.0)
                    for at, model in enumerate(models)],
            ensemble=ensemble, deadline_ms=deadline_ms, quorum=quorum, replicas=replicas, scaling=_scaling(scaling),
            worker=worker, inputs=_tensor_list(inputs, "inputs"), outputs=_tensor_list(outputs, "outputs"),
        )

    # Last in the class: below it, `list` in an annotation would name this method.
    def list(self, project: str = "", *, all: bool = False) -> list[Service]:
        """Running services (every one with `all`), of one `project` or every project you may
        read (`kiln serve ls`)."""
        request = serve_pb2.ListServicesRequest(project=project, all=all)
        with translated():
            listed = self._stubs().serve.ListServices(request, metadata=self._metadata, timeout=60).services
        return [_service(service) for service in listed]


__all__ = ["Scaling", "Service", "ServiceMember", "ServiceTraffic", "ServiceWorker", "Services", "TensorSpec"]
