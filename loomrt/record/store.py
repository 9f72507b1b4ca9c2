"""The store interface behind the record.

The record is append-only: a store can add runs and events and read them back; it
can never change or delete one. SQLite implements this now (:mod:`.sqlite`); a
PostgreSQL store will implement the same protocol.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from loomrt.events import Event, RunInfo

__all__ = ["Store"]


@runtime_checkable
class Store(Protocol):
    """Where records live."""

    def create_run(self, info: RunInfo) -> None:
        """Register a new run (written once)."""

    def append(self, run_id: str, kind: str, data: dict[str, Any]) -> Event:
        """Append one event, assigning the next ``seq`` of that run, and return it."""

    def events(
        self, run_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> list[Event]:
        """The run's events with ``seq > after``, oldest first, optionally of some kinds."""

    def get_run(self, run_id: str) -> RunInfo:
        """One run; raises :class:`~loomrt.errors.NotFoundError` for an unknown id."""

    def list_runs(self, *, limit: int = 50, agent: str | None = None) -> list[RunInfo]:
        """Recent runs, newest first."""

    def close(self) -> None:
        """Release the connection."""
