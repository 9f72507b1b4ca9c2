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
    (
        "0003_runs_append_only",
        """
        CREATE TRIGGER runs_no_update BEFORE UPDATE ON runs
        BEGIN SELECT RAISE(ABORT, 'the record is append-only: runs are never updated'); END;
        CREATE TRIGGER runs_no_delete BEFORE DELETE ON runs
        BEGIN SELECT RAISE(ABORT, 'the record is append-only: runs are never deleted'); END;
        """,
    ),
    (
        "0004_insert_never_replaces",
        # INSERT OR REPLACE deletes the old row without firing a delete trigger (recursive
        # triggers are off): refuse any insert whose key exists, whatever its conflict clause.
        """
        CREATE TRIGGER events_no_replace BEFORE INSERT ON events
        WHEN EXISTS (SELECT 1 FROM events WHERE run_id = NEW.run_id AND seq = NEW.seq)
        BEGIN SELECT RAISE(ABORT, 'the record is append-only: an event with this run_id and seq exists'); END;
        CREATE TRIGGER runs_no_replace BEFORE INSERT ON runs
        WHEN EXISTS (SELECT 1 FROM runs WHERE run_id = NEW.run_id)
        BEGIN SELECT RAISE(ABORT, 'the record is append-only: a run with this run_id exists'); END;
        """,
    ),
    (
        "0005_event_hash_chain",
        # each event's hash covers its content and the previous event's hash (the run's ledger)
        """
        ALTER TABLE events ADD COLUMN hash TEXT;
        """,
    ),
    (
        "0006_run_lineage",
        # a sub-agent's run knows its parent (parent_run_id, from 0001) and the run at the top
        """
        ALTER TABLE runs ADD COLUMN root_run_id TEXT;
        CREATE INDEX runs_parent ON runs(parent_run_id);
        """,
    ),
    (
        "0007_forks_and_cards",
        # a fork's record continues its parent's seqs after fork_seq; fold's cards are indexed
        # by id (each is written once, whole, in the distillation event that made it)
        """
        ALTER TABLE runs ADD COLUMN forked_from TEXT;
        ALTER TABLE runs ADD COLUMN fork_seq INTEGER;
        CREATE TABLE cards (
            card_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(run_id),
            seq INTEGER NOT NULL,
            depth INTEGER NOT NULL,
            data TEXT NOT NULL
        );
        CREATE INDEX cards_run ON cards(run_id);
        CREATE TRIGGER cards_no_update BEFORE UPDATE ON cards
        BEGIN SELECT RAISE(ABORT, 'cards are immutable: a card is never updated'); END;
        CREATE TRIGGER cards_no_delete BEFORE DELETE ON cards
        BEGIN SELECT RAISE(ABORT, 'cards are immutable: a card is never deleted'); END;
        """,
    ),
    (
        "0008_leases_and_latest",
        # leases (not the record: they come and go) keep two workers from working on one run
        # at once; the index finds a run's last event of a kind without reading the others
        """
        CREATE TABLE leases (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            expires_at REAL NOT NULL
        );
        CREATE INDEX events_kind_seq ON events(run_id, kind, seq);
        """,
    ),
    (
        "0009_run_owners",
        # a run played by one worker at a time: a lease with an epoch that each of its appends
        # carries as a fencing token (refused once a newer owner has the run)
        """
        CREATE TABLE run_owners (
            run_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            epoch INTEGER NOT NULL,
            ttl_s REAL NOT NULL,
            expires_at REAL NOT NULL
        );
        """,
    ),
    (
        "0010_run_heads_and_keyed_chains",
        # each run's head (last seq and hash) kept apart from its events, only ever moving
        # forward, so a cut tail shows (its epoch: the newest claim's fencing token, which
        # never falls); a run names its chain scheme (NULL: v1, plain); a card is never
        # replaced (the store inserts only ids it does not have)
        """
        ALTER TABLE runs ADD COLUMN chain TEXT;
        CREATE TABLE run_heads (
            run_id TEXT PRIMARY KEY REFERENCES runs(run_id),
            seq INTEGER NOT NULL,
            hash TEXT,
            epoch INTEGER NOT NULL DEFAULT 0
        );
        INSERT INTO run_heads (run_id, seq, hash, epoch)
            SELECT e.run_id, e.seq, e.hash, 0 FROM events e
            WHERE e.seq = (SELECT MAX(x.seq) FROM events x WHERE x.run_id = e.run_id);
        CREATE TRIGGER run_heads_forward_only BEFORE UPDATE ON run_heads
        WHEN NEW.run_id != OLD.run_id OR NEW.seq <= OLD.seq OR NEW.epoch < OLD.epoch
        BEGIN SELECT RAISE(ABORT, 'a run head only moves forward: its seq grows and its epoch never falls'); END;
        CREATE TRIGGER run_heads_no_delete BEFORE DELETE ON run_heads
        BEGIN SELECT RAISE(ABORT, 'a run head is never deleted'); END;
        CREATE TRIGGER run_heads_no_replace BEFORE INSERT ON run_heads
        WHEN EXISTS (SELECT 1 FROM run_heads WHERE run_id = NEW.run_id)
        BEGIN SELECT RAISE(ABORT, 'a run head is never replaced: it only moves forward'); END;
        CREATE TRIGGER cards_no_replace BEFORE INSERT ON cards
        WHEN EXISTS (SELECT 1 FROM cards WHERE card_id = NEW.card_id)
        BEGIN SELECT RAISE(ABORT, 'cards are immutable: a card with this id exists'); END;
        """,
    ),
    (
        "0011_run_epochs",
        # each run's highest epoch ever handed out, apart from the claims: it only grows and is
        # never deleted, so a claim after a claim row was deleted (or rewritten) still gets an
        # epoch above every earlier one, and a stale writer's epoch stays refused
        """
        CREATE TABLE run_epochs (
            run_id TEXT PRIMARY KEY,
            epoch INTEGER NOT NULL
        );
        INSERT INTO run_epochs (run_id, epoch)
            SELECT run_id, MAX(epoch) FROM (
                SELECT run_id, epoch FROM run_owners UNION ALL SELECT run_id, epoch FROM run_heads
            ) GROUP BY run_id;
        CREATE TRIGGER run_epochs_only_grow BEFORE UPDATE ON run_epochs
        WHEN NEW.run_id != OLD.run_id OR NEW.epoch < OLD.epoch
        BEGIN SELECT RAISE(ABORT, 'a run''s epoch only grows: it is never lowered'); END;
        CREATE TRIGGER run_epochs_no_delete BEFORE DELETE ON run_epochs
        BEGIN SELECT RAISE(ABORT, 'a run''s epoch is never deleted'); END;
        CREATE TRIGGER run_epochs_no_replace BEFORE INSERT ON run_epochs
        WHEN EXISTS (SELECT 1 FROM run_epochs WHERE run_id = NEW.run_id)
        BEGIN SELECT RAISE(ABORT, 'a run''s epoch is never replaced: it only grows'); END;
        """,
    ),
]


def migrate(conn: sqlite3.Connection, migrations: list[tuple[str, str]] | None = None) -> list[str]:
    """Apply every migration not yet applied; return the names applied now. ``migrations``
    is another part's own list for the same file (harvest's durable memory), applied and
    remembered the same way (default: the record's).

    Each migration runs in its own write transaction, so it applies whole or not at all,
    and two processes opening a fresh file at once apply it once.
    """
    conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    applied = []
    for name, sql in MIGRATIONS if migrations is None else migrations:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("SELECT 1 FROM _migrations WHERE name = ?", (name,)).fetchone() is None:
                for statement in _statements(sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO _migrations VALUES (?, ?)", (name, time.time()))
                applied.append(name)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
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
