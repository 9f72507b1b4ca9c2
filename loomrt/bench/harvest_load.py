"""The harvest load: banked spans drained by concurrent consolidator processes.

``bank_load`` banks ``n`` synthetic spans (each user line a distinct fact) over some
scopes; ``drain`` starts worker processes (``python -m loomrt.bench.harvest_load work
DB``, DB a SQLite file or a PostgreSQL URL), which begin their passes together and pass over
the queue with the model-free echo extractor until nothing is left, optionally one of them
killed at a crash point; each extraction call is logged by the extractor (the worker
process and the banked lines it was sent). ``verify`` counts what durable memory holds
against what was banked, and what the extractor was sent: lost (a banked line with no
fact), doubled (a line extracted more than once: work paid twice), redone (a line a killed
worker had extracted and a replacement extracted again: the repeat a crash costs by
design, reported apart) and stored twice (a line stored as two facts).

Doubled is counted at the extractor, not in durable memory: a batch extracted twice writes
the same fact keys twice, and idempotent writes hide it. The figures can come out badly: a
batch taken by two workers is extracted twice, a batch lost with a dead worker leaves lines
unstored. They count lines, not the queue's batches, so they hold for any queue engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["bank_load", "drain", "verify", "extraction_figures", "SCOPES"]

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


def _logged_extractor(log: Path | None) -> Any:
    """The echo extractor; with ``log`` (a folder), each call appends the user lines it was
    sent to this process's file there (opened per call, so a killed worker's calls are kept)."""
    from loomrt.harvest.scripted import conversation_lines, echo_extractor
    from loomrt.providers.base import ModelRequest
    from loomrt.providers.scripted import FunctionProvider

    echo = echo_extractor().fn

    def extract(request: ModelRequest) -> Any:
        if log is not None:
            lines = [text for _, role, text in conversation_lines(request) if role == "user"]
            with open(log / f"extractions-{os.getpid()}.jsonl", "a", encoding="utf-8") as out:
                out.write(json.dumps({"pid": os.getpid(), "lines": lines}) + "\n")
        return echo(request)

    return FunctionProvider(extract, name="scripted/echo-extractor")


def _together(log: Path, workers: int, timeout_s: float = 60.0) -> None:
    """Wait until ``workers`` workers are ready, so that their first passes contend."""
    (log / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(log.glob("ready-*"))) < workers and time.monotonic() < deadline:
        time.sleep(0.01)


def _work(db: str, lease_s: float, batch_tokens: int, log: Path | None = None, together: int = 0) -> None:
    """One worker process: pass over the queue until nothing is pending or claimed."""
    from loomrt.harvest.consolidator import Consolidator
    from loomrt.record.sqlite import default_store

    store = default_store(db if db.startswith("postgres") else f"sqlite:{db}")
    worker = Consolidator(
        store,
        provider=_logged_extractor(log),
        embedder="hash",
        settle_s=0,
        tail_after_s=0,  # a run's tail is banked as soon as it is quiet: the chaos harness kills there too
        lease_s=lease_s,
        batch_tokens=batch_tokens,
    )
    if log is not None and together > 1:
        _together(log, together)
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
    """Start ``workers`` processes on the record at ``where`` (a store, a file or a URL); they
    begin their passes together. The first is killed at ``crash_at`` (``POINT:N``), and a
    replacement started once it died. Returns the wall time, the exit codes, whether a
    worker was killed, and every extraction call (``pid``, ``lines``) with the killed pids."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    from loomrt.harvest.db import where_of

    with tempfile.TemporaryDirectory(prefix="loomrt-harvest-load-") as log:
        cmd = [
            sys.executable,
            "-m",
            "loomrt.bench.harvest_load",
            "work",
            where_of(where),
            str(lease_s),
            str(batch_tokens),
            log,
        ]
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                [*cmd, str(workers)], env={**env, **({"LOOMRT_CRASH_AT": crash_at} if crash_at and i == 0 else {})}
            )
            for i in range(workers)
        ]
        codes = [p.wait(timeout=timeout_s) for p in procs]
        killed = [p.pid for p, c in zip(procs, codes, strict=True) if c == -9]
        if killed:  # the dead worker's claimed batch waits for its lease to expire: a new worker takes it up
            codes.append(subprocess.run([*cmd, "0"], env=env, timeout=timeout_s).returncode)
        wall_s = time.perf_counter() - start
        calls = [json.loads(line) for f in sorted(Path(log).glob("extractions-*.jsonl")) for line in f.open()]
    return {"wall_s": wall_s, "exit_codes": codes, "killed": bool(killed), "killed_pids": killed, "extractions": calls}


def verify(where: Any, texts: list[str], ran: dict[str, Any] | None = None) -> dict[str, Any]:
    """What durable memory holds against the banked ``texts``; with ``ran`` (what
    :func:`drain` returned), what the extractor was sent: each banked line's extractions
    beyond one are doubled, except those a killed worker's extraction explains (redone)."""
    from loomrt.harvest.db import harvest_db

    db = harvest_db(where)
    stored = Counter(s for (s,) in db.rows("SELECT statement FROM memory_facts WHERE class <> 'passage'"))
    states = dict(db.rows("SELECT state, COUNT(*) FROM harvest_spans GROUP BY state"))
    out: dict[str, Any] = {
        "banked_lines": len(texts),
        "facts": sum(stored.values()),
        "lost": sum(1 for t in texts if t not in stored),
        "stored_twice": sum(c - 1 for c in stored.values() if c > 1),
        "span_states": states,
    }
    if ran is not None:
        out.update(extraction_figures(texts, ran["extractions"], ran.get("killed_pids", [])))
    return out


def extraction_figures(texts: list[str], calls: list[dict[str, Any]], killed_pids: list[int]) -> dict[str, Any]:
    """Extraction work against the banked ``texts``: ``calls`` (each with ``pid`` and ``lines``).

    A line extracted n times has n - 1 extra extractions; as many of them as killed workers
    made (at most) are ``redone``, the rest ``doubled``. ``batches_doubled``: extraction
    calls that carried a doubled line (a batch counts once per extra extraction)."""
    banked = set(texts)
    sent: Counter[str] = Counter()
    by_killed: Counter[str] = Counter()
    for call in calls:
        for line in set(call["lines"]) & banked:
            sent[line] += 1
            by_killed[line] += call["pid"] in killed_pids
    redone = {t: min(n - 1, by_killed[t]) for t, n in sent.items() if n > 1}
    doubled = {t: n - 1 - redone.get(t, 0) for t, n in sent.items() if n - 1 - redone.get(t, 0) > 0}
    repeats = Counter(frozenset(set(c["lines"]) & banked) for c in calls)
    return {
        "extractions": len(calls),
        "lines_extracted": len(sent),
        "doubled": sum(doubled.values()),
        "redone": sum(redone.values()),
        "batches_doubled": sum(n - 1 for batch, n in repeats.items() if n > 1 and batch & doubled.keys()),
        "most_extractions": max(sent.values(), default=0),
    }


if __name__ == "__main__":
    if len(sys.argv) in (5, 7) and sys.argv[1] == "work":
        log, together = (Path(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) == 7 else (None, 0)
        _work(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), log, together)
    else:
        sys.exit("usage: python -m loomrt.bench.harvest_load work DB LEASE_S BATCH_TOKENS [LOG_DIR WORKERS]")
