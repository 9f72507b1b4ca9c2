"""``loomrt db status|migrate|copy`` (and ``serve``, :mod:`loomrt.cli.db_serve`): the record's schema and moving it between stores.

The store is the one ``LOOMRT_DB_URL`` (or ``--db-url``) names, else the SQLite file under
``$LOOMRT_HOME``. SQLite migrates itself as it opens; PostgreSQL is migrated here, by one
operator, before the workers start (a worker refuses a schema behind its own).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import typer

from loomrt.cli._common import err, friendly, out, plural, print_json
from loomrt.cli.db_serve import serve_cmd
from loomrt.errors import StoreError

__all__ = ["db_app", "workers_app"]

db_app = typer.Typer(help="The record's database: status, migrate, copy, serve.", no_args_is_help=True)
db_app.command("serve")(serve_cmd)

_JSON = typer.Option(False, "--json", help="Print JSON.")


def _target(url: str | None) -> str:
    """The URL in use: ``url``, else ``$LOOMRT_DB_URL``, else the default SQLite file."""
    from loomrt.record.sqlite import loomrt_home

    url = (url or os.environ.get("LOOMRT_DB_URL", "")).strip()
    return url or f"sqlite:{loomrt_home() / 'record.sqlite'}"


def _sqlite_path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:").removeprefix("//")).expanduser()


def _pg(url: str) -> Any:
    """A connection to PostgreSQL at ``url`` (autocommit), or one clear error."""
    try:
        import psycopg
    except ImportError as exc:
        raise StoreError(f"PostgreSQL needs psycopg ({exc}). Install it with: pip install 'loomrt[postgres]'") from None
    from loomrt.record.postgres import redact_url

    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=30)
    except psycopg.Error as exc:
        raise StoreError(
            f"cannot connect to {redact_url(url)}: {str(exc).strip()}. Check the URL and that the server is running."
        ) from None


def _other_parts() -> set[str]:
    """Migrations of other parts that share the file's list (harvest's durable memory)."""
    try:
        from loomrt.harvest.db import MIGRATIONS as HARVEST
    except ImportError:
        return set()
    return {n for n, _ in HARVEST}


def _schema(url: str) -> dict[str, Any]:
    """Backend, where, applied, missing and newer migrations, without changing anything."""
    from loomrt.record.migrations import MIGRATIONS

    names = [n for n, _ in MIGRATIONS]
    known = set(names) | _other_parts()
    if url.startswith("sqlite:"):
        path = _sqlite_path(url)
        have: list[str] = []
        if path.exists():
            raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                have = [r[0] for r in raw.execute("SELECT name FROM _migrations ORDER BY name")]
            except sqlite3.Error:
                have = []
            finally:
                raw.close()
        where, backend = str(path), "sqlite"
    else:
        from loomrt.record import pg_migrations
        from loomrt.record.postgres import redact_url

        with _pg(url) as conn:
            have = pg_migrations.applied(conn)
        where, backend = redact_url(url), "postgresql"
        names = pg_migrations.names()  # harvest's tables are migrated here too (on SQLite, as they open)
    return {
        "backend": backend,
        "where": where,
        "version": len(names),
        "applied": [n for n in have if n in names],
        "missing": [n for n in names if n not in have],
        "newer": [n for n in have if n not in known],
        "other_parts": [n for n in have if n in known and n not in names],
    }


@db_app.command("status")
@friendly
def status_cmd(
    db_url: str | None = typer.Option(None, "--db-url", help="The database (default $LOOMRT_DB_URL)."),
    json_output: bool = _JSON,
) -> None:
    """The schema: which migrations the database has, which this loomrt would apply."""
    info = _schema(_target(db_url))
    if json_output:
        print_json(info)
        return
    out.print(
        f"{info['backend']} at {info['where']}: {len(info['applied'])} of {info['version']} migrations applied",
        highlight=False,
    )
    for name in info["missing"]:
        out.print(f"  missing: {name}", highlight=False)
    for name in info["newer"]:
        out.print(f"  newer than this loomrt: {name} (accepted: migrations are additive)", highlight=False)
    if info["missing"]:
        out.print(
            "run `loomrt db migrate` to apply what is missing"
            + (" (SQLite also applies it on open)" if info["backend"] == "sqlite" else ""),
            highlight=False,
        )


@db_app.command("migrate")
@friendly
def migrate_cmd(
    db_url: str | None = typer.Option(None, "--db-url", help="The database (default $LOOMRT_DB_URL)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be applied; apply nothing."),
    json_output: bool = _JSON,
) -> None:
    """Apply the migrations the database is missing (each whole or not at all)."""
    url = _target(db_url)
    if url.startswith("sqlite:"):
        if dry_run:
            names = _schema(url)["missing"]
        else:
            from loomrt.record.migrations import migrate

            path = _sqlite_path(url)
            path.parent.mkdir(parents=True, exist_ok=True)
            raw = sqlite3.connect(path, isolation_level=None)
            try:
                names = migrate(raw)
            finally:
                raw.close()
    else:
        from loomrt.record import pg_migrations

        with _pg(url) as conn:
            names = pg_migrations.migrate(conn, dry_run=dry_run)
            if not dry_run:
                _say_without_pgvector(conn)
    if json_output:
        print_json({"dry_run": dry_run, "applied" if not dry_run else "would_apply": names})
        return
    verb = "would apply" if dry_run else "applied"
    out.print(f"{verb} {plural(len(names), 'migration')}" + "".join(f"\n  {n}" for n in names), highlight=False)


def _say_without_pgvector(conn: Any) -> None:
    """After a migrate: say, on stderr, when durable memory is left without pgvector, and the fix."""
    try:
        from loomrt.harvest.pg import has_vectors
    except ImportError:
        return
    if conn.execute("SELECT to_regclass('memory_facts')").fetchone()[0] is None or has_vectors(conn):
        return
    err.print(
        "note: pgvector is not in this database (creating the extension needs a superuser): durable-memory "
        "vectors are searched exactly, without an HNSW index. To add it, a superuser runs `CREATE EXTENSION "
        "vector` in this database; the next `loomrt db migrate` adds the column and index.",
        highlight=False,
    )


@db_app.command("copy")
@friendly
def copy_cmd(
    source: str = typer.Option(..., "--from", help="The record to copy: sqlite:PATH or postgresql://..."),
    target: str = typer.Option(..., "--to", help="Where to: postgresql://... (migrated) or sqlite:PATH."),
    json_output: bool = _JSON,
) -> None:
    """Copy every run (ids, seqs, times, hashes kept) and verify each on the target; durable memory and the
    harvest queue beside the record go with it."""
    from rich.progress import Progress

    from loomrt.record.copy import copy_record
    from loomrt.record.sqlite import default_store

    src, dst = default_store(source), default_store(target)
    try:
        total = len(src.list_runs(limit=2**31))
        with Progress(console=err, transient=True, disable=json_output) as bar:
            task = bar.add_task("copying runs", total=total)
            result = copy_record(src, dst, progress=lambda _run: bar.advance(task))
        from loomrt.harvest.copy import copy_memory, has_memory

        if has_memory(src):  # the harvest queue and durable memory beside the record go with it
            from loomrt.harvest.backends import memory_of
            from loomrt.harvest.db import harvest_db, release

            there = harvest_db(dst)
            result["memory"] = copy_memory(harvest_db(src), there, memory_of(there, embedder=False))
            release(src)
            release(dst)
    finally:
        src.close()
        dst.close()
    if json_output:
        print_json(result)
        return
    out.print(
        f"copied {plural(result['copied'], 'run')}, {plural(result['events'], 'event')} verified"
        + (f"; {result['skipped']} already there, identical" if result["skipped"] else ""),
        highlight=False,
    )
    if "memory" in result:
        out.print(
            f"durable memory: {plural(result['memory']['memory_facts'], 'fact')}, "
            f"{plural(result['memory']['harvest_spans'], 'banked span')} on the target",
            highlight=False,
        )


workers_app = typer.Typer(help="The workers sharing this record: who plays which run.", no_args_is_help=True)


@workers_app.command("list")
@friendly
def workers_list_cmd(json_output: bool = _JSON) -> None:
    """The workers holding claims on this record's runs: each worker (HOST/PID/INSTANCE), whether it
    is live, the runs it plays now (agent, status, epoch) and how long ago it last renewed each
    claim (its heartbeat); and workers that stopped without letting their runs go (lapsed
    claims: any `loomrt worker` resumes those runs). Then the queue: runs and distillations
    waiting for a worker, the oldest wait, job latency (queued to taken) and retries."""
    from loomrt.queue_metrics import queue_metrics
    from loomrt.record.sqlite import default_store

    store = default_store()
    try:
        claims = store.run_owners() + [c for c in store.run_owners(expired=True) if not c["released"]]
        workers = _workers(store, claims)
        try:
            queue = queue_metrics(store)
        except StoreError as exc:  # the workers are shown all the same
            queue = {"error": str(exc)}
        from loomrt.record.postgres import PostgresStore

        if isinstance(store, PostgresStore) and "error" not in queue:  # the job engine's own figures
            from loomrt.jobs.status import engine_status

            try:
                queue["engine"] = engine_status(store)
            except StoreError as exc:  # the rest is shown all the same
                queue["engine"] = {"error": str(exc)}
    finally:
        store.close()
    if json_output:
        print_json({"workers": workers, "queue": queue})
        return
    if not workers:
        out.print("no live claims (no worker is playing a run of this record)", highlight=False)
    for w in workers:
        state = "live" if w["live"] else "not live"
        out.print(
            f"{w['worker']}  {state} (process: {w['process']}), last heartbeat {w['heartbeat_age_s']:.0f} s ago",
            highlight=False,
        )
        for r in w["runs"]:
            doing = f"plays run {r['run_id']} ({r['agent']}, {r['status']})"
            if r["lapsed"]:
                out.print(f"  {doing}: claim lapsed {-r['expires_in_s']:.0f} s ago, resumable", highlight=False)
            else:
                out.print(
                    f"  {doing}  epoch {r['epoch']}  heartbeat {r['heartbeat_age_s']:.0f} s ago  "
                    f"expires in {r['expires_in_s']:.0f} s",
                    highlight=False,
                )
    _say_queue(queue)


def _say_queue(q: dict[str, Any]) -> None:
    """The queue block: what waits for a worker, and how fast the queue moved lately."""
    if "error" in q:
        err.print(f"queue: cannot be read: {q['error']}", highlight=False)
        return
    oldest = f" (the oldest for {q['oldest_queued_s']:.0f} s)" if q["oldest_queued_s"] is not None else ""
    out.print(
        f"queue: {plural(q['runs_queued'], 'run')} waiting{oldest}, "
        f"{plural(q['distillations_queued'], 'distillation')} queued, "
        f"{plural(q['runs_resumable'], 'run')} to resume",
        highlight=False,
    )
    engine = q.get("engine")
    if engine and "error" in engine:
        err.print(f"  the job engine cannot be read: {engine['error']}", highlight=False)
    elif engine:
        states = ", ".join(f"{n} {state}" for state, n in sorted(engine["jobs"].items())) or "none"
        beats = ", ".join(f"{w['heartbeat_age_s']:.0f} s" for w in engine["workers"])
        out.print(
            f"  jobs (procrastinate): {states}; {plural(len(engine['workers']), 'worker')} registered"
            + (f" (heartbeats {beats} ago)" if beats else ""),
            highlight=False,
        )
    if q["taken"]:
        out.print(
            f"  queued to taken ({plural(q['taken'], 'run')} of the {q['recent']} newest): median "
            f"{q['latency_s_median']:.1f} s, worst {q['latency_s_worst']:.1f} s; "
            f"{plural(q['retries'], 'retry', 'retries')}",
            highlight=False,
        )


def _workers(store: Any, claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claims grouped by worker: live when its process is not known to have ended (its
    instance lock, :func:`~loomrt.record.owners.owner_state`: ``running`` or ``gone`` on this
    machine, ``elsewhere`` for one this machine cannot see) and it holds a claim that has not
    lapsed; its runs with their agent and status."""
    from loomrt.errors import NotFoundError
    from loomrt.record.owners import owner_state

    grouped: dict[str, list[dict[str, Any]]] = {}
    for c in claims:
        try:
            info = store.get_run(c["run_id"])
            agent, status = info.agent, info.status
        except NotFoundError:
            agent, status = "?", "unknown"
        lapsed = c["expires_in_s"] <= 0
        row = {k: v for k, v in c.items() if k not in ("owner", "released")}
        grouped.setdefault(c["owner"], []).append({**row, "agent": agent, "status": status, "lapsed": lapsed})
    workers = []
    for owner, runs in grouped.items():
        state = owner_state(owner)
        process = "elsewhere" if state == "unknown" else state
        workers.append(
            {
                "worker": owner,
                "live": process != "gone" and any(not r["lapsed"] for r in runs),
                "process": process,
                "heartbeat_age_s": min(r["heartbeat_age_s"] for r in runs),
                "runs": runs,
            }
        )
    return sorted(workers, key=lambda w: (not w["live"], w["worker"]))
