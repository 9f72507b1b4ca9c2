"""The PostgreSQL store: one database shared by several loomrt processes on several machines.

The same protocol as the SQLite store (:class:`loomrt.record.store.Store`), over psycopg 3
and a psycopg-pool connection pool. What differs:

- **Schema.** Not migrated on open: ``loomrt db migrate`` does it, and opening a database
  behind this version is refused with that command (:mod:`loomrt.record.pg_migrations`).
- **Seqs.** The next seq of a run is taken under a transaction-scoped advisory lock on the
  run id, so writers on any machine serialise per run and never share a seq; ``(run_id,
  seq)`` is the primary key besides.
- **Time.** Leases expire in database time (``clock_timestamp()``), so machines whose clocks
  disagree still agree on who holds one.
- **Transactions.** ``async with store.transaction()`` pins one pooled connection to the
  task (a context variable) until the block ends; appends inside join it.

- **Async for real.** Every query goes through psycopg's async connections, pooled on the
  store's own I/O loop (:mod:`loomrt.record.pg_io`): the run core awaits its appends and
  reads there while its event loop plays the other runs; the sync face (the CLI, reports)
  waits for the same queries. An append is two round trips (``BEGIN``, the lock, the run's
  head and its fence in one pipeline; the rows, the head anchor and ``COMMIT`` in another).
  Inside a step the first append takes a connection, begins the step's transaction and
  leaves it open; a later append to the same run is chained in the process and sent with
  the step's ``COMMIT`` (:mod:`loomrt.record.pg_steps`), one to another run is a savepoint.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from loomrt.errors import FencedError, MovedOnError, NotFoundError, StoreError
from loomrt.events import Event, RunInfo
from loomrt.record import pg_migrations
from loomrt.record.inline import inline_wanted
from loomrt.record.ledger import canonical, ledger_key
from loomrt.record.owners import fenced
from loomrt.record.pg_append_sql import FENCED_HEAD, FIRST, HEAD, MOVE_HEAD, NESTED, OWN, events_and_head, head_args
from loomrt.record.pg_claims import PgClaims, owner_row
from loomrt.record.pg_io import DB_NOW as _NOW
from loomrt.record.pg_io import Conn, IOLoop, rows_of
from loomrt.record.pg_steps import INSERT_CARD, Pin, commit, send_deferred
from loomrt.record.rows import (
    RunReads,
    RunSums,
    chain_key,
    chain_start,
    chained,
    insert_run_sql,
    new_run,
    run_info,
    run_row,
    run_sums,
    runs_sql,
    sums_sql,
)

__all__ = ["PostgresStore", "redact_url", "import_run", "run_cards"]

_INSERT_EVENT = "INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES (%s, %s, %s, %s, %s, %s)"
T = TypeVar("T")


def redact_url(url: str) -> str:
    """``url`` without its password (for messages and logs)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    auth, host = rest.rsplit("@", 1)
    user = auth.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in auth else ''}@{host}"


FRESH_S = 2.0
"""A pooled connection that answered within this many seconds is handed out unchecked."""


def _pool_size() -> int:
    """Connections a process may open: ``$LOOMRT_DB_POOL_SIZE``, else 10 (opened as runs need them)."""
    raw = os.environ.get("LOOMRT_DB_POOL_SIZE", "").strip()
    if not raw:
        return 10
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise StoreError(f"LOOMRT_DB_POOL_SIZE must be a whole number of connections from 1 to 1000 (got {raw!r})")
    return int(raw)


class PostgresStore(PgClaims, RunReads):
    """Append-only record in a PostgreSQL database (``postgresql://...``)."""

    shared = True
    """Several machines share it: each runtime claims the runs it plays."""
    _mark = "%s"
    """psycopg's placeholder (:class:`~loomrt.record.rows.RunReads`)."""
    _now = _NOW
    """The database's clock (claims expire by it on every machine)."""

    def __init__(self, url: str, *, pool_size: int | None = None, check: bool = True):
        try:
            import psycopg
            from psycopg_pool import AsyncConnectionPool
        except ImportError as exc:
            raise StoreError(
                f"LOOMRT_DB_URL names PostgreSQL, but psycopg is not installed ({exc}). "
                "Install it with: pip install 'loomrt[postgres]'"
            ) from None
        pool_size = pool_size or _pool_size()
        self.url = url
        self.ledger_key = ledger_key()
        """The deployment's ledger key (:mod:`loomrt.record.ledger`): new runs are chained v2 with it."""
        self.path = redact_url(url)
        """Where the record is, as messages name it (the URL without its password)."""
        self._errors = psycopg.Error
        self.newer_migrations: list[str] = []
        """Migrations the database has that this version does not know (a rolling upgrade)."""
        try:
            # one connection first: a server that is not there is its own error at once,
            # where the pool would retry for its whole 30-second timeout and say only that
            given = psycopg.conninfo.conninfo_to_dict(url)
            probe = url if "connect_timeout" in given else psycopg.conninfo.make_conninfo(url, connect_timeout=10)
            with psycopg.connect(probe, autocommit=True) as conn:
                if check:
                    self.newer_migrations = pg_migrations.check_schema(conn, self.path)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to connect is one clear error
            raise self._unreachable(exc) from None

        async def open_pool() -> Any:  # on the I/O loop, whose pool it is
            pool = AsyncConnectionPool(
                url,
                min_size=1,
                max_size=pool_size,
                open=False,
                timeout=30,
                kwargs={"autocommit": True},
                name="loomrt-record",
                check=self._check_idle,  # a server restart leaves no dead connection to hand out
            )
            await pool.open(wait=True, timeout=30)
            return pool

        self._used: dict[int, float] = {}
        """When each pooled connection (by id) last answered a query (:meth:`_check_idle`)."""
        self._pinned: contextvars.ContextVar[Pin | None] = contextvars.ContextVar(f"loomrt-pg-{id(self)}", default=None)
        self._io = IOLoop("loomrt-record-io")
        try:
            self._pool = self._io.call(open_pool())
        except Exception as exc:  # noqa: BLE001 - as above
            self._io.close()
            raise self._unreachable(exc) from None
        self.closed = False

    def _unreachable(self, exc: BaseException) -> StoreError:
        detail = " ".join(str(exc).split()).rstrip(".")  # libpq's message, on one line
        return StoreError(
            f"cannot connect to the record at {self.path}: {detail}{'' if detail.endswith('?') else '.'} "
            "Check LOOMRT_DB_URL and that the server is running."
        )

    @property
    def stalls(self) -> int:
        """Store calls that blocked a running event loop (sync calls made from async code)."""
        return self._io.stalls

    @property
    def calls(self) -> int:
        """Store calls made to the server so far (each a hop to the I/O loop and a round trip at least)."""
        return self._io.calls

    async def _check_idle(self, conn: Conn) -> None:
        """The pool's check before it hands a connection out: one that answered a query in the
        last :data:`FRESH_S` seconds is handed out as it is (a round trip saved on every call
        of a busy process); one idle longer is asked first, so a server restart is found
        before a caller meets it."""
        if time.monotonic() - self._used.get(id(conn), 0.0) < FRESH_S:
            return
        from psycopg_pool import AsyncConnectionPool

        await AsyncConnectionPool.check_connection(conn)

    def _fail(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"{what} at {self.path}: {str(exc).strip()}")

    # ------------------------------------------------------------ the two ways in

    def _on(self, op: Callable[[Conn], Awaitable[T]], *, writes: bool = False) -> Coroutine[Any, Any, T]:
        """``op`` on a connection: inside :meth:`transaction`, the block's (read here, in the
        caller's context; a write there takes it and begins its transaction first, and what
        the block held back is sent before ``op``), else a pooled one."""
        pin = self._pinned.get()

        async def pooled() -> T:
            async with self._pool.connection() as conn:
                out = await op(conn)
                self._used[id(conn)] = time.monotonic()
                return out

        async def run() -> T:
            assert pin is not None
            try:
                async with pin.turn:
                    pin.opened()
                    if pin.conn is None and not writes:  # the block has not written: nothing to see
                        return await pooled()
                    await self._begin(pin)
                    await send_deferred(pin)
                    if not writes:
                        return await op(pin.conn)
                    async with pin.conn.transaction():  # a savepoint: a failed write leaves the block whole
                        return await op(pin.conn)
            finally:
                pin.leave()

        if pin is None:
            return pooled()
        pin.enter()
        return run()

    async def _begin(self, pin: Pin) -> None:
        """The block's connection, taken with its first write, and its transaction begun."""
        if pin.conn is None:
            pin.conn = await self._pool.getconn()
        if not pin.begun:
            pin.begun = True
            await pin.conn.execute("BEGIN")

    def _sync(self, op: Callable[[Conn], Awaitable[T]], fail: str, *, write: bool = False) -> T:
        """The sync face: run ``op`` on the I/O loop and wait for it (``write``: it writes)."""
        return self._wait(lambda: self._on(op, writes=write), fail)

    async def _async(self, op: Callable[[Conn], Awaitable[T]], fail: str, *, write: bool = False) -> T:
        """The async face: await ``op`` on the I/O loop (``write``: it writes). A cancelled
        caller waits for a write, or any call inside a transaction block (a query cancelled
        there would fail the block's transaction), to complete."""
        shield = write or self._pinned.get() is not None
        return await self._await(lambda: self._on(op, writes=write), fail, write=shield)

    def _wait(self, work: Callable[[], Coroutine[Any, Any, T]], fail: str) -> T:
        try:
            return self._io.call(work())
        except self._errors as exc:
            raise self._fail(fail, exc) from exc

    async def _await(
        self,
        work: Callable[[], Coroutine[Any, Any, T]],
        fail: str,
        *,
        write: bool = False,
        undo: Callable[[T], Coroutine[Any, Any, Any]] | None = None,
    ) -> T:
        """``work()`` on the I/O loop, awaited (inline where the caller cannot wait:
        :func:`~loomrt.record.inline.inline_wanted`)."""
        if inline_wanted():
            return self._wait(work, fail)
        try:
            return await self._io.wait(work(), write=write, undo=undo)
        except self._errors as exc:
            raise self._fail(fail, exc) from exc

    def _select(self, sql: str, args: Iterable[Any]) -> list[tuple[Any, ...]]:
        return self._sync(lambda conn: rows_of(conn, sql, args), "cannot read the record")

    # ------------------------------------------------------------ the async face

    async def write_run(self, info: RunInfo) -> None:
        await self._async(self._create_run_op(info), f"cannot record run {info.run_id}", write=True)

    async def write(self, run_id: str, kind: str, data: dict[str, Any]) -> Event:
        return (await self.write_many(run_id, [(kind, data)]))[0]

    async def write_many(
        self,
        run_id: str,
        items: list[tuple[str, dict[str, Any]]],
        *,
        after: int | None = None,
        epoch: int | None = None,
    ) -> list[Event]:
        pin = self._pinned.get()
        held = pin.defer(run_id, items, after, epoch) if pin is not None else None
        if held is not None:  # chained here, sent with the block's COMMIT
            return held
        return await self._await(
            self._appending(run_id, items, after, epoch), f"cannot append to the record of run {run_id}", write=True
        )

    async def read(
        self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None, until: int | None = None
    ) -> list[Event]:
        sql, args = _events_sql(run_id, after, kinds, until)
        rows = await self._async(lambda conn: rows_of(conn, sql, args), "cannot read the record")
        return _events(run_id, rows)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """Everything appended inside is committed together at the end (also when the block
        raises, as on SQLite: what was appended is what the run saw); a process killed inside
        commits nothing. Blocks nest."""
        if self._pinned.get() is not None:
            yield
            return

        async def end(pin: Pin) -> None:
            async with pin.turn:
                pin.ended = True
                if pin.conn is None:
                    return
                try:
                    if pin.begun:
                        await commit(pin)
                        self._used[id(pin.conn)] = time.monotonic()
                finally:
                    await self._pool.putconn(pin.conn)

        pin = Pin()  # its connection is taken, and BEGIN sent, with the block's first write
        token = self._pinned.set(pin)
        try:
            yield
        finally:
            self._pinned.reset(token)
            pin.close()  # a task the block started, still running, defers nothing more
            if pin.conn is None and not pin.busy:  # nothing written, nothing held: no call
                pin.ended = True
            else:
                await self._await(lambda: end(pin), "cannot commit to the record", write=True)

    # ------------------------------------------------------------ the sync face

    def create_run(self, info: RunInfo) -> None:
        self._sync(self._create_run_op(info), f"cannot record run {info.run_id}", write=True)

    def _create_run_op(self, info: RunInfo) -> Callable[[Conn], Awaitable[None]]:
        import psycopg.errors

        info = new_run(info, self.ledger_key)

        async def op(conn: Conn) -> None:
            try:
                await conn.execute(insert_run_sql("%s"), run_row(info))
            except psycopg.errors.UniqueViolation:
                raise StoreError(f"run {info.run_id} already exists in {self.path}; run ids are never reused") from None

        return op

    def append(self, run_id: str, kind: str, data: dict[str, Any]) -> Event:
        return self.append_many(run_id, [(kind, data)])[0]

    def append_many(
        self,
        run_id: str,
        items: list[tuple[str, dict[str, Any]]],
        *,
        after: int | None = None,
        epoch: int | None = None,
    ) -> list[Event]:
        """Append ``items`` (kind, data) as consecutive events in one transaction: all or none.
        With ``after``, only if the run's last seq is still ``after`` (else :class:`MovedOnError`);
        with ``epoch``, only while that claim is the run's newest (else :class:`FencedError`),
        renewing it."""
        return self._wait(self._appending(run_id, items, after, epoch), f"cannot append to the record of run {run_id}")

    def _appending(
        self, run_id: str, items: list[tuple[str, dict[str, Any]]], after: int | None, epoch: int | None
    ) -> Callable[[], Coroutine[Any, Any, list[Event]]]:
        """The append as work for the I/O loop: on the pinned connection inside
        :meth:`transaction` (beginning it, in the append's first round trip, if nothing was
        written yet), else on a pooled one in a transaction of its own."""
        pin = self._pinned.get()

        async def own() -> list[Event]:  # a transaction of its own
            async with self._pool.connection() as conn:
                out, _ = await self._append_op(conn, run_id, items, after, epoch, around=OWN)
                self._used[id(conn)] = time.monotonic()
                return out

        async def in_block() -> list[Event]:
            assert pin is not None
            try:
                async with pin.turn:
                    pin.opened()
                    if pin.begun:  # a savepoint: a failed append leaves the block's other writes whole
                        await send_deferred(pin)
                        out, key = await self._append_op(pin.conn, run_id, items, after, epoch, around=NESTED)
                    else:  # the block's first write begins its transaction, left open
                        if pin.conn is None:
                            pin.conn = await self._pool.getconn()
                        pin.begun = True
                        try:
                            out, key = await self._append_op(pin.conn, run_id, items, after, epoch, around=FIRST)
                        except BaseException:
                            pin.begun = False  # rolled back: nothing of the block was written yet
                            raise
                    pin.locked(run_id, out, key, epoch)
                    return out
            finally:
                pin.leave()

        def start() -> Coroutine[Any, Any, list[Event]]:
            if pin is None:
                return own()
            pin.enter()  # on the caller's thread: nothing of the block is deferred meanwhile
            return in_block()

        return start

    async def _append_op(
        self,
        conn: Conn,
        run_id: str,
        items: list[tuple[str, dict[str, Any]]],
        after: int | None,
        epoch: int | None,
        *,
        around: tuple[str, str | None, str],
    ) -> tuple[list[Event], bytes | None]:
        """Two round trips, each one pipeline: ``around``'s opening (BEGIN, or a savepoint inside
        the pinned transaction), the run's lock, its head and its fence; then the rows with the
        head anchor, and ``around``'s closing (the commit, the savepoint's release, or none: the
        block's transaction stays open). Anything raised is undone by ``around``'s undo. The
        events, and the run's chain key."""
        opening, closing, undo = around
        try:
            async with conn.pipeline():
                await conn.execute(opening)
                # one writer per run at a time, on any machine (released at commit); then the
                # time, the run's last seq and hash, where a fork's seqs start (a snapshot taken
                # after the lock: every earlier append shows), and the fence
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (run_id,))
                head = await conn.execute(HEAD if epoch is None else FENCED_HEAD, head_args(run_id, epoch))
                now, last, last_hash, fork_seq, chain, renewed = await head.fetchone()
                key = chain_key(run_id, chain, self.ledger_key)
                if last is not None:
                    seq, prev = int(last), last_hash or ""
                else:  # a fork's first event continues after the seq it was forked at
                    seq = int(fork_seq or 0)
                    prev = chain_start(await self._run_on(conn, run_id), key) if key else ""
                if after is not None and seq != after:
                    raise MovedOnError(
                        f"run {run_id} moved on (its record is at seq {seq}, this writer read it to "
                        f"{after}): the write is refused"
                    )
                if epoch is not None and not renewed:
                    raise FencedError(fenced(run_id, epoch, await owner_row(conn, run_id)))
                rows, cards, out = chained(run_id, seq, prev, float(now), items, key)
                if rows:  # the events and the head anchor in one statement
                    await conn.execute(*events_and_head(run_id, rows, epoch))
                if cards:
                    async with conn.cursor() as cur:
                        await cur.executemany(INSERT_CARD, cards)
                if closing is not None:
                    await conn.execute(closing)
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.execute(undo)
            raise
        return out, key

    async def _run_on(self, conn: Conn, run_id: str) -> RunInfo:
        rows = await rows_of(conn, runs_sql(f"WHERE r.run_id = {self._mark}", self._mark), [run_id, 1])
        if not rows:
            raise NotFoundError(f"no run {run_id!r} in {self.path}. `loomrt runs list` shows the runs.")
        return run_info(rows[0])

    def head(self, run_id: str) -> tuple[int, str | None, int] | None:
        """The run's head anchor: (last seq, its hash, epoch), or None where none was kept."""
        rows = self._select("SELECT seq, hash, epoch FROM run_heads WHERE run_id = %s", (run_id,))
        return (int(rows[0][0]), rows[0][1], int(rows[0][2])) if rows else None

    def events(
        self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None, until: int | None = None
    ) -> list[Event]:
        sql, args = _events_sql(run_id, after, kinds, until)
        return _events(run_id, self._select(sql, args))

    def latest(self, run_id: str, kind: str, *, until: int | None = None) -> Event | None:
        rows = self._select(
            "SELECT seq, kind, ts, data, hash FROM events WHERE run_id = %s AND kind = %s AND seq <= %s "
            "ORDER BY seq DESC LIMIT 1",
            (run_id, kind, until if until is not None else 2**62),
        )
        return _events(run_id, rows)[0] if rows else None

    def cards(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        return {
            c: json.loads(d)
            for c, d in self._select("SELECT card_id, data FROM cards WHERE card_id = ANY(%s)", [wanted])
        }

    def pending(self, kind: str, settled_by: Iterable[str]) -> list[str]:
        rows = self._select(
            "SELECT q.run_id FROM events q WHERE q.kind = %s GROUP BY q.run_id "
            "HAVING MAX(q.seq) > COALESCE((SELECT MAX(s.seq) FROM events s WHERE s.run_id = q.run_id "
            "AND s.kind = ANY(%s)), 0) ORDER BY MIN(q.ts)",
            (kind, list(settled_by)),
        )
        return [r[0] for r in rows]

    def run_sums(self, run_ids: Iterable[str]) -> dict[str, RunSums]:
        """What each runs row sums, by run id, in one grouped query (``jsonb ->>``); unknown ids are left out."""

        def jsonb(alias: str, path: str) -> str:  # data is kept as text: read as jsonb
            *keys, last = path.split(".")
            return f"({alias}.data::jsonb" + "".join(f" -> '{k}'" for k in keys) + f" ->> '{last}')"

        wanted = list(dict.fromkeys(run_ids))
        sql = sums_sql("= ANY(%s)", jsonb)
        return run_sums(self._select(sql, [wanted, wanted])) if wanted else {}

    def _runs(self, where: str, args: list[Any], limit: int) -> list[RunInfo]:
        return [run_info(r) for r in self._select(runs_sql(where, self._mark), [*args, limit])]

    def close(self) -> None:
        """Close the pool's connections, and stop the I/O loop."""
        if self.closed:
            return
        self.closed = True
        self._io.close(self._pool.close())


def import_run(
    store: PostgresStore, info: RunInfo, events: list[Event], cards: list[tuple[str, int, int, str]]
) -> None:
    """Write one run's record as it is elsewhere (seqs, times and hashes kept), all or nothing:
    ``loomrt db copy``'s writer (:mod:`loomrt.record.copy`); never for a run that exists."""

    async def op(conn: Conn) -> None:
        async with conn.transaction(), conn.cursor() as cur:
            await cur.execute(insert_run_sql("%s"), run_row(info))
            await cur.executemany(
                _INSERT_EVENT, [(e.run_id, e.seq, e.kind, e.ts, canonical(e.data), e.hash) for e in events]
            )
            await cur.executemany(INSERT_CARD, [(c, info.run_id, s, d, data) for c, s, d, data in cards])
            if events:
                await _move_head(cur, info.run_id, events[-1].seq, events[-1].hash, None)

    store._sync(op, f"cannot copy run {info.run_id}", write=True)


def _events_sql(run_id: str, after: int, kinds: Iterable[str] | None, until: int | None) -> tuple[str, list[Any]]:
    sql = "SELECT seq, kind, ts, data, hash FROM events WHERE run_id = %s AND seq > %s"
    args: list[Any] = [run_id, after]
    if until is not None:
        sql += " AND seq <= %s"
        args.append(until)
    wanted = list(kinds or [])
    if wanted:
        sql += " AND kind = ANY(%s)"
        args.append(wanted)
    return sql + " ORDER BY seq", args


def _events(run_id: str, rows: list[tuple[Any, ...]]) -> list[Event]:
    return [Event(run_id=run_id, seq=s, kind=k, ts=t, data=json.loads(d), hash=h) for s, k, t, d, h in rows]


async def _move_head(cur: Any, run_id: str, seq: int, hash_: str | None, epoch: int | None) -> None:
    """Move the run's head anchor to its new last event (inside the append's transaction)."""
    await cur.execute(MOVE_HEAD, (run_id, seq, hash_, epoch or 0))


def run_cards(store: PostgresStore, run_id: str) -> list[tuple[str, int, int, str]]:
    """The card index rows run ``run_id`` wrote: (card id, seq, depth, data)."""
    return [
        (c, int(s), int(d), data)
        for c, s, d, data in store._select(
            "SELECT card_id, seq, depth, data FROM cards WHERE run_id = %s ORDER BY seq", (run_id,)
        )
    ]
