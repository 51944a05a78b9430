"""kiln.checkpoint(): the marker the runner watches (tests/e2e/tests/leases.rs shows a runner
syncing on it)."""

import os

import kiln


def test_checkpoint_touches_the_marker_in_the_outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_OUTPUTS", str(tmp_path))
    assert kiln.checkpoint()
    marker = tmp_path / ".kiln-sync"
    first = os.stat(marker).st_mtime_ns
    os.utime(marker, ns=(first - 5_000_000_000, first - 5_000_000_000))
    assert kiln.checkpoint()
    assert os.stat(marker).st_mtime_ns > first - 5_000_000_000


def test_checkpoint_outside_a_job_does_nothing(monkeypatch):
    monkeypatch.delenv("KILN_OUTPUTS", raising=False)
    assert kiln.checkpoint() is False
