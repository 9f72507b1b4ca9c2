"""The store interface behind the record.

The record is append-only: a store can add runs and events and read them back; it can
never change or delete one. Two faces of one protocol:

- the **async** face, which the run core awaits (:meth:`Store.write_run`,
  :meth:`Store.write`, :meth:`Store.read`): a store on a network database must never
  block the event loop that plays many runs at once;
- the **sync** face, for inspection (the CLI, tests, reports): :meth:`Store.events`,
  :meth:`Store.get_run`, :meth:`Store.list_runs`, and the writes ``create_run`` and
  ``append`` that tools and tests use directly.

SQLite implements both (:mod:`.sqlite`; its async face completes inline, since a WAL
append on a local file takes tens of microseconds, which a thread hop would only double).
PostgreSQL implements both over psycopg's async connections (:mod:`.postgres`, on an I/O
loop of its own: :mod:`.pg_io`), so an awaited append never blocks the caller's loop. Which
store a process uses is chosen in one place, :func:`loomrt.record.open_store`.

The store is the log alone. Who may append to a run, and who holds a piece of out-of-band
work, is :class:`~loomrt.record.coordination.Coordination`, a protocol beside it: both stores
implement it too (its rows live in the same database, so a claim and the appends it fences
commit together), and the runtime reaches it through :attr:`loomrt.Runtime.coordination`.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

from loomrt.events import Event, RunInfo
from loomrt.record.rows import RunSums

__all__ = ["Store"]


@runtime_checkable
class Store(Protocol):
    """Where records live."""

    ledger_key: bytes | None
    """The deployment's ledger key (:func:`loomrt.record.ledger.ledger_key`): new runs are
    chained v2 (keyed) with it, and a v2 run takes appends only from a store that has it."""

    async def write_run(self, info: RunInfo) -> None:
        """Register a new run (written once)."""

    async def write(self, run_id: str, kind: str, data: dict[str, Any]) -> Event:
        """Append one event, assigning the next ``seq`` of that run, and return it."""

    async def write_many(
        self,
        run_id: str,
        items: list[tuple[str, dict[str, Any]]],
        *,
        after: int | None = None,
        epoch: int | None = None,
    ) -> list[Event]:
        """Append ``items`` (kind, data) as consecutive events atomically: all are recorded, or
        none. With ``after``, only if the run's last seq is still ``after``, else
        :class:`~loomrt.errors.MovedOnError` (a writer working beside the run's own process).
        With ``epoch`` (a claim's fencing token, :meth:`claim_run`), only while that claim is
        the run's newest, else :class:`~loomrt.errors.FencedError`; the write renews it."""

    async def read(
        self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None, until: int | None = None
    ) -> list[Event]:
        """The run's events with ``after < seq <= until``, oldest first, optionally of some kinds."""

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """``async with store.transaction():`` everything written inside is recorded together,
        at the end, or (the process killed inside) not at all."""

    def create_run(self, info: RunInfo) -> None:
        """:meth:`write_run`, for code that is not async."""

    def append(self, run_id: str, kind: str, data: dict[str, Any]) -> Event:
        """:meth:`write`, for code that is not async."""

    def events(
        self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None, until: int | None = None
    ) -> list[Event]:
        """:meth:`read`, for code that is not async."""

    def latest(self, run_id: str, kind: str, *, until: int | None = None) -> Event | None:
        """The run's last event of ``kind`` (at or before ``until``), or None."""

    def head(self, run_id: str) -> tuple[int, str | None, int] | None:
        """The run's head anchor, kept apart from its events and only ever moving forward:
        (last seq, that event's hash, the newest claim's epoch); None where none was kept."""

    def cards(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Fold's cards by id, whichever run of the family wrote them (the ids found)."""

    def pending(self, kind: str, settled_by: Iterable[str]) -> list[str]:
        """The runs with a ``kind`` event after their last ``settled_by`` one."""

    def get_run(self, run_id: str) -> RunInfo:
        """One run; raises :class:`~loomrt.errors.NotFoundError` for an unknown id."""

    def list_runs(self, *, limit: int = 50, agent: str | None = None) -> list[RunInfo]:
        """Recent runs, newest first."""

    def run_sums(self, run_ids: Iterable[str]) -> dict[str, RunSums]:
        """What each of these runs' rows sums from its own events (tokens, model calls,
        distillations, turns, its task, its last activity), by run id, in one grouped query;
        unknown ids are left out."""

    def children(self, run_id: str) -> list[RunInfo]:
        """The runs ``run_id`` spawned (its sub-agents), oldest first."""

    def close(self) -> None:
        """Release the connection."""
