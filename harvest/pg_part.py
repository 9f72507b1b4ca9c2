"""Harvest's part of a PostgreSQL database's migrations: its one list (:data:`loomrt.harvest.db.MIGRATIONS`,
the span queue and durable memory) and their PostgreSQL SQL (:data:`loomrt.harvest.pg.POSTGRES_SQL`).

Registered from harvest's own side, as the entry point ``loomrt.pg_migrations: harvest``
(pyproject.toml): the record (the bottom floor) finds it there and never imports harvest.
"""

from __future__ import annotations

from typing import Any

from loomrt.harvest.db import MIGRATIONS
from loomrt.harvest.pg import POSTGRES_SQL, add_vectors, passage_windows

__all__ = ["PART", "catch_up"]


def catch_up(conn: Any) -> list[str]:
    """What every ``loomrt db migrate`` checks after the migrations: pgvector's column once the
    extension exists, and the postings of passages stored before they were matched with
    their windows."""
    return [*add_vectors(conn), *passage_windows(conn)]


PART = (MIGRATIONS, POSTGRES_SQL, catch_up)
"""(the ordered list of (name, SQLite SQL), PostgreSQL SQL by name, the catch-up step every
``loomrt db migrate`` runs: :func:`catch_up`)."""
