"""kiln's Python SDK.

    import kiln
    kiln.init(config={"lr": 3e-4})          # in a kiln job: that job; elsewhere: a new run
    for step in range(steps):
        kiln.log({"train/loss": loss}, step=step)
    kiln.log_series("lr", schedule)         # many values of one key at once, at the next steps
    kiln.summary({"best/loss": best})       # summary values of the run
    kiln.save("checkpoints/")               # a file or directory, as an artifact of the run
    kiln.checkpoint()                       # sync $KILN_OUTPUTS now (a resumed attempt gets them)
    kiln.finish()                           # also done at exit

Reading runs back (plain dataclasses, or pandas frames with frame=True):

    client = kiln.Client()
    runs = client.runs(project="vision", where="lr<0.01")
    series = client.metrics([run.id for run in runs], keys=["val/loss"])

`kiln.log` does not wait for the network: points go to a bounded buffer that a background
thread sends at once when it is idle, in batches under load. When the buffer is full, `log` waits for
room rather than dropping points. Each point is keyed by (job, key, step), so a batch sent twice
stores nothing twice.

In a sweep's trial, `kiln.init()` puts the advisor's knobs in `kiln.config`, and
`kiln.should_stop()` turns True once the advisor stopped the trial early:

    kiln.init()
    for epoch in range(kiln.config["epochs"]):
        kiln.log({"val/loss": train_one_epoch(kiln.config["lr"]), "epoch": epoch + 1}, step=epoch)
        if kiln.should_stop():
            break

Jobs (what `kiln run`, `logs`, `stop` and `artifacts get` do; the working directory is packed
as `kiln run` packs it):

    jobs = kiln.Client().jobs
    job = jobs.submit(["python", "train.py"], cpus=2, memory="4G", workdir=".")
    for line in jobs.logs(job.id, follow=True):
        print(line.text)
    if jobs.wait(job.id).state == "SUCCEEDED":
        jobs.download(job.id, "results/")

A call kiln refuses raises `kiln.KilnError` (its gRPC status `code` and the server's `message`).

Sweeps, the model registry, inference services and tokens (what `kiln sweep`, `model`, `serve`
and `token` do; see kiln._sweeps, _registry, _services, _tokens):

    client = kiln.Client()
    sweep = client.sweeps.create(spec, workdir=".")       # a dict, a YAML text or a pathlib.Path
    best = client.sweeps.best(client.sweeps.wait(sweep.id).id)
    version = client.models.register("digits-net", best.job_id, alias="production")
    client.models.download("digits-net@production", "model/")
    client.services.create("digits", ["digits-net@production"], ["python", "serve.py"])
    outputs = client.services.predict("digits", {"x": features}, wait=120)   # numpy arrays
    created = client.tokens.create("ci", expires="30d"); client.tokens.revoke("ci")

Batches (a command run once per item, on workers that scale with the backlog):

    batch = kiln.Client().batches.create(["python", "resize.py", "{uri}"], max_workers=50)
    batch.add(uris); batch.seal(); batch.wait()

An inference worker, which kiln's relay calls over the Open Inference Protocol's REST API (JSON,
on KILN_SERVE_PORT). `load` gets the model version's directory (KILN_MODEL_DIR) once; `predict`
gets numpy arrays by input name and returns arrays by output name, one call at a time:

    kiln.serve(lambda model, inputs: {"y": model(inputs["x"])}, lambda path: load_model(path))
"""

from typing import Any

from ._batch import Batch, Client, Progress, RetryRule
from ._checkpoint import checkpoint
from ._client import RunInfo, Series
from ._errors import KilnError
from ._jobs import Job, LogLine, OutputFile
from ._registry import DatasetRef, Lineage, Model, ModelFile, ModelVersion
from ._run import Run, finish, init, log, log_series
from ._serve import serve
from ._services import Scaling, Service, ServiceMember, ServiceTraffic, ServiceWorker, TensorSpec
from ._sweep import should_stop
from ._sweeps import Sweep, Trial, TrialCounts
from ._tokens import NewToken, Token
from ._track import Saved, save, summary
from ._version import __version__

config: dict[str, Any] = {}
"""The configuration given to `init` (a plain dict)."""

__all__ = [
    "Batch", "Client", "DatasetRef", "Job", "KilnError", "Lineage", "LogLine", "Model", "ModelFile", "ModelVersion",
    "NewToken", "OutputFile", "Progress", "RetryRule", "Run", "RunInfo", "Saved", "Scaling", "Series", "Service",
    "ServiceMember", "ServiceTraffic", "ServiceWorker", "Sweep", "TensorSpec", "Token", "Trial", "TrialCounts",
    "checkpoint", "config", "finish", "init", "log",
    "log_series",
    "save", "serve", "should_stop", "summary", "__version__",
]
