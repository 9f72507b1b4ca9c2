"""The record's migrations on PostgreSQL: the same names, in the same order, as
:data:`loomrt.record.migrations.MIGRATIONS` (that list is the one list; this module holds
only the SQL that must differ), and the migration policy a shared database needs.

SQLite migrates as it opens (one machine, one file). PostgreSQL does not: several
processes on several machines share the schema, so ``loomrt db migrate`` applies what is
missing, and a process refuses to start against a schema behind its own
(:func:`check_schema`), naming the command. A schema *ahead* of it (a newer loomrt migrated
it first: a rolling upgrade) is accepted, since migrations are additive and forward-only.

The record stays append-only in two ways, both tested with direct SQL: triggers refuse
UPDATE, DELETE and TRUNCATE on ``runs``, ``events`` and ``cards``; and the role
``loomrt_app`` (created here, NOLOGIN: grant it to the login role the workers use) may
only read and insert them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loomrt.errors import StoreError
from loomrt.record.migrations import MIGRATIONS

__all__ = ["POSTGRES_SQL", "APP_ROLE", "migrate", "applied", "missing", "check_schema", "names"]

APP_ROLE = "loomrt_app"
"""The role the application connects through: SELECT and INSERT on the record, no UPDATE,
DELETE or TRUNCATE (leases, which come and go, it may change; claims it may take and renew
but not delete, and a run's highest epoch, ``run_epochs``, it may only raise)."""


def _refuse(table: str, what: str) -> str:
    """A trigger function and its triggers: UPDATE, DELETE (per row) and TRUNCATE refused."""
    fn = f"loomrt_{table}_append_only"
    return f"""
        CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION '{what}: % is refused on {table}', TG_OP USING ERRCODE = 'insufficient_privilege';
        END $$;
        CREATE TRIGGER {table}_no_change BEFORE UPDATE OR DELETE ON {table}
            FOR EACH ROW EXECUTE FUNCTION {fn}();
        CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}
            FOR EACH STATEMENT EXECUTE FUNCTION {fn}();
    """


def _only_forward(table: str, name: str, backwards: str, what: str) -> str:
    """A trigger function and its triggers that let rows of ``table`` only move forward: an
    UPDATE changing the run id or where ``backwards`` holds, any DELETE (per row) and any
    TRUNCATE are refused, for every role (a superuser too)."""
    fn = f"loomrt_{table}_{name}"
    return f"""
        CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP <> 'UPDATE' OR NEW.run_id <> OLD.run_id OR {backwards} THEN
                RAISE EXCEPTION '{what}: % is refused on {table}', TG_OP
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER {table}_{name} BEFORE UPDATE OR DELETE ON {table}
            FOR EACH ROW EXECUTE FUNCTION {fn}();
        CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}
            FOR EACH STATEMENT EXECUTE FUNCTION {fn}();
    """


POSTGRES_SQL: dict[str, str] = {
    "0001_runs_and_events": """
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            def_hash TEXT NOT NULL,
            mode TEXT NOT NULL,
            model TEXT NOT NULL,
            interactive INTEGER NOT NULL DEFAULT 0,
            agents_file TEXT,
            parent_run_id TEXT,
            created_at DOUBLE PRECISION NOT NULL
        );
        -- data is the canonical JSON text the ledger hashes (loomrt.record.ledger.canonical),
        -- kept as text: jsonb would reorder keys and refuse a NUL character in a tool's output
        CREATE TABLE events (
            run_id TEXT NOT NULL REFERENCES runs(run_id),
            seq BIGINT NOT NULL,
            kind TEXT NOT NULL,
            ts DOUBLE PRECISION NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        );
        CREATE INDEX events_kind ON events(run_id, kind);
        CREATE INDEX runs_created ON runs(created_at);
    """,
    "0002_append_only_guards": _refuse("events", "the record is append-only"),
    "0003_runs_append_only": _refuse("runs", "the record is append-only"),
    # SQLite's INSERT OR REPLACE deletes silently; PostgreSQL has no such statement (an
    # ON CONFLICT DO UPDATE fires the update trigger and a duplicate key is refused)
    "0004_insert_never_replaces": "SELECT 1;",
    "0005_event_hash_chain": "ALTER TABLE events ADD COLUMN hash TEXT;",
    "0006_run_lineage": """
        ALTER TABLE runs ADD COLUMN root_run_id TEXT;
        CREATE INDEX runs_parent ON runs(parent_run_id);
    """,
    "0007_forks_and_cards": """
        ALTER TABLE runs ADD COLUMN forked_from TEXT;
        ALTER TABLE runs ADD COLUMN fork_seq BIGINT;
        CREATE TABLE cards (
            card_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(run_id),
            seq BIGINT NOT NULL,
            depth INTEGER NOT NULL,
            data TEXT NOT NULL
        );
        CREATE INDEX cards_run ON cards(run_id);
    """
    + _refuse("cards", "cards are immutable"),
    "0008_leases_and_latest": f"""
        CREATE TABLE leases (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX events_kind_seq ON events(run_id, kind, seq);
        DO $$ BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                CREATE ROLE {APP_ROLE} NOLOGIN;
            END IF;
        END $$;
        REVOKE ALL ON runs, events, cards, leases FROM PUBLIC;
        GRANT SELECT, INSERT ON runs, events, cards TO {APP_ROLE};
        GRANT SELECT, INSERT, UPDATE, DELETE ON leases TO {APP_ROLE};
        GRANT SELECT ON _migrations TO {APP_ROLE};
    """,
    "0009_run_owners": f"""
        CREATE TABLE run_owners (
            run_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            epoch BIGINT NOT NULL,
            ttl_s DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL
        );
        GRANT SELECT, INSERT, UPDATE, DELETE ON run_owners TO {APP_ROLE};
    """,
    # a card is refused again by the primary key (an upsert fires the update trigger)
    "0010_run_heads_and_keyed_chains": """
        ALTER TABLE runs ADD COLUMN chain TEXT;
        CREATE TABLE run_heads (
            run_id TEXT PRIMARY KEY REFERENCES runs(run_id),
            seq BIGINT NOT NULL,
            hash TEXT,
            epoch BIGINT NOT NULL DEFAULT 0
        );
        INSERT INTO run_heads (run_id, seq, hash, epoch)
            SELECT DISTINCT ON (run_id) run_id, seq, hash, 0 FROM events ORDER BY run_id, seq DESC;
    """
    + _only_forward(
        "run_heads",
        "forward_only",
        "NEW.seq <= OLD.seq OR NEW.epoch < OLD.epoch",
        "a run head only moves forward",
    )
    + f"""
        REVOKE ALL ON run_heads FROM PUBLIC;
        GRANT SELECT, INSERT, UPDATE ON run_heads TO {APP_ROLE};
    """,
    # the app role may not delete claims (the obvious way to unstick a run, which reset its
    # epoch); and whatever happens to claim rows, a run's epoch only grows (for every role:
    # the trigger holds for a superuser too)
    "0011_run_epochs": """
        CREATE TABLE run_epochs (
            run_id TEXT PRIMARY KEY,
            epoch BIGINT NOT NULL
        );
        INSERT INTO run_epochs (run_id, epoch)
            SELECT run_id, MAX(epoch) FROM (
                SELECT run_id, epoch FROM run_owners UNION ALL SELECT run_id, epoch FROM run_heads
            ) every_epoch GROUP BY run_id;
    """
    + _only_forward("run_epochs", "only_grow", "NEW.epoch < OLD.epoch", "a run''s epoch only grows")
    + f"""
        REVOKE ALL ON run_epochs FROM PUBLIC;
        GRANT SELECT, INSERT, UPDATE ON run_epochs TO {APP_ROLE};
        REVOKE DELETE, TRUNCATE ON run_owners FROM {APP_ROLE};
    """,
}
"""The PostgreSQL SQL of each migration, by name (``tests/test_postgres.py`` checks the
names are exactly those of the one list, in its order)."""

_LOCK = 7_710_001
"""The advisory lock ``loomrt db migrate`` holds: two migrators never interleave."""


PARTS_GROUP = "loomrt.pg_migrations"
"""The entry-point group where the parts above the record register their migrations
(harvest's: ``loomrt.harvest.pg_part:PART``), so the record never imports them."""


Repair = Callable[[Any], list[str]]
"""A part's catch-up step, run by every ``loomrt db migrate`` after the migrations: it does
what a migration could not when it ran (harvest: pgvector's column and index, once a
superuser has created the extension) and says what it did, or returns nothing."""


def _parts() -> list[tuple[Any, ...]]:
    """Each part's one list of migrations, its PostgreSQL SQL by name and, optionally, its
    :data:`Repair`: the record's, then each registered part's, by entry-point name (harvest:
    the span queue and durable memory)."""
    from importlib.metadata import entry_points

    parts: list[tuple[Any, ...]] = [(MIGRATIONS, POSTGRES_SQL)]
    for ep in sorted(entry_points(group=PARTS_GROUP), key=lambda e: e.name):
        parts.append(tuple(ep.load()))
    return parts


def names() -> list[str]:
    """Every migration a database of this version has, in the order they apply."""
    return [name for part in _parts() for name, _ in part[0]]


def _sql(name: str) -> str:
    return str(next(part[1][name] for part in _parts() if name in part[1]))


def applied(conn: Any) -> list[str]:
    """The names of the migrations this database has (none for a fresh one)."""
    exists = conn.execute("SELECT to_regclass('_migrations') IS NOT NULL").fetchone()[0]
    if not exists:
        return []
    return [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY name").fetchall()]


def missing(conn: Any) -> list[str]:
    """This version's migrations the database does not have yet, in order."""
    have = set(applied(conn))
    return [n for n in names() if n not in have]


def migrate(conn: Any, *, dry_run: bool = False) -> list[str]:
    """Apply every missing migration, each in its own transaction (whole or not at all),
    then each part's :data:`Repair`, under an advisory lock; return the names applied and
    what the repairs did (with ``dry_run``: the migrations that would be applied).
    ``conn`` is a psycopg connection in autocommit mode. A privilege the migrating role
    lacks is one :class:`StoreError` saying what a superuser must run."""
    import psycopg

    if dry_run:
        return missing(conn)
    done = []
    conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK,))
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
        for name in missing(conn):
            try:
                with conn.transaction():
                    conn.execute(_sql(name))
                    conn.execute("INSERT INTO _migrations VALUES (%s, extract(epoch from clock_timestamp()))", (name,))
            except psycopg.errors.InsufficientPrivilege as exc:
                raise StoreError(_lacking(conn, name, exc)) from None
            except psycopg.Error as exc:  # whole or not at all: nothing of it was applied
                hint = f" {exc.diag.message_hint}" if exc.diag.message_hint else ""
                why = " ".join(str(exc).strip().splitlines()[0].split())
                raise StoreError(f"migration {name} failed, and nothing of it was applied: {why}.{hint}") from None
            done.append(name)
        for part in _parts():
            if len(part) > 2:
                done += part[2](conn)
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK,))
    return done


def _lacking(conn: Any, name: str, exc: Exception) -> str:
    """What to do when migration ``name`` needs a privilege the connecting role lacks."""
    who = conn.execute("SELECT current_user").fetchone()[0]
    why = str(exc).strip().splitlines()[0]
    if "create role" in why.lower():
        return (
            f"migration {name} creates the role {APP_ROLE}, and {who} may not create roles ({why}). "
            f"Ask a superuser to run, once for this server: CREATE ROLE {APP_ROLE} NOLOGIN; "
            f"(e.g. psql -c 'CREATE ROLE {APP_ROLE} NOLOGIN'), then run `loomrt db migrate` again as {who}."
        )
    return (
        f"migration {name} needs a privilege {who} lacks ({why}); nothing of it was applied. "
        "Run `loomrt db migrate` as the database's owner, or ask a superuser to grant what it names."
    )


def check_schema(conn: Any, where: str) -> list[str]:
    """Refuse a schema behind this version (:class:`StoreError` naming ``loomrt db migrate``);
    return the names of newer migrations this version does not know (a rolling upgrade:
    accepted)."""
    have = applied(conn)
    behind = [n for n in names() if n not in set(have)]
    if behind:
        raise StoreError(
            f"the database at {where} is behind this loomrt: {len(behind)} migration(s) to apply "
            f"({', '.join(behind[:3])}{', ...' if len(behind) > 3 else ''}). Run `loomrt db migrate` "
            "(with LOOMRT_DB_URL set to it), then start again."
        )
    return [n for n in have if n not in set(names())]
