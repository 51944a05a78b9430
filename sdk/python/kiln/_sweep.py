"""Inside a sweep's trial: its knobs, and whether the advisor stopped it early."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import grpc

from kiln.v1 import sweep_pb2, sweep_pb2_grpc

# How often `should_stop` asks the advisor, at most (between, it answers what it last heard).
_ASK_EVERY = 1.0

_lock = threading.Lock()
_stub: sweep_pb2_grpc.SweepServiceStub | None = None
_asked_at = 0.0
_stopped = False


def trial_knobs() -> dict[str, Any]:
    """The knobs the advisor gave this trial (KILN_TRIAL_CONFIG, a JSON object); empty outside a sweep."""
    text = os.environ.get("KILN_TRIAL_CONFIG")
    if not text:
        return {}
    knobs = json.loads(text)
    if not isinstance(knobs, dict):
        raise RuntimeError(f"kiln: KILN_TRIAL_CONFIG is not a JSON object: {text[:200]!r}")
    return knobs


def should_stop() -> bool:
    """True once the advisor has stopped this trial early (ASHA, the median rule, or the sweep
    was stopped): end the training loop, save what is worth keeping, and exit. A trial that goes
    on is stopped anyway after a grace period (SIGTERM, then its outputs are synced). Outside a
    sweep it is always False. It asks the advisor at most once a second."""
    global _stub, _asked_at, _stopped
    address = os.environ.get("KILN_ADVISOR_ADDR")
    job_id = os.environ.get("KILN_JOB_ID")
    token = os.environ.get("KILN_TOKEN")
    if not address or not job_id or not token:
        return False
    with _lock:
        if _stopped or time.monotonic() - _asked_at < _ASK_EVERY:
            return _stopped
        _asked_at = time.monotonic()
        if _stub is None:
            from ._run import _channel

            _stub = sweep_pb2_grpc.SweepServiceStub(_channel(address))
        try:
            answer = _stub.ShouldStop(
                sweep_pb2.ShouldStopRequest(job_id=job_id),
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=5,
            )
        except grpc.RpcError:
            # The advisor is away (a new leader is taking over): go on, ask again later.
            return False
        _stopped = answer.stop
        return _stopped


__all__ = ["should_stop", "trial_knobs"]
