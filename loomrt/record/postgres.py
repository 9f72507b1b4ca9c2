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

The async face completes inline, as SQLite's does (the run core's sync entry points drive
it without an event loop; see :func:`loomrt.runtime.drive`): each append is one round trip
to the database while the caller waits.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from loomrt.errors import FencedError, MovedOnError, StoreError
from loomrt.events import Event, RunInfo
from loomrt.record import pg_migrations
from loomrt.record.inline import InlineAsyncFace
from loomrt.record.ledger import canonical, ledger_key
from loomrt.record.owners import FENCE, claimed, fenced, owner_rows
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

_NOW = "extract(epoch from clock_timestamp())"


def redact_url(url: str) -> str:
    """``url`` without its password (for messages and logs)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    auth, host = rest.rsplit("@", 1)
    user = auth.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in auth else ''}@{host}"


class PostgresStore(InlineAsyncFace, RunReads):
    """Append-only record in a PostgreSQL database (``postgresql://...``)."""

    shared = True
    """Several machines share it: each runtime claims the runs it plays."""
    _mark = "%s"
    """psycopg's placeholder (:class:`~loomrt.record.rows.RunReads`)."""
    _now = _NOW
    """The database's clock (claims expire by it on every machine)."""

    def __init__(self, url: str, *, pool_size: int = 4, check: bool = True):
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise StoreError(
                f"LOOMRT_DB_URL names PostgreSQL, but psycopg is not installed ({exc}). "
                "Install it with: pip install 'loomrt[postgres]'"
            ) from None
        self.url = url
        self.ledger_key = ledger_key()
        """The deployment's ledger key (:mod:`loomrt.record.ledger`): new runs are chained v2 with it."""
        self.path = redact_url(url)
        """Where the record is, as messages name it (the URL without its password)."""
        self._errors = psycopg.Error
        try:
            # one connection first: a server that is not there is its own error at once,
            # where the pool would retry for its whole 30-second timeout and say only that
            given = psycopg.conninfo.conninfo_to_dict(url)
            probe = url if "connect_timeout" in given else psycopg.conninfo.make_conninfo(url, connect_timeout=10)
            psycopg.connect(probe, autocommit=True).close()
            self._pool = ConnectionPool(
                url,
                min_size=1,
                max_size=pool_size,
                open=True,
                timeout=30,
                kwargs={"autocommit": True},
                name="loomrt-record",
                check=ConnectionPool.check_connection,  # a server restart leaves no dead connection to hand out
            )
            self._pool.wait(timeout=30)
        except Exception as exc:  # noqa: BLE001 - any failure to connect is one clear error
            detail = " ".join(str(exc).split()).rstrip(".")  # libpq's message, on one line
            raise StoreError(
                f"cannot connect to the record at {self.path}: {detail}{'' if detail.endswith('?') else '.'} "
                "Check LOOMRT_DB_URL and that the server is running."
            ) from None
        self._pinned: contextvars.ContextVar[Any] = contextvars.ContextVar(f"loomrt-pg-{id(self)}", default=None)
        self.closed = False
        self._listener: Any = None
        """The connection that LISTENs for work (:meth:`wait_for_work`), opened on first use."""
        self.newer_migrations: list[str] = []
        """Migrations the database has that this version does not know (a rolling upgrade)."""
        if check:
            with self._conn() as conn:
                try:
                    self.newer_migrations = pg_migrations.check_schema(conn, self.path)
                except StoreError:
                    self._pool.close()
                    raise

    @contextlib.contextmanager
    def _conn(self) -> Iterator[Any]:
        """A connection: the task's pinned one inside :meth:`transaction`, else a pooled one."""
        pinned = self._pinned.get()
        if pinned is not None:
            yield pinned
            return
        with self._pool.connection() as conn:
            yield conn

    def _fail(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"{what} at {self.path}: {str(exc).strip()}")

    # the async face: InlineAsyncFace (write_run, write, write_many, read)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """Everything appended inside is committed together at the end (also when the block
        raises, as on SQLite: what was appended is what the run saw); a process killed inside
        commits nothing. Blocks nest."""
        if self._pinned.get() is not None:
            yield
            return
        with contextlib.ExitStack() as stack:
            try:  # a server down longer than the pool waits is the record's error, not a bug
                conn = stack.enter_context(self._pool.connection())
                conn.execute("BEGIN")
            except self._errors as exc:
                raise self._fail("cannot begin a transaction on the record", exc) from exc
            token = self._pinned.set(conn)
            try:
                yield
            finally:
                self._pinned.reset(token)
                try:
                    conn.execute("COMMIT")
                except self._errors as exc:
                    raise self._fail("cannot commit to the record", exc) from exc

    # the sync face

    def create_run(self, info: RunInfo) -> None:
        import psycopg.errors

        info = new_run(info, self.ledger_key)
        try:
            with self._conn() as conn:
                conn.execute(insert_run_sql("%s"), run_row(info))
        except psycopg.errors.UniqueViolation:
            raise StoreError(f"run {info.run_id} already exists in {self.path}; run ids are never reused") from None
        except self._errors as exc:
            raise self._fail(f"cannot record run {info.run_id}", exc) from exc

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
        out: list[Event] = []
        try:
            with self._conn() as conn, conn.transaction():
                # one writer per run at a time, on any machine; released at commit
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (run_id,))
                # the time, the run's last seq and hash, and where a fork's seqs start: one round
                # trip, in a snapshot taken after the lock (read committed: every earlier append shows)
                now, last, last_hash, fork_seq, chain = conn.execute(
                    f"SELECT {_NOW}, last.seq, last.hash, r.fork_seq, r.chain FROM "
                    "(SELECT 1) one LEFT JOIN LATERAL (SELECT seq, hash FROM events WHERE run_id = %s "
                    "ORDER BY seq DESC LIMIT 1) last ON true LEFT JOIN runs r ON r.run_id = %s",
                    (run_id, run_id),
                ).fetchone()
                ts = float(now)
                key = chain_key(run_id, chain, self.ledger_key)
                if last is not None:
                    seq, prev = int(last), last_hash or ""
                else:  # a fork's first event continues after the seq it was forked at
                    seq, prev = int(fork_seq or 0), (chain_start(self.get_run(run_id), key) if key else "")
                if after is not None and seq != after:
                    raise MovedOnError(
                        f"run {run_id} moved on (its record is at seq {seq}, this writer read it to "
                        f"{after}): the write is refused"
                    )
                if (
                    epoch is not None
                    and conn.execute(
                        f"UPDATE run_owners SET expires_at = %s + ttl_s WHERE run_id = %s AND epoch = %s AND {FENCE}",
                        (ts, run_id, epoch),
                    ).rowcount
                    == 0
                ):
                    raise FencedError(fenced(run_id, epoch, self._owner_row(conn, run_id)))
                rows, cards, out = chained(run_id, seq, prev, ts, items, key)
                with conn.cursor() as cur:
                    if len(rows) == 1:  # executemany prepares; one row needs one round trip
                        cur.execute(
                            "INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES (%s, %s, %s, %s, %s, %s)",
                            rows[0],
                        )
                    else:
                        cur.executemany(
                            "INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES (%s, %s, %s, %s, %s, %s)",
                            rows,
                        )
                    if cards:
                        cur.executemany(
                            "INSERT INTO cards (card_id, run_id, seq, depth, data) VALUES (%s, %s, %s, %s, %s) "
                            "ON CONFLICT (card_id) DO NOTHING",
                            cards,
                        )
                    if rows:
                        _move_head(cur, run_id, rows[-1][1], rows[-1][5], epoch)
        except (MovedOnError, FencedError):
            raise
        except self._errors as exc:
            raise self._fail(f"cannot append to the record of run {run_id}", exc) from exc
        return out

    def _select(self, sql: str, args: Iterable[Any]) -> list[tuple[Any, ...]]:
        try:
            with self._conn() as conn:
                return list(conn.execute(sql, list(args)).fetchall())
        except self._errors as exc:
            raise self._fail("cannot read the record", exc) from exc

    def head(self, run_id: str) -> tuple[int, str | None, int] | None:
        """The run's head anchor: (last seq, its hash, epoch), or None where none was kept."""
        rows = self._select("SELECT seq, hash, epoch FROM run_heads WHERE run_id = %s", (run_id,))
        return (int(rows[0][0]), rows[0][1], int(rows[0][2])) if rows else None

    def events(
        self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None, until: int | None = None
    ) -> list[Event]:
        sql = "SELECT seq, kind, ts, data, hash FROM events WHERE run_id = %s AND seq > %s"
        args: list[Any] = [run_id, after]
        if until is not None:
            sql += " AND seq <= %s"
            args.append(until)
        kinds = list(kinds or [])
        if kinds:
            sql += " AND kind = ANY(%s)"
            args.append(kinds)
        return [
            Event(run_id=run_id, seq=s, kind=k, ts=t, data=json.loads(d), hash=h)
            for s, k, t, d, h in self._select(sql + " ORDER BY seq", args)
        ]

    def latest(self, run_id: str, kind: str, *, until: int | None = None) -> Event | None:
        rows = self._select(
            "SELECT seq, kind, ts, data, hash FROM events WHERE run_id = %s AND kind = %s AND seq <= %s "
            "ORDER BY seq DESC LIMIT 1",
            (run_id, kind, until if until is not None else 2**62),
        )
        if not rows:
            return None
        s, k, t, d, h = rows[0]
        return Event(run_id=run_id, seq=s, kind=k, ts=t, data=json.loads(d), hash=h)

    def cards(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        return {
            c: json.loads(d)
            for c, d in self._select("SELECT card_id, data FROM cards WHERE card_id = ANY(%s)", [wanted])
        }

    def take_lease(self, name: str, holder: str, ttl_s: float, *, replacing: str | None = None) -> bool:
        """Hold lease ``name`` for ``ttl_s`` seconds of database time: True if ``holder`` has it
        now (it was free, expired, already its own, or ``replacing``'s)."""
        try:
            with self._conn() as conn:
                row = conn.execute(
                    f"INSERT INTO leases (name, holder, expires_at) VALUES (%s, %s, {_NOW} + %s) "
                    f"ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at "
                    f"WHERE leases.holder = excluded.holder OR leases.holder = %s OR leases.expires_at <= {_NOW} "
                    "RETURNING holder",
                    (name, holder, ttl_s, replacing),
                ).fetchone()
        except self._errors as exc:
            raise self._fail(f"cannot take lease {name}", exc) from exc
        return row is not None

    def lease_holder(self, name: str) -> str | None:
        rows = self._select(f"SELECT holder FROM leases WHERE name = %s AND expires_at > {_NOW}", (name,))
        return rows[0][0] if rows else None

    def release_lease(self, name: str, holder: str) -> None:
        try:
            with self._conn() as conn:
                conn.execute("DELETE FROM leases WHERE name = %s AND holder = %s", (name, holder))
        except self._errors as exc:
            raise self._fail(f"cannot release lease {name}", exc) from exc

    @staticmethod
    def _owner_row(conn: Any, run_id: str) -> tuple[str, int, float] | None:
        row = conn.execute("SELECT owner, epoch, expires_at FROM run_owners WHERE run_id = %s", (run_id,)).fetchone()
        return (row[0], int(row[1]), float(row[2])) if row else None

    def claim_run(self, run_id: str, owner: str, ttl_s: float) -> int:
        """Own run ``run_id`` for ``ttl_s`` seconds of database time (renewed by each fenced
        append): its epoch. Refused (:class:`RunOwnedError`) while another owner's claim is live;
        of two workers racing for one run, one wins."""
        try:
            with self._conn() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (run_id,))
                now = float(conn.execute(f"SELECT {_NOW}").fetchone()[0])
                high = conn.execute("SELECT epoch FROM run_epochs WHERE run_id = %s", (run_id,)).fetchone()
                epoch = claimed(run_id, owner, self._owner_row(conn, run_id), now, int(high[0]) if high else 0)
                conn.execute(  # the run's highest epoch: only ever raised (a trigger refuses less)
                    "INSERT INTO run_epochs (run_id, epoch) VALUES (%s, %s) ON CONFLICT (run_id) "
                    "DO UPDATE SET epoch = excluded.epoch WHERE run_epochs.epoch < excluded.epoch",
                    (run_id, epoch),
                )
                conn.execute(
                    "INSERT INTO run_owners (run_id, owner, epoch, ttl_s, expires_at) VALUES (%s, %s, %s, %s, %s) "
                    "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch, "
                    "ttl_s = excluded.ttl_s, expires_at = excluded.expires_at",
                    (run_id, owner, epoch, ttl_s, now + ttl_s),
                )
                return epoch
        except self._errors as exc:
            raise self._fail(f"cannot claim run {run_id}", exc) from exc

    def renew_run(self, run_id: str, owner: str, epoch: int, ttl_s: float) -> bool:
        """A heartbeat: the claim at ``epoch`` holds ``ttl_s`` more seconds of database time;
        False once it is not the run's (taken over, or let go). Never a new claim."""
        try:
            with self._conn() as conn:
                return bool(
                    conn.execute(
                        f"UPDATE run_owners SET ttl_s = %s, expires_at = {_NOW} + %s "
                        f"WHERE run_id = %s AND owner = %s AND epoch = %s AND expires_at > 0 AND {FENCE}",
                        (ttl_s, ttl_s, run_id, owner, epoch),
                    ).rowcount
                )
        except self._errors as exc:
            raise self._fail(f"cannot renew the claim on run {run_id}", exc) from exc

    def release_run(self, run_id: str, owner: str, epoch: int) -> None:
        """Let the run go (its lease expires now; its epoch stays)."""
        try:
            with self._conn() as conn:
                conn.execute(
                    "UPDATE run_owners SET expires_at = 0 WHERE run_id = %s AND owner = %s AND epoch = %s",
                    (run_id, owner, epoch),
                )
        except self._errors as exc:
            raise self._fail(f"cannot release run {run_id}", exc) from exc

    def run_owners(self, *, expired: bool = False) -> list[dict[str, Any]]:
        """The live claims (with ``expired``: the lapsed ones, released or not): run id, owner,
        epoch and seconds left, soonest to expire first."""
        rows = self._select(
            f"SELECT run_id, owner, epoch, expires_at, ttl_s, {_NOW} FROM run_owners "
            f"WHERE expires_at {'<=' if expired else '>'} {_NOW} ORDER BY expires_at",
            (),
        )
        return owner_rows(rows, float(rows[0][5]) if rows else 0.0)

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

    def announce(self, run_id: str) -> None:
        """Wake the idle workers: ``NOTIFY loomrt_work, 'run:RUN_ID'`` (ids only, never content)."""
        try:
            with self._conn() as conn:
                conn.execute("SELECT pg_notify('loomrt_work', %s)", (f"run:{run_id}",))
        except self._errors:  # a worker that misses it finds the run when it next looks
            pass

    def wait_for_work(self, timeout_s: float) -> bool:
        """Wait for a NOTIFY on ``loomrt_work`` for at most ``timeout_s`` seconds: True if one
        came. On a listening connection that drops, sleep out the time instead (polling) and
        listen again next time."""
        import psycopg

        try:
            if self._listener is None:
                self._listener = psycopg.connect(self.url, autocommit=True)
                self._listener.execute("LISTEN loomrt_work")
            return any(True for _ in self._listener.notifies(timeout=timeout_s, stop_after=1))
        except psycopg.Error:
            if self._listener is not None:
                with contextlib.suppress(psycopg.Error):
                    self._listener.close()
            self._listener = None
            time.sleep(timeout_s)
            return False

    def close(self) -> None:
        """Close the pool's connections (and the listening one)."""
        self.closed = True
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._listener.close()
        self._pool.close()


def import_run(
    store: PostgresStore, info: RunInfo, events: list[Event], cards: list[tuple[str, int, int, str]]
) -> None:
    """Write one run's record as it is elsewhere (seqs, times and hashes kept), all or nothing:
    ``loomrt db copy``'s writer (:mod:`loomrt.record.copy`); never for a run that exists."""
    with store._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
        cur.execute(insert_run_sql("%s"), run_row(info))
        cur.executemany(
            "INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES (%s, %s, %s, %s, %s, %s)",
            [(e.run_id, e.seq, e.kind, e.ts, canonical(e.data), e.hash) for e in events],
        )
        cur.executemany(
            "INSERT INTO cards (card_id, run_id, seq, depth, data) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (card_id) DO NOTHING",
            [(c, info.run_id, s, d, data) for c, s, d, data in cards],
        )
        if events:
            _move_head(cur, info.run_id, events[-1].seq, events[-1].hash, None)


def _move_head(cur: Any, run_id: str, seq: int, hash_: str | None, epoch: int | None) -> None:
    """Move the run's head anchor to its new last event (inside the append's transaction)."""
    cur.execute(
        "INSERT INTO run_heads (run_id, seq, hash, epoch) VALUES (%s, %s, %s, %s) ON CONFLICT (run_id) DO UPDATE "
        "SET seq = excluded.seq, hash = excluded.hash, epoch = GREATEST(run_heads.epoch, excluded.epoch)",
        (run_id, seq, hash_, epoch or 0),
    )


def run_cards(store: PostgresStore, run_id: str) -> list[tuple[str, int, int, str]]:
    """The card index rows run ``run_id`` wrote: (card id, seq, depth, data)."""
    return [
        (c, int(s), int(d), data)
        for c, s, d, data in store._select(
            "SELECT card_id, seq, depth, data FROM cards WHERE run_id = %s ORDER BY seq", (run_id,)
        )
    ]
