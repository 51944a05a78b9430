"""The README's pipeline example, run as written: the blocks of "Sweeps, models, services and
tokens from Python" marked `<!-- readme-example: FILE -->` are written out to a directory, and
`python pipeline.py` runs there against a real `kiln up` (local processes; the `up` fixture is
conftest's). What it prints and what it leaves on the server are then checked. Needs numpy (the
example's trials, worker and pipeline use it; the `test` extra brings it with pandas)."""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np

import kiln

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"
# The files the example is made of, in the order the README shows them.
EXAMPLE_FILES = ("train.py", "serve.py", "pipeline.py")
MARKED_BLOCK = re.compile(r"^<!-- readme-example: (\S+) -->\n```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# The three blob centres the pipeline asks about, and the classes their points come from.
CENTERS = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]])


def readme_example() -> dict[str, str]:
    """The marked blocks by file name; fails naming the marker that is missing or given twice."""
    text = README.read_text()
    blocks: dict[str, str] = {}
    for match in MARKED_BLOCK.finditer(text):
        name = match.group(1)
        assert name not in blocks, f"README.md marks two blocks as readme-example: {name}"
        blocks[name] = match.group(2)
    for name in EXAMPLE_FILES:
        marker = f"<!-- readme-example: {name} -->"
        assert marker in text, f"README.md has no {marker} line"
        assert name in blocks, f"README.md's {marker} is not followed at once by a ```python block"
    assert sorted(blocks) == sorted(EXAMPLE_FILES), f"README.md marks unexpected blocks: {sorted(blocks)}"
    return blocks


def readme_promised_output() -> list[str]:
    """The lines the README says pipeline.py prints: the first ```text block after it."""
    text = README.read_text()
    after = text[text.index("<!-- readme-example: pipeline.py -->"):]
    promised = re.search(r"^```text\n(.*?)^```$", after, re.MULTILINE | re.DOTALL)
    assert promised, "README.md shows no ```text block of what pipeline.py prints after it"
    return promised.group(1).splitlines()


def test_the_readme_finds_its_example_blocks():
    blocks = readme_example()
    assert "kiln.serve(" in blocks["serve.py"] and "KILN_OUTPUTS" in blocks["train.py"]
    assert 'workdir="."' in blocks["pipeline.py"]


def test_the_readme_pipeline_runs_as_written(up, tmp_path):
    example = tmp_path / "example"
    example.mkdir()
    for name, code in readme_example().items():
        (example / name).write_text(code)

    # The environment the `up` fixture made (KILN_HOME, the others unset), as a user's shell has it.
    run = subprocess.run([sys.executable, "pipeline.py"], cwd=example, env=dict(os.environ),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"pipeline.py exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    printed = run.stdout.splitlines()
    # What the README shows, but for the predictor's address (kiln up's default there, a free port here).
    assert [re.sub(r"http://\S+", "URL", line) for line in printed] == [
        re.sub(r"http://\S+", "URL", line) for line in readme_promised_output()], run.stdout
    best_line = re.fullmatch(r"best lr (\S+): val/loss (\d+\.\d{4})", printed[0])
    assert best_line, printed[0]
    # The middle learning rate wins: 0.01 learns too slowly in 20 epochs, 10.0 overshoots.
    assert best_line.group(1) == "0.3", printed[0]
    assert printed[1] == "registered blobs-softmax:1: ['weights.npz']", printed[1]
    served_line = re.fullmatch(r"blobs at (http://\S+): classes \[0 1 2\]", printed[2])
    assert served_line, printed[2]

    with kiln.Client() as client:
        sweeps = [s for s in client.sweeps.list(all=True) if s.name == "blobs-lr"]
        assert len(sweeps) == 1, sweeps
        sweep = client.sweeps.get(sweeps[0].id)
        assert (sweep.state, sweep.algorithm, sweep.counts.succeeded) == ("finished", "grid", 3), sweep
        values = {t.config["lr"]: t.value for t in sweep.trials}
        assert sorted(values) == [0.01, 0.3, 10.0] and min(values, key=values.get) == 0.3, values
        assert f"{sweep.best.value:.4f}" == best_line.group(2) and sweep.best.config == {"lr": 0.3}

        version = client.models.get("blobs-softmax@production")
        assert (version.ref, version.aliases, version.tags) == ("blobs-softmax:1", ("production",), {"sweep": sweep.id})
        assert (version.lineage.job_id, version.lineage.sweep_id) == (sweep.best.job_id, sweep.id)
        assert [f.path for f in version.files] == ["weights.npz"]

        service = client.services.get("blobs")
        assert (service.state, service.models, service.url) == ("RUNNING", ("blobs-softmax@production",),
                                                                served_line.group(1)), service
        assert service.members[0].model_version == "blobs-softmax:1" and service.recent.answered >= 1, service
        # The worker serves the registered weights: its answer is what they compute here.
        weights = np.load(client.models.download("blobs-softmax@production", tmp_path / "model")[0])
        logits = CENTERS @ weights["w"] + weights["b"]
        expected = np.exp(logits - logits.max(axis=1, keepdims=True))
        expected /= expected.sum(axis=1, keepdims=True)
        answer = client.services.predict("blobs", {"x": CENTERS})["probabilities"]
        np.testing.assert_allclose(answer, expected, rtol=1e-12)
        assert client.services.stop("blobs").state == "STOPPED"

