"""The work queue on PostgreSQL is procrastinate's (issue 45): queued work and its job are one
transaction, the engine's worker plays the job and forgets it, a job a dead worker left
``doing`` goes back to the queue, and ``workers list`` shows the engine's own figures. Real
server, real worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from spine_kit import write
from typer.testing import CliRunner

from loomrt.cli import app
from loomrt.record.sqlite import default_store

runner = CliRunner()


def _agents(folder: Path) -> Path:
    write(folder, "s.yaml", "turns:\n" + "".join(f"  - {{text: answer {i}}}\n" for i in range(8)))
    return write(folder, "agents.yaml", "agents:\n  a: {model: scripted/s.yaml}\n")


def _detach(url: str, agents: Path) -> str:
    done = runner.invoke(app, ["--db-url", url, "run", "a", "go", "--agents", str(agents), "--detach", "--json"])
    assert done.exit_code == 0, done.output
    return str(json.loads(done.stdout)["run_id"])


def _jobs(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT task_name, queueing_lock, status::text, args->>'run_id' FROM procrastinate_jobs ORDER BY id"
        ).fetchall()


def _worker(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "loomrt", "worker", "--json", "--interval", "1", *args],
        env={**os.environ, "LOOMRT_DB_URL": url, **(env or {})},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _tried(url: str) -> bool:
    """The engine has taken every job: none waits (a job waiting for its run is ``doing``, a
    spent one is deleted)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'").fetchone()
    return row is not None and row[0] == 0


def _sabotage(folder: Path, line: str) -> Path:
    """A folder whose ``sitecustomize`` breaks the worker processes started with it on PYTHONPATH."""
    (folder / "sabotage").mkdir(exist_ok=True)
    (folder / "sabotage" / "sitecustomize.py").write_text(f"import loomrt.jobs.engine\n{line}\n", encoding="utf-8")
    return folder / "sabotage"


def _until(what: Any, timeout_s: float = 30.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if what():
            return True
        time.sleep(0.2)
    return False


def test_a_detached_run_and_its_job_are_written_in_one_transaction(postgres_url: str, tmp_path: Path) -> None:
    run_id = _detach(postgres_url, _agents(tmp_path))
    assert _jobs(postgres_url) == [("loomrt.play", f"play:{run_id}", "todo", run_id)]
    with psycopg.connect(postgres_url) as conn:  # a queued fold: its job is in the same transaction, or nowhere
        seq = conn.execute("SELECT max(seq) + 1 FROM events WHERE run_id = %s", (run_id,)).fetchone()[0]  # type: ignore[index]
        conn.execute(
            "INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES (%s, %s, 'fold_queued', 0, '{}', 'x')",
            (run_id, seq),
        )
        inside = conn.execute("SELECT task_name, queueing_lock FROM procrastinate_jobs ORDER BY id").fetchall()
        assert inside == [("loomrt.play", f"play:{run_id}"), ("loomrt.distil", f"distil:{run_id}")]
        assert len(_jobs(postgres_url)) == 1  # not committed: not seen from elsewhere
        conn.rollback()
    assert _jobs(postgres_url) == [("loomrt.play", f"play:{run_id}", "todo", run_id)]


def test_the_same_work_queued_twice_has_one_job_waiting(postgres_url: str, tmp_path: Path) -> None:
    run_id = _detach(postgres_url, _agents(tmp_path))
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # the trigger lets the engine's refusal pass
        seq = conn.execute("SELECT max(seq) + 1 FROM events WHERE run_id = %s", (run_id,)).fetchone()[0]  # type: ignore[index]
        conn.execute(
            "INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES (%s, %s, 'run_queued', 0, '{}', 'x')",
            (run_id, seq),
        )
    assert [j[1] for j in _jobs(postgres_url)] == [f"play:{run_id}"]


def test_the_engines_worker_plays_the_job_and_forgets_it(postgres_url: str, tmp_path: Path) -> None:
    run_id = _detach(postgres_url, _agents(tmp_path))
    done = runner.invoke(app, ["--db-url", postgres_url, "worker", "--once", "--json"])
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"run_id": run_id, "work": "play", "done": True, "status": "done", "reason": None}
    ]
    assert _jobs(postgres_url) == []  # succeeded: deleted
    listed = runner.invoke(app, ["--db-url", postgres_url, "workers", "list", "--json"])
    engine = json.loads(listed.stdout)["queue"]["engine"]
    assert engine == {"jobs": {}, "tasks": {}, "workers": []}, engine  # --once unregistered itself
    text = runner.invoke(app, ["--db-url", postgres_url, "workers", "list"])
    assert "jobs (procrastinate): none; 0 workers registered" in text.stdout


@pytest.mark.parametrize("trigger", [True, False], ids=["trigger", "sabotaged-no-trigger"])
def test_a_running_worker_plays_what_is_queued_after_it_started(
    postgres_url: str, tmp_path: Path, trigger: bool
) -> None:
    """The record's trigger is what hands a long-running worker new work at once: without it
    (the sabotage) a run queued after the worker's first look waits for its next (a minute)."""
    if not trigger:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER events_defer_work ON events")
    agents = _agents(tmp_path)
    worker = _worker(postgres_url, "--interval", "60")
    try:
        time.sleep(5)  # it has looked once and waits
        run_id = _detach(postgres_url, agents)
        store = default_store(postgres_url)
        played = _until(lambda: store.get_run(run_id).status == "done", timeout_s=20 if trigger else 8)
        store.close()
        assert played is trigger
    finally:
        worker.kill()
        worker.communicate()


def test_a_job_a_dead_worker_left_doing_goes_back_to_the_queue(postgres_url: str, tmp_path: Path) -> None:
    run_id = _detach(postgres_url, _agents(tmp_path))
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # a worker took it, then stopped beating an hour ago
        dead = conn.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) VALUES (now() - interval '1 hour') RETURNING id"
        ).fetchone()[0]  # type: ignore[index]
        conn.execute("UPDATE procrastinate_jobs SET status = 'doing', worker_id = %s", (dead,))
    worker = _worker(postgres_url, "--heartbeat-timeout-s", "3")
    try:
        assert _until(lambda: _jobs(postgres_url) == [], timeout_s=30), _jobs(postgres_url)
    finally:
        worker.kill()
        worker.communicate()
    store = default_store(postgres_url)
    kinds = [e.kind for e in store.events(run_id)]
    assert (store.get_run(run_id).status, kinds.count("resumed"), kinds.count("final")) == ("done", 1, 1), kinds
    store.close()


def test_a_parked_chats_queued_fold_is_done_by_its_distil_job(postgres_url: str, tmp_path: Path) -> None:
    import asyncio
    import random

    from fold_kit import said, spec

    from loomrt.runtime import Runtime

    script = tmp_path / "chat.yaml"
    script.write_text(json.dumps({"turns": [{"text": "Noted."}] * 60, "summaries": [{"extractive": 300}]}))
    store = default_store(postgres_url)
    rt = Runtime(store)
    run = rt.start(spec(soft_pct=40, cache_idle_s=0).clone(model=f"scripted/{script}"), interactive=True)
    rng = random.Random(11)

    async def until_queued() -> None:
        for text in [said(i, rng) for i in range(60)]:
            await rt.send(run, text)
            if run.mode.queued(run.view):
                return

    asyncio.run(until_queued())
    assert ("loomrt.distil", f"distil:{run.run_id}") in [(j[0], j[1]) for j in _jobs(postgres_url)]
    rt.coordination.release_run(run.run_id, str(rt.owner), int(run.epoch or 0))  # the chat closed
    done = runner.invoke(app, ["--db-url", postgres_url, "worker", "--once", "--json"])
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["run_id"], r["work"], r["done"]) for r in rows] == [(run.run_id, "fold", True)], rows
    assert rows[0]["tokens_after"] < rows[0]["tokens_before"]
    assert store.pending("fold_queued", ("distillation", "fold_skipped")) == []
    store.close()


SPEND = """
loomrt.jobs.engine.LET_GO_S = 0.0  # the sabotage: a job that finds its run held is spent at once
"""


@pytest.mark.parametrize("retried", [True, False], ids=["retried", "sabotaged-not-retried"])
def test_a_job_that_comes_before_its_queuer_let_the_run_go_is_tried_again(
    postgres_url: str, tmp_path: Path, retried: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The play job can run before ``run --detach`` let its claim go (the event and its job
    commit first): the job waits for it to be let go, and plays it. The sabotage spends the
    job at once: the run waits for the next look (a minute here)."""
    run_id = _detach(postgres_url, _agents(tmp_path))
    store = default_store(postgres_url)
    epoch = store.claim_run(run_id, "queuer/1/slow", 60)  # the queuer still holds it
    env = {} if retried else {"PYTHONPATH": str(_sabotage(tmp_path, SPEND))}
    worker = _worker(postgres_url, "--interval", "60", env=env)
    try:
        assert _until(lambda: _tried(postgres_url), timeout_s=30)  # the job ran, and found the run held
        time.sleep(1)
        store.release_run(run_id, "queuer/1/slow", epoch)
        played = _until(lambda: store.get_run(run_id).status == "done", timeout_s=15 if retried else 6)
        assert played is retried
    finally:
        worker.kill()
        worker.communicate()
        store.close()


@pytest.mark.parametrize("once", [False, True], ids=["worker", "worker-once"])
def test_a_worker_the_database_refuses_says_why_once_and_stops(postgres_url: str, tmp_path: Path, once: bool) -> None:
    from conftest import app_login

    _detach(postgres_url, _agents(tmp_path))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("REVOKE SELECT ON procrastinate_workers FROM loomrt_app")
    login = app_login(postgres_url, "refused_worker")
    worker = _worker(login, *(["--once"] if once else []))
    out, err = worker.communicate(timeout=60)  # it ends by itself: no waiting out what no wait mends
    assert worker.returncode != 0 and "permission denied" in err, (worker.returncode, err[-800:])
    assert "reconnect" not in out, out


def test_what_no_wait_mends_is_told_from_what_a_wait_does() -> None:
    from procrastinate.exceptions import ConnectorException

    from loomrt.jobs.engine import fatal

    def wrapped(inner: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except BaseException as exc:
                raise ConnectorException("Database error.") from exc
        except ConnectorException as outer:
            return outer

    assert fatal(wrapped(psycopg.errors.UndefinedTable("no procrastinate_jobs")))
    assert fatal(wrapped(psycopg.errors.InsufficientPrivilege("permission denied")))
    assert not fatal(wrapped(psycopg.errors.AdminShutdown("terminating connection")))
    assert not fatal(wrapped(psycopg.OperationalError("connection refused")))
    assert not fatal(OSError("network unreachable"))


def test_a_look_the_database_refuses_stops_the_worker_with_it(postgres_url: str) -> None:
    """A later look that meets an error no wait mends ends the worker with that error (not a
    worker that goes on taking jobs and never looks again)."""
    import asyncio

    from loomrt.errors import StoreError
    from loomrt.jobs.engine import JobWorker
    from loomrt.runtime import Runtime

    store = default_store(postgres_url)
    worker = JobWorker(Runtime(store), interval_s=0.3)
    looked = [0]
    real = worker.look

    async def look() -> None:
        looked[0] += 1
        if looked[0] >= 2:
            raise psycopg.errors.InsufficientPrivilege("permission denied for table procrastinate_jobs")
        await real()

    worker.look = look  # type: ignore[method-assign]
    started = time.monotonic()
    try:
        with pytest.raises(StoreError, match="permission denied"):
            asyncio.run(asyncio.wait_for(worker.serve(), timeout=30))
    finally:
        store.close()
    assert looked[0] == 2 and time.monotonic() - started < 15


def test_a_database_with_procrastinate_of_its_own_is_refused_by_migrate(postgres_server: Any) -> None:
    from importlib.resources import files

    from loomrt.errors import StoreError
    from loomrt.record import pg_migrations

    base = postgres_server.get_uri()  # type: ignore[attr-defined]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS theirs")
        conn.execute("CREATE DATABASE theirs")
    url = base.replace("/postgres?", "/theirs?")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((files("procrastinate.sql") / "schema.sql").read_text(encoding="utf-8"))  # another app's
        with pytest.raises(StoreError, match="has a procrastinate schema already.*a database of its own"):
            pg_migrations.migrate(conn)
        assert "jobs_0001_procrastinate_3_10" not in pg_migrations.applied(conn)


def test_one_process_never_plays_one_run_twice_at_once(postgres_url: str, tmp_path: Path) -> None:
    """A second job for a run this process works on now leaves it (the engine may hand out
    two: the look's and the trigger's)."""
    import asyncio

    from loomrt.jobs.engine import JobWorker
    from loomrt.runtime import Runtime

    run_id = _detach(postgres_url, _agents(tmp_path))
    store = default_store(postgres_url)
    worker = JobWorker(Runtime(store))

    async def main() -> None:
        worker.working[run_id] = asyncio.current_task()  # type: ignore[assignment]  # another job has it
        await worker._play(run_id)
        assert store.get_run(run_id).status == "queued" and list(worker.rows) == []
        del worker.working[run_id]
        await worker._play(run_id)

    try:
        asyncio.run(main())
        assert store.get_run(run_id).status == "done" and [r["work"] for r in worker.rows] == ["play"]
    finally:
        store.close()


def test_consolidation_jobs_go_to_a_queue_only_consolidating_workers_take(postgres_url: str) -> None:
    import asyncio

    from loomrt.jobs.engine import JobWorker
    from loomrt.jobs.schema import CONSOLIDATE, CONSOLIDATE_QUEUE, QUEUE
    from loomrt.runtime import Runtime

    store = default_store(postgres_url)
    try:
        plain, consolidating = JobWorker(Runtime(store)), JobWorker(Runtime(store), consolidator=object())
        assert plain._worker().queues == [QUEUE]
        assert consolidating._worker().queues == [QUEUE, CONSOLIDATE_QUEUE]

        async def defer() -> None:
            async with plain.app.open_async():
                await plain._defer(CONSOLIDATE, "consolidate:user:alice", scope="user:alice")

        asyncio.run(defer())
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            queues = conn.execute("SELECT queue_name FROM procrastinate_jobs WHERE task_name = %s", (CONSOLIDATE,))
            assert [q for (q,) in queues.fetchall()] == [CONSOLIDATE_QUEUE]
    finally:
        store.close()


def test_an_idle_look_costs_the_same_queries_after_three_runs_or_twelve(postgres_url: str, tmp_path: Path) -> None:
    """The look a worker makes every interval is a constant number of record queries, however
    many runs were ever played (issue 45 point 7)."""
    import asyncio

    from loomrt.jobs.engine import JobWorker
    from loomrt.runtime import Runtime

    agents = _agents(tmp_path)
    store = default_store(postgres_url)
    worker = JobWorker(Runtime(store))
    counted: list[str] = []
    select = store._select  # type: ignore[attr-defined]

    def counting(sql: str, args: Any) -> Any:
        counted.append(sql)
        return select(sql, args)

    store._select = counting  # type: ignore[attr-defined]

    async def look() -> int:
        counted.clear()
        async with worker.app.open_async():
            await worker.look()
        return len(counted)

    try:
        costs = []
        for total in (3, 12):
            while len(store.list_runs(limit=100)) < total:
                _detach(postgres_url, agents)
            runner.invoke(app, ["--db-url", postgres_url, "worker", "--once", "--json"])  # all played
            costs.append(asyncio.run(look()))
        assert costs[0] == costs[1] and costs[0] <= 8, costs
    finally:
        store.close()
