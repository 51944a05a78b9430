"""Sweeps from Python: `kiln.Client().sweeps`, what `kiln sweep create|status|ls|best|stop|resume`
do. (In a trial, `kiln.init()` and `kiln.should_stop()` are in kiln._sweep.)

    client = kiln.Client()
    sweep = client.sweeps.create({
        "name": "lr-search",
        "objective": {"metric": "val/loss", "goal": "minimize"},
        "algorithm": {"name": "random", "seed": 0},
        "budget": {"max-trials": 20, "max-parallel": 4},
        "parameters": {"lr": {"type": "float", "min": 1e-5, "max": 1e-1, "log": True}},
        "trial": {"command": ["python", "train.py"], "cpu": 2, "mem": "8G"},
    }, workdir=".")                                  # or a YAML text, or a pathlib.Path to one
    final = client.sweeps.wait(sweep.id)             # "finished", "failed" or "stopped"
    best = client.sweeps.best(sweep.id)              # a Trial: job_id, config, value

The spec is the one `kiln sweep create -f` reads (see the README's Sweeps): a dict is sent as
JSON, which YAML reads as it is. The advisor checks it and refuses a bad one with
INVALID_ARGUMENT naming every field at fault, raised as `kiln.KilnError`.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

import yaml

from kiln.v1 import sweep_pb2

from ._address import Metadata
from ._errors import retried, translated
from ._manage import ManageStubs
from ._pack import upload_code
from ._track import from_proto

Spec = Union[Mapping[str, Any], str, "os.PathLike[str]"]
"""A sweep spec: a dict, a YAML text, or the path (a `pathlib.Path`) of a YAML file."""

# The states a sweep ends in: no trial runs and none starts ("stopped" may be resumed).
ENDED = frozenset({"stopped", "finished", "failed"})


@dataclass(frozen=True)
class Trial:
    """One trial of a sweep: its job, its knobs (`config`) and its objective `value` (its last
    observation; None before it logged one). `state` is "pending", "queued", "running",
    "succeeded", "failed" or "stopped" (stopped early: `reason` says at which rung and why)."""

    index: int
    job_id: str
    state: str
    config: dict[str, Any] = field(default_factory=dict)
    value: Optional[float] = None
    resource: float = 0.0
    reason: str = ""
    preemptions: int = 0


@dataclass(frozen=True)
class TrialCounts:
    """How many trials were suggested, and how many are running or ended each way."""

    suggested: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    stopped: int = 0


@dataclass(frozen=True)
class Sweep:
    """A sweep. `state` is "running", "stopping" (asked to stop: its live trials are being
    stopped), "stopped" (then; or paused: `paused_reason`), "finished" (its budget spent or its
    grid exhausted) or "failed" (more failed trials than `max-failed`); `reason` says why it
    ended. `trials` is filled by `get` only (by index);
    `best` is the best trial so far, None while none has a value; `registered` the model
    version its `register:` made ("NAME:V")."""

    id: str
    name: str
    project: str
    owner: str
    state: str
    reason: str = ""
    paused_reason: str = ""
    objective_metric: str = ""
    goal: str = ""  # "minimize" or "maximize"
    algorithm: str = ""
    early_stop: str = ""
    max_trials: int = 0
    max_parallel: int = 0
    counts: TrialCounts = TrialCounts()
    gpu_hours: float = 0.0
    best: Optional[Trial] = None
    registered: str = ""
    spec_yaml: str = ""
    trials: tuple[Trial, ...] = ()
    created_at_ms: int = 0
    finished_at_ms: int = 0

    @property
    def ended(self) -> bool:
        """Whether no trial runs and none starts: finished, failed or stopped (a stopped sweep
        may be resumed)."""
        return self.state in ENDED


def _trial(message: sweep_pb2.Trial) -> Trial:
    return Trial(
        index=message.index, job_id=message.job_id, state=message.state, config=from_proto(message.config),
        value=message.value if message.HasField("value") else None, resource=message.resource,
        reason=message.reason, preemptions=message.preemptions,
    )


def _sweep(message: sweep_pb2.Sweep) -> Sweep:
    counts = message.counts
    return Sweep(
        id=message.id, name=message.name, project=message.project, owner=message.owner, state=message.state,
        reason=message.reason, paused_reason=message.paused_reason, objective_metric=message.objective_metric,
        goal=message.goal, algorithm=message.algorithm, early_stop=message.early_stop,
        max_trials=message.max_trials, max_parallel=message.max_parallel,
        counts=TrialCounts(suggested=counts.suggested, running=counts.running, succeeded=counts.succeeded,
                           failed=counts.failed, stopped=counts.stopped),
        gpu_hours=message.gpu_hours, best=_trial(message.best) if message.HasField("best") else None,
        registered=message.registered, spec_yaml=message.spec_yaml,
        trials=tuple(_trial(trial) for trial in message.trials), created_at_ms=message.created_at_ms,
        finished_at_ms=message.finished_at_ms,
    )


def spec_text(spec: Spec) -> tuple[str, str]:
    """(the spec as YAML text, the project it names or ""). A dict is written as JSON (YAML
    reads JSON as it is, and keeps the order of `parameters`)."""
    if isinstance(spec, Mapping):
        try:
            text = json.dumps(spec, indent=2, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"kiln: the sweep spec cannot be written as YAML: {error}") from error
        project = spec.get("project", "")
        return text, project if isinstance(project, str) else ""
    if isinstance(spec, os.PathLike):
        text = pathlib.Path(spec).read_text()
    elif isinstance(spec, str):
        text = spec
    else:
        raise TypeError(f"kiln: a sweep spec is a dict, a YAML text or a pathlib.Path, not {type(spec).__name__}")
    # The project the code goes to, as `kiln sweep create` finds it: a spec that does not read
    # gets none here, and the advisor says what is wrong with it.
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        return text, ""
    project = document.get("project", "") if isinstance(document, dict) else ""
    return text, project if isinstance(project, str) else ""


class Sweeps:
    """Creates, reads, stops and resumes sweeps, run by the advisor: `kiln.Client().sweeps`."""

    def __init__(self, stubs: Callable[[], ManageStubs], metadata: Metadata):
        self._stubs = stubs  # the client's, opened on first use
        self._metadata = metadata

    def create(self, spec: Spec, *, project: str = "", workdir: str | os.PathLike[str] | None = ".") -> Sweep:
        """Starts a sweep from `spec` (a dict, a YAML text, or a `pathlib.Path` of a YAML file),
        as `kiln sweep create -f` does. `workdir` is packed and uploaded as every trial's code
        (as `Jobs.submit` packs it; None for `--no-code`) to `project`, else the spec's
        `project`, else `default`. The create is retried while the advisor is unavailable,
        with one idempotency key, so it never makes two sweeps.

            sweep = client.sweeps.create(pathlib.Path("sweep.yaml"), project="vision")
            print(sweep.id, sweep.max_trials, sweep.max_parallel)
        """
        text, spec_project = spec_text(spec)
        stubs = self._stubs()
        code_digest = ""
        if workdir is not None:
            with translated():
                code_digest = upload_code(stubs.artifacts, self._metadata, workdir, project or spec_project)
        request = sweep_pb2.CreateSweepRequest(spec_yaml=text, code_digest=code_digest, project=project,
                                               idempotency_key=uuid.uuid4().hex)
        return _sweep(retried(lambda: stubs.sweeps.CreateSweep(request, metadata=self._metadata, timeout=60)))

    def get(self, sweep_id: str) -> Sweep:
        """The sweep as it is now, with its trials (`kiln sweep status`).

            sweep = client.sweeps.get(sweep_id)
            print(sweep.state, sweep.counts, [(t.index, t.state, t.value) for t in sweep.trials])
        """
        return self._call("GetSweep", sweep_id)

    def wait(self, sweep_id: str, timeout: float | None = None, poll: float = 2.0) -> Sweep:
        """Waits until the sweep has ended (finished, failed, or stopped with its trials) and
        returns it; raises TimeoutError after `timeout` seconds. Asks every `poll` seconds.

            final = client.sweeps.wait(sweep.id, timeout=6 * 3600)
            assert final.state == "finished", final.reason
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sweep = self.get(sweep_id)
            if sweep.ended:
                return sweep
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"kiln: sweep {sweep_id} is still {sweep.state} after {timeout} s")
            time.sleep(poll if deadline is None else max(min(poll, deadline - time.monotonic()), 0))

    def best(self, sweep_id: str) -> Trial:
        """The trial with the best objective value so far (`kiln sweep best`); a KilnError
        NOT_FOUND while no trial has a value.

            best = client.sweeps.best(sweep.id)
            client.models.register("resnet-cifar", best.job_id, alias="candidate")
        """
        request = sweep_pb2.GetSweepRequest(sweep_id=sweep_id)
        with translated():
            return _trial(self._stubs().sweeps.BestTrial(request, metadata=self._metadata, timeout=60))

    def stop(self, sweep_id: str) -> Sweep:
        """Stops the sweep: no more trials start, and running ones are stopped (grace, outputs
        synced). Returns it as it is then: "stopping" while its trials are being stopped,
        "stopped" once they are (`wait` for it).

            client.sweeps.stop(sweep.id)
            assert client.sweeps.wait(sweep.id).state == "stopped"
        """
        return self._call("StopSweep", sweep_id)

    def resume(self, sweep_id: str) -> Sweep:
        """Lets a stopped sweep go on within its budget (`kiln sweep resume`)."""
        return self._call("ResumeSweep", sweep_id)

    def _call(self, method: str, sweep_id: str) -> Sweep:
        request = sweep_pb2.GetSweepRequest(sweep_id=sweep_id)
        with translated():
            return _sweep(getattr(self._stubs().sweeps, method)(request, metadata=self._metadata, timeout=60))

    # Last in the class: below it, `list` in an annotation would name this method.
    def list(self, project: str = "", *, all: bool = False) -> list[Sweep]:
        """Sweeps newest first, without their trials: running ones, or every one with `all`;
        of one `project`, or of every project you may read (`kiln sweep ls`).

            running = client.sweeps.list(project="vision")
        """
        request = sweep_pb2.ListSweepsRequest(project=project, all=all)
        with translated():
            listed = self._stubs().sweeps.ListSweeps(request, metadata=self._metadata, timeout=60).sweeps
        return [_sweep(sweep) for sweep in listed]


__all__ = ["ENDED", "Spec", "Sweep", "Sweeps", "Trial", "TrialCounts", "spec_text"]
