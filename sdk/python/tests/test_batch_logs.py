"""Batch.search_logs against in-process gRPC servers: item-batch's BatchService and log-ingest's
BatchLogService on ports of their own, found through KILN_BATCH_ADDR and KILN_LOGS_ADDR (no
`kiln up`; test_sdk.py searches a real batch's lines)."""

from concurrent import futures

import grpc
import pytest

import kiln
from kiln.v1 import batch_pb2, batch_pb2_grpc, item_log_pb2, item_log_pb2_grpc, log_pb2

TOKEN = "kiln_test_token"


class Batches(batch_pb2_grpc.BatchServiceServicer):
    def GetBatch(self, request, context):
        return batch_pb2.Batch(id=request.batch_id)


class BatchLogs(item_log_pb2_grpc.BatchLogServiceServicer):
    def __init__(self):
        self.requests = []
        self.metadata = []

    def SearchBatchLogs(self, request, context):
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        if request.pattern == "[":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pattern: regex parse error")
        lines = [
            item_log_pb2.ItemLogLine(key="bad", attempt=1, line=3, stream=log_pb2.LOG_STREAM_STDERR, timestamp_ms=1000,
                                     text="Traceback: boom", state=batch_pb2.ITEM_STATE_FAILED),
            item_log_pb2.ItemLogLine(key="bad", attempt=2, line=3, stream=log_pb2.LOG_STREAM_STDOUT, timestamp_ms=2000,
                                     text="Traceback: boom again", state=batch_pb2.ITEM_STATE_DEAD),
        ]
        return item_log_pb2.SearchBatchLogsResponse(lines=lines[: request.limit], truncated=request.limit < len(lines))


@pytest.fixture
def servers(monkeypatch, tmp_path):
    """(BatchLogs servicer, log-ingest's address): two servers on free ports, and the SDK's
    environment pointing at them."""
    from kiln._run import _discovered

    batch_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    batch_pb2_grpc.add_BatchServiceServicer_to_server(Batches(), batch_server)
    batch_port = batch_server.add_insecure_port("127.0.0.1:0")
    logs = BatchLogs()
    log_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    item_log_pb2_grpc.add_BatchLogServiceServicer_to_server(logs, log_server)
    log_port = log_server.add_insecure_port("127.0.0.1:0")
    batch_server.start()
    log_server.start()
    monkeypatch.setenv("KILN_HOME", str(tmp_path))  # no credentials file
    monkeypatch.setenv("KILN_ADDR", f"127.0.0.1:{batch_port}")
    monkeypatch.setenv("KILN_TOKEN", TOKEN)
    monkeypatch.setenv("KILN_BATCH_ADDR", f"127.0.0.1:{batch_port}")
    monkeypatch.setenv("KILN_LOGS_ADDR", f"http://127.0.0.1:{log_port}")
    _discovered.clear()
    yield logs
    batch_server.stop(None)
    log_server.stop(None)


def test_search_logs_asks_log_ingest_and_returns_its_lines(servers):
    with kiln.Client() as client:
        batch = client.batches.get("b-1")
        found = batch.search_logs("Traceback")
        assert not found.truncated
        assert [(m.key, m.attempt, m.line, m.stream, m.text, m.state, m.timestamp_ms) for m in found.lines] == [
            ("bad", 1, 3, "stderr", "Traceback: boom", "failed", 1000),
            ("bad", 2, 3, "stdout", "Traceback: boom again", "dead", 2000),
        ]
        [request] = servers.requests
        assert (request.batch_id, request.pattern, request.regex, request.state, request.limit) == (
            "b-1", "Traceback", False, batch_pb2.ITEM_STATE_UNSPECIFIED, 1000)
        assert servers.metadata[0]["authorization"] == f"Bearer {TOKEN}"

        found = batch.search_logs(r"boom \w+$", regex=True, state="dead", limit=1)
        assert found.truncated and len(found.lines) == 1
        request = servers.requests[-1]
        assert (request.pattern, request.regex, request.state, request.limit) == (
            r"boom \w+$", True, batch_pb2.ITEM_STATE_DEAD, 1)
        batch.search_logs("x", state="succeeded")
        assert servers.requests[-1].state == batch_pb2.ITEM_STATE_SUCCEEDED
        client.batches.get("b-2").search_logs("x", state="failed")
        assert (servers.requests[-1].batch_id, servers.requests[-1].state) == ("b-2", batch_pb2.ITEM_STATE_FAILED)


def test_search_logs_refuses_bad_arguments_before_asking(servers):
    with kiln.Client() as client:
        batch = client.batches.get("b-1")
        for state in ("pending", "DEAD", "all"):
            with pytest.raises(ValueError, match="state must be one of"):
                batch.search_logs("x", state=state)
        for limit in (0, 100_001):
            with pytest.raises(ValueError, match="limit must be"):
                batch.search_logs("x", limit=limit)
        assert servers.requests == []
        with pytest.raises(grpc.RpcError) as refused:
            batch.search_logs("[", regex=True)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
