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
from collections.abc import Callable
from typing import Any

from loomrt.errors import StoreError
from loomrt.jobs.schema import CONSOLIDATE, DISTIL, PLAY, QUEUE
from loomrt.record.owners import worker_name
from loomrt.runtime import Runtime
from loomrt.worker import (
    PLAYED,
    RUN_QUEUED,
    abandoned,
    consolidate_row,
    distil_row,
    play_row,
    queued_distillations,
)
from loomrt.worker_life import Backoff, Stopping, hand_back

__all__ = ["JobWorker", "serve"]

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
        self.rows: list[dict[str, Any]] = []
        self.playing: dict[str, asyncio.Task[Any]] = {}
        """The runs this process plays now (their jobs' tasks): never resumed by its own look."""
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
        app.task(name=CONSOLIDATE, queue=QUEUE)(self._consolidate)
        return app

    def tell(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self._tell:
            self._tell(row)

    async def _play(self, run_id: str, kind: str = RUN_QUEUED) -> None:
        store = self.runtime.store
        info = await asyncio.to_thread(store.get_run, run_id)
        if info.status == "queued":
            work = "play"
        elif run_id in await asyncio.to_thread(self._left):
            work = "resume"
        else:
            return  # played, or playing elsewhere: nothing for this job to do
        self.playing[run_id] = asyncio.current_task()  # type: ignore[assignment]
        try:
            row = await play_row(self.runtime, work, run_id)
        finally:
            self.playing.pop(run_id, None)
        self.tell(row)

    async def _distil(self, run_id: str, kind: str = "") -> None:
        queued = dict(await asyncio.to_thread(queued_distillations, self.runtime.store))
        if run_id not in queued:
            return  # settled meanwhile
        self.tell(await distil_row(self.runtime, run_id, queued[run_id]))

    async def _consolidate(self, scope: str) -> None:
        if self.consolidator is not None:
            self.tell(await consolidate_row(self.consolidator, [scope]))

    # ------------------------------------------------------------------ the look

    def _left(self) -> list[str]:
        """The runs a worker left (this one's too, but not those it plays now)."""
        return [r for r in abandoned(self.runtime.coordination, self.runtime.owner) if r not in self.playing]

    async def _defer(self, task: str, lock: str, **args: Any) -> None:
        from procrastinate.exceptions import AlreadyEnqueued

        with contextlib.suppress(AlreadyEnqueued):  # its job waits already
            await self.app.configure_task(task, queue=QUEUE, queueing_lock=lock).defer_async(**args)

    async def look(self, *, starting: bool = False) -> None:
        """Make the jobs the record's trigger cannot: runs a worker left, and scopes to
        consolidate; at the start also the work queued before the engine's schema existed.
        Then hand the jobs of workers that stopped beating back to the queue."""
        store = self.runtime.store
        if starting:
            for run_id in await asyncio.to_thread(store.pending, RUN_QUEUED, PLAYED):
                await self._defer(PLAY, f"play:{run_id}", run_id=run_id, kind=RUN_QUEUED)
            for run_id, _ in await asyncio.to_thread(queued_distillations, store):
                await self._defer(DISTIL, f"distil:{run_id}", run_id=run_id)
        for run_id in await asyncio.to_thread(self._left):
            await self._defer(PLAY, f"play:{run_id}", run_id=run_id, kind="abandoned")
        if self.consolidator is not None:
            for scope in await asyncio.to_thread(self.consolidator.queue.scopes):
                await self._defer(CONSOLIDATE, f"consolidate:{scope}", scope=scope)
        if not starting:
            await self._requeue_stalled()

    async def _requeue_stalled(self) -> None:
        """Jobs left ``doing`` by a worker whose heartbeat is older than the timeout go back
        to the queue (what they find then: a run to resume, or nothing)."""
        manager = self.app.job_manager
        for job in await manager.get_stalled_jobs(seconds_since_heartbeat=self.heartbeat_timeout_s):
            with contextlib.suppress(Exception):  # its work has a job waiting already: this one can go
                await manager.retry_job(job)

    # ------------------------------------------------------------------ the worker

    def halted(self) -> bool:
        return self.stop() or (self.stopping is not None and self.stopping())

    def _worker(self) -> Any:
        from procrastinate.worker import Worker

        return Worker(
            app=self.app,
            queues=[QUEUE],
            name=self.runtime.owner,
            concurrency=self.concurrency,
            wait=not self.once,
            fetch_job_polling_interval=self.interval_s,
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
            await self.look(starting=True)
            self._backoff.reset()  # the record answers again
            worker = self._worker()
            running = asyncio.create_task(worker.run())
            looking = asyncio.create_task(self._keep_looking())
            try:
                while not running.done():
                    await asyncio.wait({running}, timeout=0.2)
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
            for task in list(self.playing.values()):
                task.cancel()

    async def _keep_looking(self) -> None:
        if self.once:
            return
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.look()
            except (StoreError, OSError, Exception) as exc:  # noqa: BLE001 - the server may be down: look again
                self._reconnecting(exc, self.interval_s)

    def _reconnecting(self, exc: BaseException, delay: float) -> None:
        self.tell(
            {
                "run_id": None,
                "work": "reconnect",
                "done": False,
                "reason": f"the record cannot be reached ({type(exc).__name__}: {exc}); looking again in {delay:g} s",
            }
        )

    async def serve(self) -> list[dict[str, Any]]:
        """Work until stopped (``once``: until no job is left), waiting out a database that
        cannot be reached with a backoff, each wait told as a ``reconnect`` row; the runs
        this worker still holds are let go as it stops. Its rows."""
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
                    delay = backoff.next()
                    self._reconnecting(exc, delay)
                    end = asyncio.get_running_loop().time() + delay
                    while not self.halted() and asyncio.get_running_loop().time() < end:
                        await asyncio.sleep(0.2)
                    continue
        finally:
            await asyncio.to_thread(hand_back, self.runtime.coordination, str(self.runtime.owner))
        return self.rows


def serve(runtime: Runtime, **kw: Any) -> list[dict[str, Any]]:
    """Run a :class:`JobWorker` (keyword arguments as its) to its end; its rows."""
    return asyncio.run(JobWorker(runtime, **kw).serve())
