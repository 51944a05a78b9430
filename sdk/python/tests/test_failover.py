"""`KILN_ADDR` (and `KILN_LOGS_ADDR`) listing several replicas: the SDK talks to the first that
answers and, when it goes away, to the next, keeping a submit's idempotency key, and a log
followed through it goes on after the last line shown. The replicas here are two TCP
proxies in front of one `kiln up` api; closing a proxy (its listener and every connection) is
a replica dying as the client sees it."""

import pathlib
import socket
import threading

import pytest

import kiln

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib


class Replica:
    """A TCP proxy to `target` (host:port) on a free port, counting the connections it took."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.connections += 1
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def die(self) -> None:
        """Refuses new connections and resets the open ones. (A listener closed while a thread
        waits in accept() goes on listening until that accept returns: shut it down first.)"""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            for end in self.sockets:
                try:
                    end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    end.close()
                except OSError:
                    pass


@pytest.fixture
def replicas(up, monkeypatch):
    credentials = tomllib.loads((pathlib.Path(up) / "credentials.toml").read_text())
    api = credentials["api"].split("://", 1)[-1]
    first, second = Replica(api), Replica(api)
    monkeypatch.setenv("KILN_ADDR", f"{first.url},{second.url}")
    monkeypatch.setenv("KILN_TOKEN", credentials["token"])
    # The other services at their own addresses, so only the api's replicas are in play.
    monkeypatch.setenv("KILN_LOGS_ADDR", credentials["logs"])
    yield first, second
    first.die()
    second.die()


def test_a_client_given_two_api_replicas_outlives_the_first(replicas, monkeypatch):
    first, second = replicas
    client = kiln.Client()
    client.jobs.list()
    # (Discovery and the calls may share one connection or open one each.)
    taken = first.connections
    assert taken >= 1 and second.connections == 0, "the first replica that answers is used"
    first.die()
    job = client.jobs.submit(["true"], workdir=None, cpus=0.1, memory="64M")
    assert client.jobs.wait(job.id, timeout=60).state == "SUCCEEDED"
    assert first.connections == taken and second.connections >= 1, "the second replica took over"
    assert [j.id for j in client.jobs.list(state="SUCCEEDED") if j.id == job.id] == [job.id], "one job, not two"
    # The control: a client given only the dead replica cannot reach kiln.
    monkeypatch.setenv("KILN_ADDR", first.url)
    with pytest.raises(kiln.KilnError) as refused:
        kiln.Client().jobs.list()
    assert refused.value.code.name == "UNAVAILABLE"


def test_a_follow_outlives_its_log_ingest_replica_without_a_line_lost_or_twice(up, monkeypatch):
    credentials = tomllib.loads((pathlib.Path(up) / "credentials.toml").read_text())
    logs = credentials["logs"].split("://", 1)[-1]
    first, second = Replica(logs), Replica(logs)
    monkeypatch.setenv("KILN_LOGS_ADDR", f"{first.url},{second.url}")
    try:
        client = kiln.Client()
        script = 'i=0; while [ $i -lt 40 ]; do echo "line $i"; i=$((i+1)); sleep 0.1; done'
        job = client.jobs.submit(["sh", "-c", script], workdir=None, cpus=0.1, memory="64M")
        shown = []
        for line in client.jobs.logs(job.id, follow=True):
            shown.append(line.text)
            if len(shown) == 10:
                first.die()  # mid-follow: the stream breaks, the follow goes on through the second
        assert shown == [f"line {i}" for i in range(40)]
        assert second.connections >= 1, "the follow moved to the second replica"
    finally:
        first.die()
        second.die()
