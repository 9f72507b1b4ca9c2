"""``loomrt worker``: the background work of runs that are not playing, off any user's path.

The execution layer's one place: queueing a run (:func:`detach`, ``loomrt run --detach``),
taking it (:func:`take`), and the steps that play, resume, distil or consolidate one item
(:func:`play_row`, :func:`distil_row`, :func:`consolidate_row`), which both queues use. The
:class:`~loomrt.Runtime` plays runs; who may append to one is
:class:`~loomrt.record.coordination.Coordination`'s (the runtime's ``coordination``).

Two kinds of work, queued on the record:

- **queued runs** (``run_queued``: ``loomrt run --detach``): the worker claims the run
  (:mod:`loomrt.record.owners`; of several workers on any machines one gets it, the others
  are refused and move on) and plays it as ``loomrt runs resume`` would, up to
  ``concurrency`` at once. A worker that dies mid-run leaves its claim to expire (at once
  on its own machine, after the lease's ttl elsewhere); the run is then queued work again
  for any worker: the next ``loomrt worker`` to look resumes it (``work: resume``).
- **queued distillations** (``fold_queued``, fold mode's soft watermark; ``distillation_queued``,
  a recap or compaction due in a chat) of runs that are parked or ended, whose chat closed
  before it could distil between turns. Each is done under the run's
  lease in the store (``distil:RUN_ID``, the same one the chat takes), so two workers, or a
  worker and the run's own chat, never fold one run at once. A run that is playing (active)
  is left to its own process, and the worker's appends are guarded
  (:attr:`loomrt.run.state.RunState.guarded`): if the run's own process starts a turn while
  the worker folds, the worker's next append is refused and its fold dropped, never mixed in.

- **consolidation** (with a :class:`~loomrt.harvest.consolidator.Consolidator`): one pass
  over the harvest queue, scope by scope under the scope's lease, as ``loomrt consolidate``
  does; of several workers each takes the scopes no other holds, and a claim locks its
  spans, so none is taken twice.

This is the queue on SQLite, where the record itself is the queue: an idle worker looks
every ``interval_s`` seconds. On PostgreSQL the queue is procrastinate's
(:mod:`loomrt.jobs`): ``loomrt worker`` runs :mod:`loomrt.jobs.engine` there, whose jobs do
one item each with the steps below (:func:`play_row`, :func:`distil_row`,
:func:`consolidate_row`). :func:`work_once` still serves one pass on either record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from loomrt.errors import FencedError, LoomError, RunOwnedError, StoreError
from loomrt.record.owners import owner_is_gone, worker_name
from loomrt.run.between_turns import between_turns
from loomrt.run.loop import add_user_input
from loomrt.run.state import RunResult, RunState
from loomrt.runtime import Runtime
from loomrt.spec import AgentSpec
from loomrt.worker_life import Backoff, Stopping, hand_back, nap, until_stopped

__all__ = [
    "work_once",
    "PLAYING_NOW",
    "detach",
    "take",
    "play_row",
    "distil_row",
    "consolidate_row",
    "queued_distillations",
    "work_once_then_stop",
    "work",
    "abandoned",
    "QUEUED",
    "SETTLED",
    "RUN_QUEUED",
    "PLAYED",
    "DISTILLATION_QUEUED",
    "DISTILLATION_SETTLED",
]

QUEUED = "fold_queued"
SETTLED = ("distillation", "fold_skipped")
"""A queued fold is settled by the fold (a distillation) or by a skip (it is queued again later)."""
DISTILLATION_QUEUED = "distillation_queued"
DISTILLATION_SETTLED = ("distillation", "distillation_declined")
"""A recap or compaction queued in a chat is settled by the distillation, or by a decline."""
PLAYING_NOW = "playing now: its own process distils it"
"""Why a queued distillation of a run that is playing is left alone."""
RUN_QUEUED = "run_queued"
PLAYED = ("resumed", "final", "error", "cancelled")
"""A queued run is taken once a worker records ``resumed`` on it (or it ended otherwise)."""


async def detach(runtime: Runtime, agent: AgentSpec | str, prompt: str, **kw: Any) -> RunState:
    """Start a run with ``prompt`` as its input and queue it (``run_queued``) for any
    ``loomrt worker`` on this record to claim and play; nothing is played here (on
    PostgreSQL the event makes the run's job, :mod:`loomrt.jobs`, and wakes the workers).
    Keyword arguments as :meth:`Runtime.astart`'s."""
    run = await runtime.astart(agent, **kw)
    await add_user_input(run, prompt)
    await run.add(RUN_QUEUED, {"by": runtime.owner or worker_name()})
    if runtime.owner is not None and run.epoch is not None:  # any worker may take it now
        await runtime.off_loop(runtime.coordination.release_run, run.run_id, runtime.owner, run.epoch)
    return run


async def take(runtime: Runtime, run_id: str) -> RunResult | None:
    """Claim a queued run (``loomrt run --detach``) and play it; None when it is not queued
    any more (another worker took it). :class:`~loomrt.errors.RunOwnedError` while another
    worker's claim on it is live."""
    run = await runtime.aopen(run_id)
    if run.view.status != "queued":
        return None
    await runtime.aclaim(run)
    if (await runtime.off_loop(runtime.store.get_run, run_id)).last_seq != run.last_seq:  # taken and played meanwhile
        if runtime.owner is not None and run.epoch is not None:
            await runtime.off_loop(runtime.coordination.release_run, run_id, runtime.owner, run.epoch)
        return None
    return await runtime.play_resumed(run)


async def play_row(runtime: Runtime, work: str, run_id: str) -> dict[str, Any]:
    """Play one queued run (``work="play"``: :func:`take`) or resume one a worker
    left (``"resume"``); its row. Cancelled (a stop's cut-off), it says nothing."""
    try:
        result = await (take(runtime, run_id) if work == "play" else runtime.resume(run_id))
    except RunOwnedError:
        return {"run_id": run_id, "work": work, "done": False, "reason": "another worker has it"}
    except LoomError as exc:
        return {"run_id": run_id, "work": work, "done": False, "reason": f"{type(exc).__name__}: {exc}"}
    if result is None:
        return {"run_id": run_id, "work": work, "done": False, "reason": "another worker has it"}
    return {"run_id": run_id, "work": work, "done": True, "status": result.status, "reason": result.error}


async def _play_queued(
    runtime: Runtime, concurrency: int, tell: Callable[[dict[str, Any]], None] | None, stop: Callable[[], bool]
) -> list[dict[str, Any]]:
    """Claim and play the queued runs and resume the abandoned ones, ``concurrency`` at once
    (none is started once ``stop()``); one row per run."""
    gate = asyncio.Semaphore(concurrency)
    rows: list[dict[str, Any]] = []

    async def do(work: str, run_id: str) -> None:
        async with gate:
            if stop():
                return
            row = await play_row(runtime, work, run_id)
        rows.append(row)
        if tell:
            tell(row)

    await asyncio.gather(
        *(do("play", r) for r in runtime.store.pending(RUN_QUEUED, PLAYED)),
        *(do("resume", r) for r in abandoned(runtime.coordination, runtime.owner)),
    )
    return rows


def abandoned(store: Any, me: str | None = None) -> list[str]:
    """Runs a worker was playing when it stopped: still active, their claim lapsed (or let
    go: handed back), or held by a worker of this machine that is gone, or by ``me`` between
    two rounds, when nothing plays here (a turn whose record could not be written while the
    database restarted: this worker resumes it). A constant number of queries, however many
    runs were ever played: the live claims (the runs playing now) and one for the rest."""
    gone = [c["owner"] for c in store.run_owners() if owner_is_gone(c["owner"])]
    return [r.run_id for r in store.stalled_runs([*gone, *([me] if me else [])])]


def queued_distillations(store: Any) -> list[tuple[str, str]]:
    """The runs with a distillation queued and not yet settled, each with its work (``fold``
    or ``distil``); one query per kind."""
    folds = store.pending(QUEUED, SETTLED)
    rest = [r for r in store.pending(DISTILLATION_QUEUED, DISTILLATION_SETTLED) if r not in folds]
    return [(r, "fold") for r in folds] + [(r, "distil") for r in rest]


async def distil_row(runtime: Runtime, run_id: str, work: str) -> dict[str, Any]:
    """Do one run's queued distillation, under its lease and through its claim; its row (a
    run playing now is left to its own process)."""
    info = await runtime.off_loop(runtime.store.get_run, run_id)
    if info.status == "active":
        return {"run_id": run_id, "work": work, "done": False, "reason": PLAYING_NOW}
    run = await runtime.aopen(run_id)
    run.guarded = True  # its own process may start a turn meanwhile: then this fold gives way
    before = run.estimate()
    try:
        with runtime.holding(run):  # through the run's claim: fenced like its owner's appends
            done = await between_turns(run, runtime.coordination)
        reason = None if done else "declined, or another worker holds its lease"
    except (RunOwnedError, FencedError) as exc:  # taken, or taken over meanwhile: it is theirs
        done, reason = False, f"another worker has it ({exc})"
    return {
        "run_id": run_id,
        "work": work,
        "done": done,
        "tokens_before": before,
        "tokens_after": run.estimate(),
        "reason": reason,
    }


async def consolidate_row(consolidator: Any, scopes: list[str] | None = None) -> dict[str, Any]:
    """One consolidation pass (over ``scopes``, or every scope with work); its row."""
    report = (await consolidator.arun_once(scopes)).to_dict()
    return {
        "run_id": None,
        "work": "consolidate",
        "done": bool(report["batches"]),
        **report,
        "reason": None if report["batches"] else "nothing settled, or other workers hold its scopes",
    }


async def work_once(
    runtime: Runtime,
    *,
    tell: Callable[[dict[str, Any]], None] | None = None,
    concurrency: int = 1,
    consolidator: Any = None,
    stop: Callable[[], bool] = lambda: False,
) -> list[dict[str, Any]]:
    """Do the queued work of every run that is not playing, then (with ``consolidator``) one
    consolidation pass; one row per run looked at, and one for the pass if it did anything.
    The runtime claims what it plays (as this process's worker, if it has no owner yet)."""
    if runtime.owner is None:
        runtime.owner = worker_name()
    rows = await _play_queued(runtime, concurrency, tell, stop)
    if stop():
        return rows
    for run_id, work in queued_distillations(runtime.store):
        row = await distil_row(runtime, run_id, work)
        rows.append(row)
        if tell:
            tell(row)
    if consolidator is not None and consolidator.queue.scopes():
        row = await consolidate_row(consolidator)
        rows.append(row)
        if tell:
            tell(row)
    return rows


def work_once_then_stop(
    runtime: Runtime,
    *,
    tell: Callable[[dict[str, Any]], None] | None = None,
    concurrency: int = 1,
    consolidator: Any = None,
    stopping: Stopping | None = None,
) -> list[dict[str, Any]] | None:
    """``loomrt worker --once``: one :func:`work_once`, stopped as :func:`work` is (on
    SIGTERM the work in flight finishes, or is cancelled at the stop's cut-off), and every
    run this worker still holds let go as it exits; its rows (None when it was cut off)."""
    try:
        return asyncio.run(
            until_stopped(
                work_once(
                    runtime,
                    tell=tell,
                    concurrency=concurrency,
                    consolidator=consolidator,
                    stop=stopping or (lambda: False),
                ),
                stopping,
            )
        )
    finally:
        if runtime.owner is not None:
            hand_back(runtime.coordination, runtime.owner)


def work(
    runtime: Runtime,
    *,
    interval_s: float = 5.0,
    tell: Callable[[dict[str, Any]], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
    concurrency: int = 1,
    consolidator: Any = None,
    stopping: Stopping | None = None,
) -> None:
    """:func:`work_once`, then wait ``interval_s`` seconds for more (the SQLite record's
    queue), until ``stop()`` (Ctrl-C on the CLI) or ``stopping`` (SIGTERM:
    the work in flight finishes, or is handed back at the stop's cut-off). A record that
    cannot be reached (a database restart) is waited out with a backoff, told as a
    ``reconnect`` row; the runs this worker holds are let go as it stops."""

    def halted() -> bool:
        return stop() or (stopping is not None and stopping())

    backoff = Backoff()
    try:
        while not halted():
            try:
                rows = asyncio.run(
                    until_stopped(
                        work_once(runtime, tell=tell, concurrency=concurrency, consolidator=consolidator, stop=halted),
                        stopping,
                    )
                )
            except StoreError as exc:
                delay = backoff.next()
                if tell:
                    tell(
                        {
                            "run_id": None,
                            "work": "reconnect",
                            "done": False,
                            "reason": f"the record cannot be reached ({exc}); looking again in {delay:g} s",
                        }
                    )
                nap(delay, halted)
                continue
            backoff.reset()
            if rows is None or any(r["work"] == "consolidate" and r["done"] for r in rows):
                continue  # stopped mid-round, or more of the queue may be waiting
            end = time.monotonic() + interval_s
            while not halted() and (left := end - time.monotonic()) > 0:  # a stop is seen within a second
                time.sleep(min(1.0, left))
    finally:
        if runtime.owner is not None:
            hand_back(runtime.coordination, runtime.owner)
