"""``loomrt worker`` on PostgreSQL: procrastinate's worker takes the jobs; loomrt plays them.

Three jobs (their task names in :mod:`loomrt.jobs.schema`):

- ``loomrt.play`` (``run_id``): a queued run is claimed and played (:func:`loomrt.worker.take`,
  row ``play``); a run a worker left (still active, its claim lapsed, handed back, or held by
  a dead worker) is resumed (row ``resume``); a run that is neither is left alone, silently
  (a job the engine hands out again after it was done);
- ``loomrt.distil`` (``run_id``): a run's queued distillation, if it is still queued;
- ``loomrt.consolidate`` (``scope``): one consolidation pass over a scope.

Jobs come from the record itself (the trigger of :mod:`loomrt.jobs.schema`: queued work and
its job are written in one transaction) and from :class:`JobWorker`'s **look**, made when a
worker starts (work queued before the engine's schema existed) and then every
``interval_s`` seconds: runs a worker left, and scopes with harvest to consolidate. A look is
a constant number of queries, however many runs were ever played; a job for work whose job
already waits is not made twice (its queueing lock). The look also hands jobs whose worker
stopped beating back to the queue (procrastinate finds them; retrying them is ours).

What procrastinate gives: the queue table and its ``SKIP LOCKED`` fetch, the workers'
registrations and heartbeats, the wake-ups (``LISTEN``/``NOTIFY``), concurrency and the
graceful stop. What stays loomrt's: who may append to a run (a job claims its run and
appends under the claim's epoch: a job played twice writes once), and the stop's cut-off
(on SIGTERM the jobs in flight have until :meth:`Stopping.cutoff`, then they are cancelled
and their runs handed back, for any worker to resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from loomrt.errors import StoreError
from loomrt.jobs.schema import CONSOLIDATE, CONSOLIDATE_QUEUE, DISTIL, PLAY, QUEUE
from loomrt.record.owners import worker_name
from loomrt.runtime import Runtime
from loomrt.worker import (
    PLAYED,
    PLAYING_NOW,
    RUN_QUEUED,
    abandoned,
    consolidate_row,
    distil_row,
    play_row,
    queued_distillations,
)
from loomrt.worker_life import Backoff, Stopping, hand_back

__all__ = ["JobWorker", "serve", "fatal", "LET_GO_S"]


LET_GO_S = 10.0
"""How long a play job waits for the process that queued its run to let the run go (it does
as soon as its ``run_queued`` event is written: milliseconds); past it the job ends, and the
next look makes the job again."""


Tell = Callable[[dict[str, Any]], None]


class JobWorker:
    """One ``loomrt worker`` process on a PostgreSQL record: procrastinate's worker with
    loomrt's three jobs, and the look that makes the jobs the record's trigger cannot."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        tell: Tell | None = None,
        concurrency: int = 1,
        consolidator: Any = None,
        interval_s: float = 5.0,
        heartbeat_timeout_s: float = 30.0,
        stopping: Stopping | None = None,
        stop: Callable[[], bool] = lambda: False,
        once: bool = False,
    ):
        if runtime.owner is None:
            runtime.owner = worker_name()
        self.runtime, self.consolidator = runtime, consolidator
        self.concurrency, self.interval_s, self.heartbeat_timeout_s = concurrency, interval_s, heartbeat_timeout_s
        self.stopping, self.stop, self.once = stopping, stop, once
        self._tell = tell
        self.rows: deque[dict[str, Any]] = deque(maxlen=1000)
        """The newest rows told (a worker runs for months: older ones are only in its output)."""
        self.working: dict[str, asyncio.Task[Any]] = {}
        """What this process's jobs work on now (a run id, ``scope:SCOPE``), and each job's task:
        never resumed by its own look, cancelled at a stop's cut-off."""
        self.app = self._app()
        self._backoff = Backoff()

    # ------------------------------------------------------------------ the jobs

    def _app(self) -> Any:
        import procrastinate

        url = str(getattr(self.runtime.store, "url", ""))
        connector = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=self.concurrency + 3)
        app = procrastinate.App(connector=connector)
        app.task(name=PLAY, queue=QUEUE)(self._play)
        app.task(name=DISTIL, queue=QUEUE)(self._distil)
        app.task(name=CONSOLIDATE, queue=CONSOLIDATE_QUEUE)(self._consolidate)
        return app

    def tell(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self._tell:
            self._tell(row)

    @contextlib.contextmanager
    def _job(self, key: str) -> Iterator[bool]:
        """This job's turn at ``key`` (a run, a scope): False when another job of this process
        has it now (checked and taken with no await between: one process never plays one run
        twice at once, whatever the engine hands out); the job's task is cancelled at a stop's
        cut-off."""
        if key in self.working:
            yield False
            return
        task = asyncio.current_task()
        assert task is not None
        self.working[key] = task
        try:
            yield True
        finally:
            if self.working.get(key) is task:
                del self.working[key]

    async def _play(self, run_id: str, kind: str = RUN_QUEUED) -> None:
        with self._job(run_id) as mine:
            if not mine:
                return
            info = await self.runtime.off_loop(self.runtime.store.get_run, run_id)
            if info.status == "queued":
                work = "play"
            elif run_id in await asyncio.to_thread(self._left, run_id):
                work = "resume"
            else:
                return  # played, or playing elsewhere: nothing for this job to do
            row, waited = await play_row(self.runtime, work, run_id), 0.0
            while await self._held_by_its_queuer(work, row, run_id):
                if waited >= LET_GO_S:
                    return  # held all this while (its queuer died holding it): the next look makes the job again
                await asyncio.sleep(0.5)  # its queuer lets it go as soon as its event is written
                waited += 0.5
                row = await play_row(self.runtime, work, run_id)
        self.tell(row)

    async def _held_by_its_queuer(self, work: str, row: dict[str, Any], run_id: str) -> bool:
        """The play was refused and the run is still queued: the process that queued it
        (``run --detach``) has not let its claim go yet (its event, and so this job, came first)."""
        if work != "play" or row["done"] or row["reason"] != "another worker has it":
            return False
        return bool((await self.runtime.off_loop(self.runtime.store.get_run, run_id)).status == "queued")

    async def _distil(self, run_id: str, kind: str = "") -> None:
        with self._job(run_id) as mine:
            if not mine:
                return
            queued = dict(await self.runtime.off_loop(queued_distillations, self.runtime.store))
            if run_id not in queued:
                return  # settled meanwhile
            row = await distil_row(self.runtime, run_id, queued[run_id])
        if row["reason"] == PLAYING_NOW:
            return  # its own process distils it, else the next look queues it again: nothing to tell
        self.tell(row)

    async def _consolidate(self, scope: str) -> None:
        with self._job(f"scope:{scope}") as mine:
            if not mine or self.consolidator is None:
                return
            row = await consolidate_row(self.consolidator, [scope])
        self.tell(row)

    # ------------------------------------------------------------------ the look

    def _left(self, also: str | None = None) -> list[str]:
        """The runs a worker left (this one's too, but not those it plays now, except ``also``)."""
        return [
            r for r in abandoned(self.runtime.coordination, self.runtime.owner) if r == also or r not in self.working
        ]

    async def _defer(self, task: str, lock: str, **args: Any) -> None:
        from procrastinate.exceptions import AlreadyEnqueued

        queue = CONSOLIDATE_QUEUE if task == CONSOLIDATE else QUEUE
        with contextlib.suppress(AlreadyEnqueued):  # its job waits already
            await self.app.configure_task(task, queue=queue, queueing_lock=lock).defer_async(**args)

    async def look(self) -> None:
        """Make the jobs no job is waiting for: queued runs and distillations (the record's
        trigger made theirs; a job that found its work not ready yet, or one queued before the
        engine's schema existed, is made again), runs a worker left, and scopes to
        consolidate. Then hand the jobs of workers that stopped beating back to the queue. A
        constant number of queries, however many runs were ever played."""
        store = self.runtime.store
        for run_id in await asyncio.to_thread(store.pending, RUN_QUEUED, PLAYED):
            await self._defer(PLAY, f"play:{run_id}", run_id=run_id, kind=RUN_QUEUED)
        for run_id, _ in await asyncio.to_thread(queued_distillations, store):
            await self._defer(DISTIL, f"distil:{run_id}", run_id=run_id)
        for run_id in await asyncio.to_thread(self._left):
            await self._defer(PLAY, f"play:{run_id}", run_id=run_id, kind="abandoned")
        if self.consolidator is not None:
            for scope in await asyncio.to_thread(self.consolidator.queue.scopes):
                await self._defer(CONSOLIDATE, f"consolidate:{scope}", scope=scope)
        await self._requeue_stalled()

    async def _requeue_stalled(self) -> None:
        """Jobs left ``doing`` by a worker whose heartbeat is older than the timeout go back
        to the queue (what they find then: a run to resume, or nothing). One whose work has a
        job waiting already cannot (the queueing lock): it stays, and finds nothing to do
        once that job has done the work."""
        import psycopg

        manager = self.app.job_manager
        for job in await manager.get_stalled_jobs(seconds_since_heartbeat=self.heartbeat_timeout_s):
            try:
                await manager.retry_job(job)
            except Exception as exc:
                if not any(isinstance(e, psycopg.errors.UniqueViolation) for e in _causes(exc)):
                    raise

    # ------------------------------------------------------------------ the worker

    def halted(self) -> bool:
        return self.stop() or (self.stopping is not None and self.stopping())

    def _worker(self) -> Any:
        from procrastinate.worker import Worker

        return Worker(
            app=self.app,
            queues=[QUEUE, CONSOLIDATE_QUEUE] if self.consolidator is not None else [QUEUE],
            name=self.runtime.owner,
            concurrency=self.concurrency,
            wait=not self.once,
            fetch_job_polling_interval=min(1.0, self.interval_s),  # a NOTIFY missed while its listener reconnects
            listen_notify=True,
            install_signal_handlers=False,  # a stop is ours (Stopping): its cut-off hands runs back
            update_heartbeat_interval=self.heartbeat_timeout_s / 3,
            stalled_worker_timeout=self.heartbeat_timeout_s,
            delete_jobs="successful",
        )

    async def _round(self) -> bool:
        """Open the engine, look, and work until stopped (or, ``once``, until no job is left);
        True when this round ended by a stop or ``once``, False when the worker stopped of
        itself (the database went away)."""
        async with self.app.open_async():
            await self.look()
            worker = self._worker()
            running = asyncio.create_task(worker.run())
            looking = asyncio.create_task(self._keep_looking())
            try:
                while not running.done():
                    watched = {running} if looking.done() else {running, looking}
                    await asyncio.wait(watched, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
                    if looking.done() and not looking.cancelled() and looking.exception() is not None:
                        worker.stop()  # an error no wait mends, met by a look: the worker stops with it
                        with contextlib.suppress(asyncio.CancelledError):
                            await running
                        raise looking.exception()  # type: ignore[misc]
                    if worker.worker_id is not None:
                        self._backoff.reset()  # registered: the database answers again
                    if self.halted():
                        worker.stop()  # no new job; those in flight finish, or are cut off
                        self._cut_off()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
            finally:
                looking.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await looking
        return self.once or self.halted()

    def _cut_off(self) -> None:
        cutoff = self.stopping.cutoff() if self.stopping is not None else None
        if cutoff is not None and time.monotonic() >= cutoff:
            for task in list(self.working.values()):
                task.cancel()

    async def _keep_looking(self) -> None:
        if self.once:
            return
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.look()
            except Exception as exc:  # noqa: BLE001 - the server may be down: look again
                if fatal(exc):
                    raise
                self._reconnecting(exc, self.interval_s)

    def _reconnecting(self, exc: BaseException, delay: float) -> None:
        self.tell(
            {
                "run_id": None,
                "work": "reconnect",
                "done": False,
                "reason": f"the record cannot be reached ({_said(exc)}); looking again in {delay:g} s",
            }
        )

    async def serve(self) -> list[dict[str, Any]]:
        """Work until stopped (``once``: until no job is left), waiting out a database that
        cannot be reached with a backoff, each wait told as a ``reconnect`` row; the runs
        this worker still holds are let go as it stops. Its rows. An error no wait mends (a
        privilege the role lacks, a table missing: :func:`fatal`), or any error of a
        ``once`` worker, is one :class:`StoreError`."""
        backoff = self._backoff = Backoff()
        try:
            while not self.halted():
                try:
                    if await self._round():
                        break
                    raise StoreError("the job engine's worker stopped: its connection to the database was lost")
                except Exception as exc:  # noqa: BLE001 - psycopg's, procrastinate's or the store's: wait, try again
                    if self.halted():
                        break
                    if fatal(exc) or self.once:
                        where = getattr(self.runtime.store, "path", "the record")
                        raise StoreError(f"loomrt worker cannot work on {where}: {_said(exc)}") from None
                    delay = backoff.next()
                    self._reconnecting(exc, delay)
                    end = asyncio.get_running_loop().time() + delay
                    while not self.halted() and asyncio.get_running_loop().time() < end:
                        await asyncio.sleep(0.2)
        finally:
            await asyncio.to_thread(hand_back, self.runtime.coordination, str(self.runtime.owner))
        return list(self.rows)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        yield at
        at = at.__cause__ or at.__context__


def fatal(exc: BaseException) -> bool:
    """An error no wait mends: a table, function or privilege is missing (SQLSTATE class 42:
    run ``loomrt db migrate``, or grant what it names). A lost connection or a server
    shutting down (57P01) is not. (A role or database the server refuses fails the worker
    before this: opening the record says so.)"""
    return any(str(getattr(e, "sqlstate", "") or "")[:2] == "42" for e in _causes(exc))


def _said(exc: BaseException) -> str:
    """The deepest error's own words, on one line (procrastinate wraps psycopg's)."""
    last = list(_causes(exc))[-1]
    return f"{type(last).__name__}: {' '.join(str(last).split())}"


def serve(runtime: Runtime, **kw: Any) -> list[dict[str, Any]]:
    """Run a :class:`JobWorker` (keyword arguments as its) to its end; its rows."""
    return asyncio.run(JobWorker(runtime, **kw).serve())
