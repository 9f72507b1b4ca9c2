"""Harvest's part of a PostgreSQL database's migrations: its one list (:data:`loomrt.harvest.db.MIGRATIONS`,
the span queue and durable memory) and their PostgreSQL SQL (:data:`loomrt.harvest.pg.POSTGRES_SQL`).

Registered from harvest's own side, as the entry point ``loomrt.pg_migrations: harvest``
(pyproject.toml): the record (the bottom floor) finds it there and never imports harvest.
"""

from __future__ import annotations

from typing import Any

from loomrt.harvest.db import MIGRATIONS
from loomrt.harvest.passages import PASSAGE, matched_as
from loomrt.harvest.pg import POSTGRES_SQL, add_vectors, write_terms
from loomrt.harvest.pg import _Conn as Conn

__all__ = ["PART", "catch_up", "passage_windows"]


def passage_windows(conn: Any) -> list[str]:
    """The catch-up step for passages stored before ``harvest_0005_passage_windows`` (a
    :data:`~loomrt.record.pg_migrations.Repair`): their postings are written again as a
    passage is matched now (``speaker: words``, and the words of the passage said before it
    where it names one), once: ``memory_settings`` remembers it was done."""
    if conn.execute("SELECT to_regclass('memory_terms')").fetchone()[0] is None:
        return []
    if conn.execute("SELECT 1 FROM memory_settings WHERE key = 'passage_windows'").fetchone():
        return []
    with conn.transaction():
        db = Conn(conn)
        rows = db.execute(
            "SELECT fact_id, scope, subject, statement, lines FROM memory_facts WHERE class = ? AND status = 'live' "
            "ORDER BY row_no",
            (PASSAGE,),
        ).fetchall()
        words = {fid: statement for fid, _, _, statement, _ in rows}
        for fid, scope, subject, statement, lines in rows:
            label, before = matched_as(PASSAGE, subject, statement, lines)
            said = words.get(before) if before and before != fid else None
            write_terms(db, fid, scope, label, said, before)
        db.execute("INSERT INTO memory_settings VALUES ('passage_windows', '1') ON CONFLICT (key) DO NOTHING")
    return (
        [f"harvest_passage_windows ({len(rows)} passages' search terms written as speaker and window)"] if rows else []
    )


def catch_up(conn: Any) -> list[str]:
    """What every ``loomrt db migrate`` checks after the migrations: pgvector's column once the
    extension exists, and the postings of passages stored before they were matched with
    their windows."""
    return [*add_vectors(conn), *passage_windows(conn)]


PART = (MIGRATIONS, POSTGRES_SQL, catch_up)
"""(the ordered list of (name, SQLite SQL), PostgreSQL SQL by name, the catch-up step every
``loomrt db migrate`` runs: :func:`catch_up`)."""
