"""``loomrt db copy`` for durable memory: the harvest queue and the facts beside a record,
moved with it (a single machine's SQLite file into a shared PostgreSQL, or back).

Every row is copied as it is (span ids, fact ids, history, watermarks, dead letters), in
one transaction on the target; a row the target has already is kept (so a copy that was
interrupted can be run again). Facts copied into PostgreSQL get its search columns there
(postings, the pgvector column), from the stored statement and vector: nothing is embedded
again. Then the counts are compared: the copy fails loudly if the target holds fewer rows
of any table than the source.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loomrt.errors import StoreError
from loomrt.harvest.db import Tables
from loomrt.harvest.passages import matched_as

__all__ = ["copy_memory", "TABLES"]

TABLES: dict[str, tuple[str, ...]] = {
    "harvest_spans": (
        "id",
        "run_id",
        "distillation_seq",
        "scope",
        "agent",
        "def_hash",
        "seq_lo",
        "seq_hi",
        "ts_lo",
        "ts_hi",
        "banked_at",
        "tokens",
        "turns",
        "redacted",
        "state",
        "batch_id",
    ),
    "harvest_batches": ("batch_id", "scope", "span_ids", "state", "claimed_at", "done_at", "attempts", "report"),
    "harvest_watermarks": ("scope", "span_id", "at"),
    "harvest_dead_letters": ("batch_id", "scope", "span_ids", "reply_prefix", "error", "at", "retried_at"),
    "harvest_swept": ("run_id", "harvest", "swept_seq"),
    "memory_facts": (
        "fact_id",
        "scope",
        "class",
        "subject",
        "statement",
        "observed_at",
        "created_at",
        "sources",
        "vector",
        "embedder",
        "status",
        "superseded_by",
        "changed_at",
        "lines",
        "model",
        "author",
    ),
    "memory_keys": ("key", "fact_id", "action"),
    "memory_history": ("id", "fact_id", "at", "action", "data"),
    "memory_settings": ("key", "value"),
}
"""Each table's columns that both backends have, in their order."""

_IDENTITY = {"harvest_spans": "id", "memory_history": "id"}
"""Columns PostgreSQL generates (copied as they are: ``OVERRIDING SYSTEM VALUE``)."""


def has_memory(source: Any) -> bool:
    """Whether the record ``source`` has harvest's tables at all (a SQLite file that never
    harvested has none, and copying must not create them there)."""
    from loomrt.record.sqlite import SQLiteStore

    if isinstance(source, SQLiteStore):
        return bool(source._conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memory_facts'").fetchone())
    return True


def copy_memory(source: Tables, target: Tables, target_memory: Any = None) -> dict[str, int]:
    """Copy every harvest and memory row of ``source`` into ``target``; rows per table on the
    target after the copy. ``target_memory`` (a durable memory on ``target``) fills the search
    columns of the facts it receives."""
    order = source.row_key
    copied: dict[str, int] = {}
    with target.write() as conn:
        for table, columns in TABLES.items():
            names = ", ".join(columns)
            rows = source.rows(
                f"SELECT {names} FROM {table}" + (f" ORDER BY {order}" if table == "memory_facts" else "")
            )
            override = " OVERRIDING SYSTEM VALUE" if target.dialect == "postgres" and table in _IDENTITY else ""
            for row in rows:
                values = list(row)
                extra: dict[str, tuple[str, Any]] = {}
                label, before = (
                    matched_as(values[2], values[3], values[4], values[13]) if table == "memory_facts" else ("", None)
                )
                if table == "memory_facts" and target_memory is not None and values[10] == "live":
                    vec = np.frombuffer(values[8], dtype=np.float32) if values[8] is not None else None
                    extra = target_memory._search_columns(label, vec)
                cols = names + "".join(f", {c}" for c in extra)
                marks = ", ".join("?" * len(columns)) + "".join(f", {e}" for e, _ in extra.values())
                cur = conn.execute(
                    f"INSERT INTO {table} ({cols}){override} VALUES ({marks}) ON CONFLICT DO NOTHING",
                    [*values, *(v for _, v in extra.values())],
                )
                if table == "memory_facts" and extra and cur.rowcount:  # (in row order: its before is there)
                    target_memory._indexed(conn, values[0], values[1], label, before=before)
            if override:
                column = _IDENTITY[table]
                conn.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
                    f"coalesce((SELECT max({column}) FROM {table}), 0) + 1, false)"
                )
            copied[table] = len(rows)
        conn.execute("UPDATE memory_revision SET rev = rev + 1")  # search indexes built before the copy are stale
    for table in TABLES:
        (there,) = target.rows(f"SELECT count(*) FROM {table}")[0]
        if there < copied[table]:
            raise StoreError(
                f"durable memory did not copy whole: {table} has {there} rows on the target, "
                f"{copied[table]} at the source"
            )
        copied[table] = int(there)
    return copied
