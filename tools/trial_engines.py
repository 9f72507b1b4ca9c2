"""The engine trial (tools/engine_trial.py): the candidates, their settings, the notes workers write, each engine's wiring and its worker process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

ENGINES = ("procrastinate", "dbos", "pgqueuer")
CANDIDATES = (*ENGINES, "loomrt")
TESTS = ("kill9", "restart_idle", "restart_mid", "sigstop", "sigterm", "key_lock", "pidns")

SETTINGS: dict[str, dict[str, Any]] = {
    "procrastinate": {
        "update_heartbeat_interval_s": 1.0,
        "stalled_worker_timeout_s": 3.0,
        "stalled_job_sweep": "each worker retries get_stalled_jobs(seconds_since_heartbeat=3) every 1 s",
        "fetch_job_polling_interval_s": 1.0,
        "abort_job_polling_interval_s": 1.0,
        "shutdown_graceful_timeout_s": 10.0,
        "pool": "PsycopgConnector (its pool checks each connection before use), 1 to 4 connections",
        "concurrency": 1,
    },
    "pgqueuer": {
        "heartbeat_timeout_s": 3.0,
        "dequeue_timeout_s": 1.0,
        "batch_size": 1,
        "max_concurrent_tasks": 2,
        "supervisor": "pgqueuer.run(restart_on_failure=True, restart_delay=1 s)",
        "driver": "PsycopgDriver on one AsyncConnection per cycle",
    },
    "dbos": {
        "queue": "register_queue('turns', partition_concurrency=1, polling_interval_sec=0.5)",
        "heartbeat": "none: a PENDING workflow is recovered only by a process with its executor_id (at launch) or Conductor",
        "executor_id": "w1, w2, ... (pidns: the default, 'local')",
        "application_version": "trial",
        "sigterm": "the harness's handler: DBOS.destroy(workflow_completion_timeout_sec=10), exit 0",
    },
    "loomrt": {
        "worker": "python -m loomrt worker --json --interval 1 --heartbeat-timeout-s 3 --grace-s 10",
        "claim": "renewed every 1 s while a turn plays, lapsed 3 s after its last renewal (loomrt's default: 30 s)",
        "liveness": "the claim's heartbeat; on one machine also the worker's instance lock "
        "($TMPDIR/loomrt-workers-UID/INSTANCE.lock, free once it died); kill9_apart: a TMPDIR per worker",
        "job": "a detached run (loomrt run a go --detach), its scripted model replying after job_s seconds",
        "record": "a database migrated by loomrt db migrate; on SQLite a file of its own",
    },
}

NOTES_DB = "trial_notes"


# ------------------------------------------------------------------ the notes (what workers did)


def note(dsn: str, test: str, tag: str, worker: str, event: str) -> None:
    """One row in the notes database, through a fresh connection, tried for up to 30 s."""
    import psycopg

    end = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
                conn.execute(
                    "INSERT INTO trial_log (test, tag, worker, event) VALUES (%s, %s, %s, %s)",
                    (test, tag, worker, event),
                )
            return
        except psycopg.OperationalError:
            if time.monotonic() > end:
                raise
            time.sleep(0.3)


def play_sync(notes: str, test: str, worker: str, tag: str, seconds: float) -> None:
    """The job: a ``start`` row, ``seconds`` of work, a ``done`` row."""
    note(notes, test, tag, worker, "start")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.1)
    note(notes, test, tag, worker, "done")


async def play_async(notes: str, test: str, worker: str, tag: str, seconds: float) -> None:
    await asyncio.to_thread(note, notes, test, tag, worker, "start")
    await asyncio.sleep(seconds)
    await asyncio.to_thread(note, notes, test, tag, worker, "done")


# ------------------------------------------------------------------ the engines


def procrastinate_app(dsn: str, notes: str = "", test: str = "", worker: str = "") -> Any:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=4)  # checks its connections
    )

    @app.task(name="play_turn")
    async def play_turn(run: str, seconds: float, tag: str) -> None:
        await play_async(notes, test, worker, tag, seconds)

    return app


def dbos_url(dsn: str) -> str:
    """A libpq URL as SQLAlchemy's (DBOS's) psycopg driver takes it; a ``sqlite:`` one as is."""
    return (
        dsn if dsn.startswith("sqlite") else dsn.replace("postgresql://postgres:@/", "postgresql+psycopg://postgres@/")
    )


def dbos_launch(dsn: str, executor_id: str | None, notes: str = "", test: str = "", worker: str = "") -> Any:
    from dbos import DBOS

    config: dict[str, Any] = {
        "name": "loomrt-trial",
        "system_database_url": dbos_url(dsn),
        "application_version": "trial",
        "log_level": "WARNING",
    }
    if executor_id:
        config["executor_id"] = executor_id

    @DBOS.step(name="play_step")
    def play_step(run: str, seconds: float, tag: str) -> None:
        play_sync(notes, test, worker, tag, seconds)

    @DBOS.workflow(name="play_turn")
    def play_turn(run: str, seconds: float, tag: str) -> None:
        play_step(run, seconds, tag)

    DBOS(config=config)  # type: ignore[arg-type]
    DBOS.launch()
    DBOS.register_queue("turns", partition_concurrency=1, polling_interval_sec=0.5, on_conflict="always_update")
    return DBOS


@contextlib.asynccontextmanager
async def pgqueuer_conn(dsn: str) -> Any:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()


def setup_engine(engine: str, dsn: str) -> None:
    """Its schema in ``dsn`` (the template the tests' databases are copied from)."""
    if engine == "procrastinate":

        async def go() -> None:
            app = procrastinate_app(dsn)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(go())
    elif engine == "pgqueuer":
        from pgqueuer.queries import Queries

        async def go() -> None:
            async with pgqueuer_conn(dsn) as conn:
                from pgqueuer.db import PsycopgDriver

                await Queries(PsycopgDriver(conn)).install()

        asyncio.run(go())
    elif engine == "loomrt":
        subprocess.run([sys.executable, "-m", "loomrt", "--db-url", dsn, "db", "migrate"], check=True)
    else:
        dbos = dbos_launch(dsn, "setup")
        dbos.destroy()


def enqueue(engine: str, dsn: str, run: str, tag: str, seconds: float) -> dict[str, Any]:
    """Queue one turn of ``run``; what the engine said (``refused`` when it would not take it)."""
    if engine == "procrastinate":

        async def go() -> dict[str, Any]:
            app = procrastinate_app(dsn)
            async with app.open_async():
                job_id = await app.tasks["play_turn"].configure(lock=run).defer_async(run=run, seconds=seconds, tag=tag)
            return {"job": job_id}

        return asyncio.run(go())
    if engine == "pgqueuer":
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries

        async def go() -> dict[str, Any]:
            async with pgqueuer_conn(dsn) as conn:
                payload = json.dumps({"run": run, "seconds": seconds, "tag": tag}).encode()
                try:
                    ids = await Queries(PsycopgDriver(conn)).enqueue("play_turn", payload, dedupe_key=run)
                except Exception as exc:  # the engine's refusal is the result
                    return {"refused": f"{type(exc).__name__}: {str(exc)[:120]}"}
            return {"job": ids[0]}

        return asyncio.run(go())
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=dbos_url(dsn))
    try:
        handle = client.enqueue(
            {
                "workflow_name": "play_turn",
                "queue_name": "turns",
                "queue_partition_key": run,
                "app_version": "trial",
            },
            run,
            seconds,
            tag,
        )
        return {"job": handle.get_workflow_id()}
    finally:
        client.destroy()


def engine_state(engine: str, dsn: str) -> list[Any]:
    """The engine's own view of its jobs at the end of a test (loomrt: each run's status, and
    every claim, lapsed ones too)."""
    import psycopg

    if engine == "loomrt":
        from loomrt.record.sqlite import default_store

        store = default_store(dsn)
        try:
            runs: list[Any] = [[r.run_id, r.status] for r in store.list_runs()]
            return runs + [
                [c["run_id"], c["owner"], c["epoch"], "released" if c["released"] else c["expires_in_s"]]
                for c in store.run_owners(expired=True)
            ]
        except Exception as exc:  # noqa: BLE001 - the state is a note, not a result
            return [f"{type(exc).__name__}: {exc}"]
        finally:
            store.close()
    query = {
        "procrastinate": "SELECT id, status::text, attempts FROM procrastinate_jobs ORDER BY id",
        "pgqueuer": "SELECT id, status::text, 'queue' FROM pgqueuer UNION ALL "
        "SELECT job_id, status::text, 'log' FROM pgqueuer_log ORDER BY 1, 3",
        "dbos": "SELECT workflow_uuid, status, executor_id, recovery_attempts FROM dbos.workflow_status "
        "WHERE name = 'play_turn' ORDER BY created_at",
    }[engine]
    if dsn.startswith("sqlite"):
        import sqlite3

        with contextlib.closing(sqlite3.connect(dsn.split("///", 1)[1])) as db:
            return [list(r) for r in db.execute(query.replace("dbos.", ""))]
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            return [list(r) for r in conn.execute(query)]
    except psycopg.Error as exc:
        return [f"{type(exc).__name__}: {exc}"]


# ------------------------------------------------------------------ a worker process


def run_worker(args: argparse.Namespace) -> int:
    worker = f"{args.name}/{os.getpid()}"
    notes, test = args.notes, args.test
    if args.engine == "procrastinate":

        async def sweep(app: Any) -> None:
            """Procrastinate's recipe for stalled jobs (its docs run it as a periodic task)."""
            while True:
                await asyncio.sleep(1.0)
                try:
                    for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=3):
                        await app.job_manager.retry_job(job)
                except Exception as exc:  # the server may be down: try again
                    print(f"sweep: {type(exc).__name__}: {exc}", flush=True)

        async def go() -> None:
            app = procrastinate_app(args.dsn, notes, test, worker)
            async with app.open_async():
                task = asyncio.create_task(sweep(app))
                await asyncio.to_thread(note, notes, test, args.name, worker, "ready")
                try:
                    await app.run_worker_async(
                        name=args.name,
                        concurrency=1,
                        fetch_job_polling_interval=1.0,
                        abort_job_polling_interval=1.0,
                        update_heartbeat_interval=1.0,
                        stalled_worker_timeout=3.0,
                        shutdown_graceful_timeout=10.0,
                    )
                finally:
                    task.cancel()

        asyncio.run(go())
        print("worker: run_worker_async returned", flush=True)
        return 0
    if args.engine == "pgqueuer":
        from datetime import timedelta

        import pgqueuer
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.models import Job
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries

        @contextlib.asynccontextmanager
        async def factory() -> Any:
            async with pgqueuer_conn(args.dsn) as conn:
                qm = QueueManager(Queries(PsycopgDriver(conn)))

                @qm.entrypoint("play_turn")
                async def play_turn(job: Job) -> None:
                    body = json.loads(job.payload or b"{}")
                    await play_async(notes, test, worker, body["tag"], body["seconds"])

                await asyncio.to_thread(note, notes, test, args.name, worker, "ready")
                yield qm

        asyncio.run(
            pgqueuer.run(
                factory,
                dequeue_timeout=timedelta(seconds=1),
                batch_size=1,
                max_concurrent_tasks=2,
                heartbeat_timeout=timedelta(seconds=3),
                restart_on_failure=True,
                restart_delay=timedelta(seconds=1),
            )
        )
        print("worker: pgqueuer.run returned", flush=True)
        return 0
    # DBOS: no signal handling of its own; a stop is what loomrt's handler would do
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    dbos = dbos_launch(args.dsn, args.executor_id or None, notes, test, worker)
    note(notes, test, args.name, worker, "ready")
    while not stop["asked"]:
        time.sleep(0.2)
    dbos.destroy(workflow_completion_timeout_sec=10)
    print("worker: DBOS destroyed after SIGTERM", flush=True)
    return 0
