"""``loomrt worker``: the background work of runs that are not playing, off any user's path.

Today that is the folds fold mode queued at its soft watermark (``fold_queued``) for runs
that are parked or ended, whose chat was closed before it could fold between turns. Each
is done under the run's lease in the store (``distil:RUN_ID``, the same one the chat takes),
so two workers, or a worker and the run's own chat, never fold one run at once. A run
that is playing (active) is left to its own process, and the worker's appends are guarded
(:attr:`loomrt.run.state.RunState.guarded`): if the run's own process starts a turn while
the worker folds, the worker's next append is refused and its fold dropped, never mixed in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from loomrt.runtime import Runtime

__all__ = ["work_once", "work", "QUEUED", "SETTLED"]

QUEUED = "fold_queued"
SETTLED = ("distillation", "fold_skipped")
"""A queued fold is settled by the fold (a distillation) or by a skip (it is queued again later)."""


async def work_once(runtime: Runtime, *, tell: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Do the queued work of every run that is not playing; one row per run looked at."""
    rows = []
    for run_id in runtime.store.pending(QUEUED, SETTLED):
        info = runtime.store.get_run(run_id)
        if info.status == "active":
            row = {"run_id": run_id, "done": False, "reason": "playing now: its own process folds it"}
        else:
            run = await runtime.aopen(run_id)
            run.guarded = True  # its own process may start a turn meanwhile: then this fold gives way
            before = run.estimate()
            done = await runtime.between_turns(run)
            row = {"run_id": run_id, "done": done, "tokens_before": before, "tokens_after": run.estimate(),
                   "reason": None if done else "declined, or another worker holds its lease"}
        rows.append(row)
        if tell:
            tell(row)
    return rows


def work(runtime: Runtime, *, interval_s: float = 5.0, tell: Callable[[dict[str, Any]], None] | None = None,
         stop: Callable[[], bool] = lambda: False) -> None:
    """:func:`work_once` every ``interval_s`` seconds until ``stop()`` (Ctrl-C on the CLI)."""
    while not stop():
        asyncio.run(work_once(runtime, tell=tell))
        time.sleep(interval_s)
