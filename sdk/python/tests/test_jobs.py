"""`kiln.Client().jobs` against a real `kiln up` (local processes), and the code bundle it packs
against the one `kiln run` packs from the same directory."""

import gzip
import io
import os
import pathlib
import subprocess
import sys
import tarfile
import time

import grpc
import pytest

import kiln
from kiln import _pack
from kiln._client import Stubs
from kiln._jobs import Jobs, _parse_duration, _parse_size
from kiln.v1 import job_pb2

from conftest import KILN  # the `up` fixture is conftest's too

# Small jobs, so that the ones running at once (the sleeper, a follower) never queue.
CPUS = 0.1


@pytest.fixture(scope="module")
def jobs(up):
    with kiln.Client() as client:
        yield client.jobs


def python(script: str) -> list:
    return [sys.executable, "-c", script]


def test_a_submitted_workdir_arrives_without_what_kilnignore_lists(jobs, tmp_path):
    (tmp_path / "data.txt").write_text("hello from the workdir\n")
    (tmp_path / "secret.bin").write_bytes(b"not for the job")
    (tmp_path / ".kilnignore").write_text("secret.bin\n")
    script = (
        "import os\n"
        "assert not os.path.exists('secret.bin'), 'secret.bin was packed'\n"
        "print('read:', open('data.txt').read().strip(), os.environ['GREETING'])\n"
    )
    job = jobs.submit(python(script), name="workdir", cpus=CPUS, memory="256M", env={"GREETING": "hi"},
                      workdir=tmp_path)
    assert isinstance(job, kiln.Job) and job.name == "workdir" and len(job.code_digest) == 64
    final = jobs.wait(job.id, timeout=120, poll=0.1)
    assert (final.state, final.exit_code) == ("SUCCEEDED", 0), (final, [line.text for line in jobs.logs(job.id)])
    assert final.finished and final.finished_at_ms >= final.started_at_ms > 0 and final.duration_s is not None
    lines = list(jobs.logs(job.id))
    assert [(line.text, line.stream) for line in lines] == [("read: hello from the workdir hi", "stdout")]
    assert [line.text for line in jobs.logs(job.id, tail=1)] == ["read: hello from the workdir hi"]
    assert job.id in [listed.id for listed in jobs.list(state="succeeded", limit=50)]
    assert job.id not in [listed.id for listed in jobs.list(active=True)]
    assert jobs.get(job.id) == final


def test_logs_follow_a_running_job_to_its_end(jobs):
    script = "import sys, time\nprint('start', flush=True)\ntime.sleep(3)\nprint('oops', file=sys.stderr)\nprint('end')\n"
    job = jobs.submit(python(script), cpus=CPUS, workdir=None)
    seen = []
    for line in jobs.logs(job.id, follow=True):
        if not seen:
            assert not jobs.get(job.id).finished, "the first line came only after the job ended"
        seen.append((line.text, line.stream))
    assert sorted(seen) == [("end", "stdout"), ("oops", "stderr"), ("start", "stdout")]
    assert seen[0] == ("start", "stdout")
    assert jobs.wait(job.id, timeout=60, poll=0.1).state == "SUCCEEDED"


def test_outputs_are_listed_and_downloaded_as_written(jobs, tmp_path):
    script = (
        "import os, pathlib\n"
        "out = pathlib.Path(os.environ['KILN_OUTPUTS'])\n"
        "(out / 'metrics').mkdir()\n"
        "(out / 'model.bin').write_bytes(bytes(range(256)) * 5000)\n"
        "(out / 'metrics' / 'final.json').write_text('{\"loss\": 0.25}')\n"
    )
    job = jobs.submit(python(script), cpus=CPUS, workdir=None)
    assert jobs.wait(job.id, timeout=120, poll=0.1).state == "SUCCEEDED"
    expected = {"model.bin": bytes(range(256)) * 5000, "metrics/final.json": b'{"loss": 0.25}'}
    listed = jobs.outputs(job.id)
    assert listed == sorted((kiln.OutputFile(path, len(data)) for path, data in expected.items()), key=lambda f: f.path)
    assert jobs.outputs(job.id, prefix="metrics") == [kiln.OutputFile("metrics/final.json", 14)]
    written = jobs.download(job.id, tmp_path / "all")
    assert sorted(written) == sorted(tmp_path / "all" / path for path in expected)
    for path, data in expected.items():
        assert (tmp_path / "all" / path).read_bytes() == data
    assert jobs.download(job.id, tmp_path / "some", prefix="metrics") == [tmp_path / "some" / "metrics" / "final.json"]
    with pytest.raises(FileNotFoundError, match="has no outputs under nothing"):
        jobs.download(job.id, tmp_path / "none", prefix="nothing")


def test_a_stopped_job_ends_stopped(jobs):
    job = jobs.submit(python("import time\ntime.sleep(600)\n"), cpus=CPUS, workdir=None)
    deadline = time.monotonic() + 60
    while jobs.get(job.id).state != "RUNNING":
        assert time.monotonic() < deadline, jobs.get(job.id)
        time.sleep(0.1)
    assert job.id in [listed.id for listed in jobs.list(state=["running", "queued"])]
    assert jobs.stop(job.id).stop_requested
    final = jobs.wait(job.id, timeout=60, poll=0.1)
    assert final.state == "STOPPED", final
    sleeper = jobs.submit(python("import time\ntime.sleep(600)\n"), cpus=CPUS, workdir=None)
    with pytest.raises(TimeoutError, match="still"):
        jobs.wait(sleeper.id, timeout=0.2)
    jobs.stop(sleeper.id)


def test_errors_carry_the_status_and_the_servers_message(jobs):
    with pytest.raises(kiln.KilnError) as unknown:
        jobs.get("01a244a3-6245-76fe-8b8b-bd1ef632098d")
    assert unknown.value.code == grpc.StatusCode.NOT_FOUND
    assert unknown.value.message == "job 01a244a3-6245-76fe-8b8b-bd1ef632098d not found"
    with pytest.raises(kiln.KilnError) as reserved:
        jobs.submit(["true"], env={"KILN_MINE": "1"}, workdir=None)
    assert reserved.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert reserved.value.message == 'env name "KILN_MINE" is reserved: KILN_* variables are set by kiln'
    assert str(reserved.value).startswith("INVALID_ARGUMENT: env name")
    with pytest.raises(kiln.KilnError) as following:
        list(jobs.logs("not-an-id"))
    assert following.value.code == grpc.StatusCode.INVALID_ARGUMENT


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "the api is restarting"


def test_a_retried_submit_keeps_its_idempotency_key():
    requests = []

    class JobService:
        def SubmitJob(self, request, metadata, timeout):
            requests.append(request)
            if len(requests) == 1:
                raise Unavailable()
            return job_pb2.SubmitJobResponse(job=job_pb2.Job(id="j1", spec=request.spec))

    client = Jobs(lambda: Stubs(JobService(), None, None), (("authorization", "Bearer t"),))
    job = client.submit(["python", "train.py"], cpus=0.5, memory="1.5GiB", max_runtime="30m", market="spot",
                        workdir=None)
    assert job.id == "j1" and job.command == ("python", "train.py")
    assert len(requests) == 2 and requests[0] == requests[1] and len(requests[0].idempotency_key) == 32
    spec = requests[0].spec
    assert (spec.resources.cpu_millis, spec.resources.memory_bytes, spec.max_runtime_secs) == (500, 3 << 29, 1800)
    assert spec.market == job_pb2.MARKET_SPOT and spec.code_digest == ""
    client.submit(["true"], workdir=None)
    assert requests[2].idempotency_key != requests[0].idempotency_key


def test_sizes_and_durations_read_as_the_cli_reads_them():
    assert [_parse_size(text, "memory") for text in ("1024", "512M", "4G", "4Gi", "1.5GiB", " 2 k")] == [
        1024, 512 << 20, 4 << 30, 4 << 30, 3 << 29, 2048]
    assert _parse_size(123, "memory") == 123
    for bad in ("abc", "4X", "", "1e3"):
        with pytest.raises(ValueError, match="not a size"):
            _parse_size(bad, "memory")
    assert [_parse_duration(text) for text in ("90", "90s", "30m", "2h", "1d", 5)] == [90, 90, 1800, 7200, 86400, 5]
    for bad in ("0", "30ms", "m", "-5"):
        with pytest.raises(ValueError):
            _parse_duration(bad)


def tricky_tree(root: pathlib.Path) -> pathlib.Path:
    """A tree whose packing needs every rule: pack.rs's test tree, nested and parent ignore
    files, `!` across kinds, directory-only and `**` patterns, a link, modes, a long path."""
    workdir = root / "project"

    def write(relative: str, text: str = "x") -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    write(".gitignore", "*.skip\n/project/anchored\n")  # above the workdir: it applies too
    write(".kilnignore", "from-parent\n")
    # pack.rs's test: src/train.py and .gitignore in; notes.log, data/big.bin, .git/HEAD out.
    write("project/src/train.py", "print('hi')\n")
    write("project/data/big.bin", "\0" * 1000)
    write("project/notes.log", "noise")
    write("project/.git/HEAD", "ref")
    write("project/.git/info/exclude", "excluded.txt\n")
    write("project/.gitignore", "*.log\nbuild/\n*.o\n**/cache\ny/gen/**\n!y/gen/h\n*.pyc\n")
    write("project/.kilnignore", "data/\n!build/\nw/\n")
    write("project/.ignore", "!n.pyc\ns1/**/\n")
    for name in ("excluded.txt", "a.skip", "anchored", "x/anchored", "from-parent", "n.pyc", "m.pyc", ".hidden",
                 "build/keep.txt", "build/foo.o", "build/sub/y.o", "build/sub/z", "z/cache/q", "z/cachefile",
                 "y/gen/h", "y/gen/inner/g", "s1/b", "s1/s2/c", "w/drop", "x/w/kept", "a-b", "a/b",
                 "src/sub/a.log", "src/sub/b.log", "d" * 80 + "/" + "e" * 80 + "/file.txt"):
        write(f"project/{name}", name)
    write("project/src/sub/.gitignore", "!b.log\n")
    write("project/x/.kilnignore", "!w/\n")
    (workdir / "empty").mkdir()
    (workdir / "run.sh").write_text("#!/bin/sh\necho run\n")
    (workdir / "run.sh").chmod(0o755)
    (workdir / "link.py").symlink_to("src/train.py")
    (workdir / "far").symlink_to("../" * 40 + "elsewhere")  # a target past tar's 100 bytes
    (workdir / "café ünïcode.txt").write_text("é")
    return workdir


def entries(bundle: bytes) -> list:
    """What an archive holds: each entry's name, type, mode, owner, time, link and content."""
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(bundle))) as archive:
        return [(member.name, member.type, oct(member.mode), member.uid, member.gid, member.uname, member.mtime,
                 member.linkname, archive.extractfile(member).read() if member.isfile() else None)
                for member in archive]


def test_the_sdk_packs_what_the_cli_packs(up, jobs, tmp_path):
    workdir = tricky_tree(tmp_path)
    done = subprocess.run([KILN, "run", "--code", str(workdir), "--", "true"], env={**os.environ, "KILN_HOME": up},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    store = pathlib.Path(up) / "objects" / "artifacts" / "sha256"
    by_cli = entries((store / jobs.get(done.stdout.split()[-1]).code_digest).read_bytes())
    by_sdk = entries((store / jobs.submit(["true"], cpus=CPUS, workdir=workdir).code_digest).read_bytes())
    assert by_sdk == by_cli
    names = [entry[0] for entry in by_cli]
    for packed in ("src/train.py", ".gitignore", ".hidden", "build/keep.txt", "build/sub/z", "n.pyc", "y/gen/h",
                   "s1/b", "x/w/kept", "src/sub/b.log", "link.py", "far", "café ünïcode.txt", "empty",
                   "d" * 80 + "/" + "e" * 80 + "/file.txt"):
        assert packed in names, (packed, names)
    for excluded in ("notes.log", "data", "data/big.bin", ".git", ".git/HEAD", "excluded.txt", "a.skip", "anchored",
                     "from-parent", "m.pyc", "build/foo.o", "build/sub/y.o", "z/cache", "y/gen/inner", "s1/s2",
                     "w", "src/sub/a.log"):
        assert excluded not in names, (excluded, names)
    assert names.index("a") < names.index("a/b") < names.index("a-b"), "paths sort by component, as Rust's"
    modes = {entry[0]: entry[2] for entry in by_cli}
    assert (modes["run.sh"], modes["src/train.py"], modes["src"]) == ("0o755", "0o644", "0o755")
    packed_names = [name for _, name in _pack.walk(workdir)]
    assert packed_names == names
