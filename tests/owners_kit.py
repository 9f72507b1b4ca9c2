"""Real workers for the worker tests: one that crashed (its instance lock file left behind,
nobody holding it), one living in another PID namespace of this host (its PID means nothing
here); and a run's event kinds as a fresh reader sees them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

CRASHED = (
    "import os\n"
    "from loomrt.record.owners import worker_name\n"
    "print(worker_name(), flush=True)\n"
    "os._exit(0)  # no clean exit: the lock file stays, as after a crash\n"
)

CLAIMER = (
    "import sys, time\n"
    "from loomrt.record.owners import worker_name\n"
    "from loomrt.record.sqlite import default_store\n"
    "store = default_store(sys.argv[1])\n"
    "store.claim_run(sys.argv[2], worker_name(), 900.0)\n"
    "print(worker_name(), flush=True)\n"
    "time.sleep(600)\n"
)


def crashed_worker() -> str:
    """The owner name of a worker of this machine that ended without letting anything go."""
    out = subprocess.run([sys.executable, "-c", CRASHED], capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


def _free_pid_floor() -> int:
    """A PID from which ten in a row are not used on this host now."""
    used = {int(p) for p in os.listdir("/proc") if p.isdigit()}
    return next(p for p in range(300, 30000) if not used & set(range(p, p + 10)))


def namespaced_claimer(url: str, run_id: str) -> tuple[subprocess.Popen[str], str]:
    """A worker in a new PID namespace (the same host name, the same temporary folder) that
    claims ``run_id`` with a fresh 900 s lease and then idles: the process and its owner name,
    whose PID is one no process of this namespace has."""
    floor = _free_pid_floor()
    script = (  # burn PIDs inside the namespace until the worker's lands on a free one here
        f'while [ "$(sh -c "echo \\$\\$")" -lt {floor} ]; do :; done; "{sys.executable}" -c "$0" "$1" "$2"'
    )
    user = [] if os.geteuid() == 0 else ["--map-current-user"]  # root may make one without a user namespace
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", *user, "sh", "-c", script, CLAIMER, url, run_id],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    name = proc.stdout.readline().strip()
    assert name, "the namespaced worker did not start"
    return proc, name


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a namespaced worker (``--kill-child`` takes its namespace with it) and wait."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(0.2)  # the namespace's processes are reaped


def kinds(url: str, run_id: str) -> list[str]:
    """The kinds of ``run_id``'s events, read through a store of its own (another process's view)."""
    from loomrt.record.sqlite import default_store

    store = default_store(url)
    try:
        return [e.kind for e in store.events(run_id)]
    finally:
        store.close()
