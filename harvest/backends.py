"""Durable memory on the record's backend: one function that picks the store for a database.

Kept apart from :mod:`loomrt.harvest.memory` (the SQLite store and the base every backend
shares) so that the PostgreSQL store, which builds on it, is imported only here.
"""

from __future__ import annotations

from loomrt.harvest.db import Tables
from loomrt.harvest.memory import MemoryStore
from loomrt.recall.embedders import EmbedderChoice

__all__ = ["memory_of"]


def memory_of(db: Tables, embedder: EmbedderChoice = None) -> MemoryStore:
    """Durable memory in ``db``: searched in the process on SQLite, in the database on PostgreSQL."""
    if db.dialect == "postgres":
        from loomrt.harvest.pg_memory import PgMemoryStore

        return PgMemoryStore(db, embedder=embedder)  # type: ignore[arg-type]
    return MemoryStore(db, embedder=embedder)
