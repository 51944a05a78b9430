"""`kiln serve` end to end on `kiln up`: a model registered from a job's outputs, served by a
`kiln.serve` worker job the predictor's controller starts, answered over the Open Inference
Protocol and SINGA-Auto's /predict, listed, and stopped."""

import json
import pathlib
import subprocess
import sys
import time
import urllib.error
import urllib.request

from kiln._run import tomllib  # tomllib, or tomli below 3.11
from kiln.v1 import job_pb2

from test_sdk import KILN, stubs

WORKER = """
import os
import kiln

def load(path):
    with open(os.path.join(path, "factor.txt")) as f:
        return float(f.read())

kiln.serve(lambda factor, inputs: {"y": inputs["x"] * factor}, load)
"""


def cli(*args):
    done = subprocess.run([KILN, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def wait_succeeded(job_id):
    jobs, _, metadata = stubs()
    deadline = time.monotonic() + 120
    while True:
        job = jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), metadata=metadata)
        if job.state == job_pb2.JOB_STATE_SUCCEEDED:
            return
        assert job.state not in (job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_STOPPED), job
        assert time.monotonic() < deadline, f"job {job_id} did not end: {job}"
        time.sleep(0.1)


def post(url, token, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_registered_model_is_served_by_a_kiln_serve_worker(up, tmp_path):
    script = 'mkdir -p "$KILN_OUTPUTS/model" && echo 4 > "$KILN_OUTPUTS/model/factor.txt"'
    job_id = cli("run", "--no-code", "--", "sh", "-c", script).split()[-1]
    wait_succeeded(job_id)
    assert cli("model", "register", "scale", "--from", f"{job_id}:model").split()[-1] == "scale:1"

    (tmp_path / "worker.py").write_text(WORKER)
    url = cli("serve", "create", "scale", "--model", "scale", "--code", str(tmp_path), "--deadline-ms", "2000",
              "--cpu", "0.5", "--mem", "256M", "--input", "x:FP64:-1,-1", "--output", "y:FP64:-1,-1",
              "--", sys.executable, "worker.py").split()[-1]
    status = json.loads(cli("serve", "status", "scale", "-o", "json"))
    assert status["url"] == url and status["revision"] == 1, status
    assert status["members"][0]["model_version"] == "scale:1", status

    token = tomllib.loads((pathlib.Path(up) / "credentials.toml").read_text())["token"]
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1.5, -2.0]}]}
    deadline = time.monotonic() + 120
    while True:
        code, answer = post(f"{url}/v2/models/scale/infer", token, body)
        if code == 200:
            break
        assert code == 503, answer  # no worker in rotation yet
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)
    assert answer["outputs"][0]["data"] == [6.0, -8.0], answer
    assert answer["parameters"]["kiln.partial"] is False, answer
    code, answer = post(f"{url}/predict/scale", token, {"queries": [[1.0], [2.0]]})
    assert (code, answer) == (200, {"predictions": [[4.0], [8.0]]})
    # Names are per project: the service and its model named with theirs, `PROJECT/NAME`.
    code, answer = post(f"{url}/v2/models/default/scale/infer", token, body)
    assert (code, answer["model_name"]) == (200, "default/scale"), answer
    assert json.loads(cli("serve", "status", "default/scale", "-o", "json"))["project"] == "default"
    assert json.loads(cli("model", "show", "scale:1", "--project", "default", "-o", "json"))["project"] == "default"
    # The declared input is checked before any worker sees the request.
    code, answer = post(f"{url}/v2/models/scale/infer", token,
                        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP64", "data": [1.0, 2.0]}]})
    assert code == 400 and "input `x` is FP64 [2]; model `scale` takes FP64 [-1, -1]" in answer["error"], answer

    # The workers' logs, each line after its worker: the adapter's line once the model loaded.
    # (The line is shipped as the worker runs: read again until it is stored.)
    deadline = time.monotonic() + 60
    while True:
        logs = subprocess.run([KILN, "serve", "logs", "scale"], capture_output=True, text=True, timeout=60)
        assert logs.returncode == 0, logs.stderr
        loaded = [line for line in logs.stderr.splitlines() if "kiln.serve: model loaded" in line]
        if loaded or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert loaded and loaded[0].startswith("[scale r1 "), logs.stderr
    other = subprocess.run([KILN, "serve", "logs", "scale", "--member", "other"], capture_output=True, text=True,
                           timeout=60)
    assert other.returncode == 0 and "has no worker of member other" in other.stderr, other.stderr

    # Bounds instead of a fixed count: the service says so, and keeps at least min workers.
    assert "1 to 3 worker(s) per member, autoscaled" in cli("serve", "scale", "scale", "--min-replicas", "1",
                                                              "--max-replicas", "3")
    scaled = json.loads(cli("serve", "status", "scale", "-o", "json"))
    assert (scaled["scaling"]["min_replicas"], scaled["scaling"]["max_replicas"]) == (1, 3), scaled
    assert "autoscaled" in cli("serve", "status", "scale")
    refused = subprocess.run([KILN, "serve", "scale", "scale", "--min-replicas", "4", "--max-replicas", "2"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "min-replicas (4) is above max-replicas (2)" in refused.stderr, refused.stderr

    listed = cli("serve", "ls")
    assert "scale" in listed and "scale:1" in listed and "1/1" in listed, listed
    cli("serve", "stop", "scale")
    code, answer = post(f"{url}/v2/models/scale/infer", token, body)
    assert code == 400 and "unknown model `scale`" in answer["error"], answer
