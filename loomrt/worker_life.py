"""What keeps ``loomrt worker`` alive through what production does to it (issue 45).

- **A stop** (SIGTERM from systemd or Kubernetes): :class:`Stopping` turns it into a
  deadline. The work in flight has ``grace_s`` to finish; what has not finished by the
  deadline's cut-off is cancelled and its runs are handed back (:func:`hand_back`: their
  claims lapse at once, so any worker resumes them), and the worker exits 0 before
  ``grace_s`` is up. A backstop ends the process at the deadline whatever it is blocked on
  (its instance lock then shows it gone on its own machine).
- **A database restart**: a store error in a round of work is not the end of the worker: it
  waits (:class:`Backoff`: 0.5 s, doubling, at most 30 s) and looks again; the pool checks
  each connection before handing it out. A run whose turn failed because its record could
  not be written stays claimed by this worker, which resumes it at its next round
  (:func:`loomrt.worker.abandoned`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from loomrt.errors import StoreError
from loomrt.record.coordination import Coordination

__all__ = ["Stopping", "Backoff", "hand_back", "until_stopped", "nap"]

T = TypeVar("T")


class Stopping:
    """A stop asked for by a signal, with its deadline: ``grace_s`` seconds after it came."""

    def __init__(self, grace_s: float = 30.0):
        self.grace_s = grace_s
        self.event = threading.Event()
        self.deadline: float | None = None
        """When the worker must have exited (``time.monotonic()``), once a stop came."""

    def __call__(self) -> bool:
        return self.event.is_set()

    def ask(self, *_: object) -> None:
        """Stop (a signal handler): the first call starts the grace period and its backstop."""
        if self.event.is_set():
            return
        self.deadline = time.monotonic() + self.grace_s
        self.event.set()
        backstop = threading.Timer(max(0.0, self.grace_s - 0.2), lambda: os._exit(0))
        backstop.daemon = True
        backstop.start()

    def install(self) -> None:
        """Handle SIGTERM as a stop."""
        signal.signal(signal.SIGTERM, self.ask)

    def cutoff(self) -> float | None:
        """When work still in flight is cancelled and handed back: early enough to let its
        claims go before the deadline."""
        if self.deadline is None:
            return None
        return self.deadline - min(5.0, self.grace_s / 3)


class Backoff:
    """Waits between tries against a record that cannot be reached: 0.5 s, doubling, at most
    ``most_s``; :meth:`reset` once a try went through."""

    def __init__(self, first_s: float = 0.5, most_s: float = 30.0):
        self.first_s, self.most_s, self.failures = first_s, most_s, 0

    def next(self) -> float:
        self.failures += 1
        return float(min(self.most_s, self.first_s * 2 ** (self.failures - 1)))

    def reset(self) -> None:
        self.failures = 0


def nap(seconds: float, stop: Callable[[], bool]) -> None:
    """Sleep ``seconds``, waking every 0.2 s to see whether the worker must stop."""
    end = time.monotonic() + seconds
    while not stop() and (left := end - time.monotonic()) > 0:
        time.sleep(min(0.2, left))


async def until_stopped(work: Coroutine[Any, Any, T], stopping: Stopping | None) -> T | None:
    """Await ``work``; if a stop's cut-off comes first, cancel it (its runs are handed back
    by the caller) and return None."""
    task = asyncio.ensure_future(work)
    if stopping is None:
        return await task
    while not task.done():
        await asyncio.wait({task}, timeout=0.2)
        cutoff = stopping.cutoff()
        if not task.done() and cutoff is not None and time.monotonic() >= cutoff:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            return None
    return task.result()


def hand_back(store: Coordination, owner: str) -> list[str]:
    """Let every claim ``owner`` holds lapse now (a worker that stops): any worker resumes
    those runs at once (a lapsed claim on an active run is what an idle worker looks for,
    :meth:`~loomrt.record.coordination.Coordination.stalled_runs`; one let go is not). The run ids handed
    back; a record that cannot be reached hands none back (their claims lapse in time)."""
    done = []
    try:
        for claim in store.run_owners():
            if claim["owner"] == owner and store.renew_run(claim["run_id"], owner, claim["epoch"], -0.001):
                done.append(claim["run_id"])
    except StoreError:
        pass
    return done
