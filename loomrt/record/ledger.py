"""The record's ledger: each event carries a hash chained to the previous event of its run.

``hash(n) = sha256(hash(n-1) | run_id | seq | kind | ts | canonical(data))``, where the
canonical form is JSON with sorted keys and no spaces, so the chain verifies the same on
any backend (PostgreSQL's jsonb reorders keys). The first event chains to the empty string.
Triggers refuse to change the record; the chain makes a change made around them (a copied
and edited file, a dropped trigger) detectable: :func:`verify_chain`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from loomrt.events import Event

__all__ = ["event_hash", "verify_chain", "canonical"]


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def event_hash(prev: str, run_id: str, seq: int, kind: str, ts: float, data: Any) -> str:
    """The hash of one event, chained to ``prev`` (the previous event's hash, or "").
    ``data`` is the payload, or its :func:`canonical` text already made."""
    text = data if isinstance(data, str) else canonical(data)
    blob = "\x1f".join([prev, run_id, str(seq), kind, repr(float(ts)), text])
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def verify_chain(events: Iterable[Event]) -> list[str]:
    """One line per problem in a run's record (seqs not dense from 1, or from the fork seq
    for a fork; a hash that does not match its content or its predecessor); an empty list
    when it audits clean."""
    problems: list[str] = []
    prev, expected = "", 1
    for e in events:
        if e.kind == "run_started" and e.data.get("forked_from") and expected == 1:
            expected = int(e.data["forked_from"]["seq"]) + 1
        if e.seq != expected:
            problems.append(f"seq {e.seq}: expected seq {expected} (seqs must be dense from 1)")
        expected = e.seq + 1
        if e.hash is None:
            problems.append(f"seq {e.seq}: no hash (written before the ledger existed); the chain restarts here")
            prev = ""
            continue
        want = event_hash(prev, e.run_id, e.seq, e.kind, e.ts, e.data)
        if e.hash != want:
            problems.append(f"seq {e.seq} ({e.kind}): hash does not match its content or the event before it")
        prev = e.hash
    return problems
