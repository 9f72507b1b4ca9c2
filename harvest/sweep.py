"""The sweep: spans a crash kept from the bank are banked from the record.

The bank runs after the distillation event is recorded, so a process killed between the
two leaves a distillation whose span was never banked. Before each pass the consolidator
reads, for every run with harvest on that has ended or gone quiet, the distillations it
has not swept yet, and banks any whose span has no row, rebuilt from the record exactly as
the bank would have seen it (the evicted messages, whole, private ones left out). The
bank's key makes this idempotent: a span banked already is never banked twice. Runs
without harvest are remembered as such and never read again.

It also banks each run's **tail** once the run has ended or been quiet long enough (the
consolidator's ``tail_after_s``): the messages no distillation evicted, which a run that
banks only what it evicts would never remember (a chat's last words). A later eviction of
those messages leaves them out (:meth:`~loomrt.harvest.bank.Bank.tail_seq`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from loomrt.events import Event, message_of
from loomrt.harvest.bank import Bank
from loomrt.harvest.db import Tables
from loomrt.harvest.scopes import ScopeError, resolve_scopes
from loomrt.messages import EvictedSpan, Message
from loomrt.tokens import count_text
from loomrt.visibility import private_seqs

__all__ = ["sweep", "tail_spans", "SWEPT", "TAILED"]

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


SWEPT, TAILED = 1, 2
"""``harvest_swept.harvest``: 0, harvest off; 1, distillations swept to ``swept_seq``; 2, and
its tail banked to there too."""


def sweep(
    store: Any,
    db: Tables,
    settled: Callable[[str], bool],
    tail_settled: Callable[[str], bool] = lambda run_id: False,
) -> int:
    """Bank what the record's settled harvest runs evicted and the bank never saw, and the
    tail of each run quiet long enough (``tail_settled``): what its working context still
    holds, never evicted (:func:`tail_spans`); how many spans."""
    known = {r: (h, s) for r, h, s in db.rows("SELECT run_id, harvest, swept_seq FROM harvest_swept")}
    banked = 0
    for info in store.list_runs(limit=1_000_000):
        harvest, swept = known.get(info.run_id, (None, 0))
        fresh = info.last_seq > swept
        if harvest == 0 or (not fresh and harvest == TAILED):
            continue
        if fresh and not settled(info.run_id):
            continue
        tailed = tail_settled(info.run_id)
        if not fresh and not tailed:
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
        spans = [
            EvictedSpan(
                run_id=info.run_id,
                agent=info.agent,
                mode=e.data.get("mode", ""),
                distillation_seq=e.seq,
                messages=tuple(messages[s] for s in e.data.get("span_seqs") or [] if s in messages),
            )
            for e in missing
        ]
        if tailed:
            spans += tail_spans(info, events, messages, bank.max_tokens, bank.tail_seq())
        for span in spans:
            if span.messages and bank.bank(span)["outcome"] == "banked":
                banked += 1
        with db.write() as conn:
            conn.execute(_SWEPT, (info.run_id, TAILED if tailed else SWEPT, info.last_seq))
    return banked


def tail_spans(
    info: Any, events: Sequence[Event], messages: dict[int, Message], max_tokens: int, after: int
) -> list[EvictedSpan]:
    """The run's tail as spans to bank: the messages after seq ``after`` (the tail banked
    already) that no distillation evicted, what its working context still holds, in pieces of
    at most half ``max_tokens`` each, every piece keyed by its last message's seq (a tail
    span's ``distillation_seq`` is its own ``seq_hi``: :meth:`Bank.tail_seq` reads them)."""
    evicted = {s for e in events if e.kind == "distillation" for s in e.data.get("span_seqs") or ()}
    kept = [m for seq, m in sorted(messages.items()) if seq > after and seq not in evicted and m.role != "system"]
    pieces: list[list[Message]] = []
    size = 0
    for m in kept:
        tokens = count_text(m.content)
        if not pieces or size + tokens > max_tokens // 2:
            pieces.append([])
            size = 0
        pieces[-1].append(m)
        size += tokens
    return [
        EvictedSpan(
            run_id=info.run_id, agent=info.agent, mode="tail", distillation_seq=int(p[-1].seq or 0), messages=tuple(p)
        )
        for p in pieces
        if p and p[-1].seq is not None
    ]
