"""The sweep: spans a crash kept from the bank are banked from the record.

The bank runs after the distillation event is recorded, so a process killed between the
two leaves a distillation whose span was never banked. Before each pass the consolidator
reads, for every run with harvest on that has ended or gone quiet, the distillations it
has not swept yet, and banks any whose span has no row, rebuilt from the record exactly as
the bank would have seen it (the evicted messages, whole, private ones left out). The
bank's key makes this idempotent: a span banked already is never banked twice. Runs
without harvest are remembered as such and never read again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loomrt.events import message_of
from loomrt.harvest.bank import Bank
from loomrt.harvest.db import Tables
from loomrt.harvest.scopes import ScopeError, resolve_scopes
from loomrt.messages import EvictedSpan
from loomrt.visibility import private_seqs

__all__ = ["sweep"]

_SWEPT = (
    "INSERT INTO harvest_swept VALUES (?, ?, ?) ON CONFLICT (run_id) DO UPDATE "
    "SET harvest = excluded.harvest, swept_seq = excluded.swept_seq"
)


def _scope(started: Any) -> str | None:
    """The scope a run banks to, from its ``run_started`` event (None: harvest is off)."""
    context = (started.data.get("definition") or {}).get("context") or {}
    if not context.get("harvest_to_memory") or not context.get("memory_scopes"):
        return None
    try:
        return resolve_scopes(
            context["memory_scopes"][:1],
            agent=started.data.get("agent", ""),
            user=started.data.get("user"),
            project=started.data.get("project"),
        )[0]
    except ScopeError:
        return None


def sweep(store: Any, db: Tables, settled: Callable[[str], bool]) -> int:
    """Bank what the record's settled harvest runs evicted and the bank never saw; how many spans."""
    known = {r: (h, s) for r, h, s in db.rows("SELECT run_id, harvest, swept_seq FROM harvest_swept")}
    banked = 0
    for info in store.list_runs(limit=1_000_000):
        harvest, swept = known.get(info.run_id, (None, 0))
        if harvest == 0 or info.last_seq <= swept or not settled(info.run_id):
            continue
        started = store.latest(info.run_id, "run_started")
        scope = _scope(started) if started is not None else None
        if scope is None:
            with db.write() as conn:
                conn.execute(_SWEPT, (info.run_id, 0, info.last_seq))
            continue
        have = {s for (s,) in db.rows("SELECT distillation_seq FROM harvest_spans WHERE run_id = ?", (info.run_id,))}
        events = store.events(info.run_id)
        missing = [e for e in events if e.kind == "distillation" and e.seq > swept and e.seq not in have]
        if missing:
            private = private_seqs(events)
            messages = {e.seq: m for e in events if (m := message_of(e)) is not None}
            bank = Bank(
                db,
                run_id=info.run_id,
                agent=info.agent,
                def_hash=info.def_hash,
                scope=scope,
                max_tokens=int(
                    ((started.data.get("definition") or {}).get("context") or {}).get("harvest_max_tokens", 8000)
                ),
                private=lambda private=private: private,  # type: ignore[misc]
                record=lambda kind, data: None,
            )
            for e in missing:
                span = tuple(messages[s] for s in e.data.get("span_seqs") or [] if s in messages)
                if (
                    span
                    and bank.bank(
                        EvictedSpan(
                            run_id=info.run_id,
                            agent=info.agent,
                            mode=e.data.get("mode", ""),
                            distillation_seq=e.seq,
                            messages=span,
                        )
                    )["outcome"]
                    == "banked"
                ):
                    banked += 1
        with db.write() as conn:
            conn.execute(_SWEPT, (info.run_id, 1, info.last_seq))
    return banked
