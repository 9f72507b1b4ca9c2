"""The job engine's own figures for ``loomrt workers list`` on PostgreSQL: procrastinate's jobs
of loomrt's queues by state and task, and its registered workers with their heartbeat ages."""

from __future__ import annotations

from typing import Any

from loomrt.jobs.schema import CONSOLIDATE_QUEUE, QUEUE

__all__ = ["engine_status"]


def engine_status(store: Any) -> dict[str, Any]:
    """``{"jobs": {STATE: n}, "tasks": {TASK: {STATE: n}}, "workers": [{"id", "heartbeat_age_s"}]}``
    read through the PostgreSQL ``store``'s own connections (finished jobs that succeeded are
    deleted by the worker, so ``succeeded`` counts none; ``failed`` and ``aborted`` stay until
    someone clears them)."""
    rows = store._select(
        "SELECT task_name, status::text, count(*) FROM procrastinate_jobs WHERE queue_name = ANY(%s) "
        "GROUP BY task_name, status",
        ([QUEUE, CONSOLIDATE_QUEUE],),
    )
    workers = store._select(
        "SELECT id, extract(epoch FROM now() - last_heartbeat) FROM procrastinate_workers ORDER BY id", ()
    )
    jobs: dict[str, int] = {}
    tasks: dict[str, dict[str, int]] = {}
    for task, state, n in rows:
        jobs[state] = jobs.get(state, 0) + int(n)
        tasks.setdefault(task, {})[state] = int(n)
    return {
        "jobs": jobs,
        "tasks": tasks,
        "workers": [{"id": int(i), "heartbeat_age_s": round(float(age), 1)} for i, age in workers],
    }
