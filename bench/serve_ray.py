"""Ray Serve's side of the serving benchmark (issue 16): deploys serve_workers.py's models
(noop and digits) on Ray Serve on this machine, so that serve-bench's client can measure
them exactly as it measures kiln's (the same Rust client, the same requests, the same run).

    python bench/serve_ray.py [--profile default|throughput-optimized] [--replica-cpus 0.5]

It needs ray[serve], scikit-learn and the kiln SDK (sdk/python) installed in the interpreter.
It speaks a line protocol: one JSON object per line on stdout, commands on stdin (progress
and Ray's own output go to stderr):

    -> {"event": "ready", "ray_version", "profile", "port", "startup_s"}
    <- deploy replicas MODEL N     an app MODEL-N of one deployment with N replicas
    <- deploy ensemble MODEL       an app ensemble-MODEL: a router calling 2 member deployments
    -> {"event": "deployed", "app", "path", "seconds"}    path: POST it (OIP JSON infer)
    <- delete APP
    -> {"event": "deleted", "app"}
    <- quit                        (or end of input) shuts Serve and Ray down
    -> {"event": "done", "killed", "notes": [...]}

A failed command answers {"event": "error", "error"} and the program goes on; a failure of
Ray itself, or SIGTERM, still shuts down and ends with "done" (exit status 1).

- Ray: `ray.init(num_cpus=2)` on a fresh local instance in a temp dir, all of it on loopback
  (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, node address 127.0.0.1), no dashboard, no usage stats,
  a 256 MiB object store; Serve's HTTP proxy on 127.0.0.1 at a free port, access logs off.
  Ray's workers run at nice 0 like kiln's (--worker-niceness; Ray's default of 15 gives its
  replicas a small share of the CPU whenever anything else runs, e.g. a build).
- Every replica does what a kiln worker does per request: kiln.serve's own OIP JSON codec
  (serve_workers.decode/encode) around the model's predict, inline in an async method, with
  OMP_NUM_THREADS=1 (as serve-bench gives kiln's workers).
- A replica asks for --replica-cpus logical CPUs (default 0.5, so the 4 replicas of two apps
  fit the 2 CPUs; the CPU is not capped either way, like kiln's process workers').
- The ensemble: an `Ensemble` ingress deployment (0 CPU, a router) calls its two member
  deployments (1 replica each: the 2 workers) through DeploymentHandles concurrently and
  answers the element-wise mean, as kiln's `mean` ensemble does.
- Each app's first answer is checked against the model's own output before it is reported.
- Serve and Ray are shut down at the end and on error or SIGTERM; processes of this run still
  alive afterwards (found by the run's temp dir) are killed, and the temp dir is removed.
"""

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_workers  # noqa: E402

OBJECT_STORE_BYTES = 256 * 1024 * 1024
# The ensemble router answers this many calls at once (Ray's default of 5 would queue C=32 in
# the proxy); the members keep Ray's default, as their predict runs one call at a time anyway.
ENSEMBLE_MAX_ONGOING = 128

# Environment of Ray's processes per --profile (read when ray is imported and by every worker).
# throughput-optimized is Ray's own switch: user code and the router on the replica's event
# loop, gRPC between deployments, direct ingress, logs not copied to stderr, GC frozen at start.
PROFILES = {
    "default": {},
    "throughput-optimized": {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
    },
}


class Stop(Exception):
    """SIGTERM: unwinds so that Serve and Ray are shut down."""


def log(*parts):
    print("serve_ray:", *parts, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------
# the deployments (defined once ray is imported)


def deployments(serve, Response):
    class Model:
        """A replica of one of serve_workers' models: OIP JSON in, OIP JSON out."""

        def __init__(self, model_name):
            import serve_workers

            self.name = model_name
            self.predict = serve_workers.PREDICT[model_name]
            self.model = serve_workers.LOAD[model_name](None)

        async def infer(self, body: bytes) -> bytes:
            import serve_workers

            return serve_workers.encode(self.name, self.predict(self.model, serve_workers.decode(body)))

        async def arrays(self, inputs: dict) -> dict:
            return self.predict(self.model, inputs)

        async def __call__(self, request):
            try:
                body = await self.infer(await request.body())
            except ValueError as error:
                return Response(json.dumps({"error": str(error)}), status_code=400, media_type="application/json")
            return Response(body, media_type="application/json")

    class Ensemble:
        """The element-wise mean of two members' outputs, the members called concurrently."""

        def __init__(self, model_name, first, second):
            self.name = model_name
            self.members = (first, second)

        async def __call__(self, request):
            import serve_workers

            try:
                inputs = serve_workers.decode(await request.body())
            except ValueError as error:
                return Response(json.dumps({"error": str(error)}), status_code=400, media_type="application/json")
            calls = [member.arrays.remote(inputs) for member in self.members]
            first, second = [await call for call in calls]
            mean = {name: (first[name] + second[name]) / 2 for name in first}
            return Response(serve_workers.encode(self.name, mean), media_type="application/json")

    return serve.deployment(Model), serve.deployment(Ensemble)


# ------------------------------------------------------------------------------------------------
# the answers' check


_LOCAL = {}  # model name -> the model, loaded in the driver to check answers


def check_answer(port, path, body, model_name):
    """The proxy's answer to one call is the model's own output."""
    import http.client

    import numpy as np

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"POST {path} answered {response.status}: {answer[:300]!r}")
    got = json.loads(answer)["outputs"][0]
    if model_name not in _LOCAL:
        _LOCAL[model_name] = serve_workers.LOAD[model_name](None)
    want = serve_workers.PREDICT[model_name](_LOCAL[model_name], serve_workers.decode(body))
    name, value = next(iter(want.items()))
    if got["name"] != name or got["shape"] != list(value.shape) or not np.allclose(got["data"], value.ravel()):
        raise RuntimeError(f"POST {path} answered {answer[:300]!r}, not the model's output")


# ------------------------------------------------------------------------------------------------
# the commands


class Deployer:
    """Serve on a fresh Ray instance, and the apps deployed on it by the commands."""

    def __init__(self, args):
        import ray
        from ray import serve
        from ray.serve.schema import LoggingConfig
        from starlette.responses import Response

        self.args = args
        self.ray, self.serve = ray, serve
        self.Model, self.Ensemble = deployments(serve, Response)
        self.quiet = LoggingConfig(log_level="WARNING", enable_access_log=False)
        self.port = free_port()
        self.body = serve_workers.request_body()
        self.actor_options = {
            "num_cpus": args.replica_cpus,
            "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}},
        }
        started = time.monotonic()
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                 object_store_memory=OBJECT_STORE_BYTES, _temp_dir=args.temp_dir, _node_ip_address="127.0.0.1")
        # ray.init put in a handler of its own that aborts the driver, leaving Ray's agents behind
        signal.signal(signal.SIGTERM, args.on_sigterm)
        serve.start(http_options={"host": "127.0.0.1", "port": self.port}, logging_config=self.quiet)
        self.startup_s = round(time.monotonic() - started, 2)
        log(f"ray {ray.__version__} and serve up in {self.startup_s}s; proxy on 127.0.0.1:{self.port}")

    def replicas(self, model_name, replicas):
        app = f"{model_name}-{replicas}"
        deployment = self.Model.options(name=f"{model_name}_model", num_replicas=replicas,
                                        ray_actor_options=self.actor_options)
        return self._run(app, model_name, deployment.bind(model_name))

    def ensemble(self, model_name):
        app = f"ensemble-{model_name}"
        members = [self.Model.options(name=f"{model_name}_member_{i}", num_replicas=1,
                                      ray_actor_options=self.actor_options).bind(model_name) for i in (1, 2)]
        router = self.Ensemble.options(name="ensemble", num_replicas=1, max_ongoing_requests=ENSEMBLE_MAX_ONGOING,
                                       ray_actor_options={"num_cpus": 0})
        return self._run(app, model_name, router.bind(model_name, *members))

    def _run(self, app, model_name, bound):
        prefix = f"/v2/models/{app}"
        started = time.monotonic()
        self.serve.run(bound, name=app, route_prefix=prefix, logging_config=self.quiet)
        check_answer(self.port, prefix + "/infer", self.body, model_name)
        seconds = round(time.monotonic() - started, 2)
        log(f"{app}: deployed in {seconds}s")
        return {"event": "deployed", "app": app, "path": prefix + "/infer", "seconds": seconds}

    def delete(self, app):
        self.serve.delete(app)
        return {"event": "deleted", "app": app}

    def command(self, line):
        words = line.split()
        if words[:2] == ["deploy", "replicas"] and len(words) == 4 and words[2] in serve_workers.MODELS:
            return self.replicas(words[2], int(words[3]))
        if words[:2] == ["deploy", "ensemble"] and len(words) == 3 and words[2] in serve_workers.MODELS:
            return self.ensemble(words[2])
        if words[:1] == ["delete"] and len(words) == 2:
            return self.delete(words[1])
        raise ValueError(f"unknown command {line!r} (deploy replicas MODEL N, deploy ensemble MODEL, "
                         f"delete APP, quit; models: {', '.join(serve_workers.MODELS)})")


def shut_down(temp_dir):
    """Serve, then Ray; then kills what is left of this run (by its temp dir) and removes it."""
    try:
        import ray
        from ray import serve
    except ImportError:  # the caller said so already
        ray = None
    if ray is not None and ray.is_initialized():
        try:
            serve.shutdown()
        except Exception as error:  # Ray still goes down below
            log(f"serve.shutdown failed: {error!r}")
        ray.shutdown()
    deadline = time.monotonic() + 10
    while True:
        left = sorted(pid for pid in _ours(temp_dir) if pid != os.getpid() and _running(pid))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in left:
        log(f"killing pid {pid}, still alive after ray.shutdown")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(temp_dir, ignore_errors=True)
    return len(left)


def _ours(temp_dir):
    """Pids whose command line names this run's temp dir."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if temp_dir.encode() in f.read():
                        pids.add(int(entry))
            except OSError:
                continue
    return pids


def _running(pid):
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="default",
                        help="Serve's defaults, or RAY_SERVE_THROUGHPUT_OPTIMIZED=1")
    parser.add_argument("--replica-cpus", type=float, default=0.5, help="logical CPUs a model replica asks for")
    parser.add_argument("--worker-niceness", type=int, default=0,
                        help="nice value of Ray's workers (Ray's own default is 15; kiln's workers run at 0)")
    args = parser.parse_args(argv)

    # stdout carries only the protocol: Ray's processes and prints go to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def say(message):
        out.write(json.dumps(message) + "\n")
        out.flush()

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # A one-node "cluster" on loopback: without this Ray's processes talk over the machine's own
    # interface address (as Ray does on macOS and Windows, where it is the default).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.update(PROFILES[args.profile])
    os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
    args.temp_dir = tempfile.mkdtemp(prefix="kiln-ray-")

    def on_sigterm(signum, frame):
        raise Stop()

    args.on_sigterm = on_sigterm
    signal.signal(signal.SIGTERM, on_sigterm)
    notes = [
        f"profile {args.profile}: " + ("Serve's defaults (Python HTTP proxy)" if args.profile == "default"
                                        else "RAY_SERVE_THROUGHPUT_OPTIMIZED=1") + "; access logs off, log level WARNING",
        f"model replicas ask for {args.replica_cpus} CPU each (OMP_NUM_THREADS=1); the ensemble router 0 CPU, "
        f"max_ongoing_requests={ENSEMBLE_MAX_ONGOING}; Ray's workers at nice {args.worker_niceness}",
    ]
    status = 0
    try:
        import ray

        deployer = Deployer(args)
        say({"event": "ready", "ray_version": ray.__version__, "profile": args.profile, "port": deployer.port,
             "startup_s": deployer.startup_s})
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            if line == "quit":
                break
            try:
                say(deployer.command(line))
            except (Stop, KeyboardInterrupt):
                raise
            except Exception as error:
                import traceback

                traceback.print_exc()
                say({"event": "error", "error": f"{type(error).__name__}: {error}"})
    except (Stop, KeyboardInterrupt):
        log("stopped by a signal")
        notes.append("stopped by a signal before the end")
        status = 1
    except Exception as error:
        import traceback

        traceback.print_exc()
        say({"event": "error", "error": f"{type(error).__name__}: {error}"})
        status = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        killed = shut_down(args.temp_dir)
        if killed:
            notes.append(f"{killed} processes outlived ray.shutdown and were killed")
    say({"event": "done", "killed": killed, "notes": notes})
    return status


if __name__ == "__main__":
    sys.exit(main())
