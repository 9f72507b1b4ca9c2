"""Harvest's tables in the record's SQLite file: the span queue and durable memory (on
PostgreSQL, in the shared database: :mod:`loomrt.harvest.pg`).

They live beside the record (one file to back up) under their own named migrations
(:data:`MIGRATIONS`, applied by the record's :func:`~loomrt.record.migrations.migrate`), and
are not the record: queue rows move from pending to done, facts are superseded or
forgotten. What they hold always points back at the record by run id and seq, and nothing
in them is silently overwritten: a fact's every change is a row of ``memory_history``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from loomrt.errors import StoreError
from loomrt.record.migrations import migrate

if TYPE_CHECKING:
    from loomrt.record.store import Store

Where: TypeAlias = "Store | str | Path"
"""Where a record is: its store, its SQLite file, or its PostgreSQL URL."""

__all__ = ["MIGRATIONS", "HarvestDB", "Tables", "harvest_db", "release", "where_of", "has_place", "row_lock"]

MIGRATIONS: list[tuple[str, str]] = [
    (
        "harvest_0001_queue_and_memory",
        """
        CREATE TABLE harvest_spans (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL,
            distillation_seq INTEGER NOT NULL,
            scope TEXT NOT NULL,
            agent TEXT NOT NULL,
            def_hash TEXT NOT NULL,
            seq_lo INTEGER NOT NULL,
            seq_hi INTEGER NOT NULL,
            ts_lo REAL,
            ts_hi REAL,
            banked_at REAL NOT NULL,
            tokens INTEGER NOT NULL,
            turns TEXT NOT NULL,
            redacted INTEGER NOT NULL DEFAULT 0,
            state TEXT NOT NULL DEFAULT 'pending',
            batch_id TEXT,
            UNIQUE (run_id, distillation_seq, scope)
        );
        CREATE INDEX harvest_spans_queue ON harvest_spans(scope, state, id);
        CREATE TABLE harvest_batches (
            batch_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            span_ids TEXT NOT NULL,
            state TEXT NOT NULL,
            claimed_at REAL NOT NULL,
            done_at REAL,
            attempts INTEGER NOT NULL DEFAULT 0,
            report TEXT
        );
        CREATE TABLE harvest_watermarks (
            scope TEXT PRIMARY KEY,
            span_id INTEGER NOT NULL,
            at REAL NOT NULL
        );
        CREATE TABLE harvest_dead_letters (
            batch_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            span_ids TEXT NOT NULL,
            reply_prefix TEXT NOT NULL,
            error TEXT NOT NULL,
            at REAL NOT NULL,
            retried_at REAL
        );
        CREATE TABLE memory_facts (
            fact_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            class TEXT NOT NULL,
            subject TEXT NOT NULL,
            statement TEXT NOT NULL,
            observed_at TEXT,
            created_at REAL NOT NULL,
            sources TEXT NOT NULL,
            vector BLOB,
            embedder TEXT,
            status TEXT NOT NULL DEFAULT 'live',
            superseded_by TEXT,
            changed_at REAL
        );
        CREATE INDEX memory_facts_scope ON memory_facts(scope, status);
        CREATE TABLE memory_keys (
            key TEXT PRIMARY KEY,
            fact_id TEXT NOT NULL,
            action TEXT NOT NULL
        );
        CREATE TABLE memory_history (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            fact_id TEXT NOT NULL,
            at REAL NOT NULL,
            action TEXT NOT NULL,
            data TEXT NOT NULL
        );
        CREATE INDEX memory_history_fact ON memory_history(fact_id);
        CREATE TABLE memory_revision (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            rev INTEGER NOT NULL
        );
        INSERT INTO memory_revision VALUES (1, 0);
        CREATE TABLE memory_settings (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        """,
    ),
    (
        "harvest_0002_swept_runs",
        # the consolidator's sweep: how far each run's record was read for spans the bank missed
        """
        CREATE TABLE harvest_swept (
            run_id TEXT PRIMARY KEY,
            harvest INTEGER NOT NULL,
            swept_seq INTEGER NOT NULL
        );
        """,
    ),
    (
        "harvest_0003_memory_search",
        # PostgreSQL searches facts in the database (postings for BM25, pgvector: harvest/pg.py);
        # SQLite searches them in the process (a RecallIndex per scope), so it adds nothing
        "SELECT 1;",
    ),
    (
        "harvest_0004_fact_words",
        # a fact keeps its source lines verbatim (merges add theirs; erasing wipes them), the
        # model that extracted it, and its author: run (extracted) or operator (written by hand)
        """
        ALTER TABLE memory_facts ADD COLUMN lines TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE memory_facts ADD COLUMN model TEXT;
        ALTER TABLE memory_facts ADD COLUMN author TEXT NOT NULL DEFAULT 'run';
        """,
    ),
    (
        "harvest_0005_passage_windows",
        # PostgreSQL: a passage's postings hold the words said before it, marked with that
        # row (``via``) so they leave with it; SQLite builds windows in the process
        "SELECT 1;",
    ),
]
"""Harvest's migrations: named, ordered, forward-only (append new ones, never edit old ones)."""


class Tables(Protocol):
    """Harvest's tables on either backend: SQL with ``?`` placeholders, written once."""

    dialect: str
    row_key: str
    lock_claimed: str
    path: Any

    def write(self) -> contextlib.AbstractContextManager[Any]:
        """One write transaction; what it yields has ``execute(sql, args)``."""
        ...

    def rows(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]: ...

    def close(self) -> None: ...


class HarvestDB:
    """One connection to the harvest tables of a record file. Safe to share between the
    threads of one process; several processes may open the same file (WAL)."""

    dialect = "sqlite"
    row_key = "rowid"
    """The column that orders facts as they were inserted."""
    lock_claimed = ""
    """A claim's write transaction (BEGIN IMMEDIATE) already excludes every other writer."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.RLock()
        deadline = time.monotonic() + 30
        while True:
            try:
                self.conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                self.conn.execute("PRAGMA busy_timeout=10000")
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
                migrate(self.conn, MIGRATIONS)
                break
            except sqlite3.OperationalError as exc:
                if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                    raise StoreError(f"cannot open durable memory in {self.path}: {exc}") from exc
                time.sleep(0.05)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open durable memory in {self.path}: {exc}") from exc

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE … COMMIT; rolled back if the block raises)."""
        with self._lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write durable memory in {self.path}: {exc}") from exc
            try:
                yield self.conn
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
            try:
                self.conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot commit durable memory in {self.path}: {exc}") from exc

    def rows(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query."""
        with self._lock:
            return self.conn.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self.conn.close()


_open: dict[str, Tables] = {}
_open_lock = threading.Lock()


def has_place(store: Where) -> bool:
    """Whether durable memory can live beside the record ``store``: a SQLite file, or a
    PostgreSQL database (not an in-memory record)."""
    if isinstance(getattr(store, "url", None), str):
        return True
    path = getattr(store, "path", None)
    return isinstance(path, Path) and str(path) != ":memory:"


def where_of(where: Where) -> str:
    """Where a record's harvest tables are: a PostgreSQL URL (a store's, with its password),
    or a SQLite file's resolved path. ``where`` is a store, a path or a URL."""
    url = getattr(where, "url", None)
    if isinstance(url, str):
        return url
    place = getattr(where, "path", where)
    if isinstance(place, str) and place.startswith(("postgresql://", "postgres://")):
        return place
    return str(Path(str(place)).resolve())


def harvest_db(where: Where) -> Tables:
    """The process's one harvest database for ``where`` (a store, a SQLite path or a
    PostgreSQL URL): a :class:`HarvestDB` (opened, and migrated, on first use) or a
    :class:`~loomrt.harvest.pg.PgHarvestDB` (migrated by ``loomrt db migrate``)."""
    if str(getattr(where, "path", where)) == ":memory:":  # not a file named ":memory:" in the working folder
        raise ValueError(
            "an in-memory record has no place for durable memory: use a file store (LOOMRT_HOME or "
            "LOOMRT_DB_URL=sqlite:PATH) or PostgreSQL"
        )
    key = where_of(where)
    with _open_lock:
        db = _open.get(key)
        if db is None:
            if key.startswith("postgres"):
                from loomrt.harvest.pg import PgHarvestDB

                db = _open[key] = PgHarvestDB(key)
            else:
                db = _open[key] = HarvestDB(key)
        return db


def release(where: Any) -> None:
    """Close and forget the process's harvest database for ``where`` (it is going away)."""
    with _open_lock:
        db = _open.pop(where_of(where), None)
    if db is not None:
        db.close()


def row_lock(db: Tables) -> str:
    """What a read appends to lock the rows it reads until the write ends (PostgreSQL; SQLite's
    writes are serial already), so a row erased meanwhile is not written back."""
    return " FOR UPDATE" if db.dialect == "postgres" else ""
