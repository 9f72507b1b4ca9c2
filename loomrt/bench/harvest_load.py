"""The harvest load: banked spans drained by concurrent consolidator processes.

``bank_load`` banks ``n`` synthetic spans (each user line a distinct fact) over some
scopes; ``drain`` starts worker processes (``python -m loomrt.bench.harvest_load work
DB``, DB a SQLite file or a PostgreSQL URL), each passing over the queue with the model-free echo extractor until nothing is
left, optionally one of them killed at a crash point; ``verify`` counts what durable memory
holds against what was banked: lost (a banked line with no fact) and doubled (a line
stored twice). The figures can come out badly: a batch taken by two workers doubles its
facts, a batch lost with a dead worker leaves lines unstored.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

__all__ = ["bank_load", "drain", "verify", "SCOPES"]

SCOPES = ("user:alice", "user:bob", "project:shop", "agent:historian")


def bank_load(where: Any, n: int, *, scopes: tuple[str, ...] = SCOPES, turns: int = 1) -> list[str]:
    """Bank ``n`` spans round-robin over ``scopes``; the user lines they hold."""
    from loomrt.harvest.bank import Bank
    from loomrt.harvest.db import harvest_db
    from loomrt.messages import EvictedSpan, Message

    db = harvest_db(where)
    banks = {
        s: Bank(
            db,
            run_id=f"load-{k}",
            agent="loader",
            def_hash="0" * 16,
            scope=s,
            max_tokens=8000,
            private=set,
            record=lambda kind, data: None,
        )
        for k, s in enumerate(scopes)
    }
    texts = []
    for i in range(n):
        scope = scopes[i % len(scopes)]
        messages = []
        for j in range(turns):
            text = f"Item{i}x{j} is worth {i * 7 + j} credits."
            texts.append(text)
            messages.append(Message(role="user", content=text, seq=2 * (i * turns + j) + 1, ts=1_700_000_000.0 + i))
        banks[scope].bank(
            EvictedSpan(
                run_id=banks[scope].run_id,
                agent="loader",
                mode="recap",
                distillation_seq=10 * i + 5,
                messages=tuple(messages),
            )
        )
    return texts


def _work(db: str, lease_s: float, batch_tokens: int) -> None:
    """One worker process: pass over the queue until nothing is pending or claimed."""
    from loomrt.harvest.consolidator import Consolidator
    from loomrt.harvest.scripted import echo_extractor
    from loomrt.record.sqlite import default_store

    store = default_store(db if db.startswith("postgres") else f"sqlite:{db}")
    worker = Consolidator(
        store, provider=echo_extractor(), embedder="hash", settle_s=0, lease_s=lease_s, batch_tokens=batch_tokens
    )
    while worker.queue.scopes():
        report = worker.run_once()
        if not report.batches:
            time.sleep(0.05)  # the scopes left are another worker's (or a dead one's, until its lease expires)


def drain(
    where: Any,
    *,
    workers: int = 2,
    lease_s: float = 5.0,
    batch_tokens: int = 200,
    crash_at: str | None = None,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Start ``workers`` processes on the record at ``where`` (a store, a file or a URL); the first is killed at
    ``crash_at`` (``POINT:N``), and a replacement started once it died. Returns the
    wall time, the exit codes, and whether a worker was killed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    from loomrt.harvest.db import where_of

    cmd = [sys.executable, "-m", "loomrt.bench.harvest_load", "work", where_of(where), str(lease_s), str(batch_tokens)]
    start = time.perf_counter()
    procs = [
        subprocess.Popen(cmd, env={**env, **({"LOOMRT_CRASH_AT": crash_at} if crash_at and i == 0 else {})})
        for i in range(workers)
    ]
    codes = [p.wait(timeout=timeout_s) for p in procs]
    killed = any(c == -9 for c in codes)
    if killed:  # the dead worker's claimed batch waits for its lease to expire: a new worker takes it up
        codes.append(subprocess.run(cmd, env=env, timeout=timeout_s).returncode)
    return {"wall_s": time.perf_counter() - start, "exit_codes": codes, "killed": killed}


def verify(where: Any, texts: list[str]) -> dict[str, Any]:
    """What durable memory holds against the banked ``texts``."""
    from loomrt.harvest.db import harvest_db

    db = harvest_db(where)
    stored = Counter(s for (s,) in db.rows("SELECT statement FROM memory_facts"))
    states = dict(db.rows("SELECT state, COUNT(*) FROM harvest_spans GROUP BY state"))
    return {
        "banked_lines": len(texts),
        "facts": sum(stored.values()),
        "lost": sum(1 for t in texts if t not in stored),
        "doubled": sum(c - 1 for c in stored.values() if c > 1),
        "span_states": states,
    }


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "work":
        _work(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("usage: python -m loomrt.bench.harvest_load work DB LEASE_S BATCH_TOKENS")
