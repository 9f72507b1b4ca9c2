"""The engine trial (tools/engine_trial.py): the baseline, loomrt's own queue, under the same faults."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trial_engines import TESTS
from trial_faults import terminate

if TYPE_CHECKING:
    from engine_trial import Trial

# ------------------------------------------------------------------ the baseline: loomrt's own queue

LOOMRT_WORKER = ["-m", "loomrt", "worker", "--json", "--interval", "1", "--heartbeat-timeout-s", "3", "--grace-s", "10"]
LOOMRT_TESTS = (*TESTS, "kill9_apart", "sigterm_cut")
"""``kill9_apart``: kill9 with a ``TMPDIR`` per worker, so no worker sees another's instance
lock (as on two machines: liveness from the heartbeat alone). ``sigterm_cut``: sigterm on a
job longer than the grace's cut-off (10 s less 3.3), so the worker must hand the run back."""


class Baseline:
    """loomrt's own queue on the trial's server: a job is a detached run (``loomrt run a go
    --detach``, its scripted model replying after ``job_s`` seconds) played by ``loomrt worker``
    processes (:data:`LOOMRT_WORKER`); what happened is read from the run's record (``resumed``:
    a worker started the turn; ``model_call``, ``final``) and its claims (``run_owners``)."""

    def __init__(self, t: Trial, test: str, url: str):
        from loomrt.record.sqlite import default_store

        self.t, self.test = t, test
        self.folder = t.data / "loomrt" / test.replace("/", ".")
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        self.env = {**os.environ, "LOOMRT_DB_URL": url, "XDG_RUNTIME_DIR": "/tmp"}
        self.store = default_store(url)
        self.by_instance: dict[str, subprocess.Popen[bytes]] = {}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "loomrt", *args], env=self.env, capture_output=True, text=True, timeout=120
        )

    def detach(self, name: str, delays: list[float]) -> str:
        """A queued run whose model replies after ``delays[i]`` seconds on a process's i-th call."""
        folder = self.folder / name
        folder.mkdir()
        (folder / "s.yaml").write_text(
            "turns:\n" + "".join(f"  - {{text: answer {i}, delay_s: {d}}}\n" for i, d in enumerate(delays))
        )
        (folder / "agents.yaml").write_text("agents:\n  a: {model: scripted/s.yaml}\n")
        done = self.cli("run", "a", "go", "--agents", str(folder / "agents.yaml"), "--detach", "--json")
        if done.returncode:
            raise RuntimeError(f"run --detach failed: {done.stderr[-1000:]}")
        return str(json.loads(done.stdout)["run_id"])

    def spawn(self, name: str, *, apart: bool = False, pidns: bool = False) -> subprocess.Popen[bytes]:
        env = dict(self.env)
        if apart:  # instance locks of its own, as on another machine
            (self.folder / f"tmp-{name}").mkdir()
            env["TMPDIR"] = str(self.folder / f"tmp-{name}")
        return self.t.launch([sys.executable, *LOOMRT_WORKER], self.test, name, env=env, pidns=pidns)

    def lock_of(self, p: subprocess.Popen[bytes]) -> str | None:
        """The worker's instance (the lock file it holds in ``loomrt-workers-UID``), once it has one."""
        with contextlib.suppress(OSError, IndexError):
            for fd in Path(f"/proc/{self.t.target(p)}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if "/loomrt-workers-" in link and link.endswith(".lock"):
                        return Path(link).stem
        return None

    def ready(self, procs: list[subprocess.Popen[bytes]], limit_s: float = 60) -> None:
        end = time.monotonic() + limit_s
        for p in procs:
            while (instance := self.lock_of(p)) is None:
                if p.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"{self.test}: worker {p.name} never got ready (see {p.log})")  # type: ignore[attr-defined]
                time.sleep(0.2)
            self.by_instance[instance] = p
        time.sleep(1.0)  # its first look at the queue

    def claim(self, run: str) -> dict[str, Any] | None:
        return next((c for c in self.store.run_owners() if c["run_id"] == run), None)

    def holder(self, run: str) -> subprocess.Popen[bytes] | None:
        claim = self.claim(run)
        return self.by_instance.get(claim["owner"].rsplit("/", 1)[-1]) if claim else None

    def starts(self, run: str) -> list[float]:
        """When a worker (or ``runs continue``) started a turn of ``run``: its ``resumed`` events."""
        return [e.ts for e in self.store.events(run) if e.kind == "resumed"]

    def ended(self, run: str) -> bool:
        return self.store.get_run(run).status in ("done", "failed", "cancelled")

    def started(self, run: str, limit_s: float = 20) -> subprocess.Popen[bytes]:
        """Wait until a worker plays ``run``; that worker."""
        end = time.monotonic() + limit_s
        while not (self.starts(run) and (p := self.holder(run))):
            if time.monotonic() > end:
                raise RuntimeError("the run never started")
            time.sleep(0.1)
        return p

    def rows(self, p: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
        """What the worker printed (``--json``: a row per run looked at)."""
        text = Path(p.log).read_text(errors="replace")  # type: ignore[attr-defined]
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def tally(self, run: str) -> dict[str, Any]:
        """Doubled: a ``final`` or a ``model_call`` beyond one per input; lost: the run did not
        end done. Clean: ``loomrt runs verify`` says so."""
        kinds = [e.kind for e in self.store.events(run)]
        inputs, finals, calls = (kinds.count(k) for k in ("user_input", "final", "model_call"))
        verify = self.cli("runs", "verify", run)
        status = self.store.get_run(run).status
        return {
            "status": status,
            "starts": kinds.count("resumed"),
            "finals": finals,
            "model_calls": calls,
            "doubled": max(0, finals - inputs, calls - inputs),
            "lost": int(status != "done"),
            "verify": "clean" if verify.returncode == 0 else verify.stdout.strip().splitlines()[:3],
        }

    def timeline(self, run: str, t0: float) -> list[str]:
        keep = ("resumed", "user_input", "model_call", "final", "error")
        return [f"{e.kind} #{e.seq} @{e.ts - t0:+.1f}" for e in self.store.events(run) if e.kind in keep]


def until(pred: Any, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def lt_hit(b: Baseline, sig: int, after_s: float, apart: bool = False) -> tuple[dict[str, Any], str, Any, Any, float]:
    """Two workers, one run; ``after_s`` into its turn, ``sig`` to the worker playing it. Seconds
    until the other started the turn again (its ``resumed``; null: not within ``move_limit_s``)."""
    w = [b.spawn(n, apart=apart) for n in ("w1", "w2")]
    b.ready(w)
    run = b.detach("j", [b.t.job_s] * 2)
    victim = b.started(run)
    time.sleep(after_s)
    b.t.signal(victim, sig)
    t0 = time.time()
    out: dict[str, Any] = {"hit": victim.name, "moved_s": None}  # type: ignore[attr-defined]
    if until(lambda: len(b.starts(run)) >= 2, b.t.move_limit_s):
        out["moved_s"] = round(b.starts(run)[1] - t0, 2)
        out["moved_to"] = getattr(b.holder(run), "name", None)
    return out, run, victim, w, t0


def lt_kill9(b: Baseline, apart: bool = False) -> dict[str, Any]:
    out, run, *_ = lt_hit(b, signal.SIGKILL, 1.5, apart)
    until(lambda: b.ended(run), b.t.job_s + 10)
    time.sleep(2)
    return {**out, **b.tally(run)}


def lt_restart(b: Baseline, mid: bool) -> dict[str, Any]:
    w1 = b.spawn("w1")
    b.ready([w1])
    if mid:
        run = b.detach("j", [b.t.job_s] * 2)
        b.started(run)
        time.sleep(1.5)
        up = b.t.restart()
    else:
        time.sleep(1.0)
        up = b.t.restart()
        time.sleep(0.5)
        run = b.detach("j", [b.t.job_s] * 2)
    until(lambda: b.ended(run), 30 + b.t.job_s)
    time.sleep(3)
    out: dict[str, Any] = {"worker_alive": w1.poll() is None, "exit_code": w1.poll(), **b.tally(run)}
    if not mid and b.starts(run):  # the detach is a CLI process of its own: queued about 2 s after the server was up
        queued = next(e.ts for e in b.store.events(run) if e.kind == "run_queued")
        out["started_s_after_server_up"] = round(b.starts(run)[0] - up, 2)
        out["started_s_after_queued"] = round(b.starts(run)[0] - queued, 2)
    out["reconnect_rows"] = sum(r["work"] == "reconnect" for r in b.rows(w1))
    out["rows"] = [r for r in b.rows(w1) if r["run_id"] == run]
    out["timeline_s_from_server_up"] = b.timeline(run, up)
    return out


def lt_sigstop(b: Baseline) -> dict[str, Any]:
    out, run, victim, w, t0 = lt_hit(b, signal.SIGSTOP, 1.0)
    time.sleep(1.0)
    b.t.signal(victim, signal.SIGCONT)
    out["stopped_s"] = round(time.time() - t0, 2)
    until(lambda: b.ended(run) and any(r["run_id"] == run for r in b.rows(victim)), b.t.job_s + 8)
    time.sleep(2)
    out.update(b.tally(run))
    out["woken_worker_rows"] = b.rows(victim)
    out["claims_after"] = b.store.run_owners()
    out["timeline_s_from_sigstop"] = b.timeline(run, t0)
    out["both_alive"] = all(p.poll() is None for p in w)
    return out


def lt_sigterm(b: Baseline, job_s: float) -> dict[str, Any]:
    w1 = b.spawn("w1")
    b.ready([w1])
    run = b.detach("j", [job_s] * 2)
    b.started(run)
    time.sleep(1.5)
    code, exit_s = terminate(b.t, w1)
    out: dict[str, Any] = {"job_s": job_s, "exit_code": code, "exit_s": exit_s, "finished_before_exit": b.ended(run)}
    out["handed_back"] = b.store.run_owners() == []
    if not out["finished_before_exit"]:  # handed back: any worker takes it at once
        w2 = b.spawn("w2")
        t1 = time.time()
        out["taken_by_next_worker"] = until(lambda: len(b.starts(run)) >= 2, 15)
        if out["taken_by_next_worker"]:
            out["taken_s_after_its_launch"] = round(b.starts(run)[1] - t1, 2)
        until(lambda: b.ended(run), job_s + 5)
        out["next_worker_rows"] = b.rows(w2)
    out.update(b.tally(run))
    return out


def lt_key_lock(b: Baseline) -> dict[str, Any]:
    """Runs A and B detached; A's second input (``runs continue A``, the one way to give a run
    another turn) is sent while a worker plays A's first, and again once it ended."""
    w = [b.spawn(n) for n in ("w1", "w2")]
    b.ready(w)
    a, bb = b.detach("A", [b.t.job_s, 3.0]), b.detach("B", [3.0])
    b.started(a)
    t0 = time.time()
    during = b.cli("runs", "continue", a, "second", "--json")
    said = {"A2_while_A1_plays": "played" if during.returncode == 0 else "refused"}
    out: dict[str, Any] = {"enqueue": said, "refusal": (during.stderr.strip().splitlines() or [None])[-1]}
    until(lambda: b.ended(a) and b.ended(bb), 30)
    if during.returncode:
        after = b.cli("runs", "continue", a, "second", "--json")
        said["A2_after_A1"] = "played (in the caller's process)" if after.returncode == 0 else "refused"
    events = list(b.store.events(a))
    finals = [e.ts for e in events if e.kind == "final"]
    again = [e.ts for e in events if e.kind == "resumed" and (e.data or {}).get("input") == "continue"]
    out["same_run_overlapped"] = bool(finals and again and again[0] < finals[0])
    b_spans = [e.ts for e in b.store.events(bb) if e.kind in ("resumed", "final")]
    a1 = (b.starts(a)[0], finals[0]) if finals else None
    out["other_run_ran_beside"] = bool(a1 and len(b_spans) == 2 and a1[0] < b_spans[1] and b_spans[0] < a1[1])
    out["A"], out["B"] = b.tally(a), b.tally(bb)
    out["A_timeline"] = b.timeline(a, t0)
    return out


def lt_pidns(b: Baseline) -> dict[str, Any]:
    w = [b.spawn(n, pidns=True) for n in ("w1", "w2")]
    b.ready(w)
    run = b.detach("j", [b.t.job_s] * 2)
    b.started(run)
    owner = b.claim(run)
    b.spawn("w3", pidns=True)  # starts mid-turn, on the same host name, as PID 1 too
    until(lambda: b.ended(run), b.t.job_s + 10)
    time.sleep(3)
    out: dict[str, Any] = {"owner": owner["owner"] if owner else None, "all_alive": all(p.poll() is None for p in w)}
    return {**out, **b.tally(run)}


def lt_test(t: Trial, test: str, key: str, dsn: str) -> dict[str, Any]:
    b = Baseline(t, key, dsn)
    try:
        if test in ("kill9", "kill9_apart"):
            return lt_kill9(b, apart=test == "kill9_apart")
        if test in ("restart_idle", "restart_mid"):
            return lt_restart(b, mid=test == "restart_mid")
        if test in ("sigterm", "sigterm_cut"):
            return lt_sigterm(b, t.job_s if test == "sigterm" else 15.0)
        return {"sigstop": lt_sigstop, "key_lock": lt_key_lock, "pidns": lt_pidns}[test](b)
    finally:
        b.store.close()
