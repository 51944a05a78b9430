"""`kiln.Client()`'s sweeps, models, services and tokens against a real `kiln up` (local
processes; the `up` fixture is conftest's): a pipeline that runs a sweep, registers its best
trial and serves it, and each area's reads, changes and refusals. The encoding `predict` uses
and the parsers are tested without a server at the end."""

import hashlib
import json
import math
import pathlib
import sys
import time

import grpc
import numpy as np
import pytest

import kiln
from kiln import _predict
from kiln._registry import manifest_digest, parse_ref
from kiln._sweeps import spec_text

# Small jobs, so that the trials and workers running at once never queue.
CPUS = 0.1

TRIAL = """
import os, pathlib, kiln
kiln.init()
factor = kiln.config["factor"]
kiln.log({"loss": (factor - 3) ** 2}, step=1)
model = pathlib.Path(os.environ["KILN_OUTPUTS"]) / "model"
model.mkdir()
(model / "factor.txt").write_text(str(factor))
kiln.finish()
"""

WORKER = """
import os
import kiln

def load(path):
    with open(os.path.join(path, "factor.txt")) as f:
        return float(f.read())

kiln.serve(lambda factor, inputs: {"y": inputs["x"] * factor}, load)
"""


@pytest.fixture(scope="module")
def client(up):
    with kiln.Client() as client:
        yield client


def eventually(what, check, timeout=120.0):
    """Asks `check()` until it returns something true, and returns that."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.2)


def test_a_pipeline_runs_a_sweep_registers_its_best_trial_and_serves_it(client, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    (code / "worker.py").write_text(WORKER)
    spec = {
        "name": "factor-search",
        "objective": {"metric": "loss", "goal": "minimize"},
        "algorithm": {"name": "grid"},
        "budget": {"max-trials": 3, "max-parallel": 3},
        "parameters": {"factor": {"type": "int", "values": [1, 3, 5]}},
        "trial": {"command": [sys.executable, "trial.py"], "cpu": CPUS, "mem": "256M"},
    }
    sweep = client.sweeps.create(spec, workdir=code)
    assert (sweep.name, sweep.state, sweep.max_trials, sweep.goal) == ("factor-search", "running", 3, "minimize")
    assert sweep.id in [listed.id for listed in client.sweeps.list()]
    final = client.sweeps.wait(sweep.id, timeout=180, poll=0.5)
    assert (final.state, final.counts.succeeded) == ("finished", 3), final
    # Each trial's value is what its code computed from the knob the advisor gave it.
    assert sorted((t.config["factor"], t.value) for t in final.trials) == [(1, 4.0), (3, 0.0), (5, 4.0)]
    best = client.sweeps.best(sweep.id)
    assert (best.config, best.value, best.state) == ({"factor": 3}, 0.0, "succeeded")
    assert final.best == best

    version = client.models.register("factor", best.job_id, "model", alias="production", description="the best")
    assert (version.ref, version.project, version.aliases) == ("factor:1", "default", ("production",))
    assert [(f.path, f.size, f.sha256) for f in version.files] == [("factor.txt", 1, hashlib.sha256(b"3").hexdigest())]
    assert (version.lineage.job_id, version.lineage.sweep_id) == (best.job_id, sweep.id)
    assert version.lineage.config["factor"] == 3 and version.lineage.metrics == {"loss": 0.0}
    assert client.models.get("factor@production") == version
    written = client.models.download("factor@production", tmp_path / "model")
    assert written == [tmp_path / "model" / "factor.txt"] and written[0].read_bytes() == b"3"

    service = client.services.create(
        "factor", ["factor@production"], [sys.executable, "worker.py"], deadline_ms=2000, cpus=CPUS,
        memory="256M", inputs=["x:FP64:-1,-1"], outputs=[kiln.TensorSpec("y", "FP64", (-1, -1))], workdir=code)
    assert (service.state, service.revision, service.models, service.url.startswith("http://")) == (
        "RUNNING", 1, ("factor@production",), True)
    assert service.inputs == (kiln.TensorSpec("x", "FP64", (-1, -1)),)
    answer = client.services.predict("factor", {"x": np.array([[1.5, -2.0]])}, wait=120)
    assert list(answer) == ["y"] and answer["y"].dtype == np.float64
    np.testing.assert_array_equal(answer["y"], [[4.5, -6.0]])
    served = client.services.get("factor")
    assert served.members[0].model_version == "factor:1" and served.recent.answered >= 1, served

    # Scaled: the controller keeps two workers, and both run.
    assert client.services.scale("factor", 2).scaling == kiln.Scaling(min_replicas=2, max_replicas=2)
    eventually("two running workers", lambda: [w for w in client.services.get("factor").members[0].workers
                                               if w.state == "RUNNING"][1:])
    # A new revision tried with half the traffic: the predictor splits exactly, so two requests
    # once its worker is in rotation get both factors. Then all of it: a roll.
    worst = max(final.trials, key=lambda t: t.value)
    second = client.models.register("factor", worst.job_id, "model")
    tried = client.services.update("factor", [second.ref], [sys.executable, "worker.py"], traffic=50, cpus=CPUS,
                                   memory="256M", deadline_ms=2000, workdir=code)
    assert (tried.revision, tried.latest_revision, tried.traffic) == (1, 2, 50), tried
    factor = float(worst.config["factor"])
    x = np.array([[1.0]])
    eventually("half the answers from revision 2", lambda: {
        float(client.services.predict("factor", {"x": x})["y"][0, 0]) for _ in range(2)} == {3.0, factor})
    assert client.services.update("factor", traffic=100).traffic == 100
    eventually("the roll to revision 2", lambda: client.services.get("factor").revision == 2)
    assert all(float(client.services.predict("factor", {"x": x})["y"][0, 0]) == factor for _ in range(4))

    assert "factor" in [listed.name for listed in client.services.list()]
    assert client.services.stop("factor").state == "STOPPED"
    assert "factor" not in [listed.name for listed in client.services.list()]
    assert [listed.state for listed in client.services.list(all=True) if listed.name == "factor"] == ["STOPPED"]
    with pytest.raises(kiln.KilnError) as gone:
        client.services.predict("factor", {"x": x})
    assert gone.value.code == grpc.StatusCode.INVALID_ARGUMENT and "unknown model `factor`" in gone.value.message


def test_a_sweep_from_a_yaml_file_is_listed_and_stopped(client, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"""
name: sleepy
objective: {{metric: loss, goal: minimize}}
algorithm: {{name: random, seed: 0}}
budget: {{max-trials: 4, max-parallel: 1}}
parameters:
  x: {{type: float, min: 0, max: 1}}
trial: {{command: ["{sys.executable}", "-c", "import time; time.sleep(600)"], cpu: {CPUS}, mem: 256M}}
""")
    sweep = client.sweeps.create(path, workdir=None)
    assert sweep.spec_yaml == path.read_text() and sweep.algorithm == "random"
    trial = eventually("a running trial", lambda: [t for t in client.sweeps.get(sweep.id).trials
                                                   if t.state == "running"])[0]
    assert client.jobs.get(trial.job_id).sweep_id == sweep.id
    assert sweep.id in [listed.id for listed in client.sweeps.list()]
    with pytest.raises(kiln.KilnError) as no_value:
        client.sweeps.best(sweep.id)
    assert no_value.value.code == grpc.StatusCode.NOT_FOUND
    assert client.sweeps.stop(sweep.id).state in ("stopping", "stopped")
    final = client.sweeps.wait(sweep.id, timeout=60, poll=0.2)
    assert (final.state, final.reason, final.ended) == ("stopped", "stopped by request", True)
    assert client.jobs.get(trial.job_id).state == "STOPPED"
    assert [t.state for t in final.trials] == ["stopped"], final.trials
    assert sweep.id not in [listed.id for listed in client.sweeps.list()]
    assert [s.state for s in client.sweeps.list(all=True) if s.id == sweep.id] == ["stopped"]
    # Resumed, it goes on within its budget: a second trial runs.
    assert client.sweeps.resume(sweep.id).state == "running"
    eventually("a second trial", lambda: [t for t in client.sweeps.get(sweep.id).trials
                                          if t.index == 1 and t.state == "running"])
    client.sweeps.stop(sweep.id)
    assert client.sweeps.wait(sweep.id, timeout=60, poll=0.2).counts.stopped == 2


def test_a_bad_sweep_spec_is_refused_naming_its_fields(client):
    spec = {"name": "bad", "algorithm": {"name": "random"}, "budget": {"max-trials": 0},
            "parameters": {"lr": {"type": "float", "min": 1, "max": 0}}, "trial": {"command": "true"}}
    with pytest.raises(kiln.KilnError) as refused:
        client.sweeps.create(spec, workdir=None)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message.startswith("the sweep spec has "), refused.value.message
    assert "objective: is missing" in refused.value.message, refused.value.message
    with pytest.raises(kiln.KilnError) as unreadable:
        client.sweeps.create("name: [unclosed", workdir=None)
    assert unreadable.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(TypeError, match="a dict, a YAML text or a pathlib.Path"):
        client.sweeps.create(42, workdir=None)
    with pytest.raises(ValueError, match="cannot be written as YAML"):
        client.sweeps.create({"budget": {"max-trials": math.nan}}, workdir=None)
    with pytest.raises(kiln.KilnError) as unknown:
        client.sweeps.get("01a244a3-6245-76fe-8b8b-bd1ef632098d")
    assert unknown.value.code == grpc.StatusCode.NOT_FOUND


def test_model_versions_are_aliased_tagged_listed_and_downloaded_as_registered(client, tmp_path):
    weights = bytes(range(256)) * 4000
    script = (
        "import os, pathlib\n"
        "out = pathlib.Path(os.environ['KILN_OUTPUTS']) / 'net'\n"
        "(out / 'sub').mkdir(parents=True)\n"
        "(out / 'weights.bin').write_bytes(bytes(range(256)) * 4000)\n"
        "(out / 'sub' / 'config.json').write_text('{\"layers\": 4}')\n"
    )
    job = client.jobs.submit([sys.executable, "-c", script], cpus=CPUS, workdir=None)
    assert client.jobs.wait(job.id, timeout=120, poll=0.2).state == "SUCCEEDED"
    first = client.models.register("net", job.id, "net", tags={"stage": "dev"}, description="first")
    second = client.models.register("net", job.id, "net/weights.bin", alias="candidate")
    assert (first.ref, second.ref) == ("net:1", "net:2")
    assert [f.path for f in first.files] == ["sub/config.json", "weights.bin"]
    assert [f.path for f in second.files] == ["weights.bin"] and second.files[0] == first.files[1]
    assert manifest_digest(first.files) == first.digest and first.size == len(weights) + 13

    assert client.models.alias("net", 1, "production").aliases == ("production",)
    assert client.models.model("net").aliases == {"candidate": 2, "production": 1}
    assert client.models.get("net@production").ref == "net:1" and client.models.get("net").ref == "net:2"
    assert [v.version for v in client.models.versions("net")] == [2, 1]
    assert [v.version for v in client.models.versions("net", tags={"stage": "dev"})] == [1]
    assert [v.version for v in client.models.versions("net", query="first")] == [1]
    assert client.models.tag("net:2", {"stage": "prod"}).tags == {"stage": "prod"}
    assert client.models.unalias("net", "candidate") == 2
    assert client.models.model("net").aliases == {"production": 1}
    assert [(m.name, m.latest_version) for m in client.models.list(query="ne")] == [("net", 2)]

    written = client.models.download("net@production", tmp_path / "dest")
    assert sorted(written) == [tmp_path / "dest" / "sub" / "config.json", tmp_path / "dest" / "weights.bin"]
    assert (tmp_path / "dest" / "weights.bin").read_bytes() == weights
    assert (tmp_path / "dest" / "sub" / "config.json").read_text() == '{"layers": 4}'
    assert not list((tmp_path / "dest").rglob("*.kiln-partial"))

    with pytest.raises(kiln.KilnError) as missing:
        client.models.get("net:9")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert missing.value.message == "model net has no version 9; `kiln model versions net` lists them"
    with pytest.raises(kiln.KilnError) as no_files:
        client.models.register("net", job.id, "nothing-here")
    assert no_files.value.code == grpc.StatusCode.FAILED_PRECONDITION, no_files.value
    assert no_files.value.message.startswith(f"job {job.id} has no outputs or saved artifacts under nothing-here")
    with pytest.raises(ValueError, match="must be a number from 1"):
        client.models.get("net:0")
    with pytest.raises(ValueError, match="name the version to tag: net:VERSION"):
        client.models.tag("net@production", {"stage": "x"})


def test_a_token_works_until_it_is_revoked(client, monkeypatch):
    created = client.tokens.create("pipeline", expires="1d")
    assert created.secret and created.secret not in repr(created)
    token = created.token
    assert (token.name, token.revoked, token.project, token.role) == ("pipeline", False, "", "")
    assert abs(token.expires_at_ms - token.created_at_ms - 86_400_000) < 5_000
    assert [t.id for t in client.tokens.list() if t.name == "pipeline"] == [token.id]

    monkeypatch.setenv("KILN_TOKEN", created.secret)
    with kiln.Client() as pipeline:
        assert "pipeline" in [t.name for t in pipeline.tokens.list()]
        pipeline.jobs.list()
        assert client.tokens.revoke("pipeline").revoked
        with pytest.raises(kiln.KilnError) as refused:
            pipeline.jobs.list()
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.message.startswith("the token is unknown, revoked or expired")
    assert "pipeline" not in [t.name for t in client.tokens.list()]
    assert [t.revoked for t in client.tokens.list(all=True) if t.id == token.id] == [True]

    viewer = client.tokens.create("watcher", project="default", role="viewer")
    assert (viewer.token.project, viewer.token.role) == ("default", "viewer")
    monkeypatch.setenv("KILN_TOKEN", viewer.secret)
    with kiln.Client() as watcher:
        watcher.sweeps.list()
        with pytest.raises(kiln.KilnError) as denied:
            watcher.jobs.submit(["true"], workdir=None)
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED, denied.value
    client.tokens.revoke(viewer.token.id)

    with pytest.raises(ValueError, match="give both, or neither"):
        client.tokens.create("half", project="default")
    with pytest.raises(ValueError, match="role must be one of viewer, member, maintainer"):
        client.tokens.create("owner", project="default", role="owner")
    with pytest.raises(ValueError, match="expires 'soon' is not a duration"):
        client.tokens.create("later", expires="soon")


def test_services_refuse_bad_definitions_before_asking(client):
    services = client.services
    with pytest.raises(TypeError, match="models is a list"):
        services.create("s", "m@production", ["python", "serve.py"], workdir=None)
    with pytest.raises(ValueError, match="give the worker's command"):
        services.create("s", ["m"], [], workdir=None)
    with pytest.raises(ValueError, match="weights gives 1 weight"):
        services.create("s", ["a", "b"], ["python", "serve.py"], weights=[2.0], workdir=None)
    with pytest.raises(ValueError, match="ensemble must be one of"):
        services.create("s", ["a"], ["python", "serve.py"], ensemble="median", workdir=None)
    with pytest.raises(ValueError, match="not NAME:DATATYPE:SHAPE"):
        services.create("s", ["a"], ["python", "serve.py"], inputs=["x:FP32"], workdir=None)
    with pytest.raises(ValueError, match="traffic .* 1 to 100"):
        services.update("s", traffic=0)
    with pytest.raises(ValueError, match="give the new revision"):
        services.update("s")
    with pytest.raises(ValueError, match="replicas or scaling"):
        services.scale("s", 2, scaling=kiln.Scaling())
    with pytest.raises(ValueError, match="replicas is 0; give 1 or more"):
        services.scale("s", 0)
    with pytest.raises(kiln.KilnError) as unknown_model:
        services.create("orphan", ["no-such-model"], ["python", "serve.py"], workdir=None)
    assert unknown_model.value.code == grpc.StatusCode.INVALID_ARGUMENT, unknown_model.value
    assert unknown_model.value.message == "model no-such-model not found in the registry (`kiln model ls`)"
    with pytest.raises(kiln.KilnError) as unknown:
        services.get("no-such-service")
    assert unknown.value.code == grpc.StatusCode.NOT_FOUND


# === Without a server ===


def test_predict_encodes_and_decodes_every_datatype_exactly():
    inputs = {
        "f64": np.array([[1.5, math.nan], [-math.inf, 1e-300]]), "f32": np.float32([0.1, 3.0]),
        "f16": np.float16([0.5, 65504]), "i64": np.int64([-(2 ** 63), 2 ** 63 - 1]), "u8": np.uint8([0, 255]),
        "i16": np.array([-2], dtype=">i2"), "b": np.array([True, False]), "s": np.array(["héllo", ""]),
        "raw": np.array([b"\x00\xff", b"x"], dtype=object), "scalar": np.float64(2.0),
    }
    body, length = _predict.encode(inputs, deadline_ms=250)
    header = json.loads(body[:length])
    assert header["parameters"] == {"binary_data_output": True, "timeout": 250_000}
    assert [(t["name"], t["datatype"], t["shape"]) for t in header["inputs"]] == [
        ("f64", "FP64", [2, 2]), ("f32", "FP32", [2]), ("f16", "FP16", [2]), ("i64", "INT64", [2]),
        ("u8", "UINT8", [2]), ("i16", "INT16", [1]), ("b", "BOOL", [2]), ("s", "BYTES", [2]), ("raw", "BYTES", [2]),
        ("scalar", "FP64", [])]
    # An answer is read as a request is written: outputs named and laid out the same way.
    head = json.dumps({"outputs": header["inputs"]}).encode()
    decoded = _predict.decode(head + body[length:], len(head))
    for name, value in inputs.items():
        expected = np.asarray(value)
        if expected.dtype.kind in "SUO":
            expected = np.array([v.encode() if isinstance(v, str) else v for v in expected.reshape(-1)], dtype=object)
        np.testing.assert_array_equal(decoded[name], expected, err_msg=name)
    assert decoded["f16"].dtype == np.float16 and decoded["scalar"].shape == ()
    json_answer = b'{"outputs": [{"name": "y", "datatype": "INT32", "shape": [2, 1], "data": [1, 2]}]}'
    np.testing.assert_array_equal(_predict.decode(json_answer, None)["y"], [[1], [2]])
    with pytest.raises(TypeError, match="input 'c' is complex128"):
        _predict.encode({"c": np.array([1j])}, None)
    with pytest.raises(ValueError, match="at least one input"):
        _predict.encode({}, None)


def test_names_and_specs_read_as_the_cli_reads_them(tmp_path):
    assert parse_ref("m") == ("m", 0, "") and parse_ref("vision/m:3") == ("vision/m", 3, "")
    assert parse_ref("m@prod") == ("m", 0, "prod")
    for bad in ("m:0", "m:x", "m:-1", ":3", "@prod"):
        with pytest.raises(ValueError):
            parse_ref(bad)
    assert kiln.TensorSpec.parse("x:fp32:-1, 64") == kiln.TensorSpec("x", "FP32", (-1, 64))
    assert spec_text({"project": "vision", "name": "a"}) == ('{\n  "project": "vision",\n  "name": "a"\n}', "vision")
    (tmp_path / "s.yaml").write_text("name: a\nproject: nlp\n")
    assert spec_text(pathlib.Path(tmp_path / "s.yaml")) == ("name: a\nproject: nlp\n", "nlp")
    assert spec_text("name: [unclosed") == ("name: [unclosed", "")
    assert spec_text(str(tmp_path / "s.yaml"))[1] == ""  # a str is a spec's text, never a path
