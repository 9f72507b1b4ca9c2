"""The statements a PostgreSQL append sends (:meth:`~loomrt.record.postgres.PostgresStore.write_many`):
how it opens and closes (a transaction of its own, a step's first write, a savepoint inside a
step), the run's head with the fencing check, and the events with the head anchor in one
statement."""

from __future__ import annotations

from typing import Any

from loomrt.record.owners import FENCE
from loomrt.record.pg_io import DB_NOW as _NOW

__all__ = ["OWN", "FIRST", "NESTED", "HEAD", "FENCED_HEAD", "MOVE_HEAD", "head_args", "events_and_head"]

OWN = ("BEGIN", "COMMIT", "ROLLBACK")
"""An append in a transaction of its own (opening, closing, undo)."""
FIRST = ("BEGIN", None, "ROLLBACK")
"""A block's first write: it begins the block's transaction and leaves it open."""
NESTED = ("SAVEPOINT loomrt_append", "RELEASE SAVEPOINT loomrt_append", "ROLLBACK TO SAVEPOINT loomrt_append")
"""A later write of a block: undone alone if it fails."""
_LAST = (
    "FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT seq, hash FROM events WHERE run_id = %s "
    "ORDER BY seq DESC LIMIT 1) last ON true LEFT JOIN runs r ON r.run_id = %s"
)
HEAD = f"SELECT {_NOW}, last.seq, last.hash, r.fork_seq, r.chain, NULL {_LAST}"
"""The time, the run's last seq and hash, where a fork's seqs start, and its chain."""
FENCED_HEAD = (
    f"WITH fence AS (UPDATE run_owners SET expires_at = {_NOW} + ttl_s "
    f"WHERE run_id = %s AND epoch = %s AND {FENCE} RETURNING 1) "
    f"SELECT {_NOW}, last.seq, last.hash, r.fork_seq, r.chain, EXISTS (SELECT 1 FROM fence) {_LAST}"
)
""":data:`HEAD`, and the fence: the claim at that epoch renewed while it is the run's newest."""


def head_args(run_id: str, epoch: int | None) -> tuple[Any, ...]:
    return (run_id, run_id) if epoch is None else (run_id, epoch, run_id, run_id)


MOVE_HEAD = (
    "INSERT INTO run_heads (run_id, seq, hash, epoch) VALUES (%s, %s, %s, %s) ON CONFLICT (run_id) DO UPDATE "
    "SET seq = excluded.seq, hash = excluded.hash, epoch = GREATEST(run_heads.epoch, excluded.epoch)"
)

_EVENTS_AND_HEAD = (
    "WITH added AS (INSERT INTO events (run_id, seq, kind, ts, data, hash) "
    "SELECT %s, s, k, t, d, h FROM unnest(%s::bigint[], %s::text[], %s::float8[], %s::text[], %s::text[]) "
    "AS x(s, k, t, d, h)) " + MOVE_HEAD
)
"""Insert a large append's events (one array a column: six parameters whatever the number of
events) and move the run's head anchor to the last."""
_VALUES_UP_TO = 64
"""Up to this many events an append lists them as a VALUES list (a turn's one to four: 0.15
ms of client CPU an append less than the arrays' adaptation); more go as arrays, since a
statement takes at most 65,535 parameters (six an event)."""


def events_and_head(run_id: str, rows: list[tuple[Any, ...]], epoch: int | None) -> tuple[str, list[Any]]:
    """One statement: insert ``rows`` (events of ``run_id``) and move its head anchor to the last."""
    last = rows[-1]
    head = [run_id, last[1], last[5], epoch or 0]
    if len(rows) <= _VALUES_UP_TO:
        values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(rows))
        sql = f"WITH added AS (INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES {values}) " + MOVE_HEAD
        return sql, [*(v for row in rows for v in row), *head]
    _, seqs, kinds, stamps, data, hashes = (list(column) for column in zip(*rows, strict=True))
    return _EVENTS_AND_HEAD, [run_id, seqs, kinds, stamps, data, hashes, *head]
