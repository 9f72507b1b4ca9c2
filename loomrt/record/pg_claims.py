"""Claims and leases on the PostgreSQL record: the coordination beside the log.

Which worker plays a run (its claim, and the claim's epoch, the fencing token every append
carries: :mod:`loomrt.record.owners`), and the named leases folds and harvest's scopes take.
Time is the database's (``clock_timestamp()``), so machines whose clocks disagree still agree
on who holds one. A mixin of :class:`~loomrt.record.postgres.PostgresStore`, over its two ways
in (``_sync``, ``_async``) and its psycopg async connections.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from loomrt.record.owners import FENCE, claimed, owner_rows
from loomrt.record.pg_io import DB_NOW as _NOW
from loomrt.record.pg_io import Conn, changed, rows_of

__all__ = ["PgClaims", "owner_row"]

T = TypeVar("T")


async def owner_row(conn: Conn, run_id: str) -> tuple[str, int, float] | None:
    rows = await rows_of(conn, "SELECT owner, epoch, expires_at FROM run_owners WHERE run_id = %s", (run_id,))
    return (rows[0][0], int(rows[0][1]), float(rows[0][2])) if rows else None


class PgClaims:
    """``take_lease`` … ``run_owners`` of the store protocol, on PostgreSQL."""

    if TYPE_CHECKING:  # what the store itself defines

        def _sync(self, op: Callable[[Conn], Awaitable[T]], fail: str, *, write: bool = False) -> T: ...

        async def _async(self, op: Callable[[Conn], Awaitable[T]], fail: str, *, write: bool = False) -> T: ...

        def _select(self, sql: str, args: Iterable[Any]) -> list[tuple[Any, ...]]: ...

    def take_lease(self, name: str, holder: str, ttl_s: float, *, replacing: str | None = None) -> bool:
        """Hold lease ``name`` for ``ttl_s`` seconds of database time: True if ``holder`` has it
        now (it was free, expired, already its own, or ``replacing``'s)."""
        rows = self._sync(
            lambda conn: rows_of(
                conn,
                f"INSERT INTO leases (name, holder, expires_at) VALUES (%s, %s, {_NOW} + %s) "
                f"ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at "
                f"WHERE leases.holder = excluded.holder OR leases.holder = %s OR leases.expires_at <= {_NOW} "
                "RETURNING holder",
                (name, holder, ttl_s, replacing),
            ),
            f"cannot take lease {name}",
            write=True,
        )
        return bool(rows)

    def lease_holder(self, name: str) -> str | None:
        rows = self._select(f"SELECT holder FROM leases WHERE name = %s AND expires_at > {_NOW}", (name,))
        return rows[0][0] if rows else None

    def release_lease(self, name: str, holder: str) -> None:
        self._sync(
            lambda conn: changed(conn, "DELETE FROM leases WHERE name = %s AND holder = %s", (name, holder)),
            f"cannot release lease {name}",
            write=True,
        )

    def claim_run(self, run_id: str, owner: str, ttl_s: float) -> int:
        """Own run ``run_id`` for ``ttl_s`` seconds of database time (renewed by each fenced
        append): its epoch. Refused (:class:`RunOwnedError`) while another owner's claim is live;
        of two workers racing for one run, one wins."""
        return self._sync(self._claim_op(run_id, owner, ttl_s), f"cannot claim run {run_id}", write=True)

    async def aclaim_run(self, run_id: str, owner: str, ttl_s: float) -> int:
        """:meth:`claim_run`, awaited (a run started on an event loop never blocks it)."""
        return await self._async(self._claim_op(run_id, owner, ttl_s), f"cannot claim run {run_id}", write=True)

    def _claim_op(self, run_id: str, owner: str, ttl_s: float) -> Callable[[Conn], Awaitable[int]]:
        async def op(conn: Conn) -> int:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (run_id,))
                ((now,),) = await rows_of(conn, f"SELECT {_NOW}", ())
                now = float(now)
                high = await rows_of(conn, "SELECT epoch FROM run_epochs WHERE run_id = %s", (run_id,))
                epoch = claimed(run_id, owner, await owner_row(conn, run_id), now, int(high[0][0]) if high else 0)
                await conn.execute(  # the run's highest epoch: only ever raised (a trigger refuses less)
                    "INSERT INTO run_epochs (run_id, epoch) VALUES (%s, %s) ON CONFLICT (run_id) "
                    "DO UPDATE SET epoch = excluded.epoch WHERE run_epochs.epoch < excluded.epoch",
                    (run_id, epoch),
                )
                await conn.execute(
                    "INSERT INTO run_owners (run_id, owner, epoch, ttl_s, expires_at) VALUES (%s, %s, %s, %s, %s) "
                    "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch, "
                    "ttl_s = excluded.ttl_s, expires_at = excluded.expires_at",
                    (run_id, owner, epoch, ttl_s, now + ttl_s),
                )
                return epoch

        return op

    def renew_run(self, run_id: str, owner: str, epoch: int, ttl_s: float) -> bool:
        """A heartbeat: the claim at ``epoch`` holds ``ttl_s`` more seconds of database time;
        False once it is not the run's (taken over, or let go). Never a new claim."""
        sql = (
            f"UPDATE run_owners SET ttl_s = %s, expires_at = {_NOW} + %s "
            f"WHERE run_id = %s AND owner = %s AND epoch = %s AND expires_at > 0 AND {FENCE}"
        )
        args = (ttl_s, ttl_s, run_id, owner, epoch)
        return bool(
            self._sync(lambda conn: changed(conn, sql, args), f"cannot renew the claim on run {run_id}", write=True)
        )

    def release_run(self, run_id: str, owner: str, epoch: int) -> None:
        """Let the run go (its lease expires now; its epoch stays)."""
        sql = "UPDATE run_owners SET expires_at = 0 WHERE run_id = %s AND owner = %s AND epoch = %s"
        self._sync(lambda conn: changed(conn, sql, (run_id, owner, epoch)), f"cannot release run {run_id}", write=True)

    def run_owners(self, *, expired: bool = False) -> list[dict[str, Any]]:
        """The live claims (with ``expired``: the lapsed ones, released or not): run id, owner,
        epoch and seconds left, soonest to expire first."""
        rows = self._select(
            f"SELECT run_id, owner, epoch, expires_at, ttl_s, {_NOW} FROM run_owners "
            f"WHERE expires_at {'<=' if expired else '>'} {_NOW} ORDER BY expires_at",
            (),
        )
        return owner_rows(rows, float(rows[0][5]) if rows else 0.0)
