"""``loomrt db copy``: move a record from one store to another (a single machine's SQLite
history into a shared PostgreSQL), run ids, seqs, times and hashes kept.

Each run is copied whole in one transaction on the target, then read back and checked:
the same number of events, the same last hash, and a chain that verifies as it does at the
source. A run the
target has already, with the same events, is skipped (so an interrupted copy can be run
again); one that differs is an error, and the copy stops before touching it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loomrt.errors import NotFoundError, StoreError
from loomrt.record.ledger import verify_chain

__all__ = ["copy_record"]


def _writer(store: Any) -> tuple[Callable[..., None], Callable[[Any, str], list[tuple[str, int, int, str]]]]:
    from loomrt.record import sqlite

    if isinstance(store, sqlite.SQLiteStore):
        return sqlite.import_run, sqlite.run_cards
    from loomrt.record import postgres

    return postgres.import_run, postgres.run_cards


def copy_record(source: Any, target: Any, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Copy every run of ``source`` into ``target``; returns ``{"runs", "copied", "skipped",
    "events"}`` (runs and events counted on the target after the copy, verified)."""
    runs = sorted(source.list_runs(limit=2**31), key=lambda r: (r.created_at, r.run_id))
    write, _ = _writer(target)
    _, cards_of = _writer(source)
    copied = skipped = events_total = 0
    for info in runs:
        events = source.events(info.run_id)
        try:
            there = target.get_run(info.run_id)
        except NotFoundError:
            there = None
        if there is not None:
            theirs = target.events(info.run_id)
            if [(e.seq, e.hash) for e in theirs] != [(e.seq, e.hash) for e in events]:
                raise StoreError(
                    f"run {info.run_id} is in the target already, with a different record "
                    f"({len(theirs)} events there, {len(events)} here): the copy stops before it "
                    f"({copied} runs copied so far)"
                )
            skipped += 1
        else:
            write(
                target,
                info.model_copy(update={"status": "active", "last_seq": 0}),
                events,
                cards_of(source, info.run_id),
            )
            back = target.events(info.run_id)
            if len(back) != len(events) or (back and back[-1].hash != events[-1].hash):
                raise StoreError(
                    f"run {info.run_id} did not read back as written ({len(back)} of {len(events)} "
                    "events): the copy stops here"
                )
            copied += 1
        problems = [p for p in verify_chain(target.events(info.run_id)) if p not in set(verify_chain(events))]
        if problems:  # what audits clean here must audit clean there
            raise StoreError(f"run {info.run_id} does not verify on the target: {problems[0]}")
        events_total += len(events)
        if progress is not None:
            progress(info.run_id)
    return {"runs": len(runs), "copied": copied, "skipped": skipped, "events": events_total}
