"""The job engine's part of a PostgreSQL database's migrations (``loomrt db migrate``).

Registered as the entry point ``loomrt.pg_migrations: jobs`` (pyproject.toml), so the
record never imports it. It applies procrastinate's own schema (the one its version ships,
``procrastinate/sql/schema.sql``), grants the app role what a worker needs on it, and adds
the trigger that turns queued work in the record into jobs:

- an ``events`` row of kind ``run_queued`` (``loomrt run --detach``) defers the job
  ``loomrt.play``; ``fold_queued`` or ``distillation_queued`` (a chat closed before it could
  distil) defers ``loomrt.distil``;
- in the same transaction as the event: queued work without its job, or a job without its
  work, cannot exist;
- each job carries a queueing lock (``play:RUN_ID``, ``distil:RUN_ID``): while one waits,
  another for the same work is not made (the trigger lets the refusal pass).

A newer procrastinate's schema changes come as migrations of this part (procrastinate ships
them as ``procrastinate/sql/migrations``): pin its minor version (``postgres`` extra: ``==3.10.0``).
"""

from __future__ import annotations

from importlib.resources import files

from loomrt.record.pg_migrations import APP_ROLE

__all__ = ["PART", "MIGRATIONS", "POSTGRES_SQL", "QUEUE", "CONSOLIDATE_QUEUE", "PLAY", "DISTIL", "CONSOLIDATE"]

QUEUE = "loomrt"
"""The procrastinate queue runs' jobs go to (play, distil)."""
CONSOLIDATE_QUEUE = "loomrt-consolidate"
"""Consolidation's queue: only workers with a consolidator (``--consolidate``) take from it."""
PLAY, DISTIL, CONSOLIDATE = "loomrt.play", "loomrt.distil", "loomrt.consolidate"
"""The jobs' task names."""


def _procrastinate_schema() -> str:
    return (files("procrastinate.sql") / "schema.sql").read_text(encoding="utf-8")


_DEFER_WORK = f"""
    CREATE FUNCTION loomrt_defer_work() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        task TEXT := CASE WHEN NEW.kind = 'run_queued' THEN '{PLAY}' ELSE '{DISTIL}' END;
        tag TEXT := CASE WHEN NEW.kind = 'run_queued' THEN 'play:' ELSE 'distil:' END;
    BEGIN
        BEGIN
            PERFORM procrastinate_defer_jobs_v1(ARRAY[ROW(
                '{QUEUE}', task, 0, NULL, tag || NEW.run_id,
                jsonb_build_object('run_id', NEW.run_id, 'kind', NEW.kind), NULL
            )::procrastinate_job_to_defer_v1]);
        EXCEPTION WHEN unique_violation THEN
            NULL;  -- that work's job is waiting already: one is enough
        END;
        RETURN NULL;
    END $$;
    CREATE TRIGGER events_defer_work AFTER INSERT ON events FOR EACH ROW
        WHEN (NEW.kind IN ('run_queued', 'fold_queued', 'distillation_queued'))
        EXECUTE FUNCTION loomrt_defer_work();
"""

_GRANTS = f"""
    GRANT SELECT, INSERT, UPDATE, DELETE ON
        procrastinate_jobs, procrastinate_periodic_defers, procrastinate_events, procrastinate_workers
        TO {APP_ROLE};
    GRANT USAGE, SELECT ON SEQUENCE
        procrastinate_jobs_id_seq, procrastinate_periodic_defers_id_seq, procrastinate_events_id_seq,
        procrastinate_workers_id_seq TO {APP_ROLE};
"""

MIGRATIONS: list[tuple[str, str]] = [("jobs_0001_procrastinate_3_10", "")]
"""This part's one list (PostgreSQL only: on SQLite the record is the queue, so the SQLite
side of each is empty)."""

_NOT_TWICE = """
    DO $$
    BEGIN
        IF to_regclass('procrastinate_jobs') IS NOT NULL THEN
            RAISE EXCEPTION 'this database has a procrastinate schema already (another application''s?)'
                USING HINT = 'loomrt installs its own: give loomrt a database of its own',
                      ERRCODE = 'duplicate_object';
        END IF;
    END $$;
"""

POSTGRES_SQL: dict[str, str] = {
    "jobs_0001_procrastinate_3_10": _NOT_TWICE + _procrastinate_schema() + _DEFER_WORK + _GRANTS
}

PART = (MIGRATIONS, POSTGRES_SQL)
"""(the ordered list of names, the PostgreSQL SQL by name): see :mod:`loomrt.record.pg_migrations`."""
