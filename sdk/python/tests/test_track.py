"""Tracking beyond metrics against a real `kiln up`: stored config, summary, saved artifacts,
the read client, and the CLI's tables of runs."""

import hashlib
import json
import os
import subprocess
import sys

import grpc
import pytest

import kiln
from kiln import _run, _track
from kiln._client import parse_condition
from kiln.v1 import artifact_pb2, artifact_pb2_grpc, job_pb2

from test_sdk import KILN, series, stubs


def cli(*args, check=True):
    done = subprocess.run([KILN, *args], env=os.environ.copy(), capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def job(job_id):
    jobs, _, metadata = stubs()
    return jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), metadata=metadata)


def test_config_is_flattened_typed_and_shown_by_status_and_the_api(up):
    given = {"optimizer": {"lr": 0.001, "name": "adam", "betas": {"b1": 0.9}}, "layers": 3, "augment": True}
    run = kiln.init(config=given, name="flat")
    assert kiln.config == given, "kiln.config keeps the nested dict"
    kiln.summary({"best": {"acc": 0.93}, "epochs": 7})
    kiln.summary({"epochs": 8})
    kiln.finish()
    stored = job(run.job_id)
    assert _track.from_proto(stored.config) == {
        "augment": True, "layers": 3, "optimizer.betas.b1": 0.9, "optimizer.lr": 0.001, "optimizer.name": "adam",
    }
    assert stored.config["layers"].WhichOneof("value") == "int_value"
    assert _track.from_proto(stored.summary) == {"best.acc": 0.93, "epochs": 8}, "summary values merge"
    shown = json.loads(cli("status", run.job_id, "-o", "json").stdout)
    assert shown["config"]["optimizer.lr"] == 0.001 and shown["config"]["augment"] is True
    assert shown["summary"]["epochs"] == 8
    table = cli("status", run.job_id).stdout
    assert "optimizer.name = adam" in table and "epochs = 8" in table


def test_a_config_value_of_another_type_is_a_type_error_before_any_run(up):
    with pytest.raises(TypeError, match=r"'opt.layers' is a list"):
        kiln.init(config={"opt": {"layers": [1, 2]}})
    assert _run._current is None
    with pytest.raises(TypeError, match="keys are strings"):
        _track.flatten({1: 2})
    with pytest.raises(ValueError, match="finite"):
        _track.config_value("lr", float("nan"))


def test_save_a_file_and_a_directory_downloads_byte_identical_and_skips_stored_blobs(up, tmp_path):
    weights = tmp_path / "weights.bin"
    weights.write_bytes(os.urandom(3 * _track.CHUNK + 17))
    checkpoint = tmp_path / "ckpt"
    (checkpoint / "opt").mkdir(parents=True)
    (checkpoint / "model.bin").write_bytes(os.urandom(100_000))
    (checkpoint / "opt" / "state.bin").write_bytes(b"state" * 1000)
    (checkpoint / "copy.bin").write_bytes(b"state" * 1000)  # the same blob twice
    run = kiln.init(name="saves")
    try:
        saved = kiln.save(weights)
        assert (saved.name, saved.files, saved.bytes, saved.uploaded) == ("weights.bin", 1, weights.stat().st_size, 1)
        saved = kiln.save(checkpoint)
        assert (saved.name, saved.files, saved.uploaded, saved.skipped) == ("ckpt", 3, 2, 0)
        again = kiln.save(checkpoint, name="ckpt-2")
        assert (again.files, again.uploaded, again.skipped) == (3, 0, 2), "stored blobs are not sent again"
    finally:
        kiln.finish()
    listed = json.loads(cli("artifacts", "saved", run.job_id, "-o", "json").stdout)
    assert [(f["name"], f["path"]) for f in listed] == [
        ("ckpt", "copy.bin"), ("ckpt", "model.bin"), ("ckpt", "opt/state.bin"),
        ("ckpt-2", "copy.bin"), ("ckpt-2", "model.bin"), ("ckpt-2", "opt/state.bin"), ("weights.bin", ""),
    ]
    sha = {f["path"] or f["name"]: f["digest"] for f in listed}
    assert sha["weights.bin"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    dest = tmp_path / "out"
    cli("artifacts", "get-saved", run.job_id, "weights.bin", "--dest", str(dest))
    cli("artifacts", "get-saved", run.job_id, "ckpt", "--dest", str(dest))
    assert (dest / "weights.bin").read_bytes() == weights.read_bytes()
    for name in ("model.bin", "opt/state.bin", "copy.bin"):
        assert (dest / "ckpt" / name).read_bytes() == (checkpoint / name).read_bytes(), name
    assert "ckpt/opt/state.bin" in cli("status", run.job_id).stdout
    missing = cli("artifacts", "get-saved", run.job_id, "nope", check=False)
    assert missing.returncode != 0 and "saved no artifact nope" in missing.stderr


def test_uploads_are_streamed_in_chunks(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * (2 * _track.CHUNK + 5))
    digest, size = _track._digest(big)
    parts = list(_track._chunks(big, digest, size))
    assert parts[0].header.size == size
    assert [len(p.chunk) for p in parts[1:]] == [_track.CHUNK, _track.CHUNK, 5]


def test_a_job_sets_its_own_config_summary_and_artifacts_and_no_others(up, tmp_path):
    other = kiln.init(name="not-yours")
    kiln.finish()
    script = (
        "import sys, pathlib, grpc, kiln\n"
        "from kiln import _track\n"
        "kiln.init(config={'lr': 0.5, 'model': {'depth': 4}})\n"
        "kiln.summary({'val/acc': 0.75})\n"
        "pathlib.Path('result.txt').write_text('inside')\n"
        "kiln.save('result.txt')\n"
        "try:\n"
        "    _track.update_run(summary={'x': 1}, session=_track._Session(sys.argv[1], _track._session.api_address, _track._session.token))\n"
        "    print('allowed')\n"
        "except grpc.RpcError as error:\n"
        "    print(error.code().name, error.details())\n"
        "kiln.finish()\n"
    )
    done = subprocess.run(
        [KILN, "run", "-f", "--no-code", "--", sys.executable, "-c", script, other.job_id],
        env=os.environ.copy(), capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"NOT_FOUND job {other.job_id} not found", done.stdout
    job_id = done.stderr.splitlines()[0].split()[1]
    inside = job(job_id)
    assert _track.from_proto(inside.config) == {"lr": 0.5, "model.depth": 4}
    assert _track.from_proto(inside.summary) == {"val/acc": 0.75}
    assert [(f["name"], f["size"]) for f in json.loads(cli("artifacts", "saved", job_id, "-o", "json").stdout)] == [
        ("result.txt", 6)
    ]


def test_another_users_run_is_not_found_to_them(up):
    run = kiln.init(name="alices")
    kiln.finish()
    token = cli("user", "create", "bob-track").stdout.strip().splitlines()[-1]
    api, _, _ = _run._endpoints()
    with _run._channel(api) as channel:
        from kiln.v1 import job_pb2_grpc

        jobs = job_pb2_grpc.JobServiceStub(channel)
        request = job_pb2.UpdateRunRequest(job_id=run.job_id)
        request.summary["x"].CopyFrom(_track.config_value("x", 1))
        with pytest.raises(grpc.RpcError) as refused:
            jobs.UpdateRun(request, metadata=(("authorization", f"Bearer {token}"),))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        artifacts = artifact_pb2_grpc.ArtifactServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            artifacts.ListRunArtifacts(artifact_pb2.ListRunArtifactsRequest(job_id=run.job_id),
                                       metadata=(("authorization", f"Bearer {token}"),))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND


def test_bad_values_and_conditions_are_refused_clearly(up):
    jobs, _, metadata = stubs()
    run = kiln.init(name="bad")
    kiln.finish()
    request = job_pb2.UpdateRunRequest(job_id=run.job_id)
    request.config["lr"].CopyFrom(job_pb2.ConfigValue(float_value=float("inf")))
    with pytest.raises(grpc.RpcError) as refused:
        jobs.UpdateRun(request, metadata=metadata)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert '"lr" is inf' in refused.value.details()
    for bad, says in [("lr<nan", "finite"), ("lr~1", "OP one of"), ("lr=<1", "unknown operator"), ("opt<adam", "needs a number")]:
        with pytest.raises(ValueError, match=says):
            parse_condition(bad)
    for bad, says in [("lr<nan", "not a finite number"), ("lr~1", "no operator"), ("lr=>1", "unknown operator")]:
        done = cli("runs", "ls", "--where", bad, check=False)
        assert done.returncode != 0 and says in done.stderr, done.stderr


def test_runs_are_compared_filtered_and_sorted_by_config_and_metrics(up):
    project_runs = []
    for lr, losses in [(0.1, [0.9, 0.7, 0.8]), (0.01, [0.8, 0.3, 0.4]), (0.001, [0.95, 0.6, 0.5])]:
        run = kiln.init(config={"lr": lr, "opt": "sgd" if lr > 0.05 else "adam"}, name=f"lr-{lr}")
        for step, loss in enumerate(losses):
            kiln.log({"val/loss": loss, "val/acc": 1 - loss}, step=step)
        kiln.finish()
        project_runs.append(run.job_id)
    for job_id in project_runs:
        series(job_id, "val/loss", 3)
    ids = set(project_runs)

    client = kiln.Client()
    runs = [r for r in client.runs(where="lr<0.05") if r.id in ids]
    assert sorted(r.config["lr"] for r in runs) == [0.001, 0.01]
    assert all(r.state == "SUCCEEDED" and r.duration_s is not None for r in runs)
    by_metric = [r.id for r in client.runs(where=["val/loss<=0.45", "opt=adam"]) if r.id in ids]
    assert by_metric == [project_runs[1]], "a metric key compares its best value"
    by_latest = [r.id for r in client.runs(where=["val/loss@last>0.45", "lr<0.05"]) if r.id in ids]
    assert by_latest == [project_runs[2]]
    got = client.metrics(project_runs, keys=["val/loss"])
    assert {s.job_id: s.values for s in got} == {
        project_runs[0]: [0.9, 0.7, 0.8], project_runs[1]: [0.8, 0.3, 0.4], project_runs[2]: [0.95, 0.6, 0.5]}
    frame = client.metrics(project_runs, keys=["val/loss"], frame=True)
    assert list(frame.columns) == ["job_id", "key", "step", "value", "timestamp_ms"] and len(frame) == 9
    table = client.runs(where="lr<1", frame=True)
    assert {"config.lr", "config.opt", "state"} <= set(table.columns)
    client.close()

    table = json.loads(cli("compare", *project_runs, "--key", "val/loss", "--key", "val/acc", "--sort", "val/loss",
                           "-o", "json").stdout)
    assert [r["id"] for r in table] == [project_runs[1], project_runs[2], project_runs[0]], "by best (min) val/loss"
    best = {r["id"]: r["metrics"] for r in table}
    assert best[project_runs[0]]["val/loss"] == {"latest": 0.8, "latest_step": 2, "best": 0.7, "goal": "min"}
    assert best[project_runs[0]]["val/acc"]["goal"] == "max"
    assert best[project_runs[0]]["val/acc"]["best"] == pytest.approx(0.3)
    listed = json.loads(cli("runs", "ls", "--where", "lr<0.05", "--where", "val/loss@last>0.45", "-o", "json").stdout)
    assert [r["id"] for r in listed if r["id"] in ids] == [project_runs[2]]
    descending = json.loads(cli("runs", "ls", "--where", "lr<=0.1", "--sort", "lr", "--desc", "-o", "json").stdout)
    assert [r["config"]["lr"] for r in descending if r["id"] in ids] == [0.1, 0.01, 0.001]
    by_acc = json.loads(cli("compare", *project_runs, "--sort", "-val/acc", "-o", "json").stdout)
    assert [r["id"] for r in by_acc] == [project_runs[1], project_runs[2], project_runs[0]], "best (max) val/acc first"
    text = cli("compare", *project_runs, "--key", "val/loss").stdout
    assert "val/loss (last)" in text and "val/loss (min)" in text and "lr-0.01" in text
    several = cli("metrics", *project_runs[:2], "--key", "val/loss", "--series", "-o", "csv").stdout.splitlines()
    assert several[0] == "job_id,key,step,value,timestamp_ms" and len(several) == 7
    assert several[1].startswith(f"{project_runs[0]},val/loss,0,0.9,")


def test_saving_a_large_file_streams_it_in_bounded_memory(up, tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as out:
        block = os.urandom(1 << 20)
        for n in range(192):
            out.write(bytes([n]) + block[1:])
    script = (
        "import resource, sys, kiln\n"
        "kiln.init(name='big')\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "saved = kiln.save(sys.argv[1])\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "kiln.finish()\n"
        "print(saved.bytes, (after - before) // 1024)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(big)], env=os.environ.copy(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    size, grown_mib = map(int, done.stdout.split())
    assert size == 192 << 20
    assert grown_mib < 64, f"peak RSS grew by {grown_mib} MiB saving 192 MiB"
    print(f"saving 192 MiB grew the peak RSS by {grown_mib} MiB")
