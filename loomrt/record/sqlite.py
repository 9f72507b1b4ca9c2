"""The SQLite store: one WAL-mode file under ``$LOOMRT_HOME`` (default ``~/.loomrt``)."""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from loomrt.errors import FencedError, MovedOnError, StoreError
from loomrt.events import Event, RunInfo
from loomrt.record import checkpoints
from loomrt.record.inline import InlineAsyncFace
from loomrt.record.ledger import canonical, ledger_key
from loomrt.record.migrations import migrate
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

__all__ = ["SQLiteStore", "loomrt_home", "default_store", "import_run", "run_cards"]


def loomrt_home() -> Path:
    """``$LOOMRT_HOME``, else ``~/.loomrt`` (created on first use)."""
    home = Path(os.environ.get("LOOMRT_HOME") or Path.home() / ".loomrt").expanduser()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"cannot use {home} as LOOMRT_HOME: {exc.strerror or exc}"
            + (f" ({exc.filename} is in the way)" if exc.filename and str(exc.filename) != str(home) else "")
            + ". Set LOOMRT_HOME to a folder you can write, or LOOMRT_DB_URL=sqlite:PATH."
        ) from None
    if not os.access(home, os.W_OK):
        raise StoreError(f"LOOMRT_HOME {home} is not writable. Set LOOMRT_HOME to a folder you can write.")
    return home


def _hint(exc: sqlite3.Error) -> str:
    """What to do about a write that failed for want of room."""
    text = str(exc).lower()
    if "disk" in text or "full" in text:
        return (
            ". The disk may be full: free some space (nothing committed is lost; "
            "`loomrt runs resume` goes on from the last committed event)"
        )
    return ""


def default_store(url: str | None = None) -> Any:
    """The store this process uses, chosen in one place from configuration: ``url``, else
    ``$LOOMRT_DB_URL`` (``sqlite:PATH`` or ``postgresql://...``), else
    ``$LOOMRT_HOME/record.sqlite``."""
    url = (url if url is not None else os.environ.get("LOOMRT_DB_URL", "")).strip()
    if not url:
        return SQLiteStore(loomrt_home() / "record.sqlite")
    if url.startswith("sqlite:"):
        path = Path(url.removeprefix("sqlite:").removeprefix("//")).expanduser()
        if str(path) != ":memory:" and not path.parent.is_dir():
            # an explicit URL names a file: a typo must not create folders and an empty record
            raise StoreError(
                f"the record's folder {path.parent} does not exist (from the URL {url!r}). Create it, or fix "
                "the path; unset LOOMRT_DB_URL to use $LOOMRT_HOME/record.sqlite."
            )
        return SQLiteStore(path)
    if url.startswith(("postgresql://", "postgres://")):
        from loomrt.record.postgres import PostgresStore

        return PostgresStore(url)
    scheme = url.split(":", 1)[0]
    raise StoreError(
        f"LOOMRT_DB_URL={scheme}:... is not a store this version of loomrt has (sqlite:PATH or "
        "postgresql://USER@HOST/DB). Unset LOOMRT_DB_URL to use $LOOMRT_HOME/record.sqlite."
    )


_NEW_CARD = (
    "INSERT INTO cards (card_id, run_id, seq, depth, data) SELECT ?, ?, ?, ?, ? "
    "WHERE NOT EXISTS (SELECT 1 FROM cards WHERE card_id = ?)"
)
"""A card is written once: an id the index has already (a fork's refold of the same cards)
is left as it is; any other insert of an existing id is refused by a trigger."""


_WALK_CHEAP = 1024
"""A range of fewer seqs than this is walked in one read: counting its kinds first would
cost more than the walk (a turn's reads of a short run)."""


class SQLiteStore(InlineAsyncFace, RunReads):
    """Append-only record in one SQLite file. Safe to share between threads of one process."""

    shared = False
    """One machine's file: runs need no claim."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.ledger_key = ledger_key()
        """The deployment's ledger key (:mod:`loomrt.record.ledger`): new runs are chained v2 with it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = self._open()
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot open the record at {self.path}: {exc}. "
                "Check the path and its permissions, or set LOOMRT_HOME to another folder."
            ) from exc
        self._lock = threading.RLock()
        self._atomic = 0  # open transaction() blocks: appends join their transaction
        self.closed = False
        if str(path) != ":memory:":
            checkpoints.register(self)  # the WAL is checkpointed by a thread, not inside a commit

    @property
    def commits(self) -> int:
        """Rows written through this store so far (the checkpoint thread watches it move)."""
        try:
            return int(self._conn.total_changes)
        except sqlite3.Error:
            return -1

    def _open(self) -> sqlite3.Connection:
        """Connect, set the pragmas and migrate. Switching a fresh file to WAL takes a lock
        that the busy timeout does not cover, so two processes opening one new file at once
        retry here for a while instead of failing with "database is locked"."""
        deadline = time.monotonic() + 30
        while True:
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            try:
                conn.execute("PRAGMA busy_timeout=5000")
                conn.execute("PRAGMA foreign_keys=ON")  # no event without its run
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA wal_autocheckpoint=0")  # see loomrt.record.checkpoints
                migrate(conn)
                return conn
            except sqlite3.OperationalError as exc:
                conn.close()
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    # the async face: InlineAsyncFace (write_run, write, write_many, read)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """Everything appended inside is committed together at the end (also when the block
        raises: what was appended is what the run saw); a process killed inside commits
        nothing. Blocks nest; the write lock is held throughout, so keep them short (no
        model or tool calls inside)."""
        with self._lock:
            outer = self._atomic == 0
            if outer:
                try:
                    self._conn.execute("BEGIN IMMEDIATE")
                except sqlite3.Error as exc:
                    raise StoreError(
                        f"cannot open a transaction on the record at {self.path}: {exc}{_hint(exc)}"
                    ) from exc
            self._atomic += 1
            try:
                yield
            finally:
                self._atomic -= 1
                if outer and self._conn.in_transaction:
                    try:
                        self._conn.execute("COMMIT")
                    except sqlite3.Error as exc:
                        raise StoreError(f"cannot commit to the record at {self.path}: {exc}{_hint(exc)}") from exc

    # the sync face

    def create_run(self, info: RunInfo) -> None:
        info = new_run(info, self.ledger_key)
        with self._lock:
            try:
                self._conn.execute(insert_run_sql("?"), run_row(info))
            except sqlite3.IntegrityError:
                raise StoreError(f"run {info.run_id} already exists in {self.path}; run ids are never reused") from None
            except sqlite3.Error as exc:
                raise StoreError(f"cannot record run {info.run_id} in {self.path}: {exc}{_hint(exc)}") from exc

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
        ts = time.time()
        out: list[Event] = []
        with self._lock:
            try:  # the next seq and its hash are taken under the write lock
                if not self._atomic:
                    self._conn.execute("BEGIN IMMEDIATE")
                chain, fork_seq, last, last_hash = self._conn.execute(
                    "SELECT r.chain, r.fork_seq, e.seq, e.hash FROM (SELECT ? AS run_id) one "
                    "LEFT JOIN runs r ON r.run_id = one.run_id LEFT JOIN events e ON e.run_id = one.run_id "
                    "AND e.seq = (SELECT MAX(seq) FROM events WHERE run_id = one.run_id)",
                    (run_id,),
                ).fetchone()
                key = chain_key(run_id, chain, self.ledger_key)
                if last is None:  # a fork's first event continues after the seq it was forked at
                    seq, prev = fork_seq or 0, (chain_start(self.get_run(run_id), key) if key else "")
                else:
                    seq, prev = last, last_hash or ""
                if after is not None and seq != after:
                    raise MovedOnError(
                        f"run {run_id} moved on (its record is at seq {seq}, this writer read it to "
                        f"{after}): the write is refused"
                    )
                if (
                    epoch is not None
                    and not self._conn.execute(
                        f"UPDATE run_owners SET expires_at = ? + ttl_s WHERE run_id = ? AND epoch = ? AND {FENCE}",
                        (ts, run_id, epoch),
                    ).rowcount
                ):
                    raise FencedError(fenced(run_id, epoch, self._owner_row(run_id)))
                rows, cards, out = chained(run_id, seq, prev, ts, items, key)
                self._conn.executemany(
                    "INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES (?, ?, ?, ?, ?, ?)", rows
                )
                self._conn.executemany(_NEW_CARD, [(*c, c[0]) for c in cards])
                if rows:
                    self._move_head(run_id, rows[-1][1], rows[-1][5], epoch)
                if not self._atomic:
                    self._conn.execute("COMMIT")
            except (MovedOnError, FencedError):
                if self._conn.in_transaction and not self._atomic:
                    self._conn.execute("ROLLBACK")
                raise
            except sqlite3.Error as exc:
                if self._conn.in_transaction and not self._atomic:
                    self._conn.execute("ROLLBACK")
                raise StoreError(f"cannot append to the record of run {run_id}: {exc}{_hint(exc)}") from exc
        return out

    def _move_head(self, run_id: str, seq: int, hash_: str | None, epoch: int | None) -> None:
        """Move the run's head anchor to its new last event (inside the append's transaction)."""
        moved = self._conn.execute(
            "UPDATE run_heads SET seq = ?, hash = ?, epoch = MAX(epoch, ?) WHERE run_id = ?",
            (seq, hash_, epoch or 0, run_id),
        ).rowcount
        if not moved:
            self._conn.execute(
                "INSERT INTO run_heads (run_id, seq, hash, epoch) VALUES (?, ?, ?, ?)", (run_id, seq, hash_, epoch or 0)
            )

    def head(self, run_id: str) -> tuple[int, str | None, int] | None:
        """The run's head anchor: (last seq, its hash, epoch), or None where none was kept."""
        with self._lock:
            row = self._conn.execute("SELECT seq, hash, epoch FROM run_heads WHERE run_id = ?", (run_id,)).fetchone()
        return (int(row[0]), row[1], int(row[2])) if row else None

    def events(
        self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None, until: int | None = None
    ) -> list[Event]:
        sql = "SELECT seq, kind, ts, data, hash FROM events WHERE run_id = ? AND seq > ?"
        args: list[Any] = [run_id, after]
        if until is not None:
            sql += " AND seq <= ?"
            args.append(until)
        kinds = list(dict.fromkeys(kinds or []))
        with self._lock:
            top = self._few_up_to(run_id, kinds, after, until) if len(kinds) > 1 else None
            if top is not None:
                # one read per kind down the (run_id, kind, seq) index, merged in seq order:
                # for a few events of a long run (the private marks of a fork's history) the
                # planner would walk every event of the range, whatever their kind. Each read
                # stops at the seq last counted, so an append from another process between
                # them cannot show in one kind's read and be missing from another's.
                one = "SELECT seq, kind, ts, data, hash FROM events WHERE run_id = ? AND kind = ? AND seq > ? AND seq <= ? ORDER BY seq"
                parts = [self._conn.execute(one, (run_id, k, after, top)).fetchall() for k in kinds]
                rows = list(heapq.merge(*parts))  # a run's seqs are unique: only seq is compared
            else:
                if kinds:
                    sql += f" AND kind IN ({','.join('?' * len(kinds))})"
                    args += kinds
                rows = self._conn.execute(sql + " ORDER BY seq", args).fetchall()
        return [Event(run_id=run_id, seq=s, kind=k, ts=t, data=json.loads(d), hash=h) for s, k, t, d, h in rows]

    def _few_up_to(self, run_id: str, kinds: list[str], after: int, until: int | None) -> int | None:
        """The seq to read ``kinds`` up to kind by kind (``until``, or the run's last seq when
        that is lower), when their events are under a quarter of the run's seqs in the range
        (counted in the kind index alone, which holds the seq); None when walking the range
        is as cheap (a short range is walked without counting)."""
        (last,) = self._conn.execute("SELECT MAX(seq) FROM events WHERE run_id = ?", (run_id,)).fetchone()
        if last is None:
            return None
        top = int(last) if until is None else min(until, int(last))
        if top - after < _WALK_CHEAP:
            return None
        found = 0
        for kind in kinds:
            (n,) = self._conn.execute(
                "SELECT COUNT(*) FROM events WHERE run_id = ? AND kind = ? AND seq > ? AND seq <= ?",
                (run_id, kind, after, top),
            ).fetchone()
            found += n
        return top if found * 4 < top - after else None

    def latest(self, run_id: str, kind: str, *, until: int | None = None) -> Event | None:
        """The run's last event of ``kind`` (at or before ``until``), or None."""
        with self._lock:
            row = self._conn.execute(
                "SELECT seq, kind, ts, data, hash FROM events WHERE run_id = ? AND seq = (SELECT MAX(seq) FROM events "
                "WHERE run_id = ? AND kind = ? AND seq <= ?)",
                (run_id, run_id, kind, until if until is not None else 2**62),
            ).fetchone()
        if row is None:
            return None
        s, k, t, d, h = row
        return Event(run_id=run_id, seq=s, kind=k, ts=t, data=json.loads(d), hash=h)

    def cards(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Fold's cards by id (as their distillation events hold them), for the family of runs
        that shares them; ids no run wrote are left out."""
        wanted = list(dict.fromkeys(ids))
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for i in range(0, len(wanted), 500):
                chunk = wanted[i : i + 500]
                rows = self._conn.execute(
                    f"SELECT card_id, data FROM cards WHERE card_id IN ({','.join('?' * len(chunk))})", chunk
                ).fetchall()
                out.update({c: json.loads(d) for c, d in rows})
        return out

    def take_lease(self, name: str, holder: str, ttl_s: float, *, replacing: str | None = None) -> bool:
        """Hold lease ``name`` for ``ttl_s`` seconds: True if ``holder`` has it now (it was
        free, expired, already its own, or ``replacing``'s), False if another holder's has
        not expired."""
        now = time.time()
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                row = self._conn.execute("SELECT holder, expires_at FROM leases WHERE name = ?", (name,)).fetchone()
                if row is not None and row[0] not in (holder, replacing) and row[1] > now:
                    self._conn.execute("ROLLBACK")
                    return False
                self._conn.execute(
                    "INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE "
                    "SET holder = excluded.holder, expires_at = excluded.expires_at",
                    (name, holder, now + ttl_s),
                )
                self._conn.execute("COMMIT")
                return True
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise StoreError(f"cannot take lease {name} in {self.path}: {exc}{_hint(exc)}") from exc

    def lease_holder(self, name: str) -> str | None:
        """Who holds lease ``name`` now (None: nobody, or it expired)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT holder FROM leases WHERE name = ? AND expires_at > ?", (name, time.time())
            ).fetchone()
        return row[0] if row else None

    def release_lease(self, name: str, holder: str) -> None:
        """Give lease ``name`` back (if ``holder`` still has it)."""
        with self._lock:
            self._conn.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))

    def _owner_row(self, run_id: str) -> tuple[str, int, float] | None:
        row = self._conn.execute(
            "SELECT owner, epoch, expires_at FROM run_owners WHERE run_id = ?", (run_id,)
        ).fetchone()
        return (row[0], int(row[1]), float(row[2])) if row else None

    def claim_run(self, run_id: str, owner: str, ttl_s: float) -> int:
        """Own run ``run_id`` for ``ttl_s`` seconds (renewed by each fenced append): its epoch.
        Refused (:class:`RunOwnedError`) while another owner's claim is live."""
        now = time.time()
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                high = self._conn.execute("SELECT epoch FROM run_epochs WHERE run_id = ?", (run_id,)).fetchone()
                epoch = claimed(run_id, owner, self._owner_row(run_id), now, int(high[0]) if high else 0)
                if high is None:
                    self._conn.execute("INSERT INTO run_epochs (run_id, epoch) VALUES (?, ?)", (run_id, epoch))
                elif epoch > int(high[0]):
                    self._conn.execute("UPDATE run_epochs SET epoch = ? WHERE run_id = ?", (epoch, run_id))
                self._conn.execute(
                    "INSERT INTO run_owners (run_id, owner, epoch, ttl_s, expires_at) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT(run_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch, "
                    "ttl_s = excluded.ttl_s, expires_at = excluded.expires_at",
                    (run_id, owner, epoch, ttl_s, now + ttl_s),
                )
                self._conn.execute("COMMIT")
                return epoch
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def renew_run(self, run_id: str, owner: str, epoch: int, ttl_s: float) -> bool:
        """A heartbeat: the claim at ``epoch`` holds ``ttl_s`` more; False once it is not the
        run's (taken over, or let go). Never a new claim."""
        with self._lock:
            return bool(
                self._conn.execute(
                    "UPDATE run_owners SET ttl_s = ?, expires_at = ? "
                    f"WHERE run_id = ? AND owner = ? AND epoch = ? AND expires_at > 0 AND {FENCE}",
                    (ttl_s, time.time() + ttl_s, run_id, owner, epoch),
                ).rowcount
            )

    def release_run(self, run_id: str, owner: str, epoch: int) -> None:
        """Let the run go (its lease expires now; its epoch stays)."""
        with self._lock:
            self._conn.execute(
                "UPDATE run_owners SET expires_at = 0 WHERE run_id = ? AND owner = ? AND epoch = ?",
                (run_id, owner, epoch),
            )

    def run_owners(self, *, expired: bool = False) -> list[dict[str, Any]]:
        """The live claims (with ``expired``: the lapsed ones, released or not): run id, owner,
        epoch and seconds left, soonest to expire first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT run_id, owner, epoch, expires_at, ttl_s FROM run_owners WHERE "
                f"expires_at {'<=' if expired else '>'} ? ORDER BY expires_at",
                (time.time(),),
            ).fetchall()
        return owner_rows(rows, time.time())

    def pending(self, kind: str, settled_by: Iterable[str]) -> list[str]:
        """The runs whose last ``kind`` event (a ``fold_queued``) came after their last
        ``settled_by`` one: work queued for them and not yet done, oldest request first."""
        settled = list(settled_by)
        marks = ",".join("?" * len(settled))
        with self._lock:
            rows = self._conn.execute(
                f"SELECT q.run_id, MAX(q.seq) AS last, MIN(q.ts) FROM events q WHERE q.kind = ? GROUP BY q.run_id "
                f"HAVING last > COALESCE((SELECT MAX(s.seq) FROM events s WHERE s.run_id = q.run_id "
                f"AND s.kind IN ({marks})), 0) ORDER BY MIN(q.ts)",
                [kind, *settled],
            ).fetchall()
        return [r[0] for r in rows]

    def run_sums(self, run_ids: Iterable[str]) -> dict[str, RunSums]:
        """What each runs row sums (tokens, model calls, distillations, turns, task, last activity),
        by run id, in one grouped query per 400 runs (``json_extract``); unknown ids are left out."""
        wanted, out = list(dict.fromkeys(run_ids)), {}
        with self._lock:
            for i in range(0, len(wanted), 400):  # twice each id: under SQLite's 999 parameters
                chunk = wanted[i : i + 400]
                sql = sums_sql(
                    f"IN ({','.join('?' * len(chunk))})", lambda a, path: f"json_extract({a}.data, '$.{path}')"
                )
                out.update(run_sums(self._conn.execute(sql, chunk * 2).fetchall()))
        return out

    def _runs(self, where: str, args: list[Any], limit: int) -> list[RunInfo]:
        with self._lock:
            rows = self._conn.execute(runs_sql(where, self._mark), [*args, limit]).fetchall()
        return [run_info(r) for r in rows]

    def close(self) -> None:
        """Checkpoint the WAL into the file (so a copy of the file alone holds everything:
        the checkpoint thread's own connection may keep SQLite from doing it at close), then
        release the connection."""
        with self._lock:
            self.closed = True
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # busy elsewhere: the WAL stays beside the file, nothing is lost
                pass
            self._conn.close()


def import_run(store: SQLiteStore, info: RunInfo, events: list[Event], cards: list[tuple[str, int, int, str]]) -> None:
    """Write one run's record as it is elsewhere (seqs, times and hashes kept), all or nothing:
    ``loomrt db copy``'s writer (:mod:`loomrt.record.copy`); never for a run that exists."""
    with store._lock:
        conn = store._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(insert_run_sql("?"), run_row(info))
            conn.executemany(
                "INSERT INTO events (run_id, seq, kind, ts, data, hash) VALUES (?, ?, ?, ?, ?, ?)",
                [(e.run_id, e.seq, e.kind, e.ts, canonical(e.data), e.hash) for e in events],
            )
            conn.executemany(_NEW_CARD, [(c, info.run_id, s, d, data, c) for c, s, d, data in cards])
            if events:
                store._move_head(info.run_id, events[-1].seq, events[-1].hash, None)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def run_cards(store: SQLiteStore, run_id: str) -> list[tuple[str, int, int, str]]:
    """The card index rows run ``run_id`` wrote: (card id, seq, depth, data)."""
    with store._lock:
        return [
            tuple(r)
            for r in store._conn.execute(
                "SELECT card_id, seq, depth, data FROM cards WHERE run_id = ? ORDER BY seq", (run_id,)
            ).fetchall()
        ]
