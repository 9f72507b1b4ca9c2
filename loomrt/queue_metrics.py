"""What the work queue holds and how fast it moves: the queue block of ``loomrt workers list``.

Its figures come from the record itself, on either store (a query for each waiting run and
for each of the ``recent`` newest runs, besides the pending and claim queries); on PostgreSQL
``loomrt workers list`` shows the job engine's own beside them (:mod:`loomrt.jobs.status`):

- **queued runs** (``loomrt run --detach``) no worker has taken yet, and how long the
  oldest has waited;
- **queued distillations**: the runs with a fold, or a chat's recap or compaction, queued
  for a worker;
- **resumable runs**: active runs whose worker stopped (claim lapsed), which the next
  worker's round retries;
- **job latency**: from ``run_queued`` to the worker's first ``resumed``, median and worst,
  over the queued runs among the ``recent`` newest (both times the record's: on PostgreSQL
  the database's clock; the oldest wait is measured against this machine's);
- **retries**: among those runs, how often a worker resumed one mid-work (a ``resumed``
  without an input, after the take: a crash, a lapsed claim, an outage).

The harvest queue (banked spans, dead letters) has its own: ``loomrt consolidate --status``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from loomrt.worker import DISTILLATION_QUEUED, DISTILLATION_SETTLED, PLAYED, QUEUED, RUN_QUEUED, SETTLED, abandoned

__all__ = ["queue_metrics"]


def queue_metrics(store: Any, *, recent: int = 200, now: float | None = None) -> dict[str, Any]:
    """The queue's depth, its oldest wait, job latency and retries (see the module)."""
    now = time.time() if now is None else now
    waiting = store.pending(RUN_QUEUED, PLAYED)
    waited = [now - e.ts for r in waiting if (e := store.latest(r, RUN_QUEUED)) is not None]
    distil = set(store.pending(QUEUED, SETTLED)) | set(store.pending(DISTILLATION_QUEUED, DISTILLATION_SETTLED))
    latencies: list[float] = []
    retries = 0
    for info in store.list_runs(limit=recent):
        events = store.events(info.run_id, kinds=[RUN_QUEUED, "resumed"])
        queued = next((e for e in events if e.kind == RUN_QUEUED), None)
        if queued is None:
            continue
        takes = [e for e in events if e.kind == "resumed" and e.seq > queued.seq and "input" not in e.data]
        if takes:
            latencies.append(takes[0].ts - queued.ts)
            retries += len(takes) - 1
    return {
        "runs_queued": len(waiting),
        "oldest_queued_s": round(max(waited), 1) if waited else None,
        "distillations_queued": len(distil),
        "runs_resumable": len(abandoned(store)),
        "taken": len(latencies),
        "latency_s_median": round(statistics.median(latencies), 3) if latencies else None,
        "latency_s_worst": round(max(latencies), 3) if latencies else None,
        "retries": retries,
        "recent": recent,
    }
