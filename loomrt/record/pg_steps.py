"""A step's transaction on PostgreSQL: one connection held for the block, and the appends a
step makes after its first sent with its ``COMMIT``.

:meth:`~loomrt.record.postgres.PostgresStore.transaction` pins a :class:`Pin` to the task.
Its connection is taken from the pool with the block's first write (a block that writes
nothing costs no round trip, and the taking rides on that write's way to the I/O loop), and
that write begins the transaction.

**Deferred appends.** The block's first append to a run takes the run's advisory lock
(held until the commit) and reads its head. While the lock is held no other writer can
append to the run, so the block knows the head from then on: a later append of the block
to that run is chained here, on the caller's thread, without a call to the server (its
events, seqs and hashes are final), and its rows are sent with the block's ``COMMIT``
(:func:`send_deferred`), in the same pipeline. A deferred append under a claim is fenced
there too: if the claim is no longer the run's newest, nothing of the block is recorded
(:class:`~loomrt.errors.FencedError` from the block's end). A deferred event's time is the
database time of the block's last append to the run that went to the server, plus the
seconds since on this process's monotonic clock, and never before the run's last event.
Once the block has ended nothing more is deferred (a task it started and left running is
refused at its next write, as before).

An append is deferred only where nothing else of the block is in flight on the I/O loop
(:attr:`Pin.busy`): any other query of the block sends the deferred rows first, so a read
inside the block sees every write before it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from loomrt.errors import FencedError, StoreError
from loomrt.events import Event
from loomrt.record.owners import FENCE, fenced
from loomrt.record.pg_append_sql import events_and_head
from loomrt.record.pg_claims import owner_row
from loomrt.record.pg_io import DB_NOW, Conn
from loomrt.record.rows import chained

__all__ = ["Pin", "Head", "commit", "send_deferred", "INSERT_CARD"]

INSERT_CARD = (
    "INSERT INTO cards (card_id, run_id, seq, depth, data) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (card_id) DO NOTHING"
)
_RENEW = f"UPDATE run_owners SET expires_at = {DB_NOW} + ttl_s WHERE run_id = %s AND epoch = %s AND {FENCE} RETURNING 1"


@dataclass(frozen=True)
class Head:
    """A run's head as the block wrote it last, under the run's lock: its last seq and hash,
    its chain key, the database time of the block's last append to it that went to the
    server and when the process heard of it (``time.monotonic``), the time of its last event,
    and the claim's epoch it was written under."""

    seq: int
    hash: str
    key: bytes | None
    ts: float
    mono: float
    last_ts: float
    epoch: int | None


@dataclass
class Pin:
    """The connection a transaction block holds, whether its transaction has begun, and the
    appends it holds back for the commit. Its operations on the I/O loop take turns (tasks of
    the block share it), and none runs once the block has ended."""

    conn: Conn = None
    begun: bool = False
    ended: bool = False
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    heads: dict[str, Head] = field(default_factory=dict)
    """Runs the block has locked, by id: where each stands (deferred appends included)."""
    deferred: list[tuple[str, list[Any]]] = field(default_factory=list)
    cards: list[tuple[Any, ...]] = field(default_factory=list)
    fences: dict[str, int] = field(default_factory=dict)
    """Runs with a deferred append under a claim: the epoch the commit checks."""
    busy: int = 0
    """The block's operations sent to the I/O loop and not yet done."""
    failed: BaseException | None = None
    """Why the deferred appends could not be sent: the block then commits nothing."""
    guard: threading.Lock = field(default_factory=threading.Lock)
    closing: bool = False
    """The block has ended on the caller's side: nothing more is deferred (set under ``guard``)."""

    def close(self) -> None:
        """The block ends (the caller's thread, before its commit is sent)."""
        with self.guard:
            self.closing = True

    def opened(self) -> None:
        if self.ended:
            raise StoreError("a task used the record's transaction block after the block ended")

    def enter(self) -> None:
        """An operation of the block is on its way to the I/O loop (the caller's thread)."""
        with self.guard:
            self.busy += 1

    def leave(self) -> None:
        with self.guard:
            self.busy -= 1

    def locked(self, run_id: str, events: list[Event], key: bytes | None, epoch: int | None) -> None:
        """The block appended ``events`` to ``run_id`` under its lock (on the I/O loop)."""
        if events:
            last = events[-1]
            self.heads[run_id] = Head(last.seq, last.hash or "", key, last.ts, time.monotonic(), last.ts, epoch)

    def defer(
        self, run_id: str, items: list[tuple[str, dict[str, Any]]], after: int | None, epoch: int | None
    ) -> list[Event] | None:
        """The events of an append held back for the commit, or None where it must go to the
        server now (the block has not locked the run, another operation is in flight, or the
        writer expects another head or claim than the block's)."""
        with self.guard:
            head = self.heads.get(run_id)
            if not self.begun or self.closing or self.busy or head is None or head.epoch != epoch:
                return None
            if after is not None and after != head.seq:
                return None
            ts = max(head.last_ts, head.ts + max(0.0, time.monotonic() - head.mono))
            rows, cards, out = chained(run_id, head.seq, head.hash, ts, items, head.key)
            if rows:
                self.deferred.append(events_and_head(run_id, rows, epoch))
                self.cards.extend(cards)
                self.heads[run_id] = dataclasses.replace(head, seq=rows[-1][1], hash=rows[-1][5], last_ts=ts)
                if epoch is not None:
                    self.fences[run_id] = epoch
            return out


async def send_deferred(pin: Pin) -> None:
    """Send the block's deferred appends (one pipeline), their claims checked; on the I/O
    loop, inside the block's turn. A claim taken over raises :class:`FencedError`."""
    if not pin.deferred:
        return
    statements, cards, fences = pin.deferred, pin.cards, pin.fences
    pin.deferred, pin.cards, pin.fences = [], [], {}
    try:
        await _send(pin.conn, statements, cards, fences)
    except BaseException as exc:
        pin.failed = exc  # its rows may be in the transaction: the block must not commit
        raise


async def _send(
    conn: Conn, statements: list[tuple[str, list[Any]]], cards: list[tuple[Any, ...]], fences: dict[str, int]
) -> None:
    async with conn.pipeline():
        renewed = [await conn.execute(_RENEW, (run_id, epoch)) for run_id, epoch in fences.items()]
        for sql, args in statements:
            await conn.execute(sql, args)
        if cards:
            async with conn.cursor() as cur:
                await cur.executemany(INSERT_CARD, cards)
        for (run_id, epoch), cur in zip(fences.items(), renewed, strict=True):
            if await cur.fetchone() is None:
                raise FencedError(fenced(run_id, epoch, await owner_row(conn, run_id)))


async def commit(pin: Pin) -> None:
    """Send what the block held back, then COMMIT its transaction. One that failed (a
    statement in it failed: PostgreSQL would answer COMMIT with ROLLBACK) is rolled back and
    said, never silently lost."""
    from psycopg.pq import TransactionStatus

    conn = pin.conn
    try:
        await send_deferred(pin)
    except BaseException:
        await conn.execute("ROLLBACK")
        raise
    if pin.failed is not None:
        await conn.execute("ROLLBACK")
        if isinstance(pin.failed, FencedError):
            raise FencedError(f"nothing of this step was recorded: {pin.failed}")
        raise StoreError(f"nothing of this step was recorded: its appends could not be sent ({pin.failed})")
    if conn.info.transaction_status == TransactionStatus.INERROR:
        await conn.execute("ROLLBACK")
        raise StoreError("a statement in this step's transaction failed, so nothing of the step was recorded")
    cur = await conn.execute("COMMIT")
    if cur.statusmessage == "ROLLBACK":
        raise StoreError("the database rolled this step's transaction back: nothing of the step was recorded")
