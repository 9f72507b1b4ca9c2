"""Harvest's part of a PostgreSQL database's migrations: its one list (:data:`loomrt.harvest.db.MIGRATIONS`,
the span queue and durable memory) and their PostgreSQL SQL (:data:`loomrt.harvest.pg.POSTGRES_SQL`).

Registered from harvest's own side, as the entry point ``loomrt.pg_migrations: harvest``
(pyproject.toml): the record (the bottom floor) finds it there and never imports harvest.
"""

from __future__ import annotations

from loomrt.harvest.db import MIGRATIONS
from loomrt.harvest.pg import POSTGRES_SQL, add_vectors

__all__ = ["PART"]

PART = (MIGRATIONS, POSTGRES_SQL, add_vectors)
"""(the ordered list of (name, SQLite SQL), PostgreSQL SQL by name, the catch-up step every
``loomrt db migrate`` runs: pgvector's column once the extension exists)."""
