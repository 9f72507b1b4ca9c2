"""Coordination beside the log: leases and run claims, the fencing tokens the log checks.

The :class:`~loomrt.record.store.Store` is the log (runs, events, cards; writes, reads,
transactions). Who may append to a run (a **claim**: an owner, an epoch every append carries,
a ttl its heartbeat renews; :mod:`loomrt.record.owners`) and who holds a piece of
out-of-band work (a **lease**: a fold's, a harvest scope's) is this protocol. Both stores
implement it over their own database, so a claim and the appends it fences are checked in
one place; the job engine's queue on PostgreSQL (:mod:`loomrt.jobs`) hands work out, and
never decides who may write: a job claims its run here first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from loomrt.events import RunInfo

__all__ = ["Coordination"]


@runtime_checkable
class Coordination(Protocol):
    """Leases and run claims."""

    def take_lease(self, name: str, holder: str, ttl_s: float, *, replacing: str | None = None) -> bool:
        """Hold lease ``name`` for ``ttl_s`` seconds (the one lease mechanism: folds, harvest's
        scopes): True if ``holder`` has it. ``replacing``: a holder the caller found gone
        (:func:`loomrt.record.owners.owner_is_gone`), whose live lease is taken over (and only
        while that holder still has it)."""

    def release_lease(self, name: str, holder: str) -> None:
        """Give lease ``name`` back."""

    def lease_holder(self, name: str) -> str | None:
        """Who holds lease ``name`` now, if anyone."""

    def claim_run(self, run_id: str, owner: str, ttl_s: float) -> int:
        """Own run ``run_id`` for ``ttl_s`` seconds, renewed by each fenced append, and return
        its epoch; :class:`~loomrt.errors.RunOwnedError` while another owner's claim is live
        (see :mod:`loomrt.record.owners`)."""

    def renew_run(self, run_id: str, owner: str, epoch: int, ttl_s: float) -> bool:
        """A heartbeat: ``owner``'s claim at ``epoch`` holds ``ttl_s`` seconds more. False when
        that claim is no longer the run's (taken over, or let go): nothing is claimed then."""

    def release_run(self, run_id: str, owner: str, epoch: int) -> None:
        """Let a claimed run go: its lease expires now, its epoch stays."""

    def run_owners(self, *, expired: bool = False) -> list[dict[str, Any]]:
        """The live claims (``loomrt workers list``); with ``expired``, the lapsed ones."""

    def stalled_runs(self, owners: Iterable[str] = ()) -> list[RunInfo]:
        """The active runs whose claim lapsed (not one let go), or is held by one of ``owners``:
        one query, however many runs were ever played."""
