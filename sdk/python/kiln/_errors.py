"""The error kiln's answers raise: `KilnError`, with the gRPC status code and the server's message.

    try:
        job = client.jobs.get(job_id)
    except kiln.KilnError as error:
        if error.code != grpc.StatusCode.NOT_FOUND:
            raise
        print(error.message)     # "job ... not found", as the server said it
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import grpc


class KilnError(Exception):
    """A call kiln refused or could not answer: `code` is the gRPC status (a `grpc.StatusCode`:
    NOT_FOUND, INVALID_ARGUMENT, PERMISSION_DENIED, UNAVAILABLE, ...) and `message` the server's
    own words. The `grpc.RpcError` it came from is its `__cause__`."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[KilnError], tuple[grpc.StatusCode, str]]:
        return (type(self), (self.code, self.message))


def from_rpc(error: grpc.RpcError) -> KilnError:
    """The KilnError of a failed call (an RpcError is also a grpc.Call, which has the status)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else None
    return KilnError(code or grpc.StatusCode.UNKNOWN, details or str(error))


@contextmanager
def translated() -> Iterator[None]:
    """Raises a gRPC error of the calls made inside as a KilnError."""
    try:
        yield
    except grpc.RpcError as error:
        raise from_rpc(error) from error


# A call is retried while its service is unavailable (a new leader, a replica that went away:
# the channel moves to the next), with doubling waits up to this one.
_RETRY_LIMIT = 10.0

Answer = TypeVar("Answer")


def retried(call: Callable[[], Answer]) -> Answer:
    """`call()`, again while it fails UNAVAILABLE, with doubling waits; every other failure (and
    the last UNAVAILABLE) raised as a KilnError. The call must be idempotent (an idempotency key)."""
    delay = 0.2
    while True:
        try:
            return call()
        except grpc.RpcError as error:
            failure = from_rpc(error)
            if failure.code != grpc.StatusCode.UNAVAILABLE or delay >= _RETRY_LIMIT:
                raise failure from error
        time.sleep(delay)
        delay *= 2


__all__ = ["KilnError", "from_rpc", "retried", "translated"]
