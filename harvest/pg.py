"""Harvest's tables on PostgreSQL: the span queue and durable memory in the shared database.

The same named migrations as :data:`loomrt.harvest.db.MIGRATIONS` (that list is the one
list; :data:`POSTGRES_SQL` holds PostgreSQL's SQL for each name), applied by ``loomrt db
migrate`` with the record's (:mod:`loomrt.record.pg_migrations`). What PostgreSQL adds:

- **Search in the database.** ``memory_terms`` holds each live fact's postings: recall's
  BM25 tokens (:func:`loomrt.recall.index.tokenize`: stems, and compounds such as
  ``ERR-4471`` whole and in parts, so identifiers and their pieces both match), with their
  frequency, under ``(scope, term)``; BM25 is computed in SQL from them. (PostgreSQL's full
  text was tried first: ``ts_rank`` has no inverse document frequency, and BM25 from
  ``tsvector`` positions took 128 ms a query at 10,000 facts.) ``memory_facts.embedding`` is
  a pgvector ``vector`` with an HNSW index (cosine) for the embedder's dimension, where the
  server has the extension. Without it vectors stay ``bytea`` only and are searched exactly
  (:mod:`loomrt.harvest.pg_memory` says so once).
- **Scopes in the database.** Row-level security on ``memory_facts`` and ``memory_terms``:
  a row is visible only when its scope is in the connection's ``loomrt.scopes`` setting
  (``*``: every scope, for the consolidator and operators). The application role is subject to it; the tables'
  owner is not (PostgreSQL's rule), so workers connect as a role granted ``loomrt_app``.
- **Many workers.** A claim locks its spans ``FOR UPDATE SKIP LOCKED``: two workers never
  take one span, and neither waits on the other.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from loomrt.errors import StoreError

__all__ = ["POSTGRES_SQL", "PgHarvestDB", "HNSW_DIMS", "add_vectors", "has_vectors", "write_terms"]

HNSW_DIMS = (384,)
"""Vector dimensions with an HNSW index (all-MiniLM-L6-v2's 384); others are searched exactly."""

_APP = "loomrt_app"

_TABLES = (
    "harvest_spans, harvest_batches, harvest_watermarks, harvest_dead_letters, memory_facts, memory_keys, "
    "memory_history, memory_revision, memory_settings"
)


_VECTOR_SQL = (
    "ALTER TABLE memory_facts ADD COLUMN embedding vector",
    *(
        f"CREATE INDEX memory_facts_hnsw_{d} ON memory_facts USING hnsw "
        f"((embedding::vector({d})) vector_cosine_ops) WHERE vector_dims(embedding) = {d}"
        for d in HNSW_DIMS
    ),
)
"""pgvector's column and HNSW index(es) on durable memory: made by migration
``harvest_0003_memory_search`` where the extension could be created, else later by
:func:`add_vectors`."""


def vector_text(vec: Any) -> str:
    """A vector as pgvector reads it: ``[0.1,0.2,...]``."""
    return "[" + ",".join(f"{float(x):.7g}" for x in vec) + "]"


def has_vectors(conn: Any) -> bool:
    """True when durable memory has pgvector's column (``memory_facts.embedding``)."""
    return bool(
        conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('memory_facts') "
            "AND attname = 'embedding' AND NOT attisdropped"
        ).fetchone()
    )


def add_vectors(conn: Any) -> list[str]:
    """The catch-up step of ``loomrt db migrate`` (a :data:`~loomrt.record.pg_migrations.Repair`):
    a database migrated where pgvector could not be created (a non-superuser owner) gets
    ``memory_facts.embedding`` and its HNSW index once the extension exists (a superuser ran
    ``CREATE EXTENSION vector``; tried here too, for a migrator who may), with the vectors
    already stored as ``bytea`` copied in. Says what it did, or nothing."""
    import numpy as np
    import psycopg

    if conn.execute("SELECT to_regclass('memory_facts')").fetchone()[0] is None or has_vectors(conn):
        return []
    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error:
        return []  # still not there: `loomrt db status` and the workers' notice say so
    with conn.transaction():
        for statement in _VECTOR_SQL:
            conn.execute(statement)
        rows = conn.execute("SELECT fact_id, vector FROM memory_facts WHERE vector IS NOT NULL").fetchall()
        for fact_id, raw in rows:
            text = vector_text(np.frombuffer(raw, dtype=np.float32))
            conn.execute("UPDATE memory_facts SET embedding = %s::vector WHERE fact_id = %s", (text, fact_id))
    return [
        f"harvest_vectors (pgvector found: memory_facts.embedding and its HNSW index added, {len(rows)} vectors copied)"
    ]


def write_terms(
    conn: Any, fact_id: str, scope: str, label: str, said: str | None = None, via: str | None = None
) -> None:
    """A live row's postings in ``memory_terms`` (``conn`` takes ``?`` placeholders): the
    recall tokens of ``label``, after those of ``said`` (the words of passage ``via``, said
    before it: its postings are marked with that row, so they leave with it), and its length."""
    from collections import Counter

    from loomrt.recall.index import tokenize

    tokens = [*(tokenize(said) if said else []), *tokenize(label)]
    conn.execute("DELETE FROM memory_terms WHERE fact_id = ?", (fact_id,))
    conn.execute("UPDATE memory_facts SET n_tokens = ? WHERE fact_id = ?", (len(tokens), fact_id))
    tf = Counter(tokens)
    if tf:
        conn.execute(
            "INSERT INTO memory_terms (scope, term, fact_id, tf, n_tokens, via) "
            "SELECT ?, t, ?, f, ?, ? FROM unnest(?::text[], ?::int[]) AS x(t, f)",
            (scope, fact_id, len(tokens), via if said else None, list(tf), list(tf.values())),
        )


def _scoped(table: str) -> str:
    """Row-level security on ``table`` by its ``scope`` column and ``loomrt.scopes``."""
    visible = (
        "current_setting('loomrt.scopes', true) = '*' "
        "OR scope = ANY (string_to_array(current_setting('loomrt.scopes', true), ','))"
    )
    return (
        f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY; "
        f"CREATE POLICY {table}_scope ON {table} USING ({visible}) WITH CHECK ({visible});"
    )


POSTGRES_SQL: dict[str, str] = {
    "harvest_0001_queue_and_memory": f"""
        CREATE TABLE harvest_spans (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id TEXT NOT NULL,
            distillation_seq BIGINT NOT NULL,
            scope TEXT NOT NULL,
            agent TEXT NOT NULL,
            def_hash TEXT NOT NULL,
            seq_lo BIGINT NOT NULL,
            seq_hi BIGINT NOT NULL,
            ts_lo DOUBLE PRECISION,
            ts_hi DOUBLE PRECISION,
            banked_at DOUBLE PRECISION NOT NULL,
            tokens INTEGER NOT NULL,
            turns TEXT NOT NULL,
            redacted INTEGER NOT NULL DEFAULT 0,
            state TEXT NOT NULL DEFAULT 'pending',
            batch_id TEXT,
            UNIQUE (run_id, distillation_seq, scope)
        );
        CREATE INDEX harvest_spans_queue ON harvest_spans(scope, state, id);
        CREATE INDEX harvest_spans_batch ON harvest_spans(batch_id);
        CREATE TABLE harvest_batches (
            batch_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            span_ids TEXT NOT NULL,
            state TEXT NOT NULL,
            claimed_at DOUBLE PRECISION NOT NULL,
            done_at DOUBLE PRECISION,
            attempts INTEGER NOT NULL DEFAULT 0,
            report TEXT
        );
        CREATE TABLE harvest_watermarks (
            scope TEXT PRIMARY KEY,
            span_id BIGINT NOT NULL,
            at DOUBLE PRECISION NOT NULL
        );
        CREATE TABLE harvest_dead_letters (
            batch_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            span_ids TEXT NOT NULL,
            reply_prefix TEXT NOT NULL,
            error TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            retried_at DOUBLE PRECISION
        );
        CREATE TABLE memory_facts (
            row_no BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
            fact_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            class TEXT NOT NULL,
            subject TEXT NOT NULL,
            statement TEXT NOT NULL,
            observed_at TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            sources TEXT NOT NULL,
            vector BYTEA,
            embedder TEXT,
            status TEXT NOT NULL DEFAULT 'live',
            superseded_by TEXT,
            changed_at DOUBLE PRECISION
        );
        CREATE INDEX memory_facts_scope ON memory_facts(scope, status);
        CREATE TABLE memory_keys (
            key TEXT PRIMARY KEY,
            fact_id TEXT NOT NULL,
            action TEXT NOT NULL
        );
        CREATE TABLE memory_history (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            fact_id TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            action TEXT NOT NULL,
            data TEXT NOT NULL
        );
        CREATE INDEX memory_history_fact ON memory_history(fact_id);
        CREATE TABLE memory_revision (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            rev BIGINT NOT NULL
        );
        INSERT INTO memory_revision VALUES (1, 0);
        CREATE TABLE memory_settings (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        GRANT SELECT, INSERT, UPDATE, DELETE ON {_TABLES} TO {_APP};
    """,
    "harvest_0002_swept_runs": f"""
        CREATE TABLE harvest_swept (
            run_id TEXT PRIMARY KEY,
            harvest INTEGER NOT NULL,
            swept_seq BIGINT NOT NULL
        );
        GRANT SELECT, INSERT, UPDATE, DELETE ON harvest_swept TO {_APP};
    """,
    "harvest_0003_memory_search": f"""
        -- lexical search: BM25 in SQL over the statements' recall tokens (full text's ts_rank
        -- has no inverse document frequency); a fact's postings leave when it stops being live
        ALTER TABLE memory_facts ADD COLUMN n_tokens INTEGER;
        CREATE TABLE memory_terms (
            scope TEXT NOT NULL,
            term TEXT NOT NULL,
            fact_id TEXT NOT NULL,
            tf INTEGER NOT NULL,
            n_tokens INTEGER NOT NULL,
            PRIMARY KEY (scope, term, fact_id) INCLUDE (tf, n_tokens)  -- read by index-only scans
        );
        CREATE INDEX memory_terms_fact ON memory_terms(fact_id);
        GRANT SELECT, INSERT, UPDATE, DELETE ON memory_terms TO {_APP};
        DO $$ BEGIN
            BEGIN
                CREATE EXTENSION IF NOT EXISTS vector;
            EXCEPTION WHEN OTHERS THEN
                RAISE NOTICE 'pgvector is not available (%): memory vectors are searched exactly', SQLERRM;
            END;
            IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector') THEN
                {"".join(f"EXECUTE '{statement}';" for statement in _VECTOR_SQL)}
            END IF;
        END $$;
        -- scopes enforced by the database: a row is visible to a connection whose loomrt.scopes
        -- names its scope (or is '*'); the tables' owner is exempt, the application role is not
        {_scoped("memory_facts")}
        {_scoped("memory_terms")}
    """,
    "harvest_0004_fact_words": """
        ALTER TABLE memory_facts ADD COLUMN lines TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE memory_facts ADD COLUMN model TEXT;
        ALTER TABLE memory_facts ADD COLUMN author TEXT NOT NULL DEFAULT 'run';
    """,
    "harvest_0005_passage_windows": """
        ALTER TABLE memory_terms ADD COLUMN via TEXT;
        CREATE INDEX memory_terms_via ON memory_terms(via) WHERE via IS NOT NULL;
    """,
}
"""PostgreSQL's SQL for each of harvest's migrations, by name (in the one list's order)."""


class PgHarvestDB:
    """Harvest's tables in the PostgreSQL database at ``url``: the same face as
    :class:`~loomrt.harvest.db.HarvestDB` (``write()``, ``rows()``; ``?`` placeholders), over
    a small connection pool. Inside :meth:`write`, :meth:`rows` on the same thread reads
    through the transaction's connection (it sees its own writes, as SQLite's one
    connection does). Every statement runs with ``loomrt.scopes`` set: ``*`` unless a
    caller narrows it with :meth:`scoped` (a run's search reads only its granted scopes, and
    the database checks)."""

    dialect = "postgres"
    row_key = "row_no"
    """The column that orders facts as they were inserted (SQLite's ``rowid``)."""
    lock_claimed = " FOR UPDATE SKIP LOCKED"
    """Appended to a claim's select: spans another worker is claiming are skipped, not waited on."""

    def __init__(self, url: str, *, pool_size: int = 4):
        try:
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise StoreError(
                f"durable memory on PostgreSQL needs psycopg ({exc}). Install it with: pip install 'loomrt[postgres]'"
            ) from None
        from loomrt.record.pg_migrations import check_schema
        from loomrt.record.postgres import redact_url

        self.url = url
        self.path = redact_url(url)
        try:
            self._pool = ConnectionPool(
                url,
                min_size=1,
                max_size=pool_size,
                open=True,
                timeout=30,
                kwargs={"autocommit": True},
                name="loomrt-harvest",
            )
            self._pool.wait(timeout=30)
        except Exception as exc:  # noqa: BLE001 - any failure to connect is one clear error
            raise StoreError(f"cannot connect to durable memory at {self.path}: {exc}") from None
        self._local = threading.local()
        with self._pool.connection() as conn:
            try:
                check_schema(conn, self.path)
            except StoreError:
                self._pool.close()
                raise
            self.extensions = {r[0] for r in conn.execute("SELECT extname FROM pg_extension").fetchall()}
            """The server's extensions this database uses (``vector`` is the one read: only once
            durable memory has its column, which `loomrt db migrate` adds when it can)."""
            if not has_vectors(conn):
                self.extensions.discard("vector")

    @contextlib.contextmanager
    def scoped(self, scopes: Sequence[str]) -> Iterator[None]:
        """Statements on this thread inside the block see only ``scopes``' memory rows."""
        old = getattr(self._local, "scopes", "*")
        self._local.scopes = ",".join(scopes)
        try:
            yield
        finally:
            self._local.scopes = old

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[_Conn]:
        pinned = getattr(self._local, "conn", None)
        if pinned is not None:
            yield pinned
            return
        with self._pool.connection() as raw, raw.transaction():
            raw.execute("SELECT set_config('loomrt.scopes', %s, true)", (getattr(self._local, "scopes", "*"),))
            conn = _Conn(raw)
            self._local.conn = conn
            try:
                yield conn
            finally:
                self._local.conn = None

    @contextlib.contextmanager
    def write(self) -> Iterator[_Conn]:
        """One write transaction (committed at the end; rolled back if the block raises)."""
        import psycopg

        try:
            with self._transaction() as conn:
                yield conn
        except psycopg.Error as exc:
            raise StoreError(f"cannot write durable memory at {self.path}: {str(exc).strip()}") from exc

    def rows(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query."""
        import psycopg

        try:
            with self._transaction() as conn:
                found: list[tuple[Any, ...]] = conn.execute(sql, args).fetchall()
                return found
        except psycopg.Error as exc:
            raise StoreError(f"cannot read durable memory at {self.path}: {str(exc).strip()}") from exc

    def close(self) -> None:
        self._pool.close()


class _Conn:
    """A psycopg connection that takes SQLite's ``?`` placeholders (harvest's SQL is written
    once, for both)."""

    def __init__(self, raw: Any):
        self.raw = raw

    def execute(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
        return self.raw.execute(sql.replace("%", "%%").replace("?", "%s") if args else sql, args or None)
