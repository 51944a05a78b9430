"""kiln's Python SDK.

    import kiln
    kiln.init(config={"lr": 3e-4})          # in a kiln job: that job; elsewhere: a new run
    for step in range(steps):
        kiln.log({"train/loss": loss}, step=step)
    kiln.log_series("lr", schedule)         # many values of one key at once, at the next steps
    kiln.finish()                           # also done at exit

`kiln.log` does not wait for the network: points go to a bounded buffer that a background
thread sends at once when it is idle, in batches under load. When the buffer is full, `log` waits for
room rather than dropping points. Each point is keyed by (job, key, step), so a batch sent twice
stores nothing twice.

Batches (a command run once per item, on workers that scale with the backlog):

    batch = kiln.Client().batches.create(["python", "resize.py", "{uri}"], max_workers=50)
    batch.add(uris); batch.seal(); batch.wait()
"""

from ._batch import Batch, Client, Progress
from ._run import Run, finish, init, log, log_series

config: dict = {}
"""The configuration given to `init` (a plain dict)."""

__all__ = ["Batch", "Client", "Progress", "Run", "config", "finish", "init", "log", "log_series"]
