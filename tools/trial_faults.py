"""The engine trial (tools/engine_trial.py): the fault tests played on the three engines."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

from trial_engines import enqueue

if TYPE_CHECKING:
    from engine_trial import Trial


def counts(rows: list[dict[str, Any]], tag: str) -> dict[str, Any]:
    mine = [r for r in rows if r["tag"] == tag]
    done = [r["worker"] for r in mine if r["event"] == "done"]
    return {
        "starts": [r["worker"] for r in mine if r["event"] == "start"],
        "dones": done,
        "doubled": max(0, len(done) - 1),
        "lost": int(not done),
    }


def timeline(rows: list[dict[str, Any]], tag: str, t0: float) -> list[str]:
    """``event worker @ seconds from t0``, for the job ``tag``."""
    return [f"{r['event']} {r['worker']} @{r['at'] - t0:+.1f}" for r in rows if r["tag"] == tag]


def hit(t: Trial, engine: str, test: str, dsn: str, sig: int, after_s: float) -> dict[str, Any]:
    """Two workers, one job; ``after_s`` into it, ``sig`` to the worker playing it. Seconds
    until the other started it (``moved_s``, null: not within ``move_limit_s``)."""
    w = [t.spawn(engine, dsn, test, n, executor_id=n if engine == "dbos" else "") for n in ("w1", "w2")]
    t.ready(test, ["w1", "w2"])
    enqueue(engine, dsn, "R1", "j", t.job_s)
    rows = t.until(test, lambda r: any(x["event"] == "start" for x in r), 20)
    if rows is None:
        raise RuntimeError("the job never started")
    victim = t.worker_of(rows, "j", w)
    time.sleep(after_s)
    t.signal(victim, sig)
    t0 = t.now()
    moved = t.until(test, lambda r: sum(x["event"] == "start" for x in r if x["tag"] == "j") >= 2, t.move_limit_s)
    out: dict[str, Any] = {"hit": victim.name, "t0": t0, "victim": victim, "workers": w}  # type: ignore[attr-defined]
    out["moved_s"] = None
    if moved is not None:
        again = [x for x in moved if x["tag"] == "j" and x["event"] == "start"][1]
        out["moved_s"], out["moved_to"] = round(again["at"] - t0, 2), again["worker"]
    return out


def t_kill9(t: Trial, engine: str, test: str, dsn: str) -> dict[str, Any]:
    out = hit(t, engine, test, dsn, signal.SIGKILL, 1.5)
    victim = out.pop("victim")
    del out["t0"], out["workers"]
    if out["moved_s"] is None and engine == "dbos":  # only a process with its executor id recovers its workflow
        t.spawn(engine, dsn, test, "w1b", executor_id=victim.name)
        t1 = t.now()
        again = t.until(test, lambda r: sum(x["event"] == "start" for x in r if x["tag"] == "j") >= 2, 30)
        if again is not None:
            start = [x for x in again if x["tag"] == "j" and x["event"] == "start"][1]
            out["moved_after_restart_with_its_executor_id_s"] = round(start["at"] - t1, 2)
    t.until(test, lambda r: any(x["event"] == "done" and x["tag"] == "j" for x in r), t.job_s + 8)
    time.sleep(3)
    out.update(counts(t.rows(test), "j"))
    return out


def t_restart(t: Trial, engine: str, test: str, dsn: str, mid: bool) -> dict[str, Any]:
    w1 = t.spawn(engine, dsn, test, "w1", executor_id="w1" if engine == "dbos" else "")
    t.ready(test, ["w1"])
    if mid:
        enqueue(engine, dsn, "R1", "j", t.job_s)
        if t.until(test, lambda r: any(x["event"] == "start" for x in r), 20) is None:
            return {"error": "the job never started"}
        time.sleep(1.5)
        up = t.restart()
    else:
        time.sleep(1.0)
        up = t.restart()
        time.sleep(0.5)
        enqueue(engine, dsn, "R1", "j", t.job_s)
    t.until(test, lambda r: any(x["event"] == "done" for x in r), 30 + t.job_s)
    time.sleep(t.job_s + 4)  # a job the engine runs again (its completion lost) shows now
    rows = t.rows(test)
    out = {"worker_alive": w1.poll() is None, "exit_code": w1.poll(), **counts(rows, "j")}
    starts = [x for x in rows if x["tag"] == "j" and x["event"] == "start"]
    if not mid and starts:
        out["started_s_after_server_up"] = round(starts[0]["at"] - up, 2)
    out["finished"] = bool(out["dones"])
    out["timeline_s_from_server_up"] = timeline(rows, "j", up)
    return out


def t_sigstop(t: Trial, engine: str, test: str, dsn: str) -> dict[str, Any]:
    out = hit(t, engine, test, dsn, signal.SIGSTOP, 1.0)
    victim, t0, w = out.pop("victim"), out.pop("t0"), out.pop("workers")
    time.sleep(1.0)
    t.signal(victim, signal.SIGCONT)
    out["stopped_s"] = round(t.now() - t0, 2)
    t.until(test, lambda r: sum(x["event"] == "done" for x in r if x["tag"] == "j") >= 2, t.job_s + 6)
    time.sleep(3)
    rows = t.rows(test)
    out.update(counts(rows, "j"))
    out["timeline_s_from_sigstop"] = timeline(rows, "j", t0)
    out["both_alive"] = all(p.poll() is None for p in w)
    return out


def terminate(t: Trial, p: subprocess.Popen[bytes]) -> tuple[int | None, float | None]:
    """SIGTERM to a worker: its exit code and the seconds it took (None, None: not within 20 s)."""
    t.signal(p, signal.SIGTERM)
    t0 = time.monotonic()
    try:
        return p.wait(20), round(time.monotonic() - t0, 2)
    except subprocess.TimeoutExpired:
        return None, None


def t_sigterm(t: Trial, engine: str, test: str, dsn: str) -> dict[str, Any]:
    w1 = t.spawn(engine, dsn, test, "w1", executor_id="w1" if engine == "dbos" else "")
    t.ready(test, ["w1"])
    enqueue(engine, dsn, "R1", "j", t.job_s)
    if t.until(test, lambda r: any(x["event"] == "start" for x in r), 20) is None:
        return {"error": "the job never started"}
    time.sleep(1.5)
    code, exit_s = terminate(t, w1)
    rows = t.rows(test)
    finished = any(x["event"] == "done" and x["worker"].startswith("w1/") for x in rows)
    out: dict[str, Any] = {"exit_code": code, "exit_s": exit_s, "finished_before_exit": finished}
    if not finished:  # handed back, or stranded? a fresh worker tells
        t.spawn(engine, dsn, test, "w2", executor_id="w2" if engine == "dbos" else "")
        t.ready(test, ["w2"])
        out["taken_by_next_worker"] = (
            t.until(test, lambda r: any(x["event"] == "start" and x["worker"].startswith("w2/") for x in r), 10)
            is not None
        )
    out.update(counts(t.rows(test), "j"))
    return out


def t_key_lock(t: Trial, engine: str, test: str, dsn: str) -> dict[str, Any]:
    for n in ("w1", "w2"):
        t.spawn(engine, dsn, test, n, executor_id=n if engine == "dbos" else "")
    t.ready(test, ["w1", "w2"])
    said = {tag: enqueue(engine, dsn, run, tag, 3.0) for run, tag in (("A", "A1"), ("A", "A2"), ("B", "B1"))}
    want = [tag for tag, s in said.items() if "job" in s]
    t.until(test, lambda r: {x["tag"] for x in r if x["event"] == "done"} >= set(want), 30)
    rows = t.rows(test)

    def span(tag: str) -> tuple[float, float] | None:
        s = [x["at"] for x in rows if x["tag"] == tag and x["event"] == "start"]
        d = [x["at"] for x in rows if x["tag"] == tag and x["event"] == "done"]
        return (s[0], d[0]) if s and d else None

    a1, a2, b1 = span("A1"), span("A2"), span("B1")
    out: dict[str, Any] = {"enqueue": {k: ("refused" if "refused" in v else "queued") for k, v in said.items()}}
    out["refusal"] = next((v["refused"] for v in said.values() if "refused" in v), None)
    out["same_run_overlapped"] = bool(a1 and a2 and a1[0] < a2[1] and a2[0] < a1[1])
    out["other_run_ran_beside"] = bool(a1 and b1 and a1[0] < b1[1] and b1[0] < a1[1])
    out["done"] = sorted({x["tag"] for x in rows if x["event"] == "done"})
    return out


def t_pidns(t: Trial, engine: str, test: str, dsn: str) -> dict[str, Any]:
    w = [t.spawn(engine, dsn, test, n, pidns=True) for n in ("w1", "w2")]
    t.ready(test, ["w1", "w2"])
    enqueue(engine, dsn, "R1", "j", t.job_s)
    rows = t.until(test, lambda r: any(x["event"] == "start" for x in r), 20)
    if rows is None:
        return {"error": "the job never started"}
    t.spawn(engine, dsn, test, "w3", pidns=True)  # starts (and recovers what it thinks is its own) mid-job
    t.until(test, lambda r: sum(x["event"] == "done" for x in r if x["tag"] == "j") >= 2, t.job_s + 10)
    rows = t.rows(test)
    out: dict[str, Any] = {"pids_inside": sorted({x["worker"] for x in rows if x["event"] == "ready"})}
    out.update(counts(rows, "j"))
    out["all_alive"] = all(p.poll() is None for p in w)
    return out
