"""The benchmarks' processes: every one is started in its own session (process group), and
stopped (with whatever it left in its group) at the end."""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time


class Fail(Exception):
    pass


# ------------------------------------------------------------------------------------------------
# processes: every one is started in its own session (process group) and stopped at the end

STARTED = []  # (Popen, label)


def start(cmd, label, **kwargs):
    try:
        proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    except OSError as e:
        raise Fail(f"cannot start {label} ({cmd[0]}): {e}")
    STARTED.append((proc, label))
    return proc


def kill_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc, sig=signal.SIGTERM, grace=15):
    """Signals the process (its group for SIGTERM), waits up to `grace` seconds, then kills the
    whole group."""
    if proc.poll() is None:
        if sig == signal.SIGINT:
            proc.send_signal(sig)  # kiln up: it stops its jobs and its nats-server itself
        else:
            kill_group(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        print(f"warning: pid {proc.pid} did not exit after SIGKILL", file=sys.stderr)


def stop_all():
    while STARTED:
        proc, _ = STARTED.pop()
        stop(proc, grace=5)


def descendants(pid):
    """{pid: pgid} of every live descendant of pid (kiln up's workers run in process groups of
    their own, so killing kiln up's group does not reach them)."""
    children, pgids = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        ppid, pgid = int(fields[1]), int(fields[2])
        children.setdefault(ppid, []).append(int(entry))
        pgids[int(entry)] = pgid
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = pgids[child]
            todo.append(child)
    return found


def pgid_of(pid):
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[2])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, label, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Fail(f"{label} exited with status {proc.returncode} before it listened on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise Fail(f"{label} did not listen on 127.0.0.1:{port} within {seconds} s")


def tail(path, lines=40):
    try:
        text = pathlib.Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(text[-lines:])
