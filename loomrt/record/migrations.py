"""Named, ordered schema migrations for the SQLite record.

Each migration runs once; the names of those applied live in ``_migrations``.
Append new ones at the end, never edit or reorder old ones.
"""

from __future__ import annotations

import sqlite3
import time

__all__ = ["MIGRATIONS", "migrate"]

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_runs_and_events",
        """
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            def_hash TEXT NOT NULL,
            mode TEXT NOT NULL,
            model TEXT NOT NULL,
            interactive INTEGER NOT NULL DEFAULT 0,
            agents_file TEXT,
            parent_run_id TEXT,
            created_at REAL NOT NULL
        );
        CREATE TABLE events (
            run_id TEXT NOT NULL REFERENCES runs(run_id),
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            ts REAL NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        );
        CREATE INDEX events_kind ON events(run_id, kind);
        CREATE INDEX runs_created ON runs(created_at);
        """,
    ),
    (
        "0002_append_only_guards",
        """
        CREATE TRIGGER events_no_update BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'the record is append-only: events are never updated'); END;
        CREATE TRIGGER events_no_delete BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'the record is append-only: events are never deleted'); END;
        """,
    ),
]


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply every migration not yet applied; return the names applied now."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
    )
    done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
    applied = []
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        with conn:
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO _migrations VALUES (?, ?)", (name, time.time()))
        applied.append(name)
    return applied


def _statements(sql: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    out, buf = [], []
    for line in sql.strip().splitlines():
        buf.append(line)
        joined = "\n".join(buf).strip()
        if joined.endswith(";") and sqlite3.complete_statement(joined):
            out.append(joined)
            buf = []
    if "\n".join(buf).strip():
        out.append("\n".join(buf).strip())
    return out
